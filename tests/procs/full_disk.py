"""Fills the disk under a queue, then checks what survived.

argv: writer queue_dir fsize_limit(0 = none) block_size(0 = default) roll_every(0 = never)
    appends 3 KB checked messages (moving the clock a day every ``roll_every`` messages, so that
    new cycle files are created too) until the queue refuses; prints each acknowledged index, then one
    line ``error <type>: <message>``. Exit 0 when the refusal was an exception, 2 if it never came.
argv: verify queue_dir acks_file
    reopens the queue (no limit) and checks every acknowledged message is there, intact, in order.
"""

from __future__ import annotations

import resource
import sys

from qhelp import BASE_MS, DAY_MS, checked_payload, parse_checked, read_all

import chronq
from chronq.rollcycles import FixedClock


def writer(path: str, limit: int, block_size: int, roll_every: int) -> None:
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    kwargs = {"block_size": block_size} if block_size else {}
    clock = FixedClock(BASE_MS)
    try:
        with chronq.open(path, clock=clock, **kwargs) as q:  # type: ignore[arg-type]
            a = q.appender()
            for n in range(200_000):
                if roll_every and n and n % roll_every == 0:
                    clock.advance(DAY_MS)
                print(a.write(checked_payload(0, n, 3000)), flush=True)
    except Exception as e:
        print(f"error {type(e).__name__}: {e}", flush=True)
        return
    raise SystemExit(2)


def verify(path: str, acks_file: str) -> None:
    with open(acks_file) as f:
        lines = f.read().splitlines()
    acked = [int(x) for x in lines if not x.startswith("error")]
    got = read_all(path, clock=FixedClock(BASE_MS))
    for k, (index, payload) in enumerate(got):
        if parse_checked(payload) != (0, k):
            raise SystemExit(f"excerpt {k} at {index:#x} is not message {k}")
    indexes = [i for i, _ in got]
    if indexes[: len(acked)] != acked:
        raise SystemExit(f"{len(acked)} acked, {len(got)} read: {indexes[-2:]} vs {acked[-2:]}")
    if len(got) > len(acked) + 1:
        raise SystemExit(f"{len(got) - len(acked)} messages appeared that were never acknowledged")
    print(f"ok {len(acked)} {len(got)}")


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        verify(sys.argv[2], sys.argv[3])
