"""Chronicle Wire BINARY (`WireType.BINARY` / `BINARY_LIGHT`), byte-compatible with Java.

Two layers:

* `Writer` / `Reader`: low-level, allocation-light, one method per wire construct. The queue core uses
  them for its own headers (alignment and binding fields included); everything else is built on them.
* `encode` / `decode` / `encode_document` / `decode_document`: generic values (see `wire.types`) and,
  through `wire.marshal`, typed ones.

Numbers follow Java's default "compact" writer exactly (the smallest code that holds the value, so the
bytes match Java's); readers are liberal and take every numeric code.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import math
import re
import struct
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, overload

from wire import _accel, _javatime, registry
from wire.errors import WireError
from wire.types import EventName, FieldNumber, HistoryBytes, Int64Array, Int64Hex, Typed, TypeLiteral

# The wire codes (NULL, TRUE, TYPE_PREFIX...) stay importable by name but are not part of `*`.
__all__ = [
    "Decoder",
    "Encoder",
    "Reader",
    "TypedCodec",
    "Writer",
    "decode",
    "decode_document",
    "decoder_for",
    "encode",
    "encode_document",
    "encoder_for",
    "install_typed",
    "put_bytes",
    "put_field",
    "put_float",
    "put_float32",
    "put_int",
    "put_text",
    "typed",
    "utf8",
    "write_stop_bit",
    "write_value",
]

# ---------------------------------------------------------------- codes (BinaryWireCode)
BYTES_LENGTH8 = 0x80
BYTES_LENGTH16 = 0x81
BYTES_LENGTH32 = 0x82
HISTORY_MESSAGE = 0x86
U8_ARRAY = 0x8A
I64_ARRAY = 0x8D
PADDING32 = 0x8E
PADDING = 0x8F
FLOAT32 = 0x90
FLOAT64 = 0x91
FLOAT_STOP_2 = 0x92
FLOAT_STOP_4 = 0x94
FLOAT_STOP_6 = 0x96
UUID = 0xA0
UINT8 = 0xA1
UINT16 = 0xA2
UINT32 = 0xA3
INT8 = 0xA4
INT16 = 0xA5
INT32 = 0xA6
INT64 = 0xA7
SET_LOW_INT8 = 0xA8
SET_LOW_INT16 = 0xA9
INT64_0x = 0xAF
FALSE = 0xB0
TRUE = 0xB1
TIME = 0xB2
DATE = 0xB3
DATE_TIME = 0xB4
ZONED_DATE_TIME = 0xB5
TYPE_PREFIX = 0xB6
FIELD_NAME_ANY = 0xB7
STRING_ANY = 0xB8
EVENT_NAME = 0xB9
FIELD_NUMBER = 0xBA
NULL = 0xBB
TYPE_LITERAL = 0xBC
EVENT_OBJECT = 0xBD
COMMENT = 0xBE
FIELD_NAME0 = 0xC0
STRING_0 = 0xE0

#: Deepest nesting decoded; deeper input is rejected instead of exhausting the Python stack.
MAX_DEPTH = 100

_I8 = struct.Struct("<b")
_U16 = struct.Struct("<H")
_I16 = struct.Struct("<h")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_I64X2 = struct.Struct("<qq")
_UUID = struct.Struct("<QQ")

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_NON_BMP = re.compile("[\U00010000-\U0010ffff]")


# ---------------------------------------------------------------- primitive helpers
def write_stop_bit(out: bytearray, n: int) -> None:
    """Java's `writeStopBit`: 7-bit groups, low first; a negative n is ~n plus a trailing 0x00."""
    if 0 <= n < 0x80:
        out.append(n)
        return
    negative = n < 0
    if negative:
        n = ~n
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    if negative:
        out.append(n | 0x80)
        out.append(0)
    else:
        out.append(n)


def _split_surrogates(m: re.Match[str]) -> str:
    c = ord(m.group()) - 0x10000
    return chr(0xD800 | (c >> 10)) + chr(0xDC00 | (c & 0x3FF))


def utf8(text: str) -> bytes:
    """Java's `writeUtf8`: per UTF-16 char, so characters beyond the BMP become CESU-8 surrogate pairs."""
    if text.isascii():
        return text.encode()
    return _NON_BMP.sub(_split_surrogates, text).encode("utf-8", "surrogatepass")


def _from_utf8(data: bytes | bytearray | memoryview, offset: int) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError:
        pass
    try:
        text = str(data, "utf-8", "surrogatepass")
        # Join CESU-8 surrogate pairs into real characters; lone surrogates stay as they are.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    except UnicodeDecodeError as e:
        raise WireError(f"invalid UTF-8 text: {e.reason}", offset + e.start) from None


def _latin1(name: str) -> bytes:
    try:
        return name.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"field and event names are 8-bit text; {name!r} is not") from None


def _is_float32(d: float) -> bool:
    try:
        return bool(_F32.unpack(_F32.pack(d))[0] == d)
    except OverflowError:
        return False


def _to_float32(d: float) -> float:
    """`(float) d` as Java rounds it: values beyond the float32 range become infinities."""
    try:
        return float(_F32.unpack(_F32.pack(d))[0])
    except OverflowError:
        return math.copysign(math.inf, d)


def _stop_float(out: bytearray, d: float, l6: int, as_float32: bool) -> bool:
    """FLOAT_STOP_2/4/6: the first scale whose stop-bit integer divides back to exactly `d`."""
    for code, div, scale in ((FLOAT_STOP_2, 10000, 1e2), (FLOAT_STOP_4, 100, 1e4), (FLOAT_STOP_6, 1, 1e6)):
        if l6 % div:
            continue
        v = l6 // div
        back = v / scale
        if (_to_float32(back) if as_float32 else back) == d:
            out.append(code)
            write_stop_bit(out, v)
            return True
    return False


