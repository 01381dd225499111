"""Protocol introspection: which methods an interface has, what they carry and what they chain to.

Done once per Protocol and cached, because writers and readers are generated from the result.
"""

from __future__ import annotations

import inspect
import keyword
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T", bound=type)

_SKIP = (object, typing.Protocol, typing.Generic)


@dataclass(frozen=True)
class MethodSpec:
    """One message method: its event (name or `@method_id`), parameters and the Protocol it chains to."""

    name: str
    event: str | int
    params: tuple[tuple[str, Any], ...]
    chain: type | None
    defaults: tuple[Any, ...] = ()  # of the trailing parameters, as a function's __defaults__


@dataclass(frozen=True)
class InterfaceSpec:
    protocol: type
    methods: tuple[MethodSpec, ...]

    def by_name(self) -> dict[str, MethodSpec]:
        return {m.name: m for m in self.methods}


def method_id(n: int) -> Callable[[F], F]:
    """Send this method as a FIELD_NUMBER event `n` instead of its name, as Java's `@MethodId(n)` does."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"method id must be a non-negative int, got {n!r}")

    def mark(fn: F) -> F:
        fn.__rpc_method_id__ = n  # type: ignore[attr-defined]
        return fn

    return mark


def is_protocol(tp: object) -> bool:
    return isinstance(tp, type) and bool(getattr(tp, "_is_protocol", False)) and tp is not typing.Protocol


_cache: dict[type, InterfaceSpec] = {}


def interface(proto: T) -> T:
    """Validate a Protocol as a message interface now rather than at the first writer or reader."""
    describe(proto)
    return proto


def describe(proto: type) -> InterfaceSpec:
    """The cached description of `proto`; raises TypeError naming the method that is not a message."""
    spec = _cache.get(proto)
    if spec is None:
        spec = _describe(proto)
        _cache[proto] = spec
    return spec


def _describe(proto: type) -> InterfaceSpec:
    if not is_protocol(proto):
        raise TypeError(f"{proto!r} is not a typing.Protocol")
    found: dict[str, MethodSpec] = {}
    bound = _type_arguments(proto)
    for klass in reversed(proto.__mro__):
        if klass in _SKIP:
            continue
        for name, fn in vars(klass).items():
            if name.startswith("_") or not inspect.isfunction(fn):
                continue
            found[name] = _method(proto, name, fn, bound)
    events: dict[str | int, str] = {}
    for m in found.values():
        if m.event in events:
            raise TypeError(f"{proto.__name__}: {m.name} and {events[m.event]} share the event {m.event!r}")
        events[m.event] = m.name
    return InterfaceSpec(proto, tuple(found.values()))


def _type_arguments(proto: type) -> dict[Any, Any]:
    """TypeVar -> type for generic Protocol bases, e.g. `class TimedSaying(Timed[Saying], Protocol)`
    binds Timed's `T` to Saying, so `def at(self, ts: int) -> T` chains to Saying."""
    bound: dict[Any, Any] = {}
    for klass in proto.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            for param, arg in zip(getattr(origin, "__parameters__", ()), typing.get_args(base), strict=False):
                bound.setdefault(param, bound.get(arg, arg))
    return bound


def _method(proto: type, name: str, fn: Callable[..., Any], bound: dict[Any, Any]) -> MethodSpec:
    where = f"{proto.__name__}.{name}"
    if typing.get_overloads(fn):
        raise TypeError(f"{where}: overloaded methods cannot be messages (one name, one signature)")
    if keyword.iskeyword(name) or not name.isidentifier() or not name.isascii():
        raise TypeError(f"{where}: not a usable method name (events are ASCII identifiers)")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as e:
        raise TypeError(f"{where}: annotation cannot be resolved ({e}); define types before use") from e
    params: list[tuple[str, Any]] = []
    defaults: list[Any] = []
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        if i == 0:
            continue  # self
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"{where}: parameter {p.name!r} must be positional (no *args, **kwargs, kw-only)")
        if p.name not in hints:
            raise TypeError(f"{where}: parameter {p.name!r} needs a type annotation")
        params.append((p.name, bound.get(hints[p.name], hints[p.name])))
        if p.default is not p.empty:
            defaults.append(p.default)
    if "return" not in hints:
        raise TypeError(f"{where}: needs a return annotation (None, or a Protocol to chain to)")
    ret = bound.get(hints["return"], hints["return"])
    chain: type | None
    if ret is None or ret is type(None):
        chain = None
    elif is_protocol(ret):
        chain = ret
    else:
        raise TypeError(f"{where}: a message returns None or a Protocol to chain to, not {ret!r}")
    event: str | int = getattr(fn, "__rpc_method_id__", name)
    return MethodSpec(name, event, tuple(params), chain, tuple(defaults))
