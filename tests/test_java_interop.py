"""Differential tests against real Java Chronicle Queue 5.26ea (`../shared/java/run.sh`).

chronq writes the queues; Java lists every document (compared with `chronq dump --json` row by row),
resumes chronq's named tailers, dispatches chronq's rpc calls with its MethodReader and appends, and
chronq reads and appends after what Java wrote. Every run.sh call starts a JVM (about 1.5 s), so each test
fills one queue with many kinds of document and asks Java once per mode.

Marked `interop`: run by `make test-interop`, not by the default `make test`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest

import chronq
import rpc
from chronq.rollcycles import ROLL_CYCLES, FixedClock, RollCycle
from tests.conftest import skip_unless_strict
from wire import binary

pytestmark = pytest.mark.interop

RUN_SH = Path(__file__).resolve().parents[2] / "shared" / "java" / "run.sh"
T0 = int(dt.datetime(2024, 1, 15, 10, tzinfo=dt.UTC).timestamp() * 1000)
MINUTE, HOUR = 60_000, 3_600_000
# Chronicle's own metadata documents; chronq's dump renders their arrays differently from Java's JSON
STORE_METADATA = {"header", "index2index", "index"}


# -- calling Java ------------------------------------------------------------------------------------------
def java(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    """run.sh MODE ARGS...; skips (fails under CHRONQ_STRICT=1) when Java or the tool is absent."""
    if not RUN_SH.is_file():
        skip_unless_strict(f"Java interop tool not found at {RUN_SH} (../shared/java is absent)")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        skip_unless_strict("no java on PATH: the Java interop tests need a JDK 17+")
    p = subprocess.run([str(RUN_SH), *map(str, args)], capture_output=True, text=True, timeout=300)
    if p.returncode == 3:  # a prerequisite is missing; the last stderr line says which
        skip_unless_strict("Java interop: " + p.stderr.strip().splitlines()[-1])
    if check and p.returncode != 0:
        pytest.fail(f"run.sh {args[0]} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}",
                    pytrace=False)
    return p


def chronicle_value(rendering: str | None) -> Any:
    """Chronicle's JSON rendering of a document body (`"k":v,...`) as a Python value (None if raw)."""
    if rendering is None:
        return None
    text, depth, in_str, esc = "{" + rendering + "}", 0, False, False
    for ch in text:  # Chronicle 5.26 leaves typed objects ({"@Type":{...) unclosed: count and close them
        if in_str:
            in_str, esc = (esc or ch != '"'), (not esc and ch == "\\")
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    text += "}" * depth
    text = re.sub(r"(?<![\w.\"])0x([0-9a-fA-F]+)", lambda m: str(int(m.group(1), 16)), text)  # int64_0x
    try:
        return json.loads(text)
    except json.JSONDecodeError:  # a body that is one bare value, no field (a raw 0xE0 is the text "")
        return json.loads(text[1:-1])


def comparable(value: Any) -> Any:
    """A decoded value as both renderings must agree on it. Type tags go: Chronicle renders a typed
    object as ``{"@Type": {...}}``, chronq's dump as ``{"@type": "Type", ...}``. Floats keep 15
    significant digits: Chronicle's JSON prints a double rounded to that (0.00030000000000000003 comes
    out as 0.0003) although the bytes, compared by sha256, hold every bit."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)).startswith("@") and isinstance(next(iter(value.values())),
                                                                                 dict):
            return comparable(next(iter(value.values())))
        return {k: comparable(v) for k, v in value.items() if k != "@type"}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.15g}")
    return value


def list_summary(stdout: str) -> dict[str, str]:
    """The `key=value` words of `run.sh list`'s summary line."""
    line = stdout.strip().splitlines()[-1]
    assert line.endswith(" OK"), line
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def chronq_dump(qdir: Path) -> list[dict[str, Any]]:
    """`chronq dump --json` of the queue's cycle files, as the command line prints it."""
    p = subprocess.run([sys.executable, "-m", "chronq", "dump", "--json", str(qdir)],
                       capture_output=True, text=True, timeout=120, check=True)
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    return [r for r in rows if r["file"].endswith(".cq4")]


