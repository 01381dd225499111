"""Damaged copies of the Java-written queues: a clear CorruptQueueError or what is valid, never a crash.

Copies of the vectors are truncated, zeroed, bit-flipped or get a forged document header, then a
separate long-lived process (``procs/corrupt_reader.py``) opens them read-only and reads everything
forwards, by index and backwards, or opens them writable and appends. A dead reader process is a
crash, a request that takes longer than ``TIMEOUT`` is a hang; both fail the test with the damage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import selectors
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GENERATED, require_vectors
from tests.procs.qhelp import child_env, header_positions, script

TIMEOUT = 20.0
VECTORS = ["fast_daily_basic", "test_daily_tiny_index", "test4_daily_spacing4", "fast_hourly_roll_eof",
           "named_tailer"]
NAMED = {"named_tailer": ["myTailer", "replicated:tailerOne", "unreadTailer"]}
DATA_DOCUMENTS = {"fast_daily_basic": 4, "test_daily_tiny_index": 20, "named_tailer": 5}


# a valid cycle file of another roll cycle (HUGE_DAILY: 40-bit sequences), to put under a queue's name
FOREIGN = ("rc_huge_daily", "20240115H.cq4")


@dataclass(frozen=True)
class Damage:
    file: str
    kind: str  # truncate | zero | flip | header | fifo | directory | foreign
    at: int
    size: int = 0  # bytes zeroed, bit number flipped, or the forged header value

    def apply(self, path: Path) -> None:
        if self.kind in ("fifo", "directory", "foreign"):  # the whole file is replaced
            if path.is_file():
                path.unlink()
            if self.kind == "fifo":
                os.mkfifo(path, 0o644)
            elif self.kind == "directory":
                path.mkdir(exist_ok=True)
            else:
                shutil.copyfile(GENERATED / FOREIGN[0] / FOREIGN[1], path)
                os.chmod(path, 0o644)
            return
        if not path.is_file():
            return  # an earlier damage made it a FIFO or a directory
        with open(path, "r+b") as f:
            if self.at >= os.fstat(f.fileno()).st_size and self.kind != "truncate":
                return  # an earlier truncation removed this spot
            if self.kind == "truncate":
                f.truncate(self.at)
            elif self.kind == "zero":
                f.seek(self.at)
                f.write(bytes(self.size))
            elif self.kind == "flip":
                f.seek(self.at)
                byte = f.read(1)[0]
                f.seek(self.at)
                f.write(bytes([byte ^ (1 << self.size)]))
            else:
                f.seek(self.at)
                f.write(struct.pack("<I", self.size))


class Reader:
    """The reader process; restarted after it crashed or hung so that later cases still run."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.stderr: IO[bytes] | None = None

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._close_pipes()
            # stderr goes to a file: warnings piling up in an unread pipe would block the reader
            if self.stderr is not None:
                self.stderr.close()
            self.stderr = tempfile.TemporaryFile()  # noqa: SIM115  (lives as long as the process)
            self.proc = subprocess.Popen(
                script("corrupt_reader"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self.stderr, text=True, env=child_env(),
            )
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(TIMEOUT)
        if not ready:
            proc.kill()
            proc.wait()
            return {"status": "hang"}
        line = proc.stdout.readline()
        if not line:
            code = proc.wait()
            assert self.stderr is not None
            self.stderr.seek(0)
            tail = self.stderr.read()[-2000:].decode(errors="replace")
            return {"status": "crash", "code": code, "stderr": tail}
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_pipes()
        if self.stderr is not None:
            self.stderr.close()

    def _close_pipes(self) -> None:
        """Close a finished reader's pipes (left open, they are closed late by the garbage collector, as
        a ResourceWarning in whichever test runs then)."""
        if self.proc is not None:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None and not pipe.closed:
                    with contextlib.suppress(BrokenPipeError):  # a dead reader's stdin, data still buffered
                        pipe.close()


@pytest.fixture(scope="module")
def reader() -> Iterator[Reader]:
    r = Reader()
    yield r
    r.close()


def copy_vector(name: str, into: Path) -> Path:
    dst = into / name
    dst.mkdir()
    for src in (GENERATED / name).iterdir():
        if src.suffix in (".cq4", ".cq4t"):
            shutil.copyfile(src, dst / src.name)
            os.chmod(dst / src.name, 0o644)  # the vectors are read-only
    return dst


def digest(queue: Path) -> dict[str, str]:
    # a FIFO must not be read here (that would block): only regular files have contents to compare
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "not a file"
            for p in sorted(queue.iterdir())}


