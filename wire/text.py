"""Text renderings of wire data: Chronicle's YAML dump style, JSON, and a small YAML reader.

* `render(body)` shows one BINARY document body (a queue message, an index or a table-store entry)
  the way Java's `ChronicleQueue.dump()` does: `!short 256`, `!byte -1`, `0x...` for int64_0x,
  `1.0E-4`, `!SCQStore {...}`, `# length: 4096, used: 1` for index arrays. It walks the bytes
  (not the decoded values) because the dump shows how a value was *encoded*.
* `json_value(body)` / `to_json(body)`: the same document as one JSON value, for tools.
* `to_yaml(value)` / `from_yaml(text)`: Python values <-> the same YAML style, for replay-test
  files (`from_yaml(to_yaml(v)) == v` for the generic value model: None, bool, int, float, str,
  bytes, list, str-keyed dict, `Int64Hex`, `Typed`, `TypeLiteral`). The reader understands the
  subset Chronicle tools write: block and flow maps/sequences, `---`/`...` separators, comments,
  `!tags`, quoted strings. It needs no YAML library.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import json
import math
import re
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from wire import _javatime, binary
from wire._fields import fields_of
from wire.errors import WireError
from wire.history import MessageHistory
from wire.types import EventName, FieldNumber, HistoryBytes, Int64Array, Int64Hex, Typed, TypeLiteral

Buffer = bytes | bytearray | memoryview

# ================================================================ Java's scalar formatting


def _java_int(x: float) -> int:
    """Java's `(int)` cast of a double: truncate, saturate at the int range."""
    if math.isnan(x):
        return 0
    return max(-(2**31), min(2**31 - 1, int(x)))


def java_double_to_string(d: float) -> str:
    """Java `Double.toString`: shortest digits, plain for 1e-3 <= |d| < 1e7, else `d.dddE±n`."""
    if math.isnan(d):
        return "NaN"
    if math.isinf(d):
        return "Infinity" if d > 0 else "-Infinity"
    if d == 0:
        return "-0.0" if math.copysign(1.0, d) < 0 else "0.0"
    sign = "-" if d < 0 else ""
    t = decimal.Decimal(repr(abs(d))).as_tuple()
    digits = "".join(map(str, t.digits)).rstrip("0") or "0"
    exp10 = len(t.digits) + int(t.exponent) - 1  # power of ten of the first digit
    if 1e-3 <= abs(d) < 1e7:
        if exp10 >= 0:
            whole, frac = digits[: exp10 + 1].ljust(exp10 + 1, "0"), digits[exp10 + 1 :]
        else:
            whole, frac = "0", "0" * (-exp10 - 1) + digits
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exp10}"


def _plain_double(d: float) -> str:
    """Chronicle Bytes `append(double)` in the range it is used for: shortest digits, never an exponent."""
    r = repr(d)
    if "e" in r or "E" in r:
        r = format(decimal.Decimal(r), "f")
    return r if "." in r else r + ".0"


def java_double(d: float) -> str:
    """How Chronicle's YAML writer prints a double (`YamlWireOut.float64`, Wire 2.26)."""
    ad = abs(d)
    if not 1e-7 <= ad < 1e15:
        return java_double_to_string(d)
    if _java_int(ad / 1e6) * 1e6 == ad:
        return f"{_java_int(d / 1e6)}E6"
    if _java_int(ad / 1e3) * 1e3 == ad:
        return f"{_java_int(d / 1e3)}E3"
    if ad < 1e-3:
        d7 = math.floor(d * 1e16 + 0.5) / 1e9
        ad7 = abs(d7)
        for limit, scale, suffix in (
            (1e1, 1, "E-7"),
            (1e2, 1e1, "E-6"),
            (1e3, 1e2, "E-5"),
            (1e4, 1e3, "E-4"),
        ):
            if ad7 < limit:
                return _plain_double(d7 / scale) + suffix
        return _plain_double(d7 / 1e4) + "E-3"
    return _plain_double(d)


_STARTS_QUOTE = frozenset("?%*&@`0123456789+- ',#:{}[]|>!\\")
_QUOTE = frozenset("?,#:{}[]|>\\^")
_ESCAPES = {
    "\0": "\\0", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f",
    "\r": "\\r", "\x1b": "\\e", "\\": "\\\\", "\x85": "\\N", "\xa0": "\\_", "\u2028": "\\L", "\u2029": "\\P",
}  # fmt: skip


def _utf16(s: str) -> str:
    """`s` as Java sees it: characters beyond the BMP become surrogate pairs."""
    if all(c < "\U00010000" for c in s):
        return s
    return "".join(
        c if c < "\U00010000" else chr(0xD7C0 + (ord(c) >> 10)) + chr(0xDC00 + (ord(c) & 0x3FF)) for c in s
    )


