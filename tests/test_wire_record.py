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
