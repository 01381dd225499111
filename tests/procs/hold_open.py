"""Commits some messages, then stops inside an open document and waits to be killed.

argv: queue_dir committed partial_bytes
Prints each committed index, then ``open`` once ``partial_bytes`` of the next message were written
(write lock held, header still unpublished). It never closes that document.
"""

from __future__ import annotations

import sys
import time

from qhelp import BASE_MS, checked_payload

import chronq
from chronq.rollcycles import FixedClock


def main() -> None:
    path, committed, partial = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with chronq.open(path, clock=FixedClock(BASE_MS)) as q:
        a = q.appender()
        for n in range(committed):
            print(a.write(checked_payload(0, n, n * 7)), flush=True)
        with a.writing_document() as dc:
            dc.write(b"\xab" * partial)
            print("open", flush=True)
            time.sleep(3600)


if __name__ == "__main__":
    main()
