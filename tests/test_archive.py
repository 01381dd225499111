"""Archives of finished cycles (`chronq.archive`, `chronq archive`): round trips, damage, kills, S3.

Queues here use TEST4_SECONDLY with a fixed clock and 4 KiB blocks: many small cycles in little time.
The S3 tests run against moto's S3 server in a subprocess on 127.0.0.1 (a real HTTP endpoint that s3fs
talks to), with fake credentials in the environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chronq
from chronq import archive as archives
from chronq.errors import ChronqError, CorruptQueueError
from chronq.rollcycles import FixedClock
from chronq.store import END_OF_DATA, read_layout, stop_header

zstandard = pytest.importorskip("zstandard")
pytest.importorskip("fsspec")

ROLL = "TEST4_SECONDLY"


def make_queue(path: Path, cycles: int, per: int, clock: FixedClock | None = None,
               size: int = 40) -> tuple[FixedClock, list[tuple[int, bytes]]]:
    """`cycles` cycles of `per` messages each; the clock is left in the last cycle."""
    clock = clock or FixedClock(0)
    written = []
    with chronq.open(path, ROLL, clock=clock, block_size=4096) as q:
        a = q.appender()
        for c in range(cycles):
            if c:
                clock.advance(1000)
            for i in range(per):
                body = f"cycle {clock.millis() // 1000} message {i} ".encode().ljust(size, b".")
                written.append((a.write(body), body))
    return clock, written


def read_queue(path: Path) -> list[tuple[int, bytes]]:
    with chronq.open(path, readonly=True) as q:
        return [(e.index, bytes(e.payload)) for e in q]


def read_archive(url: str, **opts: object) -> list[tuple[int, bytes]]:
    with archives.open(url, storage_options=opts or None) as a:
        return [(e.index, e.payload) for e in a]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(("compress", "read_back"), [(None, False), ("zstd", False), ("zstd", True)])
def test_finished_cycles_move_and_read_back_in_order(tmp_path: Path, compress: str | None,
                                                     read_back: bool) -> None:
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 6, 150)
    originals = {p.name: sha(p) for p in q.glob("*.cq4")}
    done = archives.archive(q, dest, compress=compress, clock=clock, read_back=read_back)
    assert [e["cycle"] for e in done] == [0, 1, 2, 3, 4]  # the current (last) cycle stays
    assert sorted(p.name for p in q.glob("*.cq4")) == ["19700101-000005T4.cq4"]
    archived = read_archive(str(dest))
    assert archived == written[:5 * 150]
    assert read_queue(q) == written[5 * 150:]  # the queue still reads what it kept
    manifest = json.loads((dest / archives.MANIFEST).read_text())
    assert manifest["version"] == 2 and manifest["codec"] is None
    for e in manifest["cycles"]:
        assert e["archive_sha256"] == sha(dest / e["archive"])  # of the bytes stored
        assert e["count"] == 150 and e["last_index"] - e["first_index"] == 149
    with archives.open(dest) as a:  # and each frame's crc32 is of the original: extracting is exact
        for e in manifest["cycles"]:
            assert sha(a.extract(e["cycle"], tmp_path / "x.cq4")) == originals[e["file"]]
    # every index is reachable directly, and reading goes on from there across cycles
    with archives.open(dest) as a:
        t = a.tailer()
        for idx, body in [*written[:750][::-7], written[0], written[749]]:
            assert t.move_to_index(idx)
            ex = t.read()
            assert ex is not None and (ex.index, ex.payload) == (idx, body)
        assert t.move_to_index(written[149][0])
        assert [(e.index, e.payload) for e in t] == written[149:750]
        assert not t.move_to_index(written[750][0])  # still in the queue, not in the archive
        assert a.first_index == written[0][0] and a.last_index == written[749][0]
    assert archives.verify(dest) == 5


def test_zstd_archive_decompresses_byte_identical(tmp_path: Path) -> None:
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, _ = make_queue(q, 3, 2000, size=300)  # cycles of several frames
    originals = {p.name: p.read_bytes() for p in q.glob("*.cq4")}
    archives.archive(q, dest, compress="zstd", clock=clock, frame=64 << 10)
    entries = json.loads((dest / archives.MANIFEST).read_text())["cycles"]
    assert any(len(e["frames"]) > 1 for e in entries)
    for e in entries:
        with open(dest / e["archive"], "rb") as f:
            whole = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
        assert whole == originals[e["file"]]
        if shutil.which("zstd"):
            out = subprocess.run(["zstd", "-dc", str(dest / e["archive"])], capture_output=True, check=True)
            assert out.stdout == originals[e["file"]]


def test_keep_and_rerun_and_later_cycles(tmp_path: Path) -> None:
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 5, 20)
    assert [e["cycle"] for e in archives.archive(q, dest, keep=2, clock=clock)] == [0, 1]
    assert archives.archive(q, dest, keep=2, clock=clock) == []
    clock.advance(1000)
    _, more = make_queue(q, 2, 20, clock=clock)
    assert [e["cycle"] for e in archives.archive(q, dest, compress="zstd", clock=clock)] == [2, 3, 4, 5]
    assert read_archive(str(dest)) + read_queue(q) == written + more


def test_version_1_manifest_still_reads_verifies_and_takes_new_cycles(tmp_path: Path) -> None:
    """Version 1 entries hold the sha256 of the original file instead of the stored one's."""
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 4, 300, size=120)
    originals = {p.name: sha(p) for p in q.glob("*.cq4")}
    archives.archive(q, dest, compress="zstd", clock=clock, keep=1, frame=4096)
    m = json.loads((dest / archives.MANIFEST).read_text())
    m["version"] = 1
    del m["codec"]
    for e in m["cycles"]:
        del e["archive_sha256"]
        e["sha256"] = originals[e["file"]]
    (dest / archives.MANIFEST).write_text(json.dumps(m))
    assert read_archive(str(dest)) == written[:600]
    assert archives.verify(dest) == 2
    clock.advance(1000)
    _, more = make_queue(q, 1, 10, clock=clock)
    assert [e["cycle"] for e in archives.archive(q, dest, compress="zstd", clock=clock)] == [2, 3]
    m2 = json.loads((dest / archives.MANIFEST).read_text())
    assert m2["version"] == 2 and [("sha256" in e, "archive_sha256" in e) for e in m2["cycles"]] == [
        (True, False), (True, False), (False, True), (False, True)]
    assert read_archive(str(dest)) + read_queue(q) == written + more
    assert archives.verify(dest) == 4
    # a version 1 entry whose sha256 does not match the original is reported by verify
    m2["cycles"][0]["sha256"] = "0" * 64
    (dest / archives.MANIFEST).write_text(json.dumps(m2))
    with pytest.raises(CorruptQueueError, match="sha256 of the original file"):
        archives.verify(dest)


