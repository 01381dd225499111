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
from rpc._reader import MethodReader, PoisonHook, log_poison, reader
from rpc._writer import writer

if TYPE_CHECKING:
    from rpc.service import (
        DeadLetter,
        DeadLetterHook,
        InputStatus,
        Output,
        Service,
        ServiceStatus,
        SnapshotRecord,
        Snapshottable,
        Start,
    )

_SERVICE_NAMES = ("DeadLetter", "DeadLetterHook", "InputStatus", "Output", "Service", "ServiceStatus",
                  "SnapshotRecord", "Snapshottable", "Start")

__all__ = [
    "DeadLetter",
    "DeadLetterHook",
    "InputStatus",
    "InterfaceSpec",
    "MethodReader",
    "MethodSpec",
    "Output",
    "PoisonHook",
    "Service",
    "ServiceStatus",
    "SnapshotRecord",
    "Snapshottable",
    "Start",
    "current_history",
    "describe",
    "interface",
    "log_poison",
    "method_id",
    "reader",
    "writer",
]


def __getattr__(name: str) -> Any:
    if name in _SERVICE_NAMES:
        return getattr(importlib.import_module("rpc.service"), name)
    raise AttributeError(f"module 'rpc' has no attribute {name!r}")
