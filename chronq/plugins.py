"""What chronq finds at run time instead of importing: entry points of the packages above it, and
objects the user names as ``module:Name`` (a predicate, a Protocol, a key ring). Internal to chronq's
command line and Spark source, and public so that rpc's test plugin loads names by the same rule.

Entry points keep the import rule (rpc -> chronq -> wire): chronq never imports rpc; rpc declares in
pyproject.toml what it offers chronq (``chronq.commands``: a subcommand; ``chronq.decoders``:
``interface`` for the command line, ``interface_calls`` for the Spark source's typed ``args``).
"""

from __future__ import annotations

import importlib
from typing import Any

from chronq.errors import ChronqError

__all__ = ["LoadError", "entry_point", "entry_points", "load_object"]


class LoadError(ChronqError, LookupError):
    """A ``module:Name`` that is malformed or names nothing importable; the message says which."""


def entry_points(group: str) -> list[Any]:
    """The installed entry points of `group`, by name (so subcommands list in a stable order)."""
    from importlib.metadata import entry_points as installed

    return sorted(installed(group=group), key=lambda ep: ep.name)


def entry_point(group: str, name: str) -> Any | None:
    """The object entry point `name` of `group` refers to (loaded), or None if none is installed."""
    found = [ep for ep in entry_points(group) if ep.name == name]
    return found[0].load() if found else None


def load_object(spec: str, what: str) -> Any:
    """The object ``module:Name`` names (dots allowed in Name: a nested class), importing only that
    module. A LoadError naming `what` and the part that is missing: the format, the module, the name."""
    module, sep, qualname = spec.partition(":")
    if not sep or not module.strip() or not qualname.strip():
        raise LoadError(f"{what}: expected 'module:QualName', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise LoadError(f"{what}: {spec!r}: cannot import module {module!r}: {e}") from e
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LoadError(f"{what}: {spec!r}: {module!r} has no {qualname!r}") from None
    return obj
