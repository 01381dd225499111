"""Hypothesis strategies derived from a Protocol: DTOs, call streams, and agitated call streams.

Agitators are Chronicle's idea (DuplicateMessageAgitator, MessageMissingAgitator, ...): take a valid
input stream and duplicate, drop or reorder messages, to check that a component survives what a
real feed does to it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

from rpc._interface import describe
from wire import fields_of

__all__ = [
    "Call", "agitated", "apply", "call", "calls", "dropped", "dtos", "duplicated", "reordered", "values",
]

T = TypeVar("T")
Call = tuple[str, tuple[Any, ...]]


def dtos(tp: type[T]) -> st.SearchStrategy[T]:
    """Instances of a msgspec Struct, attrs class or dataclass whose values the wire carries as they are:
    ints within Java's long, finite floats (NaN never equals itself), nested DTOs built the same way."""
    return values(tp)


def values(tp: Any) -> st.SearchStrategy[Any]:
    """Values of annotation `tp` that survive a BINARY round trip unchanged."""
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-(2**63), 2**63 - 1)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp is str:
        return st.text(max_size=40)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    info = fields_of(tp)
    if info is not None:
        # the constructor's keywords (an attrs alias where there is one); `init=False` fields are the
        # class's to set, as they are when a decoder builds the object
        return st.builds(tp, **{f.init_name: values(f.type) for f in info.fields if f.init_name is not None})
    return st.from_type(tp)


def call(protocol: type, *, overrides: dict[str, st.SearchStrategy[tuple[Any, ...]]] | None = None
         ) -> st.SearchStrategy[Call]:
    """One message call of `protocol`: (method name, arguments). `overrides` replaces the argument
    strategy of a method, e.g. to keep amounts positive or ids in a small range."""
    overrides = overrides or {}
    options = []
    for m in describe(protocol).methods:
        if m.chain is not None:
            continue  # chained calls need a terminal step; generate those with an override
        args = overrides[m.name] if m.name in overrides else st.tuples(*(values(tp) for _, tp in m.params))
        options.append(st.tuples(st.just(m.name), args))
    if not options:
        raise TypeError(f"{protocol.__name__} has no message method to call")
    return st.one_of(options)


def calls(protocol: type, *, min_size: int = 0, max_size: int = 20,
          overrides: dict[str, st.SearchStrategy[tuple[Any, ...]]] | None = None
          ) -> st.SearchStrategy[list[Call]]:
    """A stream of calls of `protocol`."""
    return st.lists(call(protocol, overrides=overrides), min_size=min_size, max_size=max_size)


def duplicated(stream: st.SearchStrategy[list[T]]) -> st.SearchStrategy[list[T]]:
    """The stream with some messages delivered twice (right after the original)."""
    return stream.flatmap(
        lambda xs: st.lists(st.booleans(), min_size=len(xs), max_size=len(xs)).map(
            lambda flags: [y for x, f in zip(xs, flags, strict=True) for y in ((x, x) if f else (x,))]
        )
    )


def dropped(stream: st.SearchStrategy[list[T]]) -> st.SearchStrategy[list[T]]:
    """The stream with some messages missing."""
    return stream.flatmap(
        lambda xs: st.lists(st.booleans(), min_size=len(xs), max_size=len(xs)).map(
            lambda keep: [x for x, k in zip(xs, keep, strict=True) if k]
        )
    )


def reordered(stream: st.SearchStrategy[list[T]]) -> st.SearchStrategy[list[T]]:
    """The stream in another order."""
    return stream.flatmap(st.permutations)


def agitated(stream: st.SearchStrategy[list[T]]) -> st.SearchStrategy[list[T]]:
    """The stream as it is, or with duplicates, drops or a new order: any mix of the agitators."""
    return st.one_of(stream, duplicated(stream), dropped(stream), reordered(stream))


def apply(target: object, stream: Sequence[Call]) -> None:
    """Make every call of `stream` on `target` (a writer or a handler)."""
    for name, args in stream:
        method: Callable[..., Any] = getattr(target, name)
        method(*args)