# ---------------------------------------------------------------- encoding onto a bytearray
def put_field(b: bytearray, name: str) -> None:
    """A field name: FIELD_NAME0..31, FIELD_NAME_ANY for longer names, and FIELD_NUMBER for a
    decimal name such as "123" (Java's `write(CharSequence)` does the same, so "007" becomes 7)."""
    if name[:1].isdigit() and len(name) < 32 and name.isdigit():
        # Java: a short name starting with a digit that parses as an int is written as its number
        try:
            number = int(name)
        except ValueError:  # digits int() does not take, such as superscripts
            number = None
        if number is not None and number < 1 << 31:
            b.append(FIELD_NUMBER)
            write_stop_bit(b, number)
            return
    data = _latin1(name)
    n = len(data)
    if n < 32:
        b.append(FIELD_NAME0 + n)
    else:
        b.append(FIELD_NAME_ANY)
        write_stop_bit(b, n)
    b += data


def put_text(b: bytearray, value: str | None) -> None:
    """Text: STRING_0..31 for up to 31 UTF-8 bytes, STRING_ANY above, NULL for None."""
    if value is None:
        b.append(NULL)
        return
    data = utf8(value)
    n = len(data)
    if n < 32:
        b.append(STRING_0 + n)
    else:
        b.append(STRING_ANY)
        write_stop_bit(b, n)
    b += data


def put_int(b: bytearray, v: int) -> None:
    """Java's compact `writeNumber(long)`: the smallest code for the value, float32 for large
    longs that a float32 holds exactly."""
    if v >= 0:
        if v <= 0xFF:
            b.append(UINT8)
            b.append(v)
        elif v <= 0x7FFF:
            b.append(INT16)
            b += _I16.pack(v)
        elif v <= 0xFFFF:
            b.append(UINT16)
            b += _U16.pack(v)
        elif v <= 0x7FFFFFFF:
            b.append(INT32)
            b += _I32.pack(v)
        elif v <= 0xFFFFFFFF:
            b.append(UINT32)
            b += _U32.pack(v)
        else:
            _put_int_large(b, v)
    elif v >= -0x80:
        b.append(INT8)
        b += _I8.pack(v)
    elif v >= -0x8000:
        b.append(INT16)
        b += _I16.pack(v)
    elif v >= -0x80000000:
        b.append(INT32)
        b += _I32.pack(v)
    else:
        _put_int_large(b, v)


def _put_int_large(b: bytearray, v: int) -> None:
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise ValueError(f"integer {v} does not fit in a signed 64-bit long")
    f = float(v)
    # Java compares (float) v == v in long arithmetic; Long.MAX_VALUE rounds to 2^63, which it
    # also accepts because the float converts back to Long.MAX_VALUE (saturating cast).
    if f == v or (v == _INT64_MAX and f == 2.0**63):
        try:
            packed = _F32.pack(f)
        except OverflowError:
            packed = b""
        if packed and float(_F32.unpack(packed)[0]) == f:
            b.append(FLOAT32)
            b += packed
            return
    b.append(INT64)
    b += _I64.pack(v)


def put_float(b: bytearray, d: float) -> None:
    """Java's compact `writeNumber(double)`: the first code that holds the value exactly, tried in Java's
    order (8/16-bit integers, float32, 32-bit integers, float64) so the bytes match Java's."""
    if d.is_integer():
        if d >= 0:
            if d <= 255:
                b.append(UINT8)
                b.append(int(d))
                return
            if d <= 65535:
                b.append(UINT16)
                b += _U16.pack(int(d))
                return
            if _is_float32(d):
                b.append(FLOAT32)
                b += _F32.pack(d)
                return
            if d <= 0xFFFFFFFF:
                b.append(UINT32)
                b += _U32.pack(int(d))
                return
        else:
            if d >= -128:
                b.append(INT8)
                b += _I8.pack(int(d))
                return
            if d >= -32768:
                b.append(INT16)
                b += _I16.pack(int(d))
                return
            if _is_float32(d):
                b.append(FLOAT32)
                b += _F32.pack(d)
                return
            if d >= -0x80000000:
                b.append(INT32)
                b += _I32.pack(int(d))
                return
        b.append(FLOAT64)
        b += _F64.pack(d)
        return
    if math.isfinite(d):
        l6 = math.floor(d * 1e6 + 0.5)
        if l6 / 1e6 == d and -(1 << 35) < l6 < (1 << 42) and _stop_float(b, d, l6, False):
            return
    if _is_float32(d) or d != d:
        b.append(FLOAT32)
        b += _F32.pack(d)
    else:
        b.append(FLOAT64)
        b += _F64.pack(d)


def put_float32(b: bytearray, f: float) -> None:
    """Java's compact `writeNumber(float)`: `f` is rounded to float32 first."""
    f = _to_float32(f) if math.isfinite(f) else f
    if f.is_integer():
        if f >= 0:
            if f <= 255:
                b.append(UINT8)
                b.append(int(f))
                return
            if f <= 65535:
                b.append(UINT16)
                b += _U16.pack(int(f))
                return
        else:
            if f >= -128:
                b.append(INT8)
                b += _I8.pack(int(f))
                return
            if f >= -32768:
                b.append(INT16)
                b += _I16.pack(int(f))
                return
    elif math.isfinite(f):
        l6 = math.floor(f * 1e6 + 0.5)
        if _to_float32(l6 / 1e6) == f and -(1 << 14) < l6 < (1 << 21) and _stop_float(b, f, l6, True):
            return
    b.append(FLOAT32)
    b += _F32.pack(f)


