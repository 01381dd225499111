"""Method writers and readers over chronq queues: typing.Protocol interfaces become messages.

`rpc.writer(queue, Proto)` returns a generated `Proto` whose calls append Chronicle method documents
(byte-identical to Java's method writers); `rpc.reader(tailer, *handlers)` dispatches them back;
`rpc.Service` runs a handler between two queues with restart semantics.

The service names load on first use, so that importing rpc (as pytest does for the replay plugin in
every run) needs only the wire layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rpc._history import current_history
from rpc._interface import InterfaceSpec, MethodSpec, describe, interface, method_id
from rpc._reader import MethodReader, reader
from rpc._writer import writer

if TYPE_CHECKING:
    from rpc.service import Output, Service, Start

__all__ = [
    "InterfaceSpec",
    "MethodReader",
    "MethodSpec",
    "Output",
    "Service",
    "Start",
    "current_history",
    "describe",
    "interface",
    "method_id",
    "reader",
    "writer",
]


def __getattr__(name: str) -> Any:
    if name in ("Output", "Service", "Start"):
        return getattr(importlib.import_module("rpc.service"), name)
    raise AttributeError(f"module 'rpc' has no attribute {name!r}")
