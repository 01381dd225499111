"""Appends checked messages with the vectors' fixed clock and prints each index (a next writer after a crash).

argv: queue_dir tag count [pause_ms]
"""

from __future__ import annotations

import sys
import time

from qhelp import BASE_MS, checked_payload

import chronq
from chronq.rollcycles import FixedClock


def main() -> None:
    path, tag, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pause = float(sys.argv[4]) / 1000 if len(sys.argv) > 4 else 0.0
    # a 5 s lock timeout: two live writers contending on a loaded machine may wait longer than 0.5 s
    # for their turn (a dead holder is still taken over after DEAD_HOLDER_GRACE, 1 s)
    with chronq.open(path, clock=FixedClock(BASE_MS), lock_timeout=5.0) as q:
        a = q.appender()
        for n in range(count):
            print(a.write(checked_payload(tag, n, n)), flush=True)
            if pause:
                time.sleep(pause)


if __name__ == "__main__":
    main()
