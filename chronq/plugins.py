"""What chronq finds at run time instead of importing: entry points of the packages above it.
Internal to chronq's command line and Spark source.

Entry points keep the import rule (rpc -> chronq -> wire): chronq never imports rpc; rpc declares in
pyproject.toml what it offers chronq (``chronq.commands``: a subcommand; ``chronq.decoders``:
``interface`` for the command line, ``interface_calls`` for the Spark source's typed ``args``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["entry_point", "entry_points"]


def entry_points(group: str) -> list[Any]:
    """The installed entry points of `group`, by name (so subcommands list in a stable order)."""
    from importlib.metadata import entry_points as installed

    return sorted(installed(group=group), key=lambda ep: ep.name)


def entry_point(group: str, name: str) -> Any | None:
    """The object entry point `name` of `group` refers to (loaded), or None if none is installed."""
    found = [ep for ep in entry_points(group) if ep.name == name]
    return found[0].load() if found else None
