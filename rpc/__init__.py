"""Method writers and readers over chronq queues: typing.Protocol interfaces become messages.

`rpc.writer(queue, Proto)` returns a generated `Proto` whose calls append Chronicle method documents
(byte-identical to Java's method writers); `rpc.reader(tailer, *handlers)` dispatches them back;
`rpc.Service` runs a handler between two queues with restart semantics.
"""

from rpc._history import current_history
from rpc._interface import interface, method_id
from rpc._reader import MethodReader, reader
from rpc._writer import writer
from rpc.service import Output, Service, Start

__all__ = [
    "MethodReader",
    "Output",
    "Service",
    "Start",
    "current_history",
    "interface",
    "method_id",
    "reader",
    "writer",
]
