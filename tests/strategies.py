"""Hypothesis strategies for generic wire values (what `wire.binary.encode` and `wire.text.to_yaml` take
without a schema), shared by the tests that round-trip, fuzz or render them.

One builder with switches rather than one strategy per test: each codec has values it cannot carry
unchanged (the text wire has no NaN, JSON no bytes, Java writes Long.MAX_VALUE lossily), and a test
narrows the shared vocabulary only by those, so a new value type added here reaches every test that can
take it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from wire.types import EventName, FieldNumber, Int64Hex, Typed, TypeLiteral

__all__ = [
    "LONGS", "TYPE_NAMES", "event_keys", "field_names", "floats", "longs", "scalars", "values",
]

LONGS = st.integers(-(1 << 63), (1 << 63) - 1)
"""Java's long: the widest integer the wire carries."""

TYPE_NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9.$]{0,8}", fullmatch=True)
"""Java class names as `!type` prefixes and type literals spell them."""


def longs(*, max_value: int = (1 << 63) - 1) -> st.SearchStrategy[int]:
    """Java longs up to `max_value` (Java writes Long.MAX_VALUE as 2^63, so exact round trips of Java's
    bytes stop one below it)."""
    return st.integers(-(1 << 63), max_value)


def floats(*, nan: bool = True, infinity: bool = True, integral: bool = True) -> st.SearchStrategy[float]:
    """Doubles; `integral=False` leaves out whole numbers, which the wire writes compactly as integers
    (as Java does) and so come back through JSON as ints."""
    s = st.floats(allow_nan=nan, allow_infinity=infinity)
    return s if integral else s.filter(lambda f: not f.is_integer())


def field_names(*, alphabet: st.SearchStrategy[str] | None = None, min_size: int = 0,
                max_size: int = 8) -> st.SearchStrategy[str]:
    """Field names: 8-bit on the wire by default, and never all digits, since an all-digit name is
    written as a FIELD_NUMBER and reads back as one."""
    chars = st.characters(max_codepoint=255) if alphabet is None else alphabet
    return st.text(chars, min_size=min_size, max_size=max_size).filter(lambda s: not s.isdigit())


def event_keys(max_size: int = 6) -> st.SearchStrategy[Any]:
    """Every kind of map key the binary wire has: field names, event names and field numbers."""
    return (
        field_names(max_size=max_size)
        | st.builds(EventName, st.text(st.characters(max_codepoint=255), max_size=max_size))
        | st.builds(FieldNumber, st.integers(-5, 300))
    )


def scalars(
    *,
    floats: st.SearchStrategy[float] | None = None,
    longs: st.SearchStrategy[int] = LONGS,
    text_size: int = 40,
    binary_size: int | None = 40,
    int64hex: bool = True,
    temporal: bool = False,
    type_literals: bool = False,
) -> st.SearchStrategy[Any]:
    """Leaf values: null, booleans, longs, doubles, text, and (each switchable) bytes, `Int64Hex`,
    UUIDs with dates and times, and type literals."""
    doubles = st.floats() if floats is None else floats
    s: st.SearchStrategy[Any] = st.none() | st.booleans() | longs | doubles | st.text(max_size=text_size)
    if binary_size is not None:
        s = s | st.binary(max_size=binary_size)
    if int64hex:
        s = s | st.builds(Int64Hex, LONGS)
    if temporal:
        s = s | st.uuids() | st.dates() | st.times() | st.datetimes()
    if type_literals:
        s = s | TYPE_NAMES.map(TypeLiteral)
    return s


def values(
    leaves: st.SearchStrategy[Any] | None = None,
    keys: st.SearchStrategy[Any] | None = None,
    *,
    typed: bool = False,
    max_size: int = 4,
    max_leaves: int = 15,
) -> st.SearchStrategy[Any]:
    """Trees of `leaves` in sequences and maps keyed by `keys` (and, with `typed`, `!type` prefixed
    values), up to `max_size` items per container."""
    leaf = scalars() if leaves is None else leaves
    key = field_names() if keys is None else keys

    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        s = st.lists(inner, max_size=max_size) | st.dictionaries(key, inner, max_size=max_size)
        return s | st.builds(Typed, TYPE_NAMES, inner) if typed else s

    return st.recursive(leaf, extend, max_leaves=max_leaves)