def test_rerun_deletes_an_archived_copy_only_if_it_is_the_same(tmp_path: Path) -> None:
    """A kill between publishing the manifest and deleting the cycle leaves it in both; the next run
    compares the queue's copy with the manifest's size and frame checksums before deleting it."""
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 3, 300, size=120)
    done = archives.archive(q, dest, compress="zstd", clock=clock, frame=4096)
    with archives.open(dest) as a:
        a.extract(0, q / done[0]["file"])
        a.extract(1, q / done[1]["file"])
    assert archives.archive(q, dest, compress="zstd", clock=clock) == []  # nothing new archived ...
    assert sorted(p.name for p in q.glob("*.cq4")) == ["19700101-000002T4.cq4"]  # ... the copies gone
    with archives.open(dest) as a:
        a.extract(1, q / done[1]["file"])
    data = bytearray((q / done[1]["file"]).read_bytes())
    data[data.index(b"message", 5000)] = ord("M")  # a payload that is not what was archived
    (q / done[1]["file"]).write_bytes(bytes(data))
    with pytest.raises(ChronqError, match="archived already with other content"):
        archives.archive(q, dest, compress="zstd", clock=clock)
    assert (q / done[1]["file"]).exists()
    assert read_archive(str(dest)) == written[:600]


def test_a_cycle_ending_in_eof_is_finished_but_never_the_current_one(tmp_path: Path) -> None:
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, _ = make_queue(q, 1, 10)
    _close_with_eof(q / "19700101-000000T4.cq4")
    assert archives.archive(q, dest, clock=clock) == []  # ends in EOF, but it is the current cycle
    clock.advance(1000)
    assert [e["cycle"] for e in archives.archive(q, dest, clock=clock)] == [0]  # now finished


