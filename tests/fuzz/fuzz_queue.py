"""Fuzz the cycle-file reader: damaged copies of Java-written cycle files, read every way a reader can.

Input: byte 0 picks the vector, byte 1 the cycle file to replace, byte 2 the mode (bit 0: also open
writable and append), bytes 3..10 a queue index to look up, then the file in the sparse encoding
(see ``common.py``). The queue is opened read-only and read forwards, every excerpt found again by its
index, read backwards, named tailers read. ``ChronqError`` (``CorruptQueueError`` naming file and
position) is the documented outcome for damage; any other exception, a wrong re-read, a crash, a hang
(``-timeout``) or a huge allocation (``-rss_limit_mb``) is a finding.

    python tests/fuzz/fuzz_queue.py CORPUS_DIR -max_total_time=60 -timeout=20 -rss_limit_mb=2048
"""

from __future__ import annotations

import shutil
import struct

import atheris
from common import load_queues, pack_sparse, run, scratch_dir, unpack_sparse, write_file

with atheris.instrument_imports(include=["chronq", "wire"]):
    import chronq
    from chronq.errors import ChronqError
    from chronq.rollcycles import FixedClock

# Single-file and multi-file queues of several roll cycles, index spacings and contents.
NAMES = ["fast_daily_basic", "test_daily_tiny_index", "test4_daily_spacing4", "named_tailer",
         "fast_hourly_roll_eof", "wire_types", "rc_small_daily", "in_progress_snapshot"]
TAILERS = {"named_tailer": ["myTailer", "replicated:tailerOne", "unreadTailer"]}
BASE_MS = 1_705_312_800_000  # the clock the vectors were written with (2024-01-15T10:00:00Z)
LIMIT = 100_000  # more excerpts than a 1 MiB file can hold: the reader goes round in circles


QUEUES = load_queues(NAMES)
WORK = scratch_dir()


def _read_everything(q: chronq.Queue, name: str, index: int) -> None:
    t = q.tailer()
    forward = []
    while (ex := t.read()) is not None:
        forward.append((ex.index, bytes(ex.payload)))
        if len(forward) > LIMIT:
            raise AssertionError("the forward reader does not terminate")
    for idx, payload in forward[:: max(1, len(forward) // 20)]:
        if not t.move_to_index(idx):
            raise AssertionError(f"move_to_index({idx:#x}) is False for an excerpt just read")
        ex = t.read()
        if ex is None or ex.index != idx or bytes(ex.payload) != payload:
            raise AssertionError(f"the excerpt at {idx:#x} reads back differently")
    if t.move_to_index(index):  # any index at all: found, not found or a ChronqError
        t.read()
    t.direction = chronq.Direction.BACKWARD
    t.to_end()
    backward = 0
    while t.read() is not None:
        backward += 1
        if backward > LIMIT:
            raise AssertionError("the backward reader does not terminate")
    for tailer_name in TAILERS.get(name, []):
        nt = q.tailer(tailer_name)
        while nt.read() is not None:
            pass


def _append(d: str) -> None:
    with chronq.open(d, clock=FixedClock(BASE_MS)) as q:
        index = q.appender().write(b"written after the damage")
        t = q.tailer()
        if t.move_to_index(index):
            ex = t.read()
            if ex is None or bytes(ex.payload) != b"written after the damage":
                raise AssertionError(f"appended excerpt {index:#x} reads back differently")


def test_one_input(data: bytes) -> None:
    if len(data) < 11 or not QUEUES:
        return
    name, files = QUEUES[data[0] % len(QUEUES)]
    cycles = sorted(f for f in files if f.endswith(".cq4"))
    target = cycles[data[1] % len(cycles)]
    mode = data[2]
    index = struct.unpack_from("<q", data, 3)[0]
    d = WORK / "q"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for fname, content in files.items():
        write_file(d / fname, unpack_sparse(data[11:]) if fname == target else content)
    try:
        with chronq.open(str(d), readonly=True) as q:
            _read_everything(q, name, index)
        if mode & 1:
            _append(str(d))
    except ChronqError:
        pass  # the documented report of damage


def seeds() -> list[bytes]:
    out = []
    for n, (_, files) in enumerate(QUEUES):
        cycles = sorted(f for f in files if f.endswith(".cq4"))
        for c, fname in enumerate(cycles):
            for mode in (0, 1):
                out.append(bytes([n, c, mode]) + struct.pack("<q", 0) + pack_sparse(files[fname]))
    return out


if __name__ == "__main__":
    try:
        run(test_one_input, seeds)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
