"""IPC writer: appends ``count`` messages (writer id, sequence) and saves the index each write returned.

argv: queue_dir writer_id count index_out roll_cycle [sleep_every]
With ``sleep_every`` > 0 it sleeps 1 ms after that many writes, so that a run spans several real-time
cycles of a short roll cycle.
Prints ``ready`` once the appender exists, waits for ``go`` on stdin so that all writers contend.
Odd writer ids append through ``writing_document()`` (two partial writes), even ones with ``write()``.
"""

from __future__ import annotations

import array
import struct
import sys
import time
from collections.abc import Callable

import chronq


def writer(appender: chronq.Appender, by_document: bool) -> Callable[[bytes], int]:
    if not by_document:
        return appender.write

    def write(data: bytes) -> int:
        with appender.writing_document() as dc:
            dc.write(data[:3])
            dc.write(data[3:])
        return dc.index

    return write


def main() -> None:
    path, wid, count, out, roll_cycle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
    sleep_every = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    pack = struct.Struct("<II").pack
    indexes = array.array("Q")
    with chronq.open(path, roll_cycle=roll_cycle) as q:
        write = writer(q.appender(), by_document=wid % 2 == 1)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("expected 'go' on stdin")
        append = indexes.append
        for seq in range(count):
            append(write(pack(wid, seq)))
            if sleep_every and seq % sleep_every == 0:
                time.sleep(0.001)
    with open(out, "wb") as f:
        indexes.tofile(f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