def put_bytes(b: bytearray, data: bytes | bytearray | memoryview) -> None:
    """`byte[]`: a length-prefixed block holding U8_ARRAY and the bytes."""
    n = len(data) + 1
    if n <= 0xFF:
        b.append(BYTES_LENGTH8)
        b.append(n)
    elif n <= 0xFFFF:
        b.append(BYTES_LENGTH16)
        b += _U16.pack(n)
    else:
        b.append(BYTES_LENGTH32)
        b += _U32.pack(n)
    b.append(U8_ARRAY)
    b += data


# ---------------------------------------------------------------- Writer
class Writer:
    """Appends BINARY wire to a bytearray.

    `base` is the absolute file offset of byte 0 of `buffer`: alignment padding (Java's `writeAlignTo`)
    depends on the absolute position, so a writer building a document that will land at file offset P
    must be created with `base = P`. `position` is absolute; `len(writer)` is the number of bytes.

    `int64`/`int32`/`float64`/`float32` follow the writer's mode like Java's `ValueOut`: compact by
    default (what queues write), fixed-width with `fixed=True` (Java's `BinaryWire` with `fixed`).
    `int_compact`/`float_compact` and the `*_fixed` methods ignore the mode.
    """

    __slots__ = ("base", "buffer", "fixed")

    def __init__(self, base: int = 0, *, fixed: bool = False) -> None:
        self.buffer = bytearray()
        self.base = base
        self.fixed = fixed

    @classmethod
    def over(cls, buffer: bytearray, base: int = 0, *, fixed: bool = False) -> Writer:
        """A writer appending to an existing bytearray (used by compiled encoders)."""
        w = cls.__new__(cls)
        w.buffer = buffer
        w.base = base
        w.fixed = fixed
        return w

    def __len__(self) -> int:
        return len(self.buffer)

    @property
    def position(self) -> int:
        return self.base + len(self.buffer)

    def getvalue(self) -> bytes:
        return bytes(self.buffer)

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes as they are (already-encoded wire, or a non-self-describing payload)."""
        self.buffer += data

    # ----- keys
    def field(self, name: str) -> None:
        """A field name: FIELD_NAME0..31, FIELD_NAME_ANY for longer names, and FIELD_NUMBER for a
        decimal name such as "123" (Java's `write(CharSequence)` does the same)."""
        put_field(self.buffer, name)

    def field_number(self, n: int) -> None:
        """FIELD_NUMBER: a numeric key, e.g. `@MethodId`; -1 is MessageHistory."""
        self.buffer.append(FIELD_NUMBER)
        write_stop_bit(self.buffer, n)

    def event_name(self, name: str) -> None:
        """EVENT_NAME: method-writer events and Map keys."""
        data = _latin1(name)
        self.buffer.append(EVENT_NAME)
        write_stop_bit(self.buffer, len(data))
        self.buffer += data

    def event_object(self) -> None:
        """EVENT_OBJECT: the next value written is the key, the one after it the value."""
        self.buffer.append(EVENT_OBJECT)

    # ----- scalars
    def null(self) -> None:
        self.buffer.append(NULL)

    def bool(self, value: bool | None) -> None:
        self.buffer.append(NULL if value is None else TRUE if value else FALSE)

    def text(self, value: str | None) -> None:
        """Text: STRING_0..31 for up to 31 UTF-8 bytes, STRING_ANY above, NULL for None."""
        put_text(self.buffer, value)

    def _utf8_with_length(self, code: int, value: str) -> None:
        data = utf8(value)
        self.buffer.append(code)
        write_stop_bit(self.buffer, len(data))
        self.buffer += data

    def type_prefix(self, name: str) -> None:
        """`!name` before a value: an alias or Java class name (`gen.Msg$Message1`)."""
        self._utf8_with_length(TYPE_PREFIX, name)

    def type_literal(self, name: str) -> None:
        """A class as a value (Java `String.class`)."""
        self._utf8_with_length(TYPE_LITERAL, name)

    def comment(self, text: str) -> None:
        self._utf8_with_length(COMMENT, text)

    def int_compact(self, v: int) -> None:
        """Java's compact `writeNumber(long)`: the smallest code for the value, float32 for large
        longs that a float32 holds exactly."""
        put_int(self.buffer, v)

    def int64(self, v: int) -> None:
        """A Java `long`: compact, or INT64 in fixed mode."""
        if self.fixed:
            self.int_fixed64(v)
        else:
            put_int(self.buffer, v)

    def int32(self, v: int) -> None:
        """A Java `int`: compact, or INT32 in fixed mode."""
        if self.fixed:
            self.int_fixed32(v)
        else:
            put_int(self.buffer, v)

    def float64(self, d: float) -> None:
        """A Java `double`: compact, or FLOAT64 in fixed mode."""
        if self.fixed:
            self.float64_fixed(d)
        else:
            put_float(self.buffer, d)

    def float32(self, f: float) -> None:
        """A Java `float`: compact, or FLOAT32 in fixed mode."""
        if self.fixed:
            self.float32_fixed(f)
        else:
            put_float32(self.buffer, f)

    def int_fixed32(self, v: int) -> None:
        """INT32 always (Java's `object(Integer)` and fixed writer)."""
        self.buffer.append(INT32)
        self.buffer += _I32.pack(v)

    def int_fixed64(self, v: int) -> None:
        """INT64 always (Java's `object(Long)` and fixed writer)."""
        self.buffer.append(INT64)
        self.buffer += _I64.pack(v)

    def int64_0x(self, v: int) -> None:
        """INT64_0x: an int64 Java renders in hex."""
        self.buffer.append(INT64_0x)
        self.buffer += _I64.pack(v) if v <= _INT64_MAX else struct.pack("<Q", v)

    def float_compact(self, d: float) -> None:
        """Java's compact `writeNumber(double)`: the first code that holds the value exactly, tried in Java's
    order (8/16-bit integers, float32, 32-bit integers, float64) so the bytes match Java's."""
        put_float(self.buffer, d)

    def float32_compact(self, f: float) -> None:
        """Java's compact `writeNumber(float)`: `f` is rounded to float32 first."""
        put_float32(self.buffer, f)

    def float64_fixed(self, d: float) -> None:
        self.buffer.append(FLOAT64)
        self.buffer += _F64.pack(d)

    def float32_fixed(self, f: float) -> None:
        self.buffer.append(FLOAT32)
        self.buffer += _F32.pack(f)

    def uuid(self, value: uuid.UUID) -> None:
        """UUID: most then least significant 64 bits, each little-endian."""
        n = value.int
        self.buffer.append(UUID)
        self.buffer += _UUID.pack(n >> 64, n & 0xFFFFFFFFFFFFFFFF)

    def date(self, value: _dt.date) -> None:
        self._utf8_with_length(DATE, _javatime.format_date(value))

    def time(self, value: _dt.time) -> None:
        self._utf8_with_length(TIME, _javatime.format_time(value))

    def date_time(self, value: _dt.datetime) -> None:
        """DATE_TIME for a naive datetime, ZONED_DATE_TIME for an aware one."""
        code = DATE_TIME if value.tzinfo is None else ZONED_DATE_TIME
        self._utf8_with_length(code, _javatime.format_datetime(value))

    def bytes_value(self, data: bytes | bytearray | memoryview) -> None:
        """`byte[]`: a length-prefixed block holding U8_ARRAY and the bytes."""
        put_bytes(self.buffer, data)

    # ----- padding and binding fields
    def padding(self, n: int) -> None:
        """`addPadding(n)`: 0x8F bytes for n <= 4, else PADDING32 with n-5 skipped zero bytes."""
        if n <= 0:
            return
        if n <= 4:
            self.buffer += b"\x8f" * n
        else:
            self.buffer.append(PADDING32)
            self.buffer += _U32.pack(n - 5)
            self.buffer += bytes(n - 5)

    def align_to(self, alignment: int, offset: int = 0) -> None:
        """Java's `writeAlignTo`: pad until `position + offset` is a multiple of `alignment`."""
        mod = (self.position + offset) & (alignment - 1)
        if mod:
            self.padding(alignment - mod)

    def int64_binding(self, value: int) -> int:
        """`int64forBinding`: an INT64 whose payload is 8-aligned; returns the payload's position."""
        self.align_to(8, 1)
        self.buffer.append(INT64)
        at = self.position
        self.buffer += _I64.pack(value)
        return at

    def int32_binding(self, value: int) -> int:
        """`int32forBinding`: an INT32 whose payload is 4-aligned; returns the payload's position."""
        self.align_to(4, 1)
        self.buffer.append(INT32)
        at = self.position
        self.buffer += _I32.pack(value)
        return at

    def int64_array(
        self, capacity: int, used: int = 0, values: list[int] | tuple[int, ...] = (), alignment: int = 8
    ) -> int:
        """I64_ARRAY of `capacity` slots (missing values are 0), data `alignment`-aligned
        (8 for index arrays, 16 for `int128forBinding`, i.e. `writePosition`). Returns the position of
        the capacity field; `used` follows at +8 and the values at +16."""
        if len(values) > capacity:
            raise ValueError(f"{len(values)} values do not fit an int64 array of capacity {capacity}")
        self.align_to(alignment, 1)
        self.buffer.append(I64_ARRAY)
        at = self.position
        self.buffer += _I64X2.pack(capacity, used)
        if values:
            self.buffer += struct.pack(f"<{len(values)}q", *values)
        self.buffer += bytes(8 * (capacity - len(values)))
        return at

    def int128_binding(self, first: int, second: int) -> int:
        """`int128forBinding`: a 2-slot I64_ARRAY, 16-aligned (the store's `writePosition`)."""
        return self.int64_array(2, 2, (first, second), alignment=16)

    # ----- nesting
    def begin(self, width: int = 4) -> int:
        """Open a length-prefixed block (marshallable or sequence); `width` 1/2/4 selects 0x80/0x81/0x82.
        Returns the token for `end`."""
        if width == 4:
            self.buffer += b"\x82\x00\x00\x00\x00"
        elif width == 2:
            self.buffer += b"\x81\x00\x00"
        elif width == 1:
            self.buffer += b"\x80\x00"
        else:
            raise ValueError(f"length width must be 1, 2 or 4, not {width}")
        return (len(self.buffer) << 3) | width

    begin_marshallable = begin
    begin_sequence = begin

    def end(self, token: int) -> None:
        """Close the block opened by `begin`, writing its length."""
        b = self.buffer
        start, width = token >> 3, token & 7
        n = len(b) - start
        if width == 4:
            _U32.pack_into(b, start - 4, n)
        elif n >= 1 << (8 * width):
            raise ValueError(f"block of {n} bytes does not fit a {8 * width}-bit length")
        elif width == 2:
            _U16.pack_into(b, start - 2, n)
        else:
            b[start - 1] = n

    # ----- generic values
    def value(self, v: Any) -> None:
        """Any generic value (see `wire.types`) or registered/structured object, as Java writes it."""
        write_value(self, v, 0)


def write_value(w: Writer, v: Any, depth: int) -> None:
    """Write `v` (nested `depth` deep) with `w` in wire's generic encoding; `wire.marshal` uses it."""
    if depth > MAX_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_DEPTH} levels")
    t = type(v)
    if t is str:
        w.text(v)
    elif t is int:
        w.int64(v)
    elif t is float:
        w.float64(v)
    elif v is None:
        w.null()
    elif t is bool:
        w.bool(v)
    elif t is dict:
        token = w.begin()
        _write_fields(w, v, depth + 1)
        w.end(token)
    elif t is list or t is tuple:
        token = w.begin()
        for item in v:
            write_value(w, item, depth + 1)
        w.end(token)
    elif t is Int64Hex:
        w.int64_0x(v)
    elif t is bytes or t is bytearray or t is memoryview:
        w.bytes_value(v)
    elif t is Typed:
        w.type_prefix(v.type_name)
        write_value(w, v.value, depth + 1)
    elif t is TypeLiteral:
        w.type_literal(v.name)
    elif t is uuid.UUID:
        w.uuid(v)
    elif t is _dt.datetime:
        w.date_time(v)
    elif t is _dt.date:
        w.date(v)
    elif t is _dt.time:
        w.time(v)
    elif t is Int64Array:
        w.int64_array(v.capacity, v.used, v.values)
    elif t is HistoryBytes:
        token = w.begin(2)
        w.buffer.append(HISTORY_MESSAGE)
        w.buffer += v.data
        w.end(token)
    elif t is EventName:
        w.text(v)
    elif t is FieldNumber:
        w.int_compact(v)
    else:
        typed().write_object(w, v)