def check(reader: Reader, vector: str, damages: list[Damage], mode: str,
          intact: int | None = None) -> dict[str, Any]:
    """Run one damaged copy; ``intact``: the messages a successful read must return (cycle files unharmed).

    Returns the reader's answer, which is either a successful read or a chronq error naming the file.
    """
    with tempfile.TemporaryDirectory(prefix="chronq-corrupt-") as tmp:
        queue = copy_vector(vector, Path(tmp))
        sizes = {p.name: p.stat().st_size for p in queue.iterdir()}
        for d in damages:
            d.apply(queue / d.file)
        for p in queue.iterdir():  # a file of another roll cycle put in place may be larger
            if p.is_file():
                sizes[p.name] = max(sizes.get(p.name, 0), p.stat().st_size)
        before = digest(queue)
        result = reader.ask({"dir": str(queue), "mode": mode, "named": NAMED.get(vector, [])})
        what = f"{mode} of {vector} damaged by {damages}: {result}"
        assert result["status"] in ("ok", "error"), what
        if result["status"] == "error":
            assert result["chronq"], f"not a chronq error: {what}"
            if result["type"] == "CorruptQueueError":
                assert Path(result["file"]).name in sizes, f"error names no file of the queue: {what}"
                assert 0 <= result["position"] <= max(sizes.values()), f"position outside the file: {what}"
        if mode in ("read", "dump"):
            assert digest(queue) == before, f"a read-only open changed the files: {what}"
            if intact is not None and result["status"] == "ok" and mode == "read":
                assert result["count"] == intact, f"messages silently missing: {what}"
        return result


def files_of(vector: str) -> list[str]:
    return sorted(p.name for p in (GENERATED / vector).iterdir() if p.suffix in (".cq4", ".cq4t"))


@st.composite
def damages(draw: st.DrawFn, vector: str) -> list[Damage]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        file = draw(st.sampled_from(files_of(vector)))
        data = (GENERATED / vector / file).read_bytes()
        heads = header_positions(data)
        # Most damage goes where the structure is: document headers, the store header, index entries.
        near = st.sampled_from(heads).flatmap(lambda h: st.integers(max(0, h - 8), h + 64))
        at = draw(st.one_of(near, st.integers(0, 1024), st.integers(0, len(data) - 1)))
        at = min(at, len(data) - 1)
        kind = draw(st.sampled_from(["truncate", "zero", "flip", "flip", "header"]))
        if kind == "truncate":
            out.append(Damage(file, kind, at))
            continue
        if kind == "zero":
            size = draw(st.integers(1, 4096))
        elif kind == "flip":
            size = draw(st.integers(0, 7))
        else:
            at = draw(st.sampled_from(heads))
            size = draw(st.one_of(st.integers(0, 2**32 - 1),
                                  st.sampled_from([0x3FFF_FFFF, 0x7FFF_FFFF, 0x8000_0000, 0xC000_0000,
                                                   0x4000_0000 | len(data), len(data) - at])))
        out.append(Damage(file, kind, at, size))
    return out


# Derandomized: the default run checks the same damage every time; the slow run explores (new examples
# each run: test_random_damage_long turns derandomize off; a failure prints the example to reproduce).
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("vector", VECTORS)
def test_random_damage_read(reader: Reader, vector: str) -> None:
    require_vectors()

    @SETTINGS
    @given(damages(vector))
    def run(ds: list[Damage]) -> None:
        check(reader, vector, ds, "read")

    run()


@pytest.mark.parametrize("vector", ["fast_daily_basic", "test_daily_tiny_index", "named_tailer"])
def test_random_damage_append(reader: Reader, vector: str) -> None:
    require_vectors()

    @settings(SETTINGS, max_examples=25)
    @given(damages(vector))
    def run(ds: list[Damage]) -> None:
        check(reader, vector, ds, "append")

    run()


@pytest.mark.slow
@pytest.mark.parametrize("vector", VECTORS)
def test_random_damage_long(reader: Reader, vector: str) -> None:
    require_vectors()

    @settings(SETTINGS, max_examples=150, derandomize=False)
    @given(damages(vector), st.sampled_from(["read", "append"]))
    def run(ds: list[Damage], mode: str) -> None:
        check(reader, vector, ds, mode)

    run()