def _quote_style(s: str) -> str:
    """Java `YamlWireOut.needsQuotes`: '' (plain), "'" or '"'."""
    if not s or s[0] in _STARTS_QUOTE or s[-1].isspace():
        return '"'
    style = ""
    has_single = False
    for i, ch in enumerate(s):
        if ch in _QUOTE or ch < " " or ch > "\x7f":
            return '"'
        if ch == "'":
            has_single = True
        if ch == '"':
            if s[i + 1 : i + 2] == "'":
                return '"'
            style = "'"
    return "" if has_single else style


def quote(s: str, *, for_reading: bool = False) -> str:
    """A string as Chronicle's YAML writes it (quoted and escaped only when needed).

    `for_reading` also quotes text that `from_yaml` would otherwise read back as another type
    (`true`, `null`, `NaN`, ...), which Java does not bother with.
    """
    s = _utf16(s)
    q = _quote_style(s)
    if not q and for_reading and (_reads_as_other(s) or s.startswith(("---", "..."))):
        q = '"'
    if not q:
        return s
    out = []
    for ch in s:
        e = _ESCAPES.get(ch)
        if e is not None:
            out.append(e)
        elif ch == q:
            out.append("\\" + ch)
        elif ch > "\xff":
            out.append(f"\\u{ord(ch):04X}")
        elif ch < " " or ch > "\x7f":
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return q + "".join(out) + q


# ================================================================ a tiny layout model


@dataclasses.dataclass(slots=True)
class _Map:
    entries: list[tuple[str | None, Any]]  # key None: the value is a comment line
    tag: str = ""


@dataclasses.dataclass(slots=True)
class _Seq:
    items: list[Any]
    tag: str = ""


@dataclasses.dataclass(slots=True)
class _Array:
    """An I64_ARRAY (index arrays): shown with its capacity and used count."""

    values: list[int]
    used: int


def _fmt(node: Any, depth: int, inline: bool) -> str:
    """Chronicle's layout: blocks one entry per line below depth 2, `{ a: 1, b: 2 }` from depth 2."""
    if isinstance(node, str):
        return node
    indent, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(node, _Map):
        prefix = f"!{node.tag} " if node.tag else ""
        if not node.entries:
            return prefix + "{ }"
        if inline or depth >= 2:
            body = ", ".join(f"{k}: {_fmt(v, depth + 1, True)}" for k, v in node.entries if k is not None)
            return f"{prefix}{{ {body} }}"
        lines = [
            inner + (f"# {v}" if k is None else f"{k}: {_fmt(v, depth + 1, False)}") for k, v in node.entries
        ]
        return prefix + "{\n" + _join_lines(lines) + "\n" + indent + "}"
    if isinstance(node, _Seq):
        prefix = f"!{node.tag} " if node.tag else ""
        if not node.items:
            return prefix + "[ ]"
        if inline:
            return prefix + "[ " + ", ".join(_fmt(v, depth + 1, True) for v in node.items) + " ]"
        lines = [inner + _fmt(v, depth + 1, False) for v in node.items]
        return prefix + "[\n" + _join_lines(lines) + "\n" + indent + "]"
    if isinstance(node, _Array):
        # Java prints the used slots one per line and the unused rest on one line
        used = max(0, min(node.used, len(node.values)))
        lines = [f"{inner}{v}" for v in node.values[:used]]
        if used < len(node.values):
            lines.append(inner + ", ".join(map(str, node.values[used:])))
        head = f"{inner}# length: {len(node.values)}, used: {node.used}"
        return "[\n" + "\n".join([head, ",\n".join(lines)] if lines else [head]) + "\n" + indent + "]"
    raise TypeError(f"cannot lay out {type(node).__name__}")  # pragma: no cover - internal model only


def _join_lines(lines: list[str]) -> str:
    """Entries separated by commas, except after comment lines."""
    out = []
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        out.append(line if last or line.lstrip().startswith("# ") else line + ",")
    return "\n".join(out)


def _top(node: Any) -> str:
    """A document: a top-level map loses its braces (one `key: value` per line)."""
    if isinstance(node, _Map) and not node.tag:
        lines = [f"# {v}" if k is None else f"{k}: {_fmt(v, 0, False)}" for k, v in node.entries]
        return "\n".join(lines) + "\n" if lines else ""
    return _fmt(node, 0, False) + "\n"


# ================================================================ BINARY document -> layout