def _write_fields(w: Writer, fields: dict[Any, Any], depth: int) -> None:
    for key, item in fields.items():
        kt = type(key)
        if kt is str:
            w.field(key)
        elif kt is EventName:
            w.event_name(key)
        elif kt is FieldNumber:
            w.field_number(key)
        else:
            w.event_object()
            write_value(w, key, depth)
        write_value(w, item, depth)


# ---------------------------------------------------------------- Reader
_FIELD_CODES = frozenset([*range(0xC0, 0xE0), FIELD_NAME_ANY, EVENT_NAME, FIELD_NUMBER, EVENT_OBJECT])
_SKIPPED = frozenset([PADDING, PADDING32, COMMENT])
_KEY_TYPES = (EventName, FieldNumber, Int64Hex)  # the classes the C generic decoder builds


class Reader:
    """Reads BINARY wire from `buf[start:end]` without copying (bytes, bytearray, memoryview or mmap).

    `position` is an index into `buf`, so when `buf` is a whole mapped file every offset the reader
    reports (errors, `binding_offset`, `Int64Array.offset`) is a file offset. An `mmap` is read through
    a memoryview, which (like any exported buffer) keeps the map from being closed while the reader lives.
    """

    __slots__ = ("buf", "depth", "end", "pos")
    buf: bytes | bytearray | memoryview

    def __init__(self, buf: Any, start: int = 0, end: int | None = None, *, _depth: int = 0) -> None:
        if type(buf) is not bytes and type(buf) is not bytearray:
            view = buf if type(buf) is memoryview else memoryview(buf)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            buf = view
        size = len(buf)
        if end is None:
            end = size
        if not 0 <= start <= end <= size:
            raise WireError(f"reader bounds {start}..{end} outside a buffer of {size} bytes", start)
        self.buf = buf
        self.pos = start
        self.end = end
        self.depth = _depth

    @property
    def position(self) -> int:
        return self.pos

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def __repr__(self) -> str:
        return f"<wire.binary.Reader at {self.pos} of {self.end}>"

    # ----- primitives
    def _need(self, n: int) -> int:
        p = self.pos
        if n > self.end - p:
            raise WireError(f"need {n} more bytes but only {self.end - p} remain", p)
        self.pos = p + n
        return p

    def _u8(self) -> int:
        p = self.pos
        if p >= self.end:
            raise WireError("unexpected end of data", p)
        self.pos = p + 1
        return self.buf[p]

    def read_stop_bit(self) -> int:
        """Java's `readStopBit` (signed 64-bit; a trailing 0x00 group means bitwise NOT)."""
        start = self.pos
        b = self._u8()
        if b < 0x80:
            return b
        value = b & 0x7F
        shift = 7
        while True:
            b = self._u8()
            if b < 0x80:
                break
            value |= (b & 0x7F) << shift
            shift += 7
            if shift > 63:
                raise WireError("stop-bit number longer than 10 bytes", start)
        if b == 0:
            value = ~value
        else:
            value |= b << shift
        value &= 0xFFFFFFFFFFFFFFFF
        return value - (1 << 64) if value >= 1 << 63 else value

    def chunk(self, n: int) -> Any:
        if n < 0:
            raise WireError(f"negative length {n}", self.pos)
        p = self._need(n)
        return self.buf[p : p + n]

    def utf8(self, n: int) -> str:
        at = self.pos
        return _from_utf8(self.chunk(n), at)

    def _8bit(self, n: int) -> str:
        return str(self.chunk(n), "latin-1")

    # ----- navigation
    def skip_padding(self) -> None:
        """Skip PADDING, PADDING32 and COMMENT, which may appear between any two items."""
        buf, end = self.buf, self.end
        while self.pos < end:
            c = buf[self.pos]
            if c == PADDING:
                self.pos += 1
            elif c == PADDING32:
                self.pos += 1
                n = _U32.unpack_from(buf, self._need(4))[0]
                self._need(n)
            elif c == COMMENT:
                self.pos += 1
                self.chunk(self.read_stop_bit())
            else:
                return

    def has_more(self) -> bool:
        """True if an item follows (after skipping padding and comments)."""
        p = self.pos
        if p < self.end and self.buf[p] not in _SKIPPED:
            return True
        self.skip_padding()
        return self.pos < self.end

    def peek_code(self) -> int:
        """The code of the next item, after padding and comments; raises at the end."""
        p = self.pos
        if p < self.end:
            code = self.buf[p]
            if code not in _SKIPPED:
                return code
        self.skip_padding()
        if self.pos >= self.end:
            raise WireError("unexpected end of data", self.pos)
        return self.buf[self.pos]

    def read_field(self) -> Any:
        """The next key: a `str` field name, an `EventName`, a `FieldNumber`, or (EVENT_OBJECT) any value."""
        code = self.peek_code()
        p = self.pos + 1
        if FIELD_NAME0 <= code < STRING_0:  # the common case, inline
            end = p + code - FIELD_NAME0
            if end > self.end:
                raise WireError(f"field name overruns the data by {end - self.end} bytes", p)
            self.pos = end
            return str(self.buf[p:end], "latin-1")
        self.pos = p
        if code == EVENT_NAME:
            return EventName(self._8bit(self.read_stop_bit()))
        if code == FIELD_NUMBER:
            return FieldNumber(self.read_stop_bit())
        if code == FIELD_NAME_ANY:
            return self._8bit(self.read_stop_bit())
        if code == EVENT_OBJECT:
            key = self._nested(Reader.read_value)
            try:
                hash(key)
            except TypeError:
                raise WireError(
                    f"EVENT_OBJECT key of type {type(key).__name__} is not usable", self.pos
                ) from None
            return key
        self.pos -= 1
        raise WireError(f"expected a field name, found code 0x{code:02x}", self.pos)

    def enter(self) -> Reader:
        """Step into the length-prefixed block (0x80/0x81/0x82) that follows; returns a reader bounded
        to its contents and moves this reader past it."""
        code = self.peek_code()
        start = self.pos
        if code == BYTES_LENGTH32:
            self.pos += 1
            n = _U32.unpack_from(self.buf, self._need(4))[0]
        elif code == BYTES_LENGTH16:
            self.pos += 1
            n = _U16.unpack_from(self.buf, self._need(2))[0]
        elif code == BYTES_LENGTH8:
            self.pos += 1
            n = self._u8()
        else:
            raise WireError(f"expected a length-prefixed block, found code 0x{code:02x}", start)
        if self.depth >= MAX_DEPTH:
            raise WireError(f"nesting deeper than {MAX_DEPTH} levels", start)
        if n > self.end - self.pos:
            raise WireError(f"block of {n} bytes overruns its container ({self.end - self.pos} left)", start)
        inner = Reader(self.buf, self.pos, self.pos + n, _depth=self.depth + 1)
        self.pos += n
        return inner

    def binding_offset(self) -> int:
        """Skip the next INT64 / INT32 / I64_ARRAY binding value and return where Java maps it: the int's
        payload, or the I64_ARRAY capacity field (used at +8, values at +16)."""
        code = self.peek_code()
        start = self.pos
        self.pos += 1
        if code == INT64:
            return self._need(8)
        if code == INT32:
            return self._need(4)
        if code == I64_ARRAY:
            capacity, _ = _I64X2.unpack_from(self.buf, self._need(16))
            if not 0 <= capacity <= (self.end - self.pos) // 8:
                raise WireError(f"int64 array capacity {capacity} overruns the data", start)
            self.pos += 8 * capacity
            return start + 1
        self.pos = start
        raise WireError(f"expected a binding int64/int32/int64 array, found code 0x{code:02x}", start)

    # ----- typed reads
    def read_int(self) -> int:
        """Any numeric code (floats truncate toward zero), TRUE/FALSE as 1/0, numeric text."""
        v = self.read_value()
        t = type(v)
        if t is int or t is Int64Hex or t is bool:
            return int(v)
        if t is float:
            if v != v:
                raise WireError("cannot read NaN as an integer", self.pos)
            # Java's (long) cast saturates: Long.MAX_VALUE is written as the float32 2^63.
            return _INT64_MAX if v >= 2.0**63 else _INT64_MIN if v <= -(2.0**63) else int(v)
        if t is str:
            try:
                return int(v)
            except ValueError:
                pass
        raise WireError(f"expected an integer, found {type(v).__name__}", self.pos)

    def read_float(self) -> float:
        v = self.read_value()
        t = type(v)
        if t is float:
            return v  # type: ignore[no-any-return]
        if t is int or t is Int64Hex or t is bool:
            return float(v)
        if t is str:
            try:
                return float(v)
            except ValueError:
                pass
        raise WireError(f"expected a number, found {type(v).__name__}", self.pos)

    def read_text(self) -> str | None:
        """Text; a number or boolean is rendered as decimal text; NULL is None."""
        v = self.read_value()
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, TypeLiteral):
            return v.name
        raise WireError(f"expected text, found {type(v).__name__}", self.pos)

    def read_bool(self) -> bool | None:
        v = self.read_value()
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, (int, float)):
            return v != 0
        if isinstance(v, str) and v.lower() in ("true", "false"):
            return v.lower() == "true"
        raise WireError(f"expected a boolean, found {type(v).__name__}", self.pos)

    # ----- generic values
    def read_value(self) -> Any:
        """The next value as a generic Python value (see `wire.types`)."""
        code = self.peek_code()
        p = self.pos
        self.pos = p + 1
        buf = self.buf
        if code >= STRING_0:  # short text, the common case, inline
            end = p + 1 + code - STRING_0
            if end > self.end:
                raise WireError(f"text overruns the data by {end - self.end} bytes", p + 1)
            self.pos = end
            return _from_utf8(buf[p + 1 : end], p + 1)
        if code < 0x80:
            return code
        hi = code >> 4
        if hi == 0xA:
            if code == UINT8:
                return self._u8()
            if code == INT16:
                return _I16.unpack_from(buf, self._need(2))[0]
            if code == INT32:
                return _I32.unpack_from(buf, self._need(4))[0]
            if code == INT64:
                return _I64.unpack_from(buf, self._need(8))[0]
            if code == INT8:
                return _I8.unpack_from(buf, self._need(1))[0]
            if code in (UINT16, SET_LOW_INT16):
                return _U16.unpack_from(buf, self._need(2))[0]
            if code == UINT32:
                return _U32.unpack_from(buf, self._need(4))[0]
            if code == SET_LOW_INT8:
                return self._u8()
            if code == INT64_0x:
                return Int64Hex(_I64.unpack_from(buf, self._need(8))[0])
            if code == UUID:
                hi64, lo64 = _UUID.unpack_from(buf, self._need(16))
                return uuid.UUID(int=(hi64 << 64) | lo64)
        elif hi == 0x9:
            if code == FLOAT64:
                return _F64.unpack_from(buf, self._need(8))[0]
            if code == FLOAT32:
                return _F32.unpack_from(buf, self._need(4))[0]
            if code == FLOAT_STOP_2:
                return self.read_stop_bit() / 1e2
            if code == FLOAT_STOP_4:
                return self.read_stop_bit() / 1e4
            if code == FLOAT_STOP_6:
                return self.read_stop_bit() / 1e6
        elif hi == 0xB:
            if code == TRUE:
                return True
            if code == FALSE:
                return False
            if code == NULL:
                return None
            if code == STRING_ANY:
                return self.utf8(self.read_stop_bit())
            if code == TYPE_PREFIX:
                name = self.utf8(self.read_stop_bit())
                return self._typed(name)
            if code == TYPE_LITERAL:
                return TypeLiteral(self.utf8(self.read_stop_bit()))
            if TIME <= code <= ZONED_DATE_TIME:
                text = self.utf8(self.read_stop_bit())
                try:
                    if code == TIME:
                        return _javatime.parse_time(text)
                    if code == DATE:
                        return _javatime.parse_date(text)
                    return _javatime.parse_datetime(text)
                except ValueError as e:
                    raise WireError(f"bad date/time text {text!r}: {e}", p) from None
            if code in (FIELD_NAME_ANY, EVENT_NAME, FIELD_NUMBER, EVENT_OBJECT):
                self.pos = p
                return self._fields_here()
        elif hi == 0x8:
            if code in (BYTES_LENGTH32, BYTES_LENGTH16, BYTES_LENGTH8):
                self.pos = p
                native = _accel.speedups
                if native is not None:  # C for the common codes; None means "Python decides"
                    found = native.generic(buf, p, self.end, False, self.depth, *_KEY_TYPES)
                    if found is not None:
                        self.pos = found[1]
                        return found[0]
                return self.enter()._block_value()
            if code == I64_ARRAY:
                capacity, used = _I64X2.unpack_from(buf, self._need(16))
                if not 0 <= capacity <= (self.end - self.pos) // 8:
                    raise WireError(f"int64 array capacity {capacity} overruns the data", p)
                at = self._need(8 * capacity)
                values = list(struct.unpack_from(f"<{capacity}q", buf, at))
                return Int64Array(values, used, p + 1)
            if code == U8_ARRAY:
                return bytes(self.chunk(self.end - self.pos))
            if code == HISTORY_MESSAGE:
                return HistoryBytes(bytes(self.chunk(self.end - self.pos)))
        else:  # 0xC / 0xD: a field name where a value was expected: an inline map of fields
            self.pos = p
            return self._fields_here()
        self.pos = p
        raise WireError(f"unknown or unsupported wire code 0x{code:02x}", p)

    def _nested(self, read: Callable[[Reader], Any]) -> Any:
        """Run `read` one nesting level deeper: type prefixes and EVENT_OBJECT keys nest without a
        length-prefixed block, so they are counted here to keep hostile input off the Python stack."""
        if self.depth >= MAX_DEPTH:
            raise WireError(f"nesting deeper than {MAX_DEPTH} levels", self.pos)
        self.depth += 1
        try:
            return read(self)
        finally:
            self.depth -= 1

    def _typed(self, name: str) -> Any:
        cls = registry.lookup(name)
        if cls is None:
            registry.note_unknown(name)
            return Typed(name, self._nested(Reader.read_value))
        return self._nested(typed().decoder_for(cls))

    def _block_value(self) -> Any:
        """A block's contents: fields -> dict, U8_ARRAY -> bytes, HISTORY -> HistoryBytes, else a list."""
        if not self.has_more():
            return []
        code = self.buf[self.pos]
        if code in _FIELD_CODES:
            return self._fields_here()
        if code in (U8_ARRAY, HISTORY_MESSAGE):
            return self.read_value()
        items = []
        while self.has_more():
            items.append(self.read_value())
        return items

    def _fields_here(self) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        has_more, read_field, read_value, buf = self.has_more, self.read_field, self.read_value, self.buf
        while has_more():
            key = read_field()
            # a field with no value (the next thing is another key, or the end) reads as None
            out[key] = None if not has_more() or buf[self.pos] in _FIELD_CODES else read_value()
        return out

    def read_document(self) -> dict[Any, Any]:
        """All remaining fields as an ordered dict (keys: see `read_field`).

        A document may also hold bare values (Java's `writeBytes` payloads are not wire at all); those
        raise WireError so callers can fall back to showing raw bytes.
        """
        native = _accel.speedups
        if native is not None:  # C for the common codes; None means "Python decides"
            found = native.generic(self.buf, self.pos, self.end, True, self.depth, *_KEY_TYPES)
            if found is not None:
                self.pos = found[1]
                return found[0]  # type: ignore[no-any-return]
        if self.has_more() and self.buf[self.pos] not in _FIELD_CODES:
            raise WireError(f"expected a field name, found code 0x{self.buf[self.pos]:02x}", self.pos)
        return self._fields_here()

    def skip_value(self) -> None:
        """Skip one value (cheaply for blocks: their length is known)."""
        code = self.peek_code()
        if code in (BYTES_LENGTH32, BYTES_LENGTH16, BYTES_LENGTH8):
            self.enter()
        elif code == TYPE_PREFIX:
            self.pos += 1
            self.chunk(self.read_stop_bit())
            self._nested(Reader.skip_value)
        else:
            self.read_value()


