"""Replicates a source queue into a sink queue in one process, one excerpt per write, until the sink holds
everything; prints "done". Killed at random moments by the tests (a sink dying mid-append).

argv: source_dir sink_dir
"""

from __future__ import annotations

import sys

import chronq
from chronq.replication.sink import SinkWriter
from chronq.replication.source import SourceReader


def main() -> None:
    with chronq.open(sys.argv[1], readonly=True) as src, \
            SinkWriter(sys.argv[2], src.roll_cycle, src.epoch, source_host=1) as w:
        reader = SourceReader(src, w.position)
        print("started", flush=True)
        while items := reader.read_batch(1, 1 << 20):
            w.write_all(items)
        reader.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
