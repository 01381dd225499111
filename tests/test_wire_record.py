"""wire.record: positional values built with `Appender.record()` and read with `Excerpt.record()` (or a
precompiled `Layout`), as Chronicle BINARY values without field names, so Java's ValueIn reads them."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
from wire import WireError
from wire.record import KINDS, Layout, RecordReader, RecordWriter

VECTORS = Path(__file__).parent / "vectors" / "fieldless" / "documents.tsv"


def java_record() -> bytes:
    for line in VECTORS.read_text().splitlines():
        if line.startswith("record:values\t"):
            return bytes.fromhex(line.split("\t")[1])
    raise AssertionError("no record:values vector")


JAVA_VALUES = (
    1,
    1 << 40,
    2.5,
    "x",
    True,
    Decimal("0.10"),
    Decimal("-12345678901234567890.123456789"),
    Decimal("1E+3"),
)
JAVA_KINDS = ("int32", "int64", "float64", "text", "boolean", "decimal", "decimal", "decimal")


def test_reads_what_java_value_out_writes():
    """Java's compact BINARY (an int64 as a float32, a double as a stop-bit float) reads the same."""
    r = RecordReader(java_record())
    got = tuple(getattr(r, k)() for k in JAVA_KINDS)
    assert got == JAVA_VALUES
    assert str(got[5]) == "0.10" and str(got[7]) == "1E+3"  # the scale too
    assert not r.has_more()
    assert Layout(*JAVA_KINDS).unpack(java_record()) == JAVA_VALUES


def test_decimal_text_is_what_java_writes_for_big_decimal():
    """Java's BigDecimal.toString() is the text after the E4 code in the Java vector."""
    w = RecordWriter()
    for d in JAVA_VALUES[5:]:
        w.decimal(d)
    assert w.getvalue() in java_record()


def test_builder_and_reader_through_a_queue(tmp_path):
    with chronq.open(tmp_path / "q") as q:
        a = q.appender()
        with a.record() as r:
            r.int32(1).decimal(Decimal("0.10")).text("x")
        with pytest.raises(RuntimeError), a.record() as r:
            r.int32(2)
            raise RuntimeError("dropped: nothing is appended")
        t = q.tailer()
        ex = t.read()
        rec = ex.record()
        assert (rec.int32(), rec.decimal(), rec.text()) == (1, Decimal("0.10"), "x")
        assert not rec.has_more()
        assert t.read() is None


@pytest.mark.parametrize(
    ("write", "read", "message"),
    [
        (lambda w: w.text("x"), "int32", "record value 0: expected int32, found text"),
        (lambda w: w.int32(1), "text", "record value 0: expected text, found an integer"),
        (lambda w: w.float64(1.5), "int64", "record value 0: expected int64, found the float 1.5"),
        (lambda w: w.int64(1 << 40), "int32", "record value 0: expected int32, found 1099511627776, out of"),
        (lambda w: w.text("abc"), "decimal", "record value 0: expected decimal, found the text 'abc'"),
        (lambda w: w.int32(0), "boolean", "record value 0: expected boolean, found an integer"),
        (lambda w: w.boolean(True), "float64", "record value 0: expected float64, found a boolean"),
        (lambda w: None, "int32", "record value 0: expected int32, found the end of the record"),
    ],
)
def test_reading_the_wrong_kind_names_position_and_both_kinds(write, read, message):
    w = RecordWriter()
    write(w)
    with pytest.raises(WireError, match=message) as info:
        getattr(RecordReader(w.getvalue()), read)()
    assert info.value.offset == 0


def test_the_position_is_the_values_index_and_byte_offset():
    data = RecordWriter().int32(1).int64(2).text("x").getvalue()
    r = RecordReader(data)
    r.int32()
    r.int64()
    with pytest.raises(WireError, match=r"record value 2: expected float64, found text \(at offset 14\)"):
        r.float64()
    with pytest.raises(WireError, match="record value 2"):
        Layout("int32", "int64", "float64").unpack(data)


@pytest.mark.parametrize(
    ("kind", "value"),
    [("int32", 1 << 31), ("int64", 1 << 63), ("decimal", Decimal("NaN")), ("decimal", 1.5), ("text", 5)],
)
def test_values_a_kind_cannot_hold_are_refused(kind, value):
    with pytest.raises(WireError):
        getattr(RecordWriter(), kind)(value)
    with pytest.raises(WireError):
        Layout(kind).pack(value)


