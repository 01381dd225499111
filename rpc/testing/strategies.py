"""Hypothesis strategies derived from a Protocol: DTOs, call streams, and agitated call streams.

Agitators are Chronicle's idea (DuplicateMessageAgitator, MessageMissingAgitator, ...): take a valid
input stream and duplicate, drop or reorder messages, to check that a component survives what a
real feed does to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

from rpc._interface import describe

__all__ = ["Call", "agitated", "apply", "call", "calls", "dropped", "dtos", "duplicated", "reordered"]

T = TypeVar("T")
Call = tuple[str, tuple[Any, ...]]


def dtos(tp: type[T]) -> st.SearchStrategy[T]:
    """Instances of a msgspec Struct, attrs class or dataclass (hypothesis builds them from the fields)."""
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
        args = overrides.get(m.name) or st.tuples(*(st.from_type(tp) for _, tp in m.params))
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