def test_a_past_cycle_without_eof_and_nothing_after_stays(tmp_path: Path) -> None:
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, _ = make_queue(q, 1, 10)
    clock.advance(5000)
    assert archives.archive(q, dest, clock=clock) == []  # a writer may still close it
    assert len(read_queue(q)) == 10


def _close_with_eof(path: Path) -> None:
    """Write the EOF marker a writer leaves when it rolls to the next cycle."""
    data = bytearray(path.read_bytes())
    layout = read_layout(data, path)
    pos, header = stop_header(data, layout.header_end, aligned=layout.aligned, file=str(path))
    assert header == 0
    struct.pack_into("<I", data, pos, END_OF_DATA)
    path.write_bytes(bytes(data))


def test_archive_refuses_another_roll_cycle(tmp_path: Path) -> None:
    clock, _ = make_queue(tmp_path / "q", 2, 3)
    archives.archive(tmp_path / "q", tmp_path / "arch", clock=clock)
    with chronq.open(tmp_path / "q2", "TEST_SECONDLY", clock=FixedClock(0), block_size=4096) as q:
        q.appender().write(b"x")
    with pytest.raises(ChronqError, match="roll cycle"):
        archives.archive(tmp_path / "q2", tmp_path / "arch", clock=FixedClock(10_000))


def test_archive_records_the_codec_and_refuses_mixing_plain_and_encoded(tmp_path: Path) -> None:
    from chronq.codecs import CODEC_KEY, Codec
    from chronq.table import TableStore

    clock, _ = make_queue(tmp_path / "plain", 2, 3)
    archives.archive(tmp_path / "plain", tmp_path / "arch", clock=clock)
    assert json.loads((tmp_path / "arch" / archives.MANIFEST).read_text())["codec"] is None
    clock = FixedClock(0)
    with chronq.open(tmp_path / "coded", ROLL, clock=clock, block_size=4096, codec=Codec("zstd")) as q:
        q.appender().write(b"x" * 100)
        clock.advance(1000)
        q.appender().write(b"y" * 100)
    with pytest.raises(ChronqError, match=r"plain payloads, the queue .* encoded ones"):
        archives.archive(tmp_path / "coded", tmp_path / "arch", clock=clock)
    archives.archive(tmp_path / "coded", tmp_path / "arch2", clock=clock)
    with TableStore.open(tmp_path / "coded" / "metadata.cq4t", readonly=True) as t:
        codec = t.get(CODEC_KEY)
    assert json.loads((tmp_path / "arch2" / archives.MANIFEST).read_text())["codec"] == codec is not None


# -- damage ----------------------------------------------------------------------------------------------
@pytest.fixture
def archived(tmp_path: Path) -> Path:
    clock, _ = make_queue(tmp_path / "q", 3, 2000, size=300)
    archives.archive(tmp_path / "q", tmp_path / "arch", compress="zstd", clock=clock, frame=64 << 10)
    return tmp_path / "arch"


def _entry(dest: Path, n: int = 1) -> dict[str, object]:
    entry: dict[str, object] = json.loads((dest / archives.MANIFEST).read_text())["cycles"][n]
    return entry


def test_flipped_byte_in_a_frame_is_reported_with_cycle_and_offset(archived: Path) -> None:
    e = _entry(archived)
    f = archived / str(e["archive"])
    frames = e["frames"]
    assert isinstance(frames, list)
    data = bytearray(f.read_bytes())
    data[frames[1][1] + 20] ^= 0x55  # inside frame 1
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptQueueError) as info:
        read_archive(str(archived))
    assert info.value.position == frames[1][0] and "cycle 1" in info.value.file
    with pytest.raises(CorruptQueueError):
        archives.verify(archived)


