"""Appends atomic blocks of self-checking messages until killed.

argv: queue_dir tag seed block_size [blocks]
Writer ``tag`` writes in its own day's cycle (the roll closes the previous writer's cycle with EOF).
Block ``b`` holds ``block_len(tag, b)`` messages ``checked_payload(tag, b * 1000 + i, ...)``; after each
block is published it prints ``b first_index`` (and ``ready`` before the first block).
"""

from __future__ import annotations

import random
import sys

from qhelp import BASE_MS, DAY_MS, block_len, checked_payload

import chronq
from chronq.rollcycles import FixedClock


def main() -> None:
    path, tag, seed, block_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    blocks = int(sys.argv[5]) if len(sys.argv) > 5 else 1_000
    rng = random.Random(seed)
    with chronq.open(path, "TEST8_DAILY", clock=FixedClock(BASE_MS + DAY_MS * tag), block_size=block_size,
                     lock_timeout=0.2) as q:
        a = q.appender()
        print("ready", flush=True)
        for b in range(blocks):
            n = block_len(tag, b)
            with a.atomic():  # messages are made inside the block, so most kills land inside one
                first = a.write(checked_payload(tag, b * 1000, 10))
                for i in range(1, n, 50):
                    extra = [rng.randrange(0, 3000 if j % 97 == 0 else 60) for j in range(i, min(i + 50, n))]
                    a.write_many(checked_payload(tag, b * 1000 + i + k, e) for k, e in enumerate(extra))
            print(b, first, flush=True)


if __name__ == "__main__":
    main()