def _key_text(key: Any) -> str:
    if isinstance(key, FieldNumber) and key == -1:
        return "history"  # MethodReader.MESSAGE_HISTORY_METHOD_ID
    if isinstance(key, str):
        return quote(str(key))
    if isinstance(key, int) and not isinstance(key, bool):
        return quote(str(int(key)))
    return "? " + _fmt(_py_node(key), 0, True)


def _history_node(h: MessageHistory) -> _Map:
    items: list[Any] = []
    for source_id, index in h.sources:
        items += [str(source_id), f"0x{index & 0xFFFFFFFFFFFFFFFF:x}"]
    return _Map([("sources", _Seq(items)), ("timings", _Seq([str(t) for t in h.timings]))])


def _read_utf8_payload(r: binary.Reader) -> str:
    """Skip the code byte and return the stop-bit-length text after it (type names, dates, comments),
    which Java writes as CESU-8 (surrogate pairs encoded one by one)."""
    r.pos += 1
    at = r.pos
    n = r.read_stop_bit()
    if not 0 <= n <= r.end - r.pos:
        raise WireError(f"text of {n} bytes overruns the data", at)
    raw = bytes(r.buf[r.pos : r.pos + n])
    r.pos += n
    try:
        text = raw.decode("utf-8", "surrogatepass")
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le") if _has_surrogate(text) else text
    except UnicodeError as exc:
        raise WireError(f"bad UTF-8 text: {exc}", at) from None


def _pending_comments(r: binary.Reader) -> list[str]:
    """Comments (and padding) before the next item: the dump shows comments, padding is invisible."""
    b = binary
    found = []
    while r.pos < r.end:
        code = r.buf[r.pos]
        if code == b.COMMENT:
            found.append(_read_utf8_payload(r))
        elif code in (b.PADDING, b.PADDING32):
            start = r.pos
            r.pos += 1
            if code == b.PADDING32:
                if r.end - r.pos < 4:
                    raise WireError("truncated PADDING32", start)
                n = int.from_bytes(r.buf[r.pos : r.pos + 4], "little")
                if n > r.end - r.pos - 4:
                    raise WireError(f"PADDING32 of {n} bytes overruns the data", start)
                r.pos += 4 + n
        else:
            break
    return found


def _fields_node(r: binary.Reader, depth: int) -> _Map:
    entries: list[tuple[str | None, Any]] = []
    while True:
        entries += [(None, c) for c in _pending_comments(r)]
        if r.pos >= r.end:
            return _Map(entries)
        key = r.read_field()
        value = _value_node(r, depth) if r.has_more() else '!!null ""'
        entries.append((_key_text(key), value))


_FIELD_STARTS = frozenset([*range(0xC0, 0xE0), 0xB7, 0xB9, 0xBA, 0xBD])


def _value_node(r: binary.Reader, depth: int) -> Any:
    b = binary
    if depth > b.MAX_DEPTH:
        raise WireError(f"nesting deeper than {b.MAX_DEPTH} levels", r.pos)
    code = r.peek_code()
    if code == b.TYPE_PREFIX:
        at = r.pos
        name = _read_utf8_payload(r)
        if not r.has_more():
            raise WireError(f"type prefix !{name} without a value", at)
        inner = _value_node(r, depth + 1)  # +1 bounds chains of prefixes too
        if isinstance(inner, (_Map, _Seq)) and not inner.tag:
            inner.tag = name
            return inner
        return f"!{name} {_fmt(inner, depth, True)}"
    if code in (b.BYTES_LENGTH8, b.BYTES_LENGTH16, b.BYTES_LENGTH32):
        sub = r.enter()
        if not sub.has_more():
            return _Seq([])
        first = sub.buf[sub.pos]
        if first in _FIELD_STARTS:
            return _fields_node(sub, depth + 1)
        if first == b.HISTORY_MESSAGE:
            return _history_node(MessageHistory.from_payload(sub.buf[sub.pos + 1 : sub.end]))
        if first == b.U8_ARRAY:
            data = sub.read_value()
            textable = all(0x20 <= c < 0x80 or c == 0x0A for c in data)
            return quote(data.decode("ascii")) if textable else _scalar(data)  # as Java's copy does
        items = []
        while sub.has_more():
            items.append(_value_node(sub, depth + 1))
        return _Seq(items)
    if code in _FIELD_STARTS:
        return _fields_node(r, depth + 1)
    if code == b.INT8:
        return f"!byte {r.read_value()}"
    if code == b.INT16:
        return f"!short {r.read_value()}"
    if b.TIME <= code <= b.ZONED_DATE_TIME:
        return quote(_read_utf8_payload(r))
    if code == b.I64_ARRAY:
        arr = r.read_value()
        if arr.capacity == arr.used and arr.capacity <= 2:  # e.g. writePosition: Java shows the values only
            return _Seq([str(v) for v in arr.values])
        return _Array(arr.values, arr.used)
    value = r.read_value()
    if type(value) is HistoryBytes:  # a HISTORY_MESSAGE outside its usual length prefix
        return _history_node(MessageHistory.from_payload(value.data))
    return _scalar(value)


