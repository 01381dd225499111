"""Audit findings on the Spark source: null arguments, chained calls, v4 queues, the plot extra.

Most checks call the decoding, listing and planning functions directly (the code every executor
runs); the Spark-marked ones go through a real local session.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
import rpc
import wire
from chronq.errors import ChronqError
from chronq.spark import _files, _plan
from chronq.spark._decode import decode_row, encode_call
from chronq.spark.source import _arrow_field, read_range
from tests.conftest import require_vectors


class Say(Protocol):
    def say(self, text: str) -> None: ...


@rpc.interface
class Calls(Protocol):
    def maybe(self, qty: int | None) -> None: ...
    def nothing(self) -> None: ...
    def pair(self, qty: int, note: str | None) -> None: ...
    def to(self, desk: str) -> Say: ...


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def maybe(self, qty: int | None) -> None:
        self.calls.append(("maybe", (qty,)))

    def nothing(self) -> None:
        self.calls.append(("nothing", ()))

    def pair(self, qty: int, note: str | None) -> None:
        self.calls.append(("pair", (qty, note)))

    def to(self, desk: str) -> Heard:
        self.calls.append(("to", (desk,)))
        return self

    def say(self, text: str) -> None:
        self.calls.append(("say", (text,)))


def written_by_rpc(call: Any) -> bytes:
    """The one document ``call(writer)`` appends through rpc's method writer."""
    with tempfile.TemporaryDirectory() as d, chronq.open(d) as q:
        call(rpc.writer(q, Calls))
        ex = q.tailer().read()
        assert ex is not None
        return bytes(ex.payload)


def heard(body: bytes) -> list[tuple[str, tuple[Any, ...]]]:
    handler = Heard()
    rpc.reader(None, handler, interfaces=[Calls]).dispatch(body)
    return handler.calls


# ----------------------------------------------------------------------------------------- 1: null argument


def test_a_null_argument_is_written_as_the_method_writer_writes_it() -> None:
    java_like = written_by_rpc(lambda w: w.maybe(None))
    assert java_like.endswith(b"\xbb")  # BINARY null, not an empty text
    assert encode_call("maybe", {"maybe": {"qty": None}, "nothing": None}) == java_like  # typed args
    assert encode_call("maybe", "null") == java_like  # JSON args
    assert heard(encode_call("maybe", "null")) == [("maybe", (None,))]
    assert encode_call("pair", '[3, null]') == written_by_rpc(lambda w: w.pair(3, None))


def test_a_call_without_arguments_is_written_and_read_as_null_args() -> None:
    java_like = written_by_rpc(lambda w: w.nothing())
    assert encode_call("nothing", None) == java_like
    assert encode_call("nothing", {"nothing": {}}) == java_like
    assert decode_row(java_like)[:2] == ("nothing", None)
    assert decode_row(written_by_rpc(lambda w: w.maybe(None)))[:2] == ("maybe", "null")


# ----------------------------------------------------------------------------------------- 2: chained calls


def test_a_chained_call_reads_as_dotted_steps_and_writes_back_the_same_bytes() -> None:
    body = written_by_rpc(lambda w: w.to("fx").say("hello"))
    method, args, _ = decode_row(body)
    assert (method, json.loads(args or "")) == ("to.say", ["fx", "hello"])
    assert encode_call(method, args) == body
    assert heard(encode_call(method, args)) == [("to", ("fx",)), ("say", ("hello",))]


def test_a_chain_with_a_repeated_step_keeps_every_step() -> None:
    w = wire.binary.Writer()
    for name, value in (("at", 1), ("at", 2), ("say", "x")):
        w.event_name(name)
        w.value(value)
    body = w.getvalue()
    method, args, _ = decode_row(body)
    assert (method, json.loads(args or "")) == ("at.at.say", [1, 2, "x"])
    assert encode_call(method, args) == body


def test_a_damaged_call_reads_as_no_call() -> None:
    body = written_by_rpc(lambda w: w.pair(3, "x"))
    for cut in range(1, len(body)):
        method, args, _ = decode_row(body[:cut])
        assert args is None or method is not None, cut  # never args without a method, never an exception
    assert decode_row(body[:-1])[:2] == (None, None)