def fixed_damages() -> list[Any]:
    """Hand-picked damage every reader meets sooner or later, one test id each.

    The index-entry cases check that an index entry is not trusted blindly (a misaligned entry, or
    one pointing at another document, must not make `move_to_index` miss or misread an excerpt a
    forward read finds); the damaged-first-message `*-append` cases that an appender does not append
    where no reader can reach (after a hole, or inside a document) without saying so.

    `cycle-cut-after-store-header`, `index2index-*` and `tiny-third-index-array-past-file` guard that
    offsets read from the store header or index arrays are checked before use (they used to surface
    as a bare ValueError from the native attach, or an error naming the bogus target instead of
    where the bad pointer is stored); `meta-roll-format-nul` that a damaged roll format in the table
    store is reported instead of silently hiding every cycle file.

    `named-position-cycle-out-of-range`: a named tailer whose stored index has a cycle no file name
    can express (it used to raise OverflowError from the file-name formatting).
    """
    cq4, meta = "20240115F.cq4", "metadata.cq4t"
    cases = {
        "cycle-empty": [Damage(cq4, "truncate", 0)],
        "cycle-3-bytes": [Damage(cq4, "truncate", 3)],
        "cycle-cut-in-store-header": [Damage(cq4, "truncate", 100)],
        "cycle-cut-after-store-header": [Damage(cq4, "truncate", 197)],
        "cycle-cut-in-index2index": [Damage(cq4, "truncate", 20_000)],
        "cycle-cut-in-message": [Damage(cq4, "truncate", 65_815)],
        "cycle-cut-after-message": [Damage(cq4, "truncate", 65_830)],
        "cycle-all-zero": [Damage(cq4, "zero", 0, 196_608)],
        "cycle-header-zeroed": [Damage(cq4, "zero", 0, 200)],
        "cycle-store-header-too-long": [Damage(cq4, "header", 0, 0x4000_0000 | 0x3FFF_FFFF)],
        "cycle-store-header-not-metadata": [Damage(cq4, "header", 0, 193)],
        "message-length-past-file": [Damage(cq4, "header", 65_808, 0x3FFF_FFFF)],
        "message-length-to-file-end": [Damage(cq4, "header", 65_808, 196_608 - 65_808 - 4)],
        "index2index-length-huge": [Damage(cq4, "header", 200, 0x4000_0000 | 0x3FFF_FFFF)],
        "index-entry-points-past-file": [Damage(cq4, "header", 33_008 + 32, 0x7FFF_FFFF)],
        "index2index-field-misaligned": [Damage(cq4, "flip", 152, 0)],
        "index2index-field-huge": [Damage(cq4, "flip", 155, 0)],
        "index2index-entry-past-file": [Damage(cq4, "header", 240, 0x7FFF_FFFF)],
        "index-entry-misaligned": [Damage(cq4, "flip", 33_040, 0)],
        "index-used-huge": [Damage(cq4, "flip", 33_039, 6)],
        "index-entry-points-at-next-message": [Damage(cq4, "header", 33_040, 65_828)],
        "store-header-length-grown": [Damage(cq4, "flip", 1, 1)],
        "first-message-header-zeroed": [Damage(cq4, "header", 65_808, 0)],
        "write-position-huge": [Damage(cq4, "flip", 71, 6)],
        "meta-empty": [Damage(meta, "truncate", 0)],
        "meta-cut-in-header": [Damage(meta, "truncate", 50)],
        "meta-all-zero": [Damage(meta, "zero", 0, 131_072)],
        "meta-entry-length-huge": [Damage(meta, "header", 180, 0x3FFF_FFFF)],
        "meta-roll-format-flipped": [Damage(meta, "flip", 80, 3)],
        "meta-roll-format-nul": [Damage(meta, "zero", 121, 1)],
        "both-empty": [Damage(cq4, "truncate", 0), Damage(meta, "truncate", 0)],
    }
    tiny = "20240115T1.cq4"  # test_daily_tiny_index: three index arrays, index2index values at 240
    tiny_cases = {
        "tiny-third-index-array-past-file": [Damage(tiny, "flip", 258, 1)],
    }
    # named_tailer: index.myTailer's int64 value is at 544; its top byte makes the cycle impossible
    named_cases = {"named-position-cycle-out-of-range": [Damage("metadata.cq4t", "flip", 551, 0)]}
    modes = ("read", "append")
    return [
        pytest.param(vector, ds, mode, id=f"{name}-{mode}")
        for vector, group in (("fast_daily_basic", cases), ("test_daily_tiny_index", tiny_cases),
                              ("named_tailer", named_cases))
        for name, ds in group.items()
        for mode in modes
    ]


