"""Which `!type` names may become Python objects: only those registered here.

Decoding never imports or instantiates anything by name; an unregistered name stays a `wire.Typed`.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["alias_of", "lookup", "note_unknown", "register", "unknown_types"]

T = TypeVar("T", bound=type[Any])

_lock = threading.Lock()
_by_name: dict[str, type[Any]] = {}
by_class: dict[type[Any], str] = {}


def register(cls: T, alias: str | None = None) -> T:
    """Map `alias` (default: the class's `__qualname__`) to `cls` both ways; usable as a decorator.

    The alias is what appears after `!` on the wire, so use the Java alias or class name
    (e.g. `"gen.Msg$Message1"`) to exchange typed objects with Java.
    """
    name = alias if alias is not None else cls.__qualname__
    if not name:
        raise ValueError("a type alias must not be empty")
    with _lock:
        old = _by_name.get(name)
        if old is not None and old is not cls:
            raise ValueError(f"type alias {name!r} is already registered for {old!r}")
        _by_name[name] = cls
        by_class.setdefault(cls, name)
    return cls


def lookup(name: str) -> type[Any] | None:
    """The class registered under `name`, or None."""
    return _by_name.get(name)


def alias_of(cls: type[Any]) -> str | None:
    """The name `cls` is written under, or None if it was never registered."""
    return by_class.get(cls)


_unknown: ContextVar[list[str] | None] = ContextVar("wire_unknown_types", default=None)


def note_unknown(name: str) -> None:
    """Record that a `!type` named `name` was decoded without a registered class (see `unknown_types`)."""
    seen = _unknown.get()
    if seen is not None:
        seen.append(name)


class unknown_types:
    """Collects the unregistered `!type` names decoded inside the `with` block, in the order met.

    Decoding keeps such a value (a `wire.Typed`, or the declared class read field by field) and
    carries on; this lets a caller that knows the context, like a method reader, report them.
    """

    __slots__ = ("_token", "names")

    def __init__(self) -> None:
        self.names: list[str] = []

    def __enter__(self) -> list[str]:
        self._token = _unknown.set(self.names)
        return self.names

    def __exit__(self, *exc: object) -> None:
        _unknown.reset(self._token)
