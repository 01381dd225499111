"""Appends messages to a replication source queue with a fixed clock, rolling (with gaps) as it goes.

argv: queue_dir first count per_cycle
Messages first..first+count-1; every `per_cycle` messages the clock jumps 2 s (TEST_SECONDLY: one cycle
is skipped) and a metadata document is written, so the queue has several cycle files, gaps between them
and metadata documents in every cycle. The clock continues from the queue's newest cycle.
"""

from __future__ import annotations

import sys

import chronq
from chronq.rollcycles import FixedClock


def main() -> None:
    path, first, count, per_cycle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    clock = FixedClock(0)
    with chronq.open(path, clock=clock) as q:
        newest = max(q.cycles(), default=0)
        clock.set(q.roll_cycle.cycle_start(newest, q.epoch))
        a = q.appender()
        for n in range(first, first + count):
            if n % per_cycle == 0:
                clock.advance(2 * q.roll_cycle.length_ms)
                a.write_meta(b"cycle starts at message %d" % n)
            a.write(b"message %d " % n + bytes(n % 97))
        print(q.last_index, flush=True)


if __name__ == "__main__":
    main()