@pytest.mark.parametrize(("vector", "ds", "mode"), fixed_damages())
def test_fixed_damage(reader: Reader, vector: str, ds: list[Damage], mode: str) -> None:
    require_vectors()
    only_table_store = all(d.file == "metadata.cq4t" for d in ds)
    intact = DATA_DOCUMENTS[vector] if only_table_store else None
    check(reader, vector, ds, mode, intact=intact)


# -- classes of damaged input: mutated bytes, a file of another roll cycle, a non-regular file, huge lengths
@st.composite
def damage_classes(draw: st.DrawFn, vector: str) -> list[Damage]:
    cycle_files = [f for f in files_of(vector) if f.endswith(".cq4")]
    file = draw(st.sampled_from(cycle_files))
    kind = draw(st.sampled_from(["bytes", "foreign", "non-regular", "huge-length"]))
    if kind == "bytes":
        return draw(damages(vector))
    if kind == "foreign":  # a valid file, wrong roll cycle; sometimes damaged as well
        more = draw(st.lists(st.builds(Damage, st.just(file), st.just("flip"), st.integers(0, 1 << 16),
                                       st.integers(0, 7)), max_size=2))
        return [Damage(file, "foreign", 0), *more]
    if kind == "non-regular":
        return [Damage(file, draw(st.sampled_from(["fifo", "directory"])), 0)]
    heads = header_positions((GENERATED / vector / file).read_bytes())
    at = draw(st.sampled_from(heads))
    length = draw(st.sampled_from([0x3FFF_FFFF, 0x3FFF_FFFC, 0x2000_0000, 0x0100_0000, 0x0002_0000]))
    return [Damage(file, "header", at, length | draw(st.sampled_from([0, 0x4000_0000])))]


@pytest.mark.parametrize("vector", ["fast_daily_basic", "test_daily_tiny_index", "fast_hourly_roll_eof"])
def test_damage_classes_read_and_dump(reader: Reader, vector: str) -> None:
    """Open + forward + backward + move_to_index, and the dump, of each class of damaged input: only
    chronq's errors, naming a file of the queue, within TIMEOUT each (a hang or crash fails)."""
    require_vectors()

    @settings(SETTINGS, max_examples=15)
    @given(damage_classes(vector))
    def run(ds: list[Damage]) -> None:
        check(reader, vector, ds, "read")
        check(reader, vector, ds, "dump")

    run()


def expect_error(result: dict[str, Any], file: str, match: str) -> None:
    assert result["status"] == "error" and result["type"] == "CorruptQueueError", result
    assert Path(result["file"]).name == file and match in result["message"], result


CQ4 = "20240115F.cq4"


@pytest.mark.parametrize("vector", ["fast_daily_basic", "rc_test_secondly"])
@pytest.mark.parametrize("mode", ["read", "dump", "append"])
def test_file_of_another_roll_cycle_is_refused(reader: Reader, vector: str, mode: str) -> None:
    """A HUGE_DAILY file under the queue's own cycle-file name used to be read with its 40-bit split:
    backward reading went 1, 0, 1, 0, ... for ever and forward indexes were wrong (negative with
    TEST_SECONDLY). Its store header says which split it has: refused, naming the file."""
    require_vectors()
    file = CQ4 if vector == "fast_daily_basic" else "20240115-100000T.cq4"
    result = check(reader, vector, [Damage(file, "foreign", 0)], mode)
    if mode == "dump":  # the dump shows the file as it is, with the file's own split
        assert result["status"] == "ok", result
    else:
        expect_error(result, file, "a file of another roll cycle")


@pytest.mark.parametrize("kind", ["fifo", "directory"])
@pytest.mark.parametrize("mode", ["read", "dump", "append"])
def test_non_regular_cycle_file_is_refused(reader: Reader, kind: str, mode: str) -> None:
    """A FIFO under a cycle-file name used to block the read-only open for ever (and a directory gave
    IsADirectoryError): a CorruptQueueError naming it instead."""
    require_vectors()
    result = check(reader, "fast_daily_basic", [Damage(CQ4, kind, 0)], mode)
    expect_error(result, CQ4, "not a regular file")