def assert_java_lists_as_chronq_dumps(qdir: Path, out: Path) -> list[dict[str, Any]]:
    """Java's `list` and chronq's dump show the same documents, Java's counts agree with chronq's, and
    chronq's tailer reads the data in Java's order. Returns Java's rows."""
    p = java("list", qdir, out)
    summary = list_summary(p.stdout)
    theirs = [json.loads(line) for line in out.read_text().splitlines()]
    ours = {(Path(r["file"]).name, r["position"]): r for r in chronq_dump(qdir)}
    assert sorted((r["file"], r["position"]) for r in theirs) == sorted(ours)
    for j in theirs:
        where = f"{j['file']}@{j['position']}"
        c = ours[j["file"], j["position"]]
        assert (j["metadata"], j["length"], j["sha256"]) == (
            c["metadata"], c["length"], c["body_sha256"]), where
        if j["metadata"]:  # Java's index there is that of the next data document; chronq shows none
            if not (isinstance(c["value"], dict) and STORE_METADATA & c["value"].keys()):
                assert comparable(chronicle_value(j["json"])) == comparable(c["value"]), where
            continue
        assert (j["index"], j["cycle"], j["seq"]) == (c["index"], c["cycle"], c["seq"]), where
        if j["json"] is None:  # raw bytes: neither side decodes them
            assert c["value"] is None, where
        else:
            assert comparable(chronicle_value(j["json"])) == comparable(c["value"]), where

    data = [j["index"] for j in theirs if not j["metadata"]]
    assert data == sorted(data) and len(set(data)) == len(data)
    with chronq.open(qdir, readonly=True) as q:
        first, last = q.first_index, q.last_index
        t = q.tailer()
        assert [ex.index for ex in iter(t.read, None)] == data
    assert data and (first, last) == (data[0], data[-1])
    assert summary["entryCount"] == str(len(data))
    assert {k: int(summary[k], 16) for k in ("firstIndex", "lastIndex", "tailerFirst", "tailerLast")} == {
        "firstIndex": first, "lastIndex": last, "tailerFirst": first, "tailerLast": last}
    return theirs


def read_values(qdir: Path, indexes: list[int]) -> list[tuple[int, Any]]:
    """(index, decoded document) chronq reads at each of `indexes`, moving a tailer to each one."""
    got = []
    with chronq.open(qdir, readonly=True) as q:
        t = q.tailer()
        for i in indexes:
            assert t.move_to_index(i), f"chronq cannot move to Java's index {i:#x}"
            ex = t.read()
            assert ex is not None, f"nothing at {i:#x}"
            got.append((ex.index, binary.decode_document(ex.bytes())))
    return got


# -- every roll cycle --------------------------------------------------------------------------------------
ROLL_CASES = [pytest.param(name, 0, id=name) for name in ROLL_CYCLES if name != "WEEKLY"] + [
    pytest.param("FAST_DAILY", 5 * HOUR, id="FAST_DAILY-epoch-5h"),
    pytest.param("FAST_HOURLY", 15 * MINUTE, id="FAST_HOURLY-epoch-15min"),
    pytest.param("DAILY", 90 * MINUTE, id="DAILY-epoch-90min"),
]  # WEEKLY is left out: Java 5.26 cannot reopen a WEEKLY queue, not even one it wrote itself