# ---------------------------------------------------------------- typed values
class TypedCodec(Protocol):
    """What this module needs from the typed codec (`wire.marshal`, which builds on this module and so
    installs itself here when it is imported, rather than this module importing it back)."""

    def write_object(self, w: Writer, v: Any) -> None: ...
    def write_fields(self, w: Writer, v: Any) -> None: ...
    def learn_whole_encoder(self, cls: type[Any]) -> None: ...
    def decode_bytes(self, data: Any, tp: Any) -> Any: ...
    def fields_decoder_for(self, tp: Any) -> Callable[[Reader], Any]: ...
    def encoder_for(self, tp: Any) -> Callable[[bytearray, Any], None]: ...
    def decoder_for(self, tp: Any) -> Callable[[Reader], Any]: ...


_typed: TypedCodec | None = None

#: class -> its C plan (None: none) for `encode(value)`, which the C `Encode` looks up first
whole_encoders: dict[type[Any], Any] = {}
#: type -> function(data) decoding a whole buffer as that type (`decode` looks here first)
whole_decoders: dict[Any, Callable[[Any], Any]] = {}


def install_typed(codec: TypedCodec) -> None:
    """Called once by `wire.marshal` at import."""
    global _typed
    _typed = codec


def typed() -> TypedCodec:
    if _typed is None:  # pragma: no cover - importing the `wire` package imports wire.marshal
        raise RuntimeError("typed values need wire.marshal, which `import wire` loads")
    return _typed


