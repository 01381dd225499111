"""Records: a document of positional values (no field names), built and read one value at a time.

Like Quick-Queue's `packInt` / `packLong` / `packDouble` / `packString` / `packBigDecimal` /
`packBoolean`, but the bytes are Chronicle BINARY values, so Java reads a record with
`dc.wire().getValueIn().int32()`, `.int64()`, `.float64()`, `.text()`, `.bool()` and
`.object(BigDecimal.class)` in the same order::

    with appender.record() as r:
        r.int32(1).decimal(Decimal("0.10")).text("x")

    r = excerpt.record()
    r.int32(), r.decimal(), r.text()

Encodings (what `RecordWriter` writes; `RecordReader` also reads Java's compact forms):

* ``int32`` / ``int64`` / ``float64``: fixed width, `A6 <i32>`, `A7 <i64>`, `91 <f64>`, as a
  `BinaryWire` with `fixed=true` writes them; Java's default (compact) BinaryWire reads them alike.
  Fixed width keeps the size of a record predictable and lets `Layout` pack a run of them with one
  `struct` call.
* ``text``: BINARY text (`E0+n` for up to 31 bytes, else `B8 <stop-bit length>`), None as `BB`.
* ``decimal``: the `Decimal`'s text, exactly what Java's `ValueOut.object(BigDecimal)` writes
  (`BigDecimal.toString()`; Python's `str(Decimal)` follows the same to-scientific-string rules),
  so the value, scale included, round-trips exactly both ways. NaN and infinities have no
  BigDecimal and are refused.
* ``boolean``: `B1` / `B0`.

Reading the wrong kind raises `wire.WireError` naming the value's position in the record, its byte
offset, the kind asked for and the kind found. A number is never read as text or the reverse.

`Layout(kinds...)` is the precompiled form for hot loops: `pack(*values)` -> bytes and
`unpack(data)` -> tuple of one fixed sequence of kinds, the same bytes as the builder.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from wire import binary as _b
from wire._accel import speedups
from wire.errors import WireError

__all__ = ["KINDS", "Layout", "RecordReader", "RecordWriter"]

Buffer = bytes | bytearray | memoryview

_INT32 = struct.Struct("<Bi")
_INT64 = struct.Struct("<Bq")
_FLOAT64 = struct.Struct("<Bd")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_INT32_CODE, _INT64_CODE, _FLOAT64_CODE = 0xA6, 0xA7, 0x91
_TRUE, _FALSE, _NULL = 0xB1, 0xB0, 0xBB
_HEADS = [bytes((0xE0 + n,)) for n in range(32)]

KINDS = ("int32", "int64", "float64", "text", "decimal", "boolean")


def _text_bytes(value: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError:  # lone surrogates: as Java's modified UTF-8 writes them
        return _b.utf8(value)


def _text_head(n: int) -> bytes:
    if n < 32:
        return _HEADS[n]
    out = bytearray(b"\xb8")
    _b.write_stop_bit(out, n)
    return bytes(out)


#: the exponents a Java BigDecimal holds: its scale (minus the exponent) is a Java int
_MIN_EXPONENT, _MAX_EXPONENT = -(2**31 - 1), 2**31


def _decimal_text(value: Decimal) -> str:
    if not isinstance(value, Decimal):
        raise WireError(f"a record decimal must be a decimal.Decimal, not {type(value).__name__}")
    if not value.is_finite():
        raise WireError(f"{value} has no Java BigDecimal: a record decimal must be finite")
    text = str(value)
    if "E" in text:  # only a text in scientific notation can carry an exponent out of a Java int
        exponent = value.as_tuple().exponent
        assert isinstance(exponent, int)  # finite, checked above
        if not _MIN_EXPONENT <= exponent <= _MAX_EXPONENT:
            raise WireError(
                f"{text} has no Java BigDecimal: its exponent {exponent} is outside "
                f"{_MIN_EXPONENT}..{_MAX_EXPONENT} (a BigDecimal's scale is a Java int)"
            )
    return text


class RecordWriter:
    """Appends positional values to a buffer; each method returns the writer, so calls chain.

    As a context manager (what `chronq.Appender.record()` returns) it hands the bytes to its `sink`
    on a clean exit and drops them on an exception, as an appender's document does."""

    __slots__ = ("_sink", "buf")

    def __init__(self, sink: Callable[[bytearray], Any] | None = None) -> None:
        self.buf = bytearray()
        self._sink = sink

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self._sink is not None:
            self._sink(self.buf)

    def int32(self, value: int) -> RecordWriter:
        try:
            self.buf += _INT32.pack(_INT32_CODE, value)
        except struct.error as e:
            raise WireError(f"int32 value {value!r}: {e}") from None
        return self

    def int64(self, value: int) -> RecordWriter:
        try:
            self.buf += _INT64.pack(_INT64_CODE, value)
        except struct.error as e:
            raise WireError(f"int64 value {value!r}: {e}") from None
        return self

    def float64(self, value: float) -> RecordWriter:
        try:
            self.buf += _FLOAT64.pack(_FLOAT64_CODE, value)
        except struct.error as e:
            raise WireError(f"float64 value {value!r}: {e}") from None
        return self

    def text(self, value: str | None) -> RecordWriter:
        if value is None:
            self.buf.append(_NULL)
            return self
        if not isinstance(value, str):
            raise WireError(f"a record text must be a str, not {type(value).__name__}")
        data = _text_bytes(value)
        self.buf += _text_head(len(data))
        self.buf += data
        return self

    def decimal(self, value: Decimal) -> RecordWriter:
        data = _decimal_text(value).encode()
        self.buf += _HEADS[len(data)] if len(data) < 32 else _text_head(len(data))
        self.buf += data
        return self

    def boolean(self, value: bool) -> RecordWriter:
        self.buf.append(_TRUE if value else _FALSE)
        return self

    def getvalue(self) -> bytes:
        return bytes(self.buf)