def test_chained_write_refuses_args_that_do_not_match_the_steps() -> None:
    with pytest.raises(ChronqError, match="2 steps"):
        encode_call("to.say", '["fx"]')
    with pytest.raises(ChronqError, match="2 steps"):
        encode_call("to.say", None)


# Integral doubles are left out: wire writes them compactly as integers (as Java does), so JSON gives
# them back as integers, which write back as integer codes (the same number to a Java reader).
_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
            | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(st.characters(codec="ascii", exclude_characters="\0"),
                                                 min_size=1, max_size=4), inner, max_size=3), max_leaves=6)
_NAMES = st.text(st.characters(categories=("Ll",), max_codepoint=0x7F), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), min_size=1, max_size=3))
def test_decoded_method_rows_write_back_to_the_same_bytes(events: list[tuple[str, Any]]) -> None:
    w = wire.binary.Writer()
    for name, value in events:
        w.event_name(name)
        w.value(value)
    body = w.getvalue()
    method, args, _ = decode_row(body)
    assert method == ".".join(name for name, _ in events)
    assert encode_call(method, args) == body


# --------------------------------------------------------------------------------------------- 3: v4 queues

V4_DOCS = [b"first v4 message", b"x", b"", b"\x8f", b"third, after an odd length"]


def v4_queue(tmp_path: Path, listing: bool) -> tuple[Path, list[int]]:
    """A Chronicle 4.x queue: the real 4.x cycle header (tr2: roll in the header, no alignment), then
    documents back to back where its EOF marker was; with ``listing``, a 4.x ``directory-listing.cq4t``."""
    tr2 = require_vectors() / "upstream" / "chronicle-queue" / "tr2"
    queue = tmp_path / "v4"
    queue.mkdir()
    data = bytearray((tr2 / "20170320.cq4").read_bytes())
    at, positions = 442, []
    assert data[at:at + 4] == b"\x00\x00\x00\xc0"  # the header's EOF marker
    for body in V4_DOCS:
        stored = body or b"\x8f"  # Chronicle stores an empty message as one padding byte
        positions.append(at)
        data[at:at + 4] = len(stored).to_bytes(4, "little")
        data[at + 4:at + 4 + len(stored)] = stored
        at += 4 + len(stored)
    (queue / "20170320.cq4").write_bytes(bytes(data))
    if listing:
        w = wire.binary.Writer(base=4)
        w.event_name("header")
        w.type_prefix("STStore")
        token = w.begin()
        w.field("wireType")
        w.type_prefix("WireType")
        w.text("BINARY_LIGHT")
        w.end(token)
        doc = (0x4000_0000 | len(w)).to_bytes(4, "little") + w.getvalue()
        (queue / "directory-listing.cq4t").write_bytes(doc + bytes(65536 - len(doc)))
    return queue, positions


def core_tailer(queue: Path, **open_args: Any) -> list[tuple[int, bytes]]:
    with chronq.open(queue, readonly=True, **open_args) as q:
        t = q.tailer()
        out = []
        while (ex := t.read()) is not None:
            out.append((ex.index, bytes(ex.payload)))
        return out


def executor_rows(queue: Path) -> list[dict[str, Any]]:
    """Every row the source's partitions yield, planned and read as the driver and executors do."""
    names = ["index", "cycle", "seq", "position", "metadata", "payload"]
    import pyarrow as pa

    schema = pa.schema([_arrow_field(n) for n in names])
    rows: list[dict[str, Any]] = []
    for state in _plan.snapshot(str(queue)):
        for rng in _plan.ranges(state, 0, state.count, 2):
            for batch in read_range(rng, names, schema, False, 3):
                rows.extend(batch.to_pylist())
    return rows