def test_seeks_after_a_damaged_length_stay_in_the_file(tmp_path: Path) -> None:
    """A flipped length bit in the second message (131097 bytes: past the end) let a seek park the
    tailer past the mapping, and the next `move_to_index` raised a bare ValueError ("position ... is
    outside the mapping") instead of CorruptQueueError."""
    import chronq
    from chronq.errors import CorruptQueueError

    require_vectors()
    queue = copy_vector("fast_daily_basic", tmp_path)
    Damage(CQ4, "flip", 65_830, 1).apply(queue / CQ4)
    first = 0x4D1900000000
    with chronq.open(queue, readonly=True) as q:
        t = q.tailer()
        with pytest.raises(CorruptQueueError, match="at position 65828"):
            list(t)
        for index in reversed(range(first, first + 4)):
            try:
                found = t.move_to_index(index)
                ex = t.read()
            except CorruptQueueError as e:
                assert e.file == str(queue / CQ4) and e.position == 65_828
                continue
            assert found == (index == first) and ex is not None and ex.index == first


def test_dump_of_a_damaged_roll_format_names_the_table_store(tmp_path: Path) -> None:
    """A roll format the table store cannot hold (a flipped bit makes an unknown pattern letter) used
    to escape the dump as a bare ValueError."""
    from chronq import dump
    from chronq.errors import CorruptQueueError

    require_vectors()
    queue = copy_vector("fast_daily_basic", tmp_path)
    Damage("metadata.cq4t", "flip", 121, 3).apply(queue / "metadata.cq4t")  # "yyyy" -> "qyyy"
    for produce in (dump.dump_text, lambda p: list(dump.dump_records(p))):
        with pytest.raises(CorruptQueueError, match="unusable roll cycle") as info:
            produce(queue)
        assert info.value.file == str(queue / "metadata.cq4t")


EOF_AT = 65_840  # fast_hourly_roll_eof: the EOF marker of 20240115-10F.cq4 (and of -11F)


def test_zeroed_eof_of_an_older_cycle_moves_on(reader: Reader) -> None:
    """A zeroed EOF marker in an older cycle (as a writer that died before closing it leaves it)
    stopped the reader there for good, silently, though later cycles hold messages. Java 5.26's tailer
    does the same; chronq moves on to the next cycle: nothing of the older cycle is lost."""
    require_vectors()
    result = check(reader, "fast_hourly_roll_eof", [Damage("20240115-10F.cq4", "header", EOF_AT, 0)], "read")
    assert result == {"status": "ok", "count": 5}


@pytest.mark.parametrize("header", [0xC000_1000, 0x8000_0000, 0xE000_0000])
def test_damaged_eof_of_an_older_cycle_is_reported(reader: Reader, header: int) -> None:
    """A header still "being written" where an older cycle ends may hide messages: CorruptQueueError
    naming the file and the position, never a silent stop or a wait for a writer that will not come."""
    require_vectors()
    damage = [Damage("20240115-10F.cq4", "header", EOF_AT, header)]
    result = check(reader, "fast_hourly_roll_eof", damage, "read")
    expect_error(result, "20240115-10F.cq4", "without an EOF marker")
    assert result["position"] == EOF_AT


@pytest.mark.parametrize("length", [
    bytes.fromhex("ffffffff00000000000000 94ffffff0e"),  # -268435456: found by fuzzing
    bytes.fromhex("ffff7f"),  # 2**21 - 1: past the end of the header
], ids=["negative", "past-the-header"])
def test_damaged_type_prefix_length_in_the_store_header(tmp_path: Path, length: bytes) -> None:
    """The length of the type name before `indexing` in a cycle file's header moved the header reader
    outside the header (a negative one made the next read a bare IndexError); it is damage, reported with
    the file and the offset."""
    import chronq
    from chronq.errors import CorruptQueueError

    require_vectors()
    queue = copy_vector("named_tailer", tmp_path)
    cycle = next(queue.glob("*.cq4"))
    data = bytearray(cycle.read_bytes())
    at = data.index(b"indexing") + len(b"indexing")
    assert data[at] == 0xB6, "the vector's indexing block starts with a type prefix"
    data[at + 1 : at + 1 + len(length)] = length
    cycle.write_bytes(bytes(data))
    with pytest.raises(CorruptQueueError) as info, chronq.open(queue, readonly=True) as q:
        q.tailer().read()
    assert info.value.file == str(cycle) and info.value.position == at + 1