def _kind_found(code: int) -> str:
    """What a value code is, in the words of the error messages."""
    if code < 0x80 or 0xA1 <= code <= 0xA9 or code == 0xAF:
        return "an integer"
    if 0x90 <= code <= 0x9F:
        return "a float"
    if code >= 0xE0 or code == 0xB8:
        return "text"
    if code in (_TRUE, _FALSE):
        return "a boolean"
    if code == _NULL:
        return "null"
    if code in (0x80, 0x81, 0x82):
        return "a length-prefixed block"
    if 0xC0 <= code <= 0xDF or code in (0xB7, 0xB9, 0xBA):
        return "a field name"
    return f"code 0x{code:02x}"


class RecordReader:
    """Reads a record's values in order from a buffer (an `Excerpt`, bytes, a memoryview).

    With an `Excerpt` it reads the mapped bytes in place: like the excerpt's payload, it is valid
    until the tailer's next read."""

    __slots__ = ("buf", "end", "index", "pos")

    def __init__(self, data: Buffer | Any, start: int = 0, end: int | None = None) -> None:
        self.buf = data if isinstance(data, (bytes, bytearray, memoryview)) else memoryview(data)
        self.pos = start
        self.end = len(self.buf) if end is None else end
        self.index = 0
        """How many values have been read: the position in the record of the next one."""

    def has_more(self) -> bool:
        return self.pos < self.end

    def _wrong(self, asked: str, found: str, pos: int) -> WireError:
        return WireError(f"record value {self.index}: expected {asked}, found {found}", pos)

    def _generic(self, asked: str) -> tuple[Any, int]:
        """The next value through the full BINARY reader; (value, its code)."""
        if self.pos >= self.end:
            raise WireError(
                f"record value {self.index}: expected {asked}, found the end of the record", self.pos
            )
        code = self.buf[self.pos]
        r = _b.Reader(self.buf, self.pos, self.end)
        value = r.read_value()
        self.pos = r.position
        return value, code

    def _integer(self, asked: str, lo: int, hi: int) -> int:
        start = self.pos
        if start >= self.end:
            raise self._wrong(asked, "the end of the record", start)
        kind = _kind_found(self.buf[start])
        if kind not in ("an integer", "a float"):
            raise self._wrong(asked, kind, start)
        value, _ = self._generic(asked)
        if kind == "a float":  # Java's compact wire writes a long a float holds exactly as that float
            if value != value or value in (float("inf"), float("-inf")) or value != int(value):
                self.pos = start
                raise self._wrong(asked, f"the float {value!r}", start)
            value = int(value)
        if not lo <= value <= hi:
            self.pos = start
            raise self._wrong(asked, f"{value}, out of its range", start)
        self.index += 1
        return int(value)

    def int32(self) -> int:
        p = self.pos
        if p + 5 <= self.end and self.buf[p] == _INT32_CODE:
            self.pos = p + 5
            self.index += 1
            return _I32.unpack_from(self.buf, p + 1)[0]  # type: ignore[no-any-return]
        return self._integer("int32", -(1 << 31), (1 << 31) - 1)

    def int64(self) -> int:
        p = self.pos
        if p + 9 <= self.end and self.buf[p] == _INT64_CODE:
            self.pos = p + 9
            self.index += 1
            return _I64.unpack_from(self.buf, p + 1)[0]  # type: ignore[no-any-return]
        return self._integer("int64", -(1 << 63), (1 << 63) - 1)

    def float64(self) -> float:
        p = self.pos
        if p + 9 <= self.end and self.buf[p] == _FLOAT64_CODE:
            self.pos = p + 9
            self.index += 1
            return _F64.unpack_from(self.buf, p + 1)[0]  # type: ignore[no-any-return]
        code = self.buf[p] if p < self.end else -1
        kind = _kind_found(code) if code >= 0 else "the end of the record"
        if kind not in ("an integer", "a float"):
            raise self._wrong("float64", kind, p)
        value, _ = self._generic("float64")
        self.index += 1
        return float(value)

    def text(self) -> str | None:
        p = self.pos
        code = self.buf[p] if p < self.end else -1
        if code >= 0xE0:
            n = code - 0xE0
            if p + 1 + n <= self.end:
                try:
                    value = str(self.buf[p + 1 : p + 1 + n], "utf-8")
                except UnicodeDecodeError:
                    pass  # modified UTF-8 (surrogates): the full reader knows it
                else:
                    self.pos = p + 1 + n
                    self.index += 1
                    return value
        kind = _kind_found(code) if code >= 0 else "the end of the record"
        if kind not in ("text", "null"):
            raise self._wrong("text", kind, p)
        value, _ = self._generic("text")
        self.index += 1
        return value  # type: ignore[no-any-return]

    def decimal(self) -> Decimal:
        p = self.pos
        code = self.buf[p] if p < self.end else -1
        if code >= 0xE0 and p + 1 + code - 0xE0 <= self.end:  # short text, as RecordWriter writes it
            end = p + 1 + code - 0xE0
            try:
                value = Decimal(str(self.buf[p + 1 : end], "ascii"))
            except (UnicodeDecodeError, InvalidOperation):
                pass  # not ASCII, or not a decimal: the path below reads the text and says which
            else:
                if value.is_finite():
                    self.pos = end
                    self.index += 1
                    return value
        kind = _kind_found(code) if code >= 0 else "the end of the record"
        if kind == "an integer":  # a BigDecimal Java wrote as a number: exact all the same
            return Decimal(self._integer("decimal", -(1 << 63), (1 << 63) - 1))
        if kind != "text":
            raise self._wrong("decimal", kind, p)
        text = self.text()
        try:
            value = Decimal(text)  # type: ignore[arg-type]  # text, as checked above: never None
        except InvalidOperation:
            self.index -= 1
            self.pos = p
            raise self._wrong("decimal", f"the text {text!r}", p) from None
        if not value.is_finite():
            self.index -= 1
            self.pos = p
            raise self._wrong("decimal", f"the text {text!r}", p)
        return value

    def boolean(self) -> bool:
        p = self.pos
        code = self.buf[p] if p < self.end else -1
        if code in (_TRUE, _FALSE):
            self.pos = p + 1
            self.index += 1
            return code == _TRUE
        raise self._wrong("boolean", _kind_found(code) if code >= 0 else "the end of the record", p)

    def skip(self) -> RecordReader:
        """Step over the next value, whatever it is."""
        self._generic("a value")
        self.index += 1
        return self