def test_truncated_archive_is_reported(archived: Path) -> None:
    e = _entry(archived)
    f = archived / str(e["archive"])
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CorruptQueueError, match="manifest says") as info:
        read_archive(str(archived))
    assert "cycle 1" in info.value.file


def test_manifest_disagreeing_with_the_file_is_reported(archived: Path) -> None:
    m = json.loads((archived / archives.MANIFEST).read_text())
    e = m["cycles"][0]
    e["count"] += 5  # more excerpts than the file holds (with a seek index that agrees)
    e["seek"]["positions"] += e["seek"]["positions"][-1:] * 5
    (archived / archives.MANIFEST).write_text(json.dumps(m))
    with archives.open(archived) as a:
        t = a.tailer()
        n = 0
        with pytest.raises(CorruptQueueError, match="manifest says") as info:
            while t.read() is not None:
                n += 1
        assert n == 2000 and "cycle 0" in info.value.file and info.value.position > 0


def _hide_50(e: dict[str, Any]) -> None:
    e["count"] -= 50  # the seek index made to agree: only counting the data shows it
    e["seek"]["positions"] = e["seek"]["positions"][:-(-e["count"] // e["seek"]["step"])]
    e["last_index"] -= 50


def _claim_5(e: dict[str, Any]) -> None:
    e["count"] += 5
    e["seek"]["positions"] += e["seek"]["positions"][-1:] * 5
    e["last_index"] += 5


@pytest.mark.parametrize(("damage", "said"), [
    (_hide_50, "count 2000; the manifest says 1950"), (_claim_5, "count 2000; the manifest says 2005"),
    (lambda e: e.__setitem__("first_index", e["first_index"] + 5), "first_index"),
    (lambda e: e.__setitem__("last_index", e["last_index"] - 1), "last_index"),
], ids=["hides-50", "claims-5", "first-index", "last-index"])
def test_verify_recounts_the_excerpts_from_the_archived_data(archived: Path, damage: Any, said: str) -> None:
    """A manifest whose `count`, `first_index` or `last_index` was edited (everything else consistent):
    reading would silently skip or miss excerpts; `verify` counts them again from the data and says so."""
    m = json.loads((archived / archives.MANIFEST).read_text())
    assert m["cycles"][1]["count"] == 2000
    damage(m["cycles"][1])
    (archived / archives.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CorruptQueueError, match=f"holds 2000 excerpts.*{said}") as info:
        archives.verify(archived)
    assert "cycle 1" in info.value.file


@pytest.mark.parametrize("damage", [
    lambda e: e["frames"].pop(),                                  # a frame left out
    lambda e: e["frames"][1].__setitem__(1, 7),                   # a frame at the wrong archive offset
    lambda e: e["frames"][1].__setitem__(0, 100 << 20),           # a frame that would be huge
    lambda e: e["seek"]["positions"].pop(),                       # seek index shorter than the count
    lambda e: e["seek"].__setitem__("positions", [10 ** 12]),     # a position outside the file
    lambda e: e.__setitem__("archive", "../elsewhere.cq4"),      # a name outside the archive
    lambda e: e.pop("archive_sha256"),
], ids=["frame-missing", "frame-offset", "frame-huge", "seek-short", "seek-outside", "name", "no-sha"])
def test_inconsistent_manifest_entry_is_reported_before_reading(archived: Path, damage: Any) -> None:
    m = json.loads((archived / archives.MANIFEST).read_text())
    damage(m["cycles"][1])
    (archived / archives.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CorruptQueueError, match="manifest entry of cycle 1"):
        archives.open(archived)


@pytest.mark.parametrize(("key", "name"), [
    ("file", "../../x.cq4"), ("file", "/x.cq4"), ("file", "..\\x.cq4"), ("file", "x\0.cq4"),
    ("file", "19700101-000000T4.cq4"),  # another cycle's name: restore would overwrite that cycle
    ("file", ".19700101-000001T4.cq4"), ("archive", "..\\x.cq4.zst"), ("archive", ""),
])
def test_a_manifest_name_outside_its_place_is_refused_by_verify_and_restore(archived: Path, key: str,
                                                                            name: str) -> None:
    """Every name a manifest holds is data anyone who can write the archive can edit: `verify` and
    `restore` refuse one that is not the plain name it must be, naming the manifest and the entry, and
    write nothing."""
    m = json.loads((archived / archives.MANIFEST).read_text())
    m["cycles"][1][key] = name
    (archived / archives.MANIFEST).write_text(json.dumps(m))
    restored = archived.parent / "a" / "b" / "restored"
    before = sorted(archived.parent.rglob("*"))
    for attempt in (lambda: archives.verify(archived), lambda: archives.restore(archived, restored)):
        with pytest.raises(CorruptQueueError, match=f"manifest entry of cycle 1: {key}") as info:
            attempt()
        assert info.value.file == str(archived / archives.MANIFEST)
    assert sorted(archived.parent.rglob("*")) == before


def test_a_frame_declaring_a_huge_size_is_refused_before_allocating(tmp_path: Path) -> None:
    """An 8 KiB archive frame whose zstd frame declares 1 GiB of content, with a manifest made to agree
    (offsets, sizes, sha256): reading and `verify` refuse it by the declared size, naming the cycle,
    without allocating anything near it."""
    import tracemalloc

    from tests.codec_support import declaring

    clock, _ = make_queue(tmp_path / "q", 2, 100)
    dest = tmp_path / "arch"
    archives.archive(tmp_path / "q", dest, compress="zstd", clock=clock, frame=8192)
    m = json.loads((dest / archives.MANIFEST).read_text())
    e = m["cycles"][0]
    stored = (dest / e["archive"]).read_bytes()
    ends = [f[0] for f in e["frames"][1:]] + [e["size"]]
    out = b""
    for i, (f, end) in enumerate(zip(e["frames"], ends, strict=True)):
        raw = stored[f[1]:f[1] + f[2]]
        if i == 0:
            raw = declaring(zstandard.ZstdDecompressor().decompress(raw), 1 << 30)
        f[1], f[2] = len(out), len(raw)
        out += raw
        assert end - f[0] <= 8192
    (dest / e["archive"]).write_bytes(out)
    e["archive_size"], e["archive_sha256"] = len(out), hashlib.sha256(out).hexdigest()
    (dest / archives.MANIFEST).write_text(json.dumps(m))
    tracemalloc.start()
    try:
        for attempt in (lambda: read_archive(str(dest)), lambda: archives.verify(dest)):
            with pytest.raises(CorruptQueueError, match=r"frame 0 .*declares 1073741824 bytes") as info:
                attempt()
            assert "cycle 0" in info.value.file
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_manifest_with_an_unusable_roll_cycle_is_reported(archived: Path) -> None:
    m = json.loads((archived / archives.MANIFEST).read_text())
    del m["roll_cycle"]["format"]
    (archived / archives.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CorruptQueueError, match="roll cycle"):
        archives.open(archived)


def test_one_archiving_run_per_queue(tmp_path: Path) -> None:
    import fcntl

    clock, _ = make_queue(tmp_path / "q", 3, 5)
    with open(tmp_path / "q" / archives.LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ChronqError, match="another archiving run"):
            archives.archive(tmp_path / "q", tmp_path / "arch", clock=clock)
    assert len(archives.archive(tmp_path / "q", tmp_path / "arch", clock=clock)) == 2


def test_plain_archive_checksum_mismatch(tmp_path: Path) -> None:
    clock, _ = make_queue(tmp_path / "q", 2, 100)
    archives.archive(tmp_path / "q", tmp_path / "arch", clock=clock)
    f = next((tmp_path / "arch").glob("*.cq4"))
    data = bytearray(f.read_bytes())
    data[1000] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptQueueError, match="checksum mismatch"):
        read_archive(str(tmp_path / "arch"))


# -- the command and kills -----------------------------------------------------------------------------
def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chronq", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_cli_archives_and_reports(tmp_path: Path) -> None:
    make_queue(tmp_path / "q", 4, 10)  # system clock: every cycle is long past, the last is unfinished
    p = _cli("archive", str(tmp_path / "q"), str(tmp_path / "arch"), "--compress", "zstd", "--keep", "1")
    assert p.returncode == 0, p.stderr
    assert [line.split()[2] for line in p.stdout.splitlines()] == ["0", "1"]
    assert len(read_archive(str(tmp_path / "arch"))) == 20
    again = _cli("archive", str(tmp_path / "q"), str(tmp_path / "arch"), "--read-back")
    assert again.returncode == 0, again.stderr
    assert [line.split()[2] for line in again.stdout.splitlines()] == ["2"]
    assert len(read_archive(str(tmp_path / "arch"))) == 30
    bad = _cli("archive", str(tmp_path / "q"), str(tmp_path / "arch"), "--keep", "-1")
    assert bad.returncode == 2 and "--keep" in bad.stderr


@pytest.mark.exclusive
def test_sigkill_at_random_points_never_loses_a_cycle(tmp_path: Path) -> None:
    """Kill `chronq archive` at random moments, over and over: after each kill every cycle is still in
    the queue (byte-identical) or complete in the archive with a valid manifest entry, and a final
    run finishes the job."""
    rng = random.Random(7)
    pristine = tmp_path / "pristine"
    _, written = make_queue(pristine, 25, 30)
    originals = {p.name: sha(p) for p in pristine.glob("*.cq4")}
    kills = rounds = mid_run = 0
    while kills < 20:
        rounds += 1
        q, dest = tmp_path / f"q{rounds}", tmp_path / f"arch{rounds}"
        shutil.copytree(pristine, q)
        started = time.monotonic()
        p = subprocess.Popen([sys.executable, "-m", "chronq", "archive", str(q), str(dest), "--compress",
                              "zstd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs = 1
        while True:
            # past the interpreter's start-up (which varies with the machine's load), then at random
            while not dest.exists() and p.poll() is None:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.3))
            killed = p.poll() is None
            if killed:
                p.send_signal(signal.SIGKILL)
                kills += 1
            p.wait()
            archived = _check_nothing_lost(q, dest, originals)
            mid_run += killed and 0 < archived < len(originals) - 1
            if not list(q.glob("*.cq4"))[1:] or kills >= 20 or runs >= 4:
                break
            runs += 1  # a later run carries on from what the killed one left
            p = subprocess.Popen([sys.executable, "-m", "chronq", "archive", str(q), str(dest),
                                  "--compress", "zstd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert time.monotonic() - started < 60
    assert mid_run >= 5, f"only {mid_run} of {kills} kills landed while cycles were being moved"
    # the last round, finished: every message once, in order
    final = _cli("archive", str(q), str(dest), "--compress", "zstd")
    assert final.returncode == 0, final.stderr
    assert read_archive(str(dest)) + read_queue(q) == written
    assert sorted(p.name for p in q.glob("*.cq4")) == ["19700101-000024T4.cq4"]


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped"])
def test_rerun_after_a_kill_never_deletes_the_only_good_copy(tmp_path: Path, damage: str) -> None:
    """A kill between publishing the manifest and deleting the cycle leaves the cycle in both; if the
    archived object is then missing or damaged, the queue's copy is the only good one. Re-running
    `chronq archive` checks the archived object (size, frames, sha256) before deleting anything, and
    archives the cycle again: every message stays readable."""
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 3, 300, size=120)
    done = archives.archive(q, dest, compress="zstd", clock=clock, frame=4096)
    with archives.open(dest) as a:  # the state the kill leaves: in the manifest and still in the queue
        a.extract(1, q / done[1]["file"])
    stored = dest / done[1]["archive"]
    if damage == "missing":
        stored.unlink()
    elif damage == "truncated":
        stored.write_bytes(stored.read_bytes()[:-10])
    else:
        data = bytearray(stored.read_bytes())
        data[len(data) // 2] ^= 0x40
        stored.write_bytes(bytes(data))
    p = _cli("archive", str(q), str(dest), "--compress", "zstd")
    assert p.returncode == 0, p.stderr
    assert [line.split()[2] for line in p.stdout.splitlines()] == ["1"]  # archived again
    assert archives.verify(dest) == 2
    assert read_archive(str(dest)) + read_queue(q) == written
    assert sorted(p.name for p in q.glob("*.cq4")) == ["19700101-000002T4.cq4"]


def test_rerun_refuses_when_the_archive_is_damaged_and_the_queue_copy_differs(tmp_path: Path) -> None:
    """Neither copy is the archived cycle: nothing is deleted, and the error names the cycle."""
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, _ = make_queue(q, 3, 300, size=120)
    done = archives.archive(q, dest, compress="zstd", clock=clock, frame=4096)
    with archives.open(dest) as a:
        a.extract(1, q / done[1]["file"])
    (dest / done[1]["archive"]).unlink()
    data = bytearray((q / done[1]["file"]).read_bytes())
    data[data.index(b"message", 5000)] = ord("M")
    (q / done[1]["file"]).write_bytes(bytes(data))
    p = _cli("archive", str(q), str(dest), "--compress", "zstd")
    assert p.returncode != 0 and "cycle 1 is archived already with other content" in p.stderr, p.stderr
    assert (q / done[1]["file"]).read_bytes() == bytes(data)


def _archived_cycles(p: subprocess.CompletedProcess[str]) -> list[int]:
    assert p.returncode == 0, p.stderr
    return [int(line.split()[2]) for line in p.stdout.splitlines()]


def test_archive_leaves_what_a_named_tailer_has_not_read(tmp_path: Path) -> None:
    """Retention never deletes the cycles a named tailer has not finished; `chronq archive` (the real
    command) does not move them out of its reach either."""
    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, written = make_queue(q, 5, 10)
    with chronq.open(q, clock=clock) as queue:
        t = queue.tailer("audit")
        read = [(ex.index, bytes(ex.payload)) for ex in itertools.islice(t, 15)]
        assert read == written[:15]  # into cycle 1
        t.close()
    assert _archived_cycles(_cli("archive", str(q), str(dest))) == [0]
    with chronq.open(q, clock=clock) as queue:
        t = queue.tailer("audit")
        assert [(ex.index, bytes(ex.payload)) for ex in t] == written[15:]
        t.close()
    assert _archived_cycles(_cli("archive", str(q), str(dest))) == [1, 2, 3]


def test_archive_on_a_replication_source_leaves_what_sinks_have_not_acknowledged(tmp_path: Path) -> None:
    from chronq.table import LAST_ACKNOWLEDGED_INDEX_REPLICATED, LAST_INDEX_REPLICATED

    q, dest = tmp_path / "q", tmp_path / "arch"
    clock, _ = make_queue(q, 5, 10)
    # a source that has sent nothing yet is one only by what the caller says
    assert archives.archive(q, dest, clock=clock, replication_source=True) == []
    with chronq.open(q, clock=clock) as queue:
        assert queue.table is not None
        queue.table.set_max(LAST_INDEX_REPLICATED, queue.roll_cycle.to_index(3, 0))  # sent, none acked
    assert _archived_cycles(_cli("archive", str(q), str(dest))) == []
    with chronq.open(q, clock=clock) as queue:
        assert queue.table is not None
        queue.table.set_max(LAST_ACKNOWLEDGED_INDEX_REPLICATED, queue.roll_cycle.to_index(2, 5))
    assert _archived_cycles(_cli("archive", str(q), str(dest))) == [0, 1]


def _check_nothing_lost(q: Path, dest: Path, originals: dict[str, str]) -> int:
    """Assert every cycle is in the queue or archived; returns how many are archived."""
    in_queue = {p.name for p in q.glob("*.cq4")}
    for name in in_queue:
        assert sha(q / name) == originals[name], name
    entries: dict[str, dict[str, object]] = {}
    if (dest / archives.MANIFEST).exists():
        entries = {e["file"]: e for e in json.loads((dest / archives.MANIFEST).read_text())["cycles"]}
        assert archives.verify(dest) == len(entries)
    with archives.open(dest) if entries else contextlib.nullcontext() as a:
        for name, digest in originals.items():
            if name not in in_queue:
                assert name in entries, name
                extracted = a.extract(entries[name]["cycle"], dest.parent / "extracted.cq4")
                assert sha(extracted) == digest, name
    return len(entries)


# -- S3 (moto's server) ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    # the server binds port 0 and names its port (a port chosen here and closed again could be taken
    # by another test running in parallel before the server binds it)
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the server below
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                              stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while (found := re.search(rb"Running on http://127\.0\.0\.1:(\d+)", log_path.read_bytes())) is None:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"moto's S3 server did not start: {log_path.read_text(errors='replace')}")
            time.sleep(0.1)
        port = int(found[1])
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
        log.close()


SECRET = "fake-secret-key-never-logged"


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "fake-access-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import fsspec

    opts: dict[str, object] = {"endpoint_url": s3_endpoint}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **opts)
    bucket = f"archive-{random.getrandbits(32):08x}"
    fs.mkdir(bucket)
    opts["bucket"] = bucket
    return opts


def test_archive_to_s3_and_read_back(tmp_path: Path, s3: dict[str, object]) -> None:
    bucket = s3.pop("bucket")
    url = f"s3://{bucket}/queues/trades"
    clock, written = make_queue(tmp_path / "q", 4, 2000, size=300)
    done = archives.archive(tmp_path / "q", url, compress="zstd", clock=clock, storage_options=s3,
                            frame=64 << 10)
    assert len(done) == 3
    assert read_archive(url, **s3) == written[:6000]
    with archives.open(url, storage_options=s3) as a:
        t = a.tailer()
        assert t.move_to_index(written[4321][0])
        ex = t.read()
        assert ex is not None and ex.payload == written[4321][1]
    assert archives.verify(url, storage_options=s3) == 3
    import fsspec

    fs = fsspec.filesystem("s3", **s3)
    manifest = fs.cat_file(f"{bucket}/queues/trades/{archives.MANIFEST}")
    assert SECRET.encode() not in manifest and b"fake-access-key" not in manifest
    archives.restore(url, tmp_path / "restored", storage_options=s3)
    assert read_queue(tmp_path / "restored") == written[:6000]


def test_cli_archives_to_s3_with_the_usual_configuration(tmp_path: Path, s3: dict[str, object]) -> None:
    bucket = s3.pop("bucket")
    make_queue(tmp_path / "q", 3, 50)
    env = {**os.environ, "AWS_ENDPOINT_URL": str(s3["endpoint_url"])}
    p = _cli("archive", str(tmp_path / "q"), f"s3://{bucket}/a", "--compress", "zstd", env=env)
    assert p.returncode == 0, p.stderr
    assert SECRET not in p.stdout + p.stderr
    assert len(read_archive(f"s3://{bucket}/a", **s3)) == 100


# -- Java ----------------------------------------------------------------------------------------------
@pytest.mark.interop
def test_java_lists_a_restored_archive(tmp_path: Path) -> None:
    from tests.test_java_interop import java, list_summary

    clock, written = make_queue(tmp_path / "q", 4, 100)
    archives.archive(tmp_path / "q", tmp_path / "arch", compress="zstd", clock=clock)
    archives.restore(tmp_path / "arch", tmp_path / "restored")
    out = tmp_path / "java.jsonl"
    p = java("list", tmp_path / "restored", out)
    summary = list_summary(p.stdout)
    assert summary["data"] == "300", summary
    assert int(summary["firstIndex"], 16) == written[0][0]
    assert int(summary["lastIndex"], 16) == written[299][0]