def test_a_v4_queue_without_table_store_takes_its_roll_from_the_cycle_header() -> None:
    tr2 = require_vectors() / "upstream" / "chronicle-queue" / "tr2"
    roll = _files.read_roll(str(tr2))
    assert (roll.format, roll.length_ms, roll.epoch) == ("yyyyMMdd", 86_400_000, 0)
    assert [(c.cycle, Path(c.path).name) for c in _files.list_cycles(str(tr2))] == [(17245, "20170320.cq4")]
    assert executor_rows(tr2) == []  # a header and an EOF marker: nothing to read, and no error
    assert core_tailer(tr2, roll_cycle="DAILY") == []


@pytest.mark.parametrize("listing", [False, True], ids=["no-table-store", "directory-listing"])
def test_a_v4_queue_with_messages_reads_like_the_core_tailer(tmp_path: Path, listing: bool) -> None:
    queue, positions = v4_queue(tmp_path, listing)
    rows = executor_rows(queue)
    want = [(p, s, 17245, b"" if b == b"\x8f" else b)  # Chronicle stores an empty message as 0x8F
            for s, (p, b) in enumerate(zip(positions, V4_DOCS, strict=True))]
    assert [(r["position"], r["seq"], r["cycle"], bytes(r["payload"])) for r in rows] == want
    assert [(r["index"], bytes(r["payload"])) for r in rows] == core_tailer(queue, roll_cycle="DAILY")


def test_a_directory_without_table_store_or_cycle_header_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(ChronqError, match="not a queue directory"):
        _files.read_roll(str(tmp_path))
    (tmp_path / "20170320.cq4").write_bytes(bytes(4096))  # created, header not written yet
    with pytest.raises(ChronqError, match="not a queue directory"):
        _files.read_roll(str(tmp_path))


@pytest.mark.spark
def test_spark_reads_a_v4_queue(tmp_path: Path) -> None:
    from tests.spark_support import spark_session

    queue, _ = v4_queue(tmp_path, listing=False)
    df = spark_session().read.format("chronq").load(str(queue)).orderBy("index")
    assert [(r["index"], bytes(r.payload)) for r in df.collect()] == core_tailer(queue, roll_cycle="DAILY")


# ---------------------------------------------------------------------------------------- 4: the plot extra


def test_a_plot_without_matplotlib_fails_before_any_spark_work(tmp_path: Path) -> None:
    """In a real interpreter where matplotlib cannot be imported (as with only ``chronq[spark]``)."""
    script = textwrap.dedent("""
        import sys
        sys.modules["matplotlib"] = None  # what an interpreter without it gives: ImportError
        from pyspark import SparkContext
        from chronq.errors import ChronqError
        from chronq.spark.latency import report
        try:
            report(["in", "out"], sys.argv[1])
        except ChronqError as e:
            print("error:", e)
        print("spark started:", SparkContext._active_spark_context is not None)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120, check=True)
    assert "error:" in done.stdout and "chronq[plot]" in done.stdout, done.stdout + done.stderr
    assert "spark started: False" in done.stdout
    assert not (tmp_path / "out").exists()


class Forward:
    def __init__(self, out: Any) -> None:
        self.out = rpc.writer(out, Calls)

    def maybe(self, qty: int | None) -> None:
        self.out.maybe(qty)


@pytest.mark.spark
def test_report_without_plot_needs_no_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chronq.spark.latency import report
    from tests.spark_support import spark_session

    spark = spark_session()
    paths = [tmp_path / "in", tmp_path / "out"]
    with chronq.open(paths[0], source_id=1) as q0, chronq.open(paths[1], source_id=2) as q1:
        w = rpc.writer(q0, Calls)
        for n in range(50):
            w.maybe(n)
        assert rpc.Service(q0, q1, Forward, 2, start=rpc.Start.ALL).run(until_idle=True) == 50
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ChronqError, match=r"chronq\[plot\]"):
        report(paths, tmp_path / "rep", spark=spark)
    rep = report(paths, tmp_path / "rep", spark=spark, plot=False)
    assert rep.png_path is None and rep.hops[0].messages == rep.hops[0].matched == 50
    assert sorted(p.name for p in rep.files) == ["latency.csv", "latency.parquet", "throughput.csv"]
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == sorted(p.name for p in rep.files)