def _scalar(v: Any) -> str:
    t = type(v)
    if v is None:
        return '!!null ""'
    if t is bool:
        return "true" if v else "false"
    if t is str:
        return quote(v)
    if t is Int64Hex:
        return f"0x{v & 0xFFFFFFFFFFFFFFFF:x}"
    if t is int:
        return str(v)
    if t is float:
        return java_double(v)
    if t is bytes:
        return "!!binary " + base64.b64encode(v).decode("ascii")
    if t is TypeLiteral:
        return "!type " + quote(v.name)
    return quote(str(v))  # uuid and the date/time family show as their text


def render(body: Buffer) -> str:
    """One BINARY document body as Chronicle's dump shows it; raises `WireError` if it is not wire.

    `looks_binary(body)` tells whether Java would try (it shows other bodies as raw text).
    """
    r = binary.Reader(body)
    if not r.has_more() or r.peek_code() in _FIELD_STARTS:
        r.pos = 0  # back before any comments: the dump shows them
        return _top(_fields_node(r, -1))
    lines = []  # values without field names (rare): one per line
    while r.has_more():
        lines.append(_fmt(_value_node(r, 0), 0, False))
    return "\n".join(lines) + "\n"


def looks_binary(body: Buffer) -> bool:
    """Java's test for a BINARY body: the first byte has its top bit set (text starts with ASCII)."""
    return len(body) > 0 and body[0] >= 0x80


# ================================================================ JSON


