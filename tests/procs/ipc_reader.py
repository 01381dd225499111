"""IPC reader: tails a queue while writers append, until ``total`` excerpts were seen or the deadline.

argv: queue_dir total out_file timeout_s readonly(0|1)
Writes one record per excerpt, in the order read: index (u64), writer id (u32), sequence (u32).
Exit status 3 when the deadline passed first (what was read is still written).
"""

from __future__ import annotations

import struct
import sys
import time

import chronq


def main() -> None:
    path, total, out, timeout, readonly = (
        sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5] == "1")
    pack = struct.Struct("<Q").pack
    records = bytearray()
    seen = 0
    deadline = time.monotonic() + timeout
    with chronq.open(path, readonly=readonly) as q:
        t = q.tailer()
        print("ready", flush=True)
        while seen < total:
            ex = t.read()
            if ex is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.0002)
                continue
            payload = bytes(ex.payload)
            if len(payload) != 8:
                raise SystemExit(f"excerpt {ex.index:#x}: {len(payload)} bytes, not 8: {payload[:32].hex()}")
            records += pack(ex.index) + payload
            seen += 1
    with open(out, "wb") as f:
        f.write(records)
    if seen < total:
        print(f"deadline passed after {seen} of {total} excerpts", file=sys.stderr, flush=True)
        raise SystemExit(3)
    print("done", flush=True)


if __name__ == "__main__":
    main()
