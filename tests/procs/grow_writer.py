"""A writer that shares a queue with other processes which grow its cycle file under it.

argv: queue_dir writer_id block_size roll_cycle message_size [count threads]

Without ``count`` it takes turns: for each ``go <target> <how>`` line on stdin it appends messages
with ``how`` (``write``, ``many`` or ``document``) until the queue's last document starts past
``target`` (at least one message), then prints ``map <size of its mapping> <messages written so far>``
and ``done``. ``quit`` ends it. The parent passes the other writer's mapping size as ``target``, so
the other writer's next write finds writePosition beyond the end of what it has mapped.

With ``count`` and ``threads`` it prints ``ready``, waits for ``go`` and then appends ``count``
messages from each of ``threads`` threads (each its own appender; thread t writes tag
``writer_id * 16 + t``) as fast as it can, then prints ``done``.

Message ``n`` of tag ``tag`` is ``qhelp.tagged_payload(tag, n, message_size)``, which the test checks
byte for byte.
"""

from __future__ import annotations

import sys
import threading

from qhelp import BASE_MS, tagged_payload

import chronq
from chronq.rollcycles import FixedClock


def take_turns(q: chronq.Queue, tag: int, size: int) -> None:
    a = q.appender()
    n = 0

    def write_one() -> None:
        nonlocal n
        a.write(tagged_payload(tag, n, size))
        n += 1

    def write_batch() -> None:
        nonlocal n
        a.write_many([tagged_payload(tag, n + i, size) for i in range(8)])
        n += 8

    def write_document() -> None:
        nonlocal n
        data = tagged_payload(tag, n, size)
        with a.writing_document() as dc:
            dc.write(data[:5])
            dc.write(data[5:])
        n += 1

    how = {"write": write_one, "many": write_batch, "document": write_document}
    for line in sys.stdin:
        words = line.split()
        if words == ["quit"]:
            return
        if len(words) != 3 or words[0] != "go":
            raise SystemExit(f"unexpected command {line!r}")
        target, step = int(words[1]), how[words[2]]
        step()
        # the last document must start past the target: its start is where writePosition points
        while a._end_position()[0] <= target + size + 64:
            step()
        print(f"map {a._map.size} {n}", flush=True)
        print("done", flush=True)


def free_run(q: chronq.Queue, writer_id: int, size: int, count: int, threads: int) -> None:
    errors: list[BaseException] = []

    def run(tag: int) -> None:
        try:
            a = q.appender()
            for n in range(count):
                a.write(tagged_payload(tag, n, size))
        except BaseException as e:  # reported by the main thread: the exit status must say it failed
            errors.append(e)

    workers = [threading.Thread(target=run, args=(writer_id * 16 + t,)) for t in range(threads)]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected 'go' on stdin")
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    print("done", flush=True)


def main() -> None:
    path, roll_cycle = sys.argv[1], sys.argv[4]
    writer_id, block_size, size = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
    if len(sys.argv) > 6:  # the real clock, as the writers of a live queue
        with chronq.open(path, roll_cycle=roll_cycle, block_size=block_size, lock_timeout=60) as q:
            free_run(q, writer_id, size, int(sys.argv[6]), int(sys.argv[7]))
    else:  # one cycle whatever the time, so that every turn grows the same file
        with chronq.open(path, roll_cycle=roll_cycle, block_size=block_size, clock=FixedClock(BASE_MS)) as q:
            take_turns(q, writer_id, size)


if __name__ == "__main__":
    main()
