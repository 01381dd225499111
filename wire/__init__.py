"""Chronicle Wire for Python: the BINARY wire (byte-compatible with Java), text renderings and MessageHistory."""

from wire import binary
from wire.errors import WireError
from wire.registry import register
from wire.types import EventName, FieldNumber, HistoryBytes, Int64Array, Int64Hex, Typed, TypeLiteral

__all__ = [
    "EventName",
    "FieldNumber",
    "HistoryBytes",
    "Int64Array",
    "Int64Hex",
    "TypeLiteral",
    "Typed",
    "WireError",
    "binary",
    "register",
]
