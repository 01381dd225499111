"""Creates a queue under a given umask: cycle files (with a roll), table store, named tailer.

argv: queue_dir umask(octal)
"""

from __future__ import annotations

import os
import sys

from qhelp import BASE_MS, DAY_MS

import chronq
from chronq.rollcycles import FixedClock


def main() -> None:
    os.umask(int(sys.argv[2], 8))
    clock = FixedClock(BASE_MS)
    with chronq.open(sys.argv[1], clock=clock) as q:
        a = q.appender()
        a.write(b"first cycle")
        clock.advance(DAY_MS)
        a.write(b"second cycle")
        t = q.tailer("reader")
        assert t.read() is not None


if __name__ == "__main__":
    main()