# ---------------------------------------------------------------- module-level API
def encode(value: Any) -> bytes:
    """One value in Java's compact BINARY encoding (a dict becomes a marshallable `82 len fields`)."""
    w = Writer()
    write_value(w, value, 0)
    cls = type(value)
    if cls not in whole_encoders:
        typed().learn_whole_encoder(cls)
    return bytes(w.buffer)


def encode_document(fields: dict[Any, Any] | Any) -> bytes:
    """A document body: a dict's items written as top-level fields (no length prefix), or a
    registered/structured object's fields."""
    w = Writer()
    if isinstance(fields, dict):
        _write_fields(w, fields, 0)
    else:
        typed().write_fields(w, fields)
    return bytes(w.buffer)


_T = TypeVar("_T")


@overload
def decode(data: Any, type: None = None) -> Any: ...
@overload
def decode(data: Any, type: builtins.type[_T]) -> _T: ...
@overload
def decode(data: Any, type: object) -> Any: ...  # a typing form (`int | None`, `Annotated[...]`)
def decode(data: Any, type: Any = None) -> Any:
    """Decode one value (or, if `data` starts with a field name, a whole document as a dict).

    With `type`, the value is converted to it (see `wire.marshal`): fields matched by name, unknown
    fields skipped, missing ones defaulted. Trailing bytes are an error.
    """
    if type is not None:
        fast = whole_decoders.get(type)
        return fast(data) if fast is not None else typed().decode_bytes(data, type)
    r = Reader(data)
    value = r.read_value()
    if r.has_more():
        raise WireError(f"{r.remaining} trailing bytes after the value", r.pos)
    return value


@overload
def decode_document(data: Any, type: None = None) -> dict[Any, Any]: ...
@overload
def decode_document(data: Any, type: builtins.type[_T]) -> _T: ...
@overload
def decode_document(data: Any, type: object) -> Any: ...
def decode_document(data: Any, type: Any = None) -> Any:
    """A document body (sequence of fields) as an ordered dict, or as `type` matched by field name."""
    r = Reader(data)
    if type is not None:
        return typed().fields_decoder_for(type)(r)
    return r.read_document()


Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[Reader], Any]


def encoder_for(tp: Any) -> Encoder:
    """A compiled function appending `tp`'s marshallable form (`82 len fields`) to a bytearray."""
    return typed().encoder_for(tp)


def decoder_for(tp: Any) -> Decoder:
    """A compiled function reading one `tp` value from a Reader."""
    return typed().decoder_for(tp)


if _accel.speedups is not None:  # straight to a class's plan, without a Python frame
    decode = _accel.speedups.Decode(decode, whole_decoders)
    encode = _accel.speedups.Encode(encode, whole_encoders, registry.by_class)
