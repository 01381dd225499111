"""Private C accelerator of wire (wire/_speedups.c), loaded only through `wire._accel`.

wire's own modules use it; other packages reach what they need through public wire names (the
method-reader dispatch through `wire.methods`). Every function has a Python reference that gives the
same result; these return None (or call their fallback) for anything the C path does not take.
"""

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

class Plan:
    """How the C path reads and writes one class's fields (built by `wire._plans` / `wire.wiretype`)."""

    fallback: Callable[[Any], Any] | None
    read_fallback: Callable[[Any], Any] | None
    @property
    def decodable(self) -> int: ...
    def __init__(self, entries: tuple[Any, ...], cls: Any, names: tuple[str, ...], positional: bool,
                 mode: int = ..., text: bool = ..., /) -> None: ...
    def read(self, reader: Any, /) -> Any: ...
    def decode(self, data: Any, /) -> Any: ...
    def encode(self, buf: bytearray, obj: Any, /) -> None: ...
    def encode_document(self, prefix: bytes, obj: Any, /) -> bytes: ...
    def encode_block(self, buf: bytearray, obj: Any, /) -> None: ...
    def decode_fields(self, buf: Any, start: int, end: int, missing: Any, /) -> list[Any] | None: ...
    def decode_object(self, buf: Any, start: int, end: int, /) -> tuple[Any, int] | None: ...

class Encode:
    """A vectorcall front of `wire.binary.encode` that goes straight to a class's plan."""

    __wrapped__: Callable[..., Any]
    def __init__(self, function: Callable[..., Any], *tables: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class Decode:
    """A vectorcall front of `wire.binary.decode` that goes straight to a class's plan."""

    __wrapped__: Callable[..., Any]
    def __init__(self, function: Callable[..., Any], *tables: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class ReadOne:
    """A method reader's read_one() in one C call (see `wire.methods.ReadOne`)."""

    def __init__(
        self,
        read: Callable[[], Any],
        table: dict[bytes, tuple[Any, ...]],
        current: ContextVar[Any],
        slow: Callable[[Any], bool],
        pending: Callable[[bytes | None, tuple[int, int] | None, int], Any],
        clock: Callable[[], int],
        source_id: int,
        source: tuple[Any, Any] | None = None,
        /,
    ) -> None: ...
    def __call__(self) -> bool: ...
    def many(self, limit: int, /) -> int: ...

class HistoryCall:
    """A generated writer's method in one C call (see `wire.methods.history_call`)."""

    __wrapped__: Callable[..., None]
    def __init__(
        self, current: Any, event: bytes, kinds: bytes,
        encoders: tuple[Callable[[bytearray, Any], Any], ...], prefix: Callable[[int], bytearray],
        on_error: Callable[[Exception, tuple[Any, ...]], Exception], slow: Callable[..., None], /,
    ) -> None: ...
    def __call__(self, writer: Any, /, *values: Any) -> None: ...

class PendingHop:
    """The history of the message being dispatched, as read (see `wire.methods.PendingHop`)."""

    base: Any
    source: tuple[int, int] | None
    read_ns: int
    _built: Any
    def __init__(self, base: Any, source: tuple[int, int] | None, read_ns: int, /) -> None: ...

def history_hop(
    payload: bytes, source: tuple[int, int] | None, timings: tuple[int, ...], /
) -> bytearray | None: ...
def last_source(body: Any, /) -> tuple[int, int] | bool | None: ...
def event_value(
    document: Any, table: dict[bytes, tuple[Any, ...]], /
) -> tuple[Any, tuple[Any, ...], int, bytes | None] | None: ...
def event_call(document: Any, table: dict[bytes, tuple[Any, ...]], /) -> Any: ...
def generic(buf: Any, start: int, end: int, document: bool, depth: int, event_name: type, field_number: type,
            int64_hex: type, /) -> tuple[Any, int] | None: ...

class RecordLayout:
    """`wire.record.Layout`'s pack and unpack in one C call each; anything unusual goes to the slow
    paths given (the Python builder and reader)."""

    def __init__(
        self,
        kinds: bytes,
        decimal: type,
        pack_slow: Callable[[tuple[Any, ...]], bytes],
        unpack_slow: Callable[[Any], tuple[Any, ...]],
        /,
    ) -> None: ...
    def pack(self, *values: Any) -> bytes: ...
    def unpack(self, buf: Any, /) -> tuple[Any, ...]: ...