# ---------------------------------------------------------------- Layout: one fixed sequence of kinds

_FIXED = {"int32": ("i", _INT32_CODE), "int64": ("q", _INT64_CODE), "float64": ("d", _FLOAT64_CODE)}
_VARIABLE = ("text", "decimal")


class Layout:
    """A fixed sequence of record kinds, compiled once: `pack(*values)` and `unpack(data)` make and
    read the bytes `RecordWriter` / `RecordReader` would, each with one `struct` call. The struct is
    chosen by the lengths of the record's texts (short ones, up to 31 bytes, which is one code byte
    each) and cached per combination of lengths. Anything else (a long or null text, a surrogate,
    Java's compact numbers, bad data) goes value by value through `RecordWriter` / `RecordReader`,
    so `unpack` reads what the reader reads and raises the same errors.

    `unpack` takes bytes, a bytearray or a memoryview (an excerpt's `payload`)."""

    def __init__(self, *kinds: str) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown record kind {unknown[0]!r}; kinds are {', '.join(KINDS)}")
        self.kinds = kinds
        self._structs: dict[Any, struct.Struct] = {}
        self.pack: Callable[..., bytes]
        self.unpack: Callable[[Buffer], tuple[Any, ...]]
        self.accelerated = speedups is not None
        """Whether `pack` and `unpack` are the C accelerator's (wire/_speedups.c) or compiled Python;
        both give the same bytes, values and errors (WIRE_NO_SPEEDUPS=1 forces Python)."""
        if speedups is not None:  # one C call per record; the same slow path for anything unusual
            native = speedups.RecordLayout(
                bytes(KINDS.index(k) for k in kinds), Decimal, self._pack_slow, self._unpack_slow
            )
            self.pack, self.unpack = native.pack, native.unpack
        else:
            self.pack, self.unpack = self._compile_pack(), self._compile_unpack()

    def _struct(self, lengths: Any) -> struct.Struct:
        """The whole record's struct for these text lengths (a tuple, or an int for one text)."""
        ns = iter(lengths if isinstance(lengths, tuple) else (lengths,))
        fmt = ["<"]
        for k in self.kinds:
            if k in _FIXED:
                fmt.append("B" + _FIXED[k][0])
            elif k == "boolean":
                fmt.append("B")
            else:
                fmt.append(f"B{next(ns)}s")
        s = struct.Struct("".join(fmt))
        if len(self._structs) < 4096:  # lengths are below 32 each, but many texts make many combinations
            self._structs[lengths] = s
        return s

    def _variables(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k in _VARIABLE]

    def _key(self) -> str:
        var = self._variables()
        return f"n{var[0]}" if len(var) == 1 else "(" + "".join(f"n{i}, " for i in var) + ")"

    def _compile_pack(self) -> Callable[..., bytes]:
        ns: dict[str, Any] = {
            "struct_error": struct.error,
            "structs": self._structs,
            "make": self._struct,
            "Decimal": Decimal,
            "slow": self._pack_slow,
        }
        args = ", ".join(f"v{i}" for i in range(len(self.kinds)))
        var = self._variables()
        lines = [f"def pack({args}):", "    try:"]
        items = []
        for i, k in enumerate(self.kinds):
            if k in _FIXED:
                items += [str(_FIXED[k][1]), f"v{i}"]
            elif k == "boolean":
                items.append(f"(0xB1 if v{i} else 0xB0)")
            else:
                if k == "text":
                    lines.append(f"        t{i} = v{i}.encode()")
                    lines.append(f"        n{i} = len(t{i})")
                else:  # NaN, the infinities and an exponent (which the writer checks) go value by value
                    lines.append(f"        if type(v{i}) is not Decimal or not v{i}.is_finite():")
                    lines.append(f"            return slow(({args},))")
                    lines.append(f"        t{i} = str(v{i}).encode()")
                    lines.append(f"        n{i} = len(t{i})")
                    lines.append(f"        if 69 in t{i}:  # E")
                    lines.append(f"            return slow(({args},))")
                lines.append(f"        if n{i} > 31:")
                lines.append(f"            return slow(({args},))")
                items += [f"0xE0 + n{i}", f"t{i}"]
        if var:
            key = self._key()
            lines.append(f"        s = structs.get({key}) or make({key})")
        else:
            ns["s"] = self._struct(())
        lines.append(f"        return s.pack({', '.join(items)})")
        lines.append("    except (struct_error, AttributeError, UnicodeEncodeError):")
        lines.append(f"        return slow(({args},))")
        code = compile("\n".join(lines) + "\n", f"<record layout pack {' '.join(self.kinds)}>", "exec")
        exec(code, ns)
        return ns["pack"]  # type: ignore[no-any-return]

    def _pack_slow(self, values: tuple[Any, ...]) -> bytes:
        """The builder, value by value: it raises the precise error (or writes a long or null text,
        or a surrogate, which the compiled path leaves to it)."""
        w = RecordWriter()
        for kind, v in zip(self.kinds, values, strict=True):
            getattr(w, kind)(v)
        return w.getvalue()

    def _compile_unpack(self) -> Callable[[Buffer], tuple[Any, ...]]:
        ns: dict[str, Any] = {
            "Decimal": Decimal,
            "slow": self._unpack_slow,
            "structs": self._structs,
            "make": self._struct,
        }
        lines = ["def unpack(buf):", "    try:"]
        # where each text's code byte is: after the fixed-size values before it and the texts before it
        offset, base = 0, "0"
        for i, k in enumerate(self.kinds):
            if k in _FIXED:
                offset += 1 + struct.calcsize("<" + _FIXED[k][0])
            elif k == "boolean":
                offset += 1
            else:
                lines.append(f"        p{i} = {base} + {offset}")
                lines.append(f"        n{i} = buf[p{i}] - 0xE0")
                lines.append(f"        if n{i} < 0:")
                lines.append("            return slow(buf)")
                base, offset = f"p{i}", 1
                base = f"(p{i} + n{i})"
        if self._variables():
            key = self._key()
            lines.append(f"        t = (structs.get({key}) or make({key})).unpack_from(buf, 0)")
        else:
            ns["S"] = self._struct(())
            lines.append("        t = S.unpack_from(buf, 0)")
        checks, out, lines_after, checks_after = [], [], [], []
        j = 0
        for k in self.kinds:
            if k in _FIXED:
                checks.append(f"t[{j}] != {_FIXED[k][1]}")
                out.append(f"t[{j + 1}]")
                j += 2
            elif k == "boolean":
                checks.append(f"(t[{j}] != 0xB1 and t[{j}] != 0xB0)")
                out.append(f"t[{j}] == 0xB1")
                j += 1
            else:
                if k == "decimal":  # NaN and the infinities have no BigDecimal: the reader refuses them
                    lines_after.append(f"        d{j} = Decimal(t[{j + 1}].decode())")
                    checks_after.append(f"not d{j}.is_finite()")
                    out.append(f"d{j}")
                else:
                    out.append(f"t[{j + 1}].decode()")
                j += 2
        if checks:
            lines.append(f"        if {' or '.join(checks)}:")
            lines.append("            return slow(buf)")
        lines += lines_after
        if checks_after:
            lines.append(f"        if {' or '.join(checks_after)}:")
            lines.append("            return slow(buf)")
        lines.append(f"        return ({', '.join(out)}{',' if len(out) == 1 else ''})")
        lines.append("    except Exception:  # short data, bad UTF-8 or decimal text: the reader says what")
        lines.append("        return slow(buf)")
        code = compile("\n".join(lines) + "\n", f"<record layout unpack {' '.join(self.kinds)}>", "exec")
        exec(code, ns)
        return ns["unpack"]  # type: ignore[no-any-return]

    def _unpack_slow(self, data: Buffer) -> tuple[Any, ...]:
        r = RecordReader(data)
        return tuple(getattr(r, kind)() for kind in self.kinds)