values = {
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float64": st.floats(allow_nan=False),
    "text": st.none() | st.text(max_size=50),
    "decimal": st.decimals(allow_nan=False, allow_infinity=False),
    "boolean": st.booleans(),
}
records = st.lists(st.sampled_from(KINDS), min_size=1, max_size=8).flatmap(
    lambda kinds: st.tuples(st.just(tuple(kinds)), st.tuples(*(values[k] for k in kinds)))
)


def _same(a: object, b: object) -> bool:
    """Equal, and for decimals the same digits and exponent (so 0.10 is not 0.1)."""
    if isinstance(a, Decimal):
        return isinstance(b, Decimal) and a.as_tuple() == b.as_tuple()
    return a == b and type(a) is type(b)


@settings(max_examples=300, deadline=None)
@given(record=records)
def test_round_trip_exactly(record):
    kinds, vals = record
    w = RecordWriter()
    for k, v in zip(kinds, vals, strict=True):
        getattr(w, k)(v)
    data = w.getvalue()
    layout = Layout(*kinds)
    assert layout.pack(*vals) == data
    r = RecordReader(data)
    for got in (tuple(getattr(r, k)() for k in kinds), layout.unpack(data), layout.unpack(memoryview(data))):
        assert all(_same(g, v) for g, v in zip(got, vals, strict=True)), (got, vals)
    assert not r.has_more()


@settings(max_examples=200, deadline=None)
@given(record=records, cut=st.integers(min_value=1, max_value=40))
def test_truncated_records_are_wire_errors(record, cut):
    kinds, vals = record
    data = Layout(*kinds).pack(*vals)
    short = data[: max(0, len(data) - cut)]
    try:
        got = Layout(*kinds).unpack(short)
    except WireError:
        return
    raise AssertionError(f"{short.hex()} read as {got}")


@pytest.mark.interop
def test_java_reads_the_records_as_positional_values(tmp_path):
    from tests.test_java_interop import java

    with chronq.open(tmp_path / "q") as q:
        a = q.appender()
        with a.record() as r:
            r.int32(-7).int64(1 << 40).float64(0.1).text("\u00e9t\u00e9").boolean(False)
            r.decimal(Decimal("-12345678901234567890.123456789"))
        a.write(Layout("int32", "decimal", "text").pack(1, Decimal("1E+3"), None))
    java("list", tmp_path / "q", tmp_path / "java.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "java.jsonl").read_text().splitlines()]
    data = [json.loads("[" + row["json"] + "]") for row in rows if not row["metadata"]]
    assert data == [
        [-7, 1 << 40, 0.1, "\u00e9t\u00e9", False, "-12345678901234567890.123456789"],
        [1, "1E+3", None],
    ]


class _Dec(Decimal):
    """A Decimal subclass: the writer takes it as a Decimal, the compiled paths hand it over."""


def test_decimals_round_trip_with_sign_exponent_and_negative_zero():
    layout = Layout("decimal")
    for text in ("-0", "-0.00", "0E+5", "0.10", "-1.5E-7", "123456789012345678901234567890.5",
                 "1E+2147483648", "1E-2147483647", "-9.99E+99"):
        d = Decimal(text)
        data = layout.pack(d)
        assert data == RecordWriter().decimal(d).getvalue()
        (got,) = layout.unpack(data)
        assert got.as_tuple() == d.as_tuple() and str(got) == text
        r = RecordReader(data)
        assert r.decimal().as_tuple() == d.as_tuple()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Decimal("NaN"), "NaN has no Java BigDecimal: a record decimal must be finite"),
        (Decimal("NaN123"), "NaN123 has no Java BigDecimal"),
        (Decimal("-sNaN"), "-sNaN has no Java BigDecimal"),
        (Decimal("-Infinity"), "-Infinity has no Java BigDecimal"),
        (Decimal("1E+2147483649"), r"exponent 2147483649 is outside -2147483647\.\.2147483648"),
        (Decimal("1E-2147483648"), r"exponent -2147483648 is outside"),
        (1.5, "a record decimal must be a decimal.Decimal, not float"),
    ],
)
def test_decimals_a_big_decimal_cannot_hold_are_refused_clearly(value, message):
    with pytest.raises(WireError, match=message):
        RecordWriter().decimal(value)
    with pytest.raises(WireError, match=message):
        Layout("decimal").pack(value)
    with pytest.raises(WireError, match=message):
        Layout("int32", "decimal").pack(1, value)


