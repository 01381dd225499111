"""Chronicle Wire for Python: the BINARY wire (byte-compatible with Java), text and MessageHistory."""

from wire import binary, marshal, text  # noqa: F401  (marshal registers the typed codec with binary)
from wire._fields import ClassFields, Field, fields_of
from wire.errors import WireError
from wire.history import MessageHistory, read_history
from wire.registry import register, unknown_types
from wire.types import EventName, FieldNumber, Float32, HistoryBytes, Int64Array, Int64Hex, Typed, TypeLiteral
from wire.wiretype import WireType

__all__ = [
    "ClassFields",
    "EventName",
    "Field",
    "FieldNumber",
    "Float32",
    "HistoryBytes",
    "Int64Array",
    "Int64Hex",
    "MessageHistory",
    "TypeLiteral",
    "Typed",
    "WireError",
    "WireType",
    "binary",
    "fields_of",
    "read_history",
    "register",
    "text",
    "unknown_types",
]
