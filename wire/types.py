"""The generic value model: what a wire value decodes to when no Python type is asked for.

Plain Python values (None, bool, int, float, str, bytes, list, dict, uuid.UUID, datetime family) cover
almost everything. The few classes below exist only where the wire carries information a plain value
would lose, so that decode followed by encode gives back Java's bytes.
"""

from __future__ import annotations

from typing import Any, NewType

#: Annotate a field `Float32` when its Java twin is a `float`: it is then written with Java's float32
#: rules (e.g. 3.14159 as FLOAT32, not as a 6-digit decimal). Values stay Python floats.
Float32 = NewType("Float32", float)


class Int64Hex(int):
    """An int64 written with INT64_0x (0xAF): Java shows it in hex (MessageHistory source indexes)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Int64Hex({int(self):#x})"


class FieldNumber(int):
    """A numeric field/event key (FIELD_NUMBER, 0xBA), e.g. an `@MethodId`; -1 is `history`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"FieldNumber({int(self)})"


class EventName(str):
    """A key written as EVENT_NAME (0xB9): method-writer events and Map keys, not plain field names."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"EventName({str(self)!r})"


class Typed:
    """A `!type` value whose type is not registered: kept as its name plus the generic value.

    Decoding never instantiates a class that was not registered with `wire.register`, so foreign
    type names (Java classes, aliases such as `SCQStore`) survive a round trip unchanged.
    """

    __slots__ = ("type_name", "value")

    def __init__(self, type_name: str, value: Any) -> None:
        self.type_name = type_name
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Typed) and other.type_name == self.type_name and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.type_name)

    def __repr__(self) -> str:
        return f"Typed({self.type_name!r}, {self.value!r})"


class TypeLiteral:
    """A class value (TYPE_LITERAL, 0xBC), e.g. Java `String.class`; only its name is kept."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeLiteral) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"TypeLiteral({self.name!r})"


class Int64Array:
    """An I64_ARRAY (0x8D): index arrays and `writePosition`. `offset` is where the capacity field was
    read (an index into the decoded buffer; None for arrays built in Python); the queue core maps the
    values in place from there: values start at `offset + 16`."""

    __slots__ = ("offset", "used", "values")

    def __init__(self, values: list[int], used: int, offset: int | None = None) -> None:
        self.values = values
        self.used = used
        self.offset = offset

    @property
    def capacity(self) -> int:
        return len(self.values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Int64Array) and other.values == self.values and other.used == self.used

    def __hash__(self) -> int:
        return hash((tuple(self.values), self.used))

    def __repr__(self) -> str:
        return f"Int64Array({self.values!r}, used={self.used})"


class HistoryBytes:
    """The body of a binary MessageHistory (HISTORY_MESSAGE, 0x86), kept raw; `wire.history` parses it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HistoryBytes) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"HistoryBytes({self.data.hex()})"


__all__ = [
    "EventName",
    "FieldNumber",
    "Float32",
    "HistoryBytes",
    "Int64Array",
    "Int64Hex",
    "TypeLiteral",
    "Typed",
]
