"""Fuzz the table-store reader: damaged copies of Java-written ``metadata.cq4t`` files.

Input: byte 0 picks the vector, then the table store in the sparse encoding (see ``common.py``). The
store is opened read-only, every key and value read, then the whole queue (with the vector's intact
cycle files) opened read-only and its first excerpts and named tailers read, which goes through the
store's roll metadata, cycle bounds and tailer indexes. ``ChronqError`` is the documented outcome for
damage; any other exception, a crash, a hang or a huge allocation is a finding.

    python tests/fuzz/fuzz_table.py CORPUS_DIR -max_total_time=60 -timeout=20 -rss_limit_mb=2048
"""

from __future__ import annotations

import shutil

import atheris
from common import load_queues, pack_sparse, run, scratch_dir, unpack_sparse, write_file

with atheris.instrument_imports(include=["chronq", "wire"]):
    import chronq
    from chronq.errors import ChronqError
    from chronq.table import TableStore

NAMES = ["fast_daily_basic", "named_tailer", "fast_hourly_roll_eof", "rc_weekly", "rc_test_secondly",
         "rc_legacy_minutely"]


QUEUES = load_queues(NAMES)
WORK = scratch_dir()


def test_one_input(data: bytes) -> None:
    if len(data) < 2 or not QUEUES:
        return
    _, files = QUEUES[data[0] % len(QUEUES)]
    table = unpack_sparse(data[1:])
    if not table:
        return  # an empty store is one being created: a reader waits for its creator (timeout), by design
    d = WORK / "q"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for fname, content in files.items():
        write_file(d / fname, table if fname == "metadata.cq4t" else content)
    keys: list[str] = []
    try:
        with TableStore.open(d / "metadata.cq4t", readonly=True) as store:
            keys = store.keys()
            dict(store.items())
            for key in keys:
                store.get(key)
            _ = store.roll, store.highest_cycle, store.lowest_cycle, store.mod_count
    except ChronqError:
        pass
    try:
        with chronq.open(str(d), readonly=True) as q:
            t = q.tailer()
            for _ in range(50):
                if t.read() is None:
                    break
            t.direction = chronq.Direction.BACKWARD
            t.to_end()
            t.read()
            for key in keys:
                if key.startswith("index.") and not key.endswith((".lock", ".version")):
                    q.tailer(key[len("index."):]).read()
    except ChronqError:
        pass


def seeds() -> list[bytes]:
    return [bytes([n]) + pack_sparse(files["metadata.cq4t"]) for n, (_, files) in enumerate(QUEUES)]


if __name__ == "__main__":
    try:
        run(test_one_input, seeds)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
