"""`chronq.merge` of four queues in key order, against reading the same four queues one after another
(no ordering: the floor) and `heapq.merge` over their tailers, in the same run.

    python benchmarks/bench_merge.py [--n 250000] [--rounds 3]

Each queue holds `--n` 32-byte messages whose first 8 bytes are an int64 timestamp, interleaved across
the queues (queue i holds 4j + i), so the merge switches input at every message, its worst case.
The key is `struct.Struct("<q").unpack_from`, a C call (its 1-tuples order as the timestamps do).
Each row is the best of `--rounds` passes over all 4 * n messages, the cases interleaved per round.

Target: >= 3,000,000 messages/s merged.
"""

from __future__ import annotations

import argparse
import heapq
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chronq

TARGET = 3_000_000
TS = struct.Struct("<q")


def cases(queues: list[chronq.Queue]) -> dict[str, Callable[[], int]]:
    key = TS.unpack_from

    def floor() -> int:
        n = 0
        for q in queues:
            for ex in q.tailer():
                key(ex)
                n += 1
        return n

    def merged(copy: bool) -> Callable[[], int]:
        def run() -> int:
            n = 0
            for _ in chronq.merge(queues, key, copy=copy):
                n += 1
            return n

        return run

    def stdlib() -> int:
        def items(src: int, q: chronq.Queue) -> Any:
            for ex in q.tailer():
                yield key(ex), src, ex.index, ex.bytes()

        n = 0
        for _ in heapq.merge(*(items(i, q) for i, q in enumerate(queues))):
            n += 1
        return n

    return {
        "read the 4 queues one after another + key (floor, unordered)": floor,
        "chronq.merge, copy=True (bytes)": merged(True),
        "chronq.merge, copy=False (excerpts)": merged(False),
        "heapq.merge over the 4 tailers (baseline)": stdlib,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=250_000, help="messages per queue")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        queues = [chronq.open(Path(tmp) / f"q{i}") for i in range(4)]
        try:
            for i, q in enumerate(queues):
                a = q.appender()
                pad = bytes(24)
                for j in range(args.n):
                    a.write(TS.pack(4 * j + i) + pad)
            merged = zip(range(8), chronq.merge(queues, TS.unpack_from), strict=False)
            first = [TS.unpack_from(item[2])[0] for _, item in merged]
            assert first == list(range(8)), first  # the rows measure a correct merge
            runs = cases(queues)
            best = dict.fromkeys(runs, 0.0)
            for _ in range(args.rounds):
                for name, run in runs.items():
                    t0 = time.perf_counter()
                    n = run()
                    assert n == 4 * args.n, (name, n)
                    best[name] = max(best[name], n / (time.perf_counter() - t0))
        finally:
            for q in queues:
                q.close()
    base = best["heapq.merge over the 4 tailers (baseline)"]
    print(f"merge of 4 queues, {args.n:,} messages each, best of {args.rounds}")
    print("| case | messages/s | vs heapq.merge | target |\n| --- | ---: | ---: | ---: |")
    for name, rate in best.items():
        target = (
            f"{TARGET / 1e6:.1f} M: {'met' if rate >= TARGET else 'NOT met'}"
            if "chronq.merge" in name
            else ""
        )
        print(f"| {name} | {rate / 1e6:.2f} M | {rate / base:.2f} | {target} |")


if __name__ == "__main__":
    main()