def _fill(a: Any, name: str, n: int) -> None:
    """n data documents: self-describing ones with every fifth a raw payload of 1-5 bytes."""
    for i in range(n):
        if i % 5 == 4:
            a.write(bytes(range(0xF1, 0xF1 + 1 + i // 5 % 5)))
        else:
            a.write_document({"rc": name, "i": i, "x": i / 8, "neg": -i * 1_000_003})


@pytest.mark.parametrize(("name", "epoch"), ROLL_CASES)
def test_java_lists_what_chronq_writes_in_every_roll_cycle(tmp_path: Path, name: str, epoch: int) -> None:
    rc: RollCycle = ROLL_CYCLES[name]
    per_array = rc.index_count * rc.index_spacing
    # TEST_DAILY (64 a cycle) is filled to its capacity; the TEST* cycles need several index arrays
    n = min(rc.max_messages_per_cycle, 300)
    clock = FixedClock(T0 + 1234)
    qdir = tmp_path / "q"
    with chronq.open(qdir, name, clock=clock, epoch=epoch) as q:
        a = q.appender()
        _fill(a, name, n)
        first_cycle = rc.cycle_at(clock.millis(), epoch)
        clock.advance(2 * rc.length_ms)  # the next cycle stays empty: a roll across a gap
        _fill(a, name, 3)
    names = sorted(p.name for p in qdir.glob("*.cq4"))
    assert names == sorted(rc.file_name(c, epoch) for c in (first_cycle, first_cycle + 2))

    rows = assert_java_lists_as_chronq_dumps(qdir, tmp_path / "java.jsonl")
    data = [r for r in rows if not r["metadata"]]
    assert [(r["cycle"], r["seq"]) for r in data] == [(first_cycle, s) for s in range(n)] + [
        (first_cycle + 2, s) for s in range(3)]
    arrays = [r for r in rows if r["file"] == rc.file_name(first_cycle, epoch) and r["metadata"]
              and (r["json"] or "").startswith('"index":')]
    assert len(arrays) == math.ceil(n / per_array)


# -- one queue of every kind of document: list, methods and tailers ----------------------------------------
class Trade(msgspec.Struct):
    symbol: str
    price: float
    quantity: int


class Trading(Protocol):
    def trade(self, t: Trade) -> None: ...
    def halt(self, symbol: str, reason: str) -> None: ...
    def ping(self) -> None: ...
    @rpc.method_id(7)
    def stamp(self, ts: int) -> None: ...


class Republisher(Trading):
    """Handles a trade by writing it on, as a service between two queues does."""

    def __init__(self, out: Trading) -> None:
        self.out = out

    def trade(self, t: Trade) -> None:
        self.out.trade(t)


def test_java_reads_documents_calls_and_tailers_chronq_wrote(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    clock = FixedClock(T0 + 5 * MINUTE)
    calls: list[tuple[int, str | None, Any, Any]] = []  # (index, method, args, history) Java must see
    with chronq.open(qdir, "FAST_HOURLY", clock=clock) as q:
        a = q.appender()
        for i in range(300):
            a.write_document({"n": i, "f": 1e-4 * i, "s": f"text {i}", "flag": i % 2 == 0})
        for n in range(6):  # raw payloads, empty up to shorter than any header Chronicle might look for
            a.write(bytes(range(0xE0, 0xE0 + n)))
        a.write_document({"big": "b" * (3 << 20)})  # more than chronq maps ahead of the write position
        with a.writing_document(metadata=True) as dc:
            dc.write(binary.encode_document({"user": "metadata", "n": 1}))
        with a.atomic():
            for i in range(3):
                a.write_document({"atomic": i})
        with a.writing_document(metadata=True) as dc:
            dc.write(binary.encode_document({"after": "atomic"}))

        w = rpc.writer(q, Trading)
        w.trade(Trade("EURUSD", 1.0875, 1_000_000))
        calls.append((a.last_index_appended, "trade", {"symbol": "EURUSD", "price": 1.0875,
                                                       "quantity": 1_000_000}, None))
        trade_index = a.last_index_appended
        w.halt("GBPUSD", "fat finger")
        calls.append((a.last_index_appended, "halt", ["GBPUSD", "fat finger"], None))
        w.ping()
        calls.append((a.last_index_appended, "ping", "", None))
        w.stamp(1_700_000_000)
        calls.append((a.last_index_appended, None, 1_700_000_000, None))
        last_of_first_hour = a.last_index_appended

        clock.advance(2 * HOUR)  # 12:05: hour 11 stays empty
        wh = rpc.writer(q, Trading, source_id=3, clock=iter([1000]).__next__)
        wh.halt("EURUSD", "history test")
        calls.append((a.last_index_appended, "halt", ["EURUSD", "history test"],
                      {"sources": [], "timings": [1000]}))
        # a service with source id 5 reads the trade and writes it on as source 6: the history then
        # holds the source it came from and both timings
        t = q.tailer()
        assert t.move_to_index(trade_index)
        hop = rpc.reader(t, Republisher(rpc.writer(q, Trading, source_id=6, clock=iter([2002]).__next__)),
                         source_id=5, clock=iter([2001]).__next__)
        assert hop.read_one()
        calls.append((a.last_index_appended, "trade", calls[0][2],
                      {"sources": [[5, trade_index]], "timings": [2001, 2002]}))
        for i in range(3):
            a.write_document({"after_gap": i})
        first, last = q.first_index, q.last_index
        assert first is not None and last is not None

        def named(name: str, reads: int | None) -> int:
            """Reads `reads` documents (None: all) with a named tailer; returns the index it stores."""
            t = q.tailer(name)
            if reads is None:
                while t.read() is not None:
                    pass
            for _ in range(reads or 0):
                assert t.read() is not None
            return int(t.index)

        stored = {
            "a.b": named("a.b", 3),
            "svc:in-1": named("svc:in-1", None),
            "end-of.hour:10": named("end-of.hour:10", 314),  # up to the last document of hour 10
            "gap.reader:2": named("gap.reader:2", 316),  # on into hour 12
            "replicated:feed": named("replicated:feed", 4),
        }
        q.tailer("never-moved")

    rows = assert_java_lists_as_chronq_dumps(qdir, tmp_path / "java.jsonl")
    user_meta = [chronicle_value(r["json"]) for r in rows if r["metadata"] and "user" in (r["json"] or "")]
    assert user_meta == [{"user": "metadata", "n": 1}]

    p = java("methods", qdir)
    assert "errors=0 OK" in p.stderr
    seen = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    ours = [(c["index"], c["method"], c["args"], c.get("history")) for c in seen
            if c["method"] in ("trade", "halt", "ping") or c.get("methodId") == 7]
    assert ours == calls
    assert [c["args"] for c in seen if c["method"] == "n"] == list(range(300))
    assert [c["args"] for c in seen if c["method"] == "atomic"] == [0, 1, 2]
    assert [len(c["args"]) for c in seen if c["method"] == "big"] == [3 << 20]

    p = java("tailers", qdir)
    resumed = {name: (int(index, 16), None if nxt == "none" else int(nxt, 16))
               for name, index, nxt in (line.split("\t") for line in p.stdout.splitlines())}
    data = [r["index"] for r in rows if not r["metadata"]]
    hour12 = data.index(last_of_first_hour) + 1
    assert resumed == {
        "a.b": (data[3], data[3]),
        "svc:in-1": (last + 1, None),
        "end-of.hour:10": (last_of_first_hour + 1, data[hour12]),
        "gap.reader:2": (data[hour12 + 2], data[hour12 + 2]),
        "replicated:feed": (data[4], data[4]),
        "never-moved": (0, first),  # stored 0: Java resumes at the first message, as chronq does
    }
    assert {name: index for name, (index, _) in resumed.items() if name != "never-moved"} == stored


# -- Java appends, chronq reads and appends after it, Java lists again --------------------------------------
def _java_append(qdir: Path, n: int, at: str | None = None) -> list[int]:
    p = java("append", qdir, n, *(("--at", at) if at else ()))
    return [int(x, 16) for x in p.stdout.split()]


def test_java_appends_at_fixed_times_and_chronq_carries_on(tmp_path: Path) -> None:
    rc = ROLL_CYCLES["FAST_HOURLY"]
    qdir = tmp_path / "q"
    clock = FixedClock(T0)  # 10:00
    with chronq.open(qdir, "FAST_HOURLY", clock=clock) as q:
        a = q.appender()
        for i in range(10):
            a.write_document({"chronq": i})
        last = a.last_index_appended
    hour10 = rc.cycle_at(T0)

    # an instant inside chronq's last cycle: Java extends chronq's file
    extend = _java_append(qdir, 3, "2024-01-15T10:30:00Z")
    assert extend == [last + 1, last + 2, last + 3]
    # a later instant: Java rolls, writing EOF into chronq's file
    rolled = _java_append(qdir, 2, "2024-01-15T13:00:00Z")
    assert rolled == [rc.to_index(hour10 + 3, 0), rc.to_index(hour10 + 3, 1)]
    assert read_values(qdir, extend + rolled) == [
        (i, {"javaAppend": n}) for i, n in zip(extend + rolled, [0, 1, 2, 0, 1], strict=True)]

    clock.set(T0 + 3 * HOUR + 10 * MINUTE)  # 13:10, in Java's cycle: chronq appends after Java
    with chronq.open(qdir, clock=clock) as q:
        a = q.appender()
        after = [a.write_document({"chronq_after": i}) for i in range(3)]
        clock.advance(2 * HOUR)  # 15:10: chronq rolls away from Java's file
        later = [a.write_document({"chronq_later": i}) for i in range(2)]
    assert after == [rc.to_index(hour10 + 3, s) for s in (2, 3, 4)]
    assert later == [rc.to_index(hour10 + 5, s) for s in (0, 1)]

    rows = assert_java_lists_as_chronq_dumps(qdir, tmp_path / "java.jsonl")
    assert [chronicle_value(r["json"]) for r in rows if not r["metadata"]] == (
        [{"chronq": i} for i in range(10)] + [{"javaAppend": i} for i in (0, 1, 2, 0, 1)]
        + [{"chronq_after": i} for i in range(3)] + [{"chronq_later": i} for i in range(2)])
    # and Java appends once more after chronq's roll
    again = _java_append(qdir, 1, "2024-01-15T15:20:00Z")
    assert again == [rc.to_index(hour10 + 5, 2)]
    assert read_values(qdir, again) == [(again[0], {"javaAppend": 0})]


def test_java_appends_on_its_own_clock_and_chronq_carries_on(tmp_path: Path) -> None:
    rc = ROLL_CYCLES["FAST_DAILY"]
    qdir = tmp_path / "q"
    with chronq.open(qdir, "FAST_DAILY", clock=FixedClock(T0)) as q:  # a day long past
        a = q.appender()
        for i in range(20):
            a.write_document({"old": i})
        last = a.last_index_appended

    today = [rc.cycle_at(int(dt.datetime.now(dt.UTC).timestamp() * 1000))]
    with chronq.open(qdir) as live:  # open while Java appends: its tailer sees Java's documents land
        tail = live.tailer()
        assert len(list(iter(tail.read, None))) == 20
        appended = _java_append(qdir, 4)  # Java rolls to today, writing EOF into chronq's file
        assert [(ex.index, binary.decode_document(ex.bytes())) for ex in iter(tail.read, None)] == [
            (i, {"javaAppend": n}) for n, i in enumerate(appended)]
    today.append(rc.cycle_at(int(dt.datetime.now(dt.UTC).timestamp() * 1000)))
    cycle = rc.split(appended[0])[0]
    assert cycle in today and cycle > rc.split(last)[0]
    assert appended == [rc.to_index(cycle, s) for s in range(4)]
    assert read_values(qdir, appended) == [(i, {"javaAppend": n}) for n, i in enumerate(appended)]

    with chronq.open(qdir) as q:  # the system clock: today's cycle, after Java's documents
        a = q.appender()
        mine = [a.write_document({"new": i}) for i in range(3)]
    assert mine == [rc.to_index(cycle, s) for s in (4, 5, 6)]
    again = _java_append(qdir, 2)  # and Java after chronq, in the same file
    assert again == [rc.to_index(cycle, s) for s in (7, 8)]

    rows = assert_java_lists_as_chronq_dumps(qdir, tmp_path / "java.jsonl")
    assert [chronicle_value(r["json"]) for r in rows if not r["metadata"]] == (
        [{"old": i} for i in range(20)] + [{"javaAppend": i} for i in range(4)]
        + [{"new": i} for i in range(3)] + [{"javaAppend": i} for i in range(2)])


def test_java_and_chronq_agree_when_a_cycle_is_full(tmp_path: Path) -> None:
    rc = ROLL_CYCLES["TEST_DAILY"]  # 64 documents a cycle
    qdir = tmp_path / "q"
    with chronq.open(qdir, "TEST_DAILY", clock=FixedClock(T0)) as q:
        a = q.appender()
        for i in range(rc.max_messages_per_cycle):
            a.write_document({"i": i})
        with pytest.raises(chronq.ChronqError, match="full"):
            a.write_document({"i": "one too many"})
    p = java("append", qdir, 1, "--at", "2024-01-15T12:00:00Z", check=False)
    assert p.returncode == 1 and "Unable to index" in p.stderr
    # the next day has room, for Java and then for chronq
    cycle = rc.cycle_at(T0)
    assert _java_append(qdir, 1, "2024-01-16T00:00:01Z") == [rc.to_index(cycle + 1, 0)]
    with chronq.open(qdir, clock=FixedClock(T0 + 86_400_000)) as q:
        assert q.appender().write_document({"i": "next day"}) == rc.to_index(cycle + 1, 1)
    assert read_values(qdir, [rc.to_index(cycle, 63), rc.to_index(cycle + 1, 0)]) == [
        (rc.to_index(cycle, 63), {"i": 63}), (rc.to_index(cycle + 1, 0), {"javaAppend": 0})]