def _jsonable(v: Any) -> Any:
    t = type(v)
    if v is None or t is bool or t is str or t is int:
        return v
    if isinstance(v, enum.Enum):
        return v.name  # Chronicle writes enums by name
    if t is float:
        return v if math.isfinite(v) else java_double_to_string(v)
    if isinstance(v, int):  # Int64Hex, FieldNumber
        return int(v)
    if isinstance(v, str):  # EventName
        return str(v)
    if t is dict:
        return {_json_key(k): _jsonable(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [_jsonable(x) for x in v]
    if t is bytes:
        return {"@binary": base64.b64encode(v).decode("ascii")}
    if t is Typed:
        inner = _jsonable(v.value)
        return (
            {"@type": v.type_name, **inner} if type(inner) is dict else {"@type": v.type_name, "value": inner}
        )
    if t is TypeLiteral:
        return {"@type": "type", "value": v.name}
    if t is Int64Array:
        return {"length": v.capacity, "used": v.used, "values": v.values}
    if t is HistoryBytes:
        h = MessageHistory.from_payload(v.data)
        return {"sources": [x for pair in h.sources for x in pair], "timings": h.timings}
    text = _java_text(v)
    if text is not None:
        return text
    try:
        return _jsonable(msgspec.to_builtins(v))
    except TypeError:
        return str(v)


def _java_text(v: Any) -> str | None:
    """The text Java stores for a UUID or a java.time value (the wire keeps them as text)."""
    if isinstance(v, _dt.datetime):
        return _javatime.format_datetime(v)
    if isinstance(v, _dt.date):
        return _javatime.format_date(v)
    if isinstance(v, _dt.time):
        return _javatime.format_time(v)
    if isinstance(v, uuid.UUID):
        return str(v)
    return None


def _json_key(k: Any) -> str:
    if isinstance(k, FieldNumber) and k == -1:
        return "history"
    return str(int(k)) if isinstance(k, int) else str(k)


def json_value(body: Buffer) -> Any:
    """One BINARY document body as a JSON-compatible value (`chronq dump --json`'s `value`).

    Fields become an object in wire order; int64_0x and numeric keys plain numbers/strings; bytes
    `{"@binary": base64}`; typed values `{"@type": name, ...fields}`; NaN/Infinity as strings.
    """
    r = binary.Reader(body)
    if not r.has_more() or r.peek_code() in _FIELD_STARTS:  # empty: a document without fields, as Java
        return _jsonable(r.read_document())
    values = []
    while r.has_more():
        values.append(_jsonable(r.read_value()))
    return values[0] if len(values) == 1 else values


def to_json(body: Buffer) -> str:
    return json.dumps(json_value(body), ensure_ascii=False, allow_nan=False)


# ================================================================ Python values -> YAML


def _py_node(v: Any) -> Any:
    t = type(v)
    if isinstance(v, enum.Enum):
        return quote(v.name, for_reading=True)  # Chronicle writes enums by name
    if t is dict:
        return _Map([(_key_text_py(k), _py_node(x)) for k, x in v.items()])
    if t is list or t is tuple:
        return _Seq([_py_node(x) for x in v])
    if t is Typed:
        inner = _py_node(v.value)
        if isinstance(inner, (_Map, _Seq)) and not inner.tag:
            inner.tag = v.type_name
            return inner
        return f"!{v.type_name} {_fmt(inner, 0, True)}"
    if t is str or isinstance(v, EventName):
        return quote(str(v), for_reading=True)
    if t is float:
        return _float_for_reading(v)
    if t is Int64Array:
        return _Array(v.values, v.used)
    if t is HistoryBytes:
        return _history_node(MessageHistory.from_payload(v.data))
    if t is FieldNumber:
        return str(int(v))
    if isinstance(v, (bool, int, bytes, TypeLiteral)) or v is None:
        return _scalar(v)
    fields = _object_fields(v)
    if fields is not None:
        return _Map([(quote(k, for_reading=True), _py_node(x)) for k, x in fields])
    text = _java_text(v)
    return quote(str(v) if text is None else text, for_reading=True)


def _float_for_reading(v: float) -> str:
    """Java's text when it reads back exactly (its E-7 form may round), else all the digits."""
    s = java_double(v)
    if math.isnan(v) or float(s) == v:
        return s
    return _plain_double(v) if abs(v) < 1e15 else repr(v).replace("e", "E")


def _object_fields(v: Any) -> list[tuple[str, Any]] | None:
    """(wire name, value) of a msgspec Struct, attrs instance or dataclass, in declaration order: the
    fields BINARY writes (`wire._fields`), so YAML and BINARY name them alike and read back alike."""
    info = fields_of(type(v))
    if info is None:
        return None
    return [(f.wire_name, x) for f, x in info.items(v)]


def _key_text_py(k: Any) -> str:
    if isinstance(k, str):
        return quote(str(k), for_reading=True)
    return quote(str(int(k)) if isinstance(k, int) else str(k), for_reading=True)


def to_yaml(value: Any) -> str:
    """A Python value as Chronicle-style YAML (a dict becomes `key: value` lines)."""
    node = _py_node(value)
    empty = isinstance(node, _Map) and not node.entries and not node.tag  # `{}`, or an object whose
    return "{ }\n" if empty else _top(node)  # fields are all omitted: not an empty (null) document


def to_yaml_all(documents: Iterable[Any]) -> str:
    """Several documents, each ended by `...` as Chronicle's replay files do."""
    return "".join(f"---\n{to_yaml(d)}...\n" for d in documents)


# ================================================================ YAML -> Python values

_INT = re.compile(r"[-+]?[0-9]+\Z")
_HEX = re.compile(r"0x[0-9a-fA-F]+\Z")
_FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?\Z")
_SPECIAL = {
    "": None, "~": None, "null": None, "Null": None, "NULL": None,
    "true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False,
    "NaN": math.nan, ".nan": math.nan, ".NaN": math.nan,
    "Infinity": math.inf, "+Infinity": math.inf, ".inf": math.inf, "-Infinity": -math.inf, "-.inf": -math.inf,
}  # fmt: skip


def _reads_as_other(s: str) -> bool:
    """Whether plain `s` would not read back as this text (a number, a boolean, null, out of range)."""
    try:
        return bool(_resolve_plain(s) != s)
    except WireError:
        return True


def _resolve_plain(s: str) -> Any:
    """A plain scalar's value. A number beyond what it can be read as (an integer longer than
    Python converts, a float literal beyond a double's range) is a WireError, never a silent
    infinity: the YAML names `.inf` when it means one."""
    if s in _SPECIAL:
        return _SPECIAL[s]
    if _INT.match(s):
        try:
            return int(s)
        except ValueError:
            raise WireError(f"integer of {len(s.lstrip('+-'))} digits is out of range") from None
    if _HEX.match(s):
        v = int(s, 16)
        if v >= 1 << 64:
            return s
        return Int64Hex(v - (1 << 64) if v >= 1 << 63 else v)
    if _FLOAT.match(s):
        number = float(s)
        if math.isinf(number):
            shown = s if len(s) <= 40 else f"{s[:20]}...{s[-10:]}"
            raise WireError(f"number {shown} is out of range (beyond a double's ±1.8e308; .inf is infinity)")
        return number
    return s


_UNESCAPE = {
    "0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r",
    "e": "\x1b", " ": " ", '"': '"', "'": "'", "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0",
    "L": "\u2028", "P": "\u2029",
}  # fmt: skip
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


MAX_YAML_DOCUMENT = 16 << 20  # characters in one document: a bound on the time and memory a reader takes


class _Parser:
    """Recursive descent over one document's text; `i` is the position in `s`. Collections nest at most
    `binary.MAX_DEPTH` deep (the limit binary wire has), so hostile text meets a WireError, not Python's
    recursion limit."""

    def __init__(self, text: str, line0: int) -> None:
        self.s, self.i, self.line0 = text, 0, line0
        self.depth = 0

    def nested(self, parse: Callable[..., Any], *args: Any) -> Any:
        """`parse(*args)` one collection (or tag) deeper."""
        if self.depth >= binary.MAX_DEPTH:
            raise self.error(f"nesting deeper than {binary.MAX_DEPTH} levels")
        self.depth += 1
        try:
            return parse(*args)
        finally:
            self.depth -= 1

    # ----- positions and errors
    def error(self, msg: str) -> WireError:
        line = self.s.count("\n", 0, self.i)
        col = self.i - (self.s.rfind("\n", 0, self.i) + 1)
        return WireError(f"YAML line {self.line0 + line + 1}, column {col + 1}: {msg}")

    def col(self, i: int | None = None) -> int:
        i = self.i if i is None else i
        return i - (self.s.rfind("\n", 0, i) + 1)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def skip_inline(self) -> None:
        s, i = self.s, self.i
        while i < len(s) and s[i] in " \t":
            i += 1
        if i < len(s) and s[i] == "#" and (i == 0 or s[i - 1] in " \t\n"):
            while i < len(s) and s[i] != "\n":
                i += 1
        self.i = i

    def skip_blank(self) -> None:
        """Whitespace, newlines and comments."""
        while True:
            self.skip_inline()
            if self.peek() == "\n":
                self.i += 1
            else:
                return

    def at_line_end(self) -> bool:
        self.skip_inline()
        return self.peek() in ("", "\n")

    # ----- block structure
    def document(self) -> Any:
        self.skip_blank()
        if self.i >= len(self.s):
            return None
        value = self.block(-1)
        self.skip_blank()
        if self.i < len(self.s):
            raise self.error(f"unexpected {self.peek()!r} after the document's value")
        return value

    def block(self, parent: int) -> Any:
        """The node starting at the next non-blank line, if indented deeper than `parent`."""
        save = self.i
        self.skip_blank()
        if self.i >= len(self.s) or self.col() <= parent:
            self.i = save
            return None
        c = self.col()
        if self.is_seq_item():
            return self.nested(self.block_seq, c)
        if self.is_key():
            return self.nested(self.block_map, c)
        value = self.flow(block_indent=c)
        if not self.at_line_end():
            raise self.error(f"unexpected {self.peek()!r} after a value")
        return value

    def is_seq_item(self) -> bool:
        return self.peek() == "-" and self.peek(1) in (" ", "\t", "\n", "")

    def is_key(self) -> bool:
        """Does the current line start with `key:` (a block mapping entry)?"""
        save = self.i
        try:
            ch = self.peek()
            if ch in "{[!":
                return False
            if ch in "\"'":
                self.quoted()
            else:
                self.plain(key=True)
            self.skip_inline()
            return self.peek() == ":" and self.peek(1) in (" ", "\t", "\n", "")
        except WireError:
            return False
        finally:
            self.i = save

    def block_map(self, c: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while True:
            self.skip_blank()
            if self.i >= len(self.s) or self.col() < c or self.is_seq_item():
                return out
            if self.col() > c:
                raise self.error("bad indentation of a mapping entry")
            key = self.key()
            if self.at_line_end():
                save = self.i
                self.skip_blank()
                if self.i < len(self.s) and self.col() == c and self.is_seq_item():
                    value = self.nested(self.block_seq, c)  # "key:\n- a\n- b"
                else:
                    self.i = save
                    value = self.block(c)
            else:
                value = self.flow(block_indent=c)
                if not self.at_line_end():
                    raise self.error(f"unexpected {self.peek()!r} after the value of {key!r}")
            if key in out:
                raise self.error(f"duplicate key {key!r}")
            out[key] = value

    def block_seq(self, c: int) -> list[Any]:
        out: list[Any] = []
        while True:
            self.skip_blank()
            if self.i >= len(self.s) or self.col() != c or not self.is_seq_item():
                if self.i < len(self.s) and self.col() > c:
                    raise self.error("bad indentation of a sequence item")
                return out
            self.i += 1
            self.skip_inline()
            if self.peek() in ("", "\n"):
                out.append(self.block(c))
            elif self.is_seq_item() or self.is_key():
                out.append(self.block(c))  # "- key: v\n  key2: v2" or "- - x"
            else:
                out.append(self.flow(block_indent=c))
                if not self.at_line_end():
                    raise self.error(f"unexpected {self.peek()!r} after a sequence item")

    def key(self) -> str:
        k = self.quoted() if self.peek() in "\"'" else self.plain(key=True)
        self.skip_inline()
        if self.peek() != ":":
            raise self.error(f"expected ':' after key {k!r}")
        self.i += 1
        return k

    # ----- flow values and scalars
    def flow(self, block_indent: int | None = None) -> Any:
        """A value: tag, flow map/sequence (may span lines), quoted or plain scalar."""
        self.skip_inline()
        ch = self.peek()
        if ch == "!":
            return self.nested(self.tagged, block_indent)
        if ch == "{":
            return self.nested(self.flow_map)
        if ch == "[":
            return self.nested(self.flow_seq)
        if ch in "\"'":
            return self.quoted()
        start = self.i
        text = self.plain(key=False, flow=block_indent is None)
        try:
            return _resolve_plain(text)
        except WireError as e:
            self.i = start
            raise self.error(str(e)) from None

    def tagged(self, block_indent: int | None) -> Any:
        start = self.i
        while self.peek() not in ("", " ", "\t", "\n", ",", "]", "}"):
            self.i += 1
        tag = self.s[start + 1 : self.i]
        if not tag:
            raise self.error("empty tag")
        self.skip_inline()
        if self.peek() in ("", "\n", ",", "]", "}"):
            raw: Any = self.block(block_indent) if block_indent is not None and self.peek() == "\n" else None
            quoted_text = False
        else:
            quoted_text = self.peek() in "\"'"
            if tag in _TEXT_TAGS and self.peek() not in "\"'[{|>&*!":
                # the scalar's own text: base64 such as "0e00" or a !!str "1.0" is not a number first
                raw = self.plain(key=False, flow=block_indent is None)
            else:
                raw = self.flow(block_indent)
        return _apply_tag(tag, raw, quoted_text, self)

    def flow_map(self) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        while True:
            self.skip_blank()
            if self.peek() == "}":
                self.i += 1
                return out
            key = self.key()
            self.skip_blank()
            value = None if self.peek() in (",", "}") else self.flow()
            if key in out:
                raise self.error(f"duplicate key {key!r}")
            out[key] = value
            self.skip_blank()
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != "}":
                raise self.error("expected ',' or '}' in a flow mapping")

    def flow_seq(self) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        while True:
            self.skip_blank()
            if self.peek() == "]":
                self.i += 1
                return out
            out.append(self.flow())
            self.skip_blank()
            if self.peek() == ",":
                self.i += 1
            elif self.peek() != "]":
                raise self.error("expected ',' or ']' in a flow sequence")

    def plain(self, key: bool, flow: bool = True) -> str:
        s, i = self.s, self.i
        start = i
        stops = ",]}" if flow or key else ""
        while i < len(s):
            ch = s[i]
            if ch == "\n" or ch in stops:
                break
            ends_key = i + 1 >= len(s) or s[i + 1] in " \t\n" or (flow and s[i + 1] in ",]}")
            if ch == ":" and (key or flow) and ends_key:
                break
            if ch == "#" and i > start and s[i - 1] in " \t":
                break
            i += 1
        self.i = i
        return s[start:i].strip()

    def quoted(self) -> str:
        s, q = self.s, self.peek()
        i = self.i + 1
        out: list[str] = []
        while True:
            if i >= len(s):
                raise self.error("unterminated quoted string")
            ch = s[i]
            if ch == q:
                if q == "'" and s[i + 1 : i + 2] == "'":
                    out.append("'")
                    i += 2
                    continue
                break
            if ch == "\\" and q == '"':
                e = s[i + 1 : i + 2]
                if e in _HEX_ESCAPES:
                    n = _HEX_ESCAPES[e]
                    digits = s[i + 2 : i + 2 + n]
                    if len(digits) != n or not all(c in "0123456789abcdefABCDEF" for c in digits):
                        self.i = i
                        raise self.error(f"bad \\{e} escape")
                    out.append(chr(int(digits, 16)))
                    i += 2 + n
                    continue
                if e not in _UNESCAPE:
                    self.i = i
                    raise self.error(f"unknown escape \\{e}")
                out.append(_UNESCAPE[e])
                i += 2
                continue
            out.append(ch)
            i += 1
        self.i = i + 1
        text = "".join(out)
        # Java escapes characters beyond the BMP as two \u surrogates: join them again
        return (
            text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
            if _has_surrogate(text)
            else text
        )


def _has_surrogate(s: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in s)


_TEXT_TAGS = frozenset({"!binary", "!str", "!string"})  # (after the leading '!' was cut) text by nature


def _apply_tag(tag: str, raw: Any, quoted_text: bool, p: _Parser) -> Any:
    if tag == "!null":  # "!!null" after the leading '!' was cut
        return None
    if tag == "!binary":
        try:
            return base64.b64decode(str(raw or ""), validate=True)
        except ValueError as exc:
            raise p.error(f"bad !!binary data: {exc}") from None
    if tag in ("!str", "!string"):
        return "" if raw is None else raw if isinstance(raw, str) else _plain_of(raw)
    if tag in ("!int", "int", "byte", "short", "long", "!!int"):
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise p.error(f"!{tag} needs an integer, got {raw!r}")
        try:
            return int(raw)
        except ValueError:
            raise p.error(f"!{tag} needs an integer, got {raw!r}") from None
    if tag in ("!float", "float", "double"):
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise p.error(f"!{tag} needs a number, got {raw!r}") from None
    if tag == "!bool":
        if isinstance(raw, bool):
            return raw
        raise p.error(f"!!bool needs true or false, got {raw!r}")
    if tag == "type":
        if not isinstance(raw, str):
            raise p.error("!type needs a class name")
        return TypeLiteral(raw)
    if tag.startswith("!"):
        raise p.error(f"unknown YAML tag !{tag}")
    return Typed(tag, raw)


def _plain_of(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


_DOC_LINE = re.compile(r"(---|\.\.\.)(\s|$)")
_DOCUMENT_MARKERS = frozenset({"!!data", "!!meta-data", "!!not-ready-data", "!!not-ready-meta-data"})


def from_yaml_all(text: str, max_document: int = MAX_YAML_DOCUMENT) -> list[Any]:
    """Every document in `text` (separated by `---` lines, optionally ended by `...`).

    Empty documents (only comments) are left out, so a file of commented method calls reads as
    just the calls. A document longer than `max_document` characters is a WireError before it is
    parsed (a stream of many documents may be as long as it likes).
    """
    docs: list[Any] = []
    chunk: list[str] = []
    start, tag = 0, ""
    for n, line in enumerate([*text.replace("\r\n", "\n").split("\n"), "---"]):
        if not _DOC_LINE.match(line):
            chunk.append(line)
            continue
        body = "\n".join(chunk)
        if len(body) > max_document:
            raise WireError(f"YAML document at line {start + 1} holds {len(body)} characters, more than "
                            f"{max_document}")
        p = _Parser(body, start)
        p.skip_blank()
        if p.i < len(body) or tag:
            try:
                value = p.document()
            except WireError as e:  # numbered as the documents returned (empty ones are left out)
                raise WireError(f"document {len(docs) + 1}: {e}") from None
            docs.append(Typed(tag, value) if tag else value)
        chunk, start, tag = [], n + 1, ""
        rest = line[3:].strip() if line.startswith("---") else ""
        if rest.startswith("!") and not rest.startswith("!!"):  # "--- !Type" tags the document
            tag, _, rest = rest[1:].partition(" ")
            rest = rest.strip()
        marker, _, after = rest.partition(" ")
        if marker in _DOCUMENT_MARKERS:  # Chronicle's dumps: "--- !!data #binary", "--- !!meta-data"
            rest = after.strip()
        if rest and not rest.startswith("#"):  # "--- value" on the separator line (any other tag is its
            chunk.append(" " * 4 + rest)  # own: an unknown one is refused, never dropped)
            start = n
    return docs


def from_yaml(text: str, type: Any = None, max_size: int = MAX_YAML_DOCUMENT) -> Any:
    """The one document in `text` (None for an empty text); with `type`, converted by msgspec
    (msgspec Structs, attrs classes, dataclasses, builtins). A text longer than `max_size` characters
    is a WireError before anything is parsed."""
    if len(text) > max_size:
        raise WireError(f"YAML text of {len(text)} characters is longer than {max_size}")
    docs = from_yaml_all(text, max_size)
    if len(docs) > 1:
        raise WireError(f"expected one YAML document, found {len(docs)}; use from_yaml_all")
    value = docs[0] if docs else None
    if type is None:
        return value
    try:
        return msgspec.convert(value, type, strict=False)
    except msgspec.ValidationError as exc:
        raise WireError(f"YAML value does not fit {getattr(type, '__name__', type)}: {exc}") from exc


__all__ = [
    "MAX_YAML_DOCUMENT",
    "from_yaml",
    "from_yaml_all",
    "java_double",
    "java_double_to_string",
    "json_value",
    "looks_binary",
    "quote",
    "render",
    "to_json",
    "to_yaml",
    "to_yaml_all",
]
