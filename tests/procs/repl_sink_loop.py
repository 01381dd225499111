"""Replicates a source queue into a sink queue in one process until the sink holds everything; prints
"started" once the first excerpts are read and about to be written, "done" at the end. Killed at random
moments by the tests (a sink dying mid-append): excerpts are read ahead, so that the process spends its
time in the sink's writes, where the kills should land.

argv: source_dir sink_dir
"""

from __future__ import annotations

import sys

import chronq
from chronq.replication.sink import SinkWriter
from chronq.replication.source import SourceReader

READ_AHEAD = 50_000  # excerpts
FRAME = 4096  # excerpts per write, as a source's batch


def main() -> None:
    with chronq.open(sys.argv[1], readonly=True) as src, \
            SinkWriter(sys.argv[2], src.roll_cycle, src.epoch, source_host=1) as w:
        reader = SourceReader(src, w.position)
        started = False
        while items := reader.read_batch(READ_AHEAD, 1 << 30):
            if not started:
                print("started", flush=True)
                started = True
            for i in range(0, len(items), FRAME):
                w.write_all(items[i:i + FRAME])
        reader.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