accelerated = pytest.mark.skipif(not Layout("int32").accelerated, reason="wire has no C accelerator")


def _outcome(f, *args):
    """What a call gives, comparable across paths: the values' types and reprs (a Decimal's repr
    keeps its exponent, a float's the sign of zero), or the error's type and message."""
    try:
        got = f(*args)
    except Exception as e:
        return ("raised", type(e).__name__, str(e))
    if isinstance(got, tuple):
        return ("values", tuple((type(v).__name__, repr(v)) for v in got))
    return ("bytes", got)


wide = {
    "int32": st.integers(-(2**33), 2**33) | st.booleans() | st.floats(),
    "int64": st.integers(-(2**65), 2**65) | st.booleans(),
    "float64": st.floats() | st.integers(-(2**64), 2**64) | st.text(max_size=2),
    "text": st.none() | st.text(st.characters(blacklist_categories=()), max_size=40) | st.integers(),
    "decimal": st.decimals()
    | st.sampled_from(
        [Decimal("-0"), Decimal("1E+2147483649"), Decimal("NaN7"), Decimal("-sNaN"), _Dec("2.50")]
    )
    | st.floats(),
    "boolean": st.booleans() | st.integers(-1, 1) | st.none(),
}
wide_records = st.lists(st.sampled_from(KINDS), min_size=1, max_size=7).flatmap(
    lambda kinds: st.tuples(st.just(tuple(kinds)), st.tuples(*(wide[k] for k in kinds)))
)


def _writer(kinds, vals):
    w = RecordWriter()
    for k, v in zip(kinds, vals, strict=True):
        getattr(w, k)(v)
    return w.getvalue()


@accelerated
@settings(max_examples=500, deadline=None)
@given(record=wide_records)
def test_c_pack_is_the_python_pack(record):
    """The C `pack`, the compiled Python `pack` and the builder: the same bytes or the same error."""
    kinds, vals = record
    layout = Layout(*kinds)
    c = _outcome(layout.pack, *vals)
    assert c == _outcome(layout._compile_pack(), *vals) == _outcome(_writer, kinds, vals)


def _reader(kinds, data):
    r = RecordReader(data)
    return tuple(getattr(r, k)() for k in kinds)


decimal_texts = st.sampled_from(
    ["1e3", "+1", " 1", "1_0", "\u0661", "NaN1", "nan", "-Infinity", "1E+9999999999", "1E+123456789", ".5",
     "5.", "-", "E5", "1.2.3", "-0", "00.100", "1e", "1e+", "\u00e9"]
)


@st.composite
def record_bytes(draw):
    """Bytes a layout reads: a valid record of the layout's kinds, with a decimal text of any kind,
    then maybe a byte overwritten, or cut short, or with bytes after it."""
    kinds, vals = draw(records)
    data = bytearray(_writer(kinds, vals))
    if "decimal" in kinds and draw(st.booleans()):
        text = draw(decimal_texts).encode()
        data = bytearray(_writer(kinds[: kinds.index("decimal")], vals[: kinds.index("decimal")]))
        data += bytes((0xE0 + len(text),)) + text
        kinds = kinds[: kinds.index("decimal") + 1]
    how = draw(st.sampled_from(["as is", "byte", "cut", "more"]))
    if how == "byte" and data:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "more":
        data += draw(st.binary(max_size=4))
    return kinds, bytes(data)


@accelerated
@settings(max_examples=500, deadline=None)
@given(case=record_bytes())
def test_c_unpack_is_the_python_unpack(case):
    """The C `unpack`, the compiled Python `unpack` and the reader: the same values or the same error."""
    kinds, data = case
    layout = Layout(*kinds)
    c = _outcome(layout.unpack, data)
    assert c == _outcome(layout._compile_unpack(), data) == _outcome(layout.unpack, memoryview(data))
    reader = _outcome(_reader, kinds, data)
    assert c == reader
