"""Crash driver: forks writer after writer into one queue and SIGKILLs each at a random moment.

argv: queue_dir rounds seed block_size
Each child appends self-verifying messages (tag = round) in a loop, by plain writes, open documents,
batches and atomic blocks, and after every committed write (or whole block) reports (n, index) over a
pipe. The parent kills it after a random short delay (sometimes before it
even opened the queue, sometimes mid-document), reaps it (so its pid is really dead), and records what
was acknowledged. The clock moves one day every few rounds, so rolls and EOF back-filling are killed
too. The last round writes a fixed number of messages and exits normally: the queue must still take
writes after all the kills. Throughout (while each writer writes, is killed, and between rounds) the
parent tails the queue read-only, the way a live consumer would: it must never see a torn message.
Prints one JSON object:
{"acks": {round: [[n, index], ...]}, "blocks": {round: [[n, count], ...]}, "live": [[index, round, n], ...],
"kills": k}.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import sys
import time

from qhelp import BASE_MS, DAY_MS, checked_payload, parse_checked

import chronq
from chronq.rollcycles import FixedClock

ACK = struct.Struct("<IQ")
BLOCK = 1 << 63  # an ACK whose index has this bit announces an atomic block of (index & ~BLOCK) messages
ROUNDS_PER_DAY = 7
FINAL_WRITES = 200
PROGRESS_TIMEOUT = 30.0
LOCK_TIMEOUT = 0.2  # how long a stale lock (dead holder) is waited on before the liveness check


def child(path: str, rnd: int, seed: int, block_size: int, ack_fd: int, limit: int | None) -> None:
    rng = random.Random(seed * 100_003 + rnd)
    clock = FixedClock(BASE_MS + DAY_MS * (rnd // ROUNDS_PER_DAY))
    with chronq.open(path, clock=clock, block_size=block_size, lock_timeout=LOCK_TIMEOUT) as q:
        a = q.appender()
        n = 0
        while limit is None or n < limit:
            extras = [rng.choice((0, 1, 3, 17, 200, rng.randrange(4000), rng.randrange(60_000)))]
            how = rng.random()
            if how < 0.15:  # a batch: one lock for all, so a kill lands between its messages too
                extras += [rng.randrange(300) for _ in range(rng.randrange(20))]
                if limit is not None:
                    extras = extras[: limit - n]
                written = a.write_many([checked_payload(rnd, n + k, e) for k, e in enumerate(extras)])
                assert written == len(extras)
                first = a.last_index_appended - len(extras) + 1
                os.write(ack_fd, b"".join(ACK.pack(n + k, first + k) for k in range(len(extras))))
                n += len(extras)
                continue
            if how < 0.27:  # an atomic block: all of it is acknowledged after the block, or none is
                extras += [rng.randrange(300) for _ in range(1 + rng.randrange(8))]
                if limit is not None:
                    extras = extras[: limit - n]
                os.write(ack_fd, ACK.pack(n, BLOCK | len(extras)))  # announced, not acknowledged
                with a.atomic():
                    indexes = [a.write(checked_payload(rnd, n + k, e)) for k, e in enumerate(extras)]
                os.write(ack_fd, b"".join(ACK.pack(n + k, i) for k, i in enumerate(indexes)))
                n += len(extras)
                continue
            data = checked_payload(rnd, n, extras[0])
            if how < 0.5:
                # An open document (write lock held, header still 0) is the widest window for a kill.
                with a.writing_document() as dc:
                    half = len(data) // 2
                    dc.write(data[:half])
                    dc.write(data[half:])
                index = dc.index
            else:
                index = a.write(data)
            os.write(ack_fd, ACK.pack(n, index))
            n += 1


def run_round(
    path: str, rnd: int, seed: int, block_size: int, rng: random.Random, final: bool, live: LiveReader
) -> tuple[list[list[int]], list[list[int]]]:
    """Run one writer; return its acknowledgements [n, index] and the atomic blocks it began [n, count].
    The live reader (once open) tails the queue every few milliseconds while the writer runs."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            child(path, rnd, seed, block_size, w, FINAL_WRITES if final else None)
        except BaseException as e:
            os.write(2, f"crash_parent child round {rnd}: {type(e).__name__}: {e}\n".encode())
            code = 1
        os._exit(code)
    os.close(w)
    buf = bytearray()

    def drain(timeout: float) -> bool:
        """Read acks for up to ``timeout``; False once the child closed the pipe."""
        import select

        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            if live.tailer is not None:
                live.poll()  # beside the writer: a document may be half written, or its writer killed
            if not select.select([r], [], [], min(left, 0.002))[0]:
                continue
            chunk = os.read(r, 65536)
            if not chunk:
                return False
            buf.extend(chunk)
        return True

    if final:
        open_ = drain(PROGRESS_TIMEOUT * 2)
        if open_:
            os.kill(pid, signal.SIGKILL)
    else:
        if rng.random() < 0.5:
            # Wait for the first ack: proves the previous kill did not leave the queue unwritable.
            end = time.monotonic() + PROGRESS_TIMEOUT
            while len(buf) < ACK.size and time.monotonic() < end and drain(0.05):
                pass
            if len(buf) < ACK.size:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise SystemExit(f"round {rnd}: no ack within {PROGRESS_TIMEOUT} s after a crash")
        drain(rng.random() * 0.03)
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    while drain(0.01):
        pass
    os.close(r)
    if final and status != 0:
        raise SystemExit(f"final round: writer exited with status {status:#x}")
    if not final and not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise SystemExit(f"round {rnd}: writer ended on its own with status {status:#x} before the kill")
    whole = len(buf) - len(buf) % ACK.size
    records = [ACK.unpack_from(buf, off) for off in range(0, whole, ACK.size)]
    acks = [[n, index] for n, index in records if not index & BLOCK]
    blocks = [[n, index & ~BLOCK] for n, index in records if index & BLOCK]
    return acks, blocks


class LiveReader:
    """A read-only tailer kept open across all rounds (opened once a writer has committed something)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.queue: chronq.Queue | None = None
        self.tailer: chronq.Tailer | None = None
        self.seen: list[list[int]] = []

    def poll(self) -> None:
        if self.tailer is None:
            self.queue = chronq.open(self.path, readonly=True)
            self.tailer = self.queue.tailer()
        while (ex := self.tailer.read()) is not None:
            try:
                rnd, n = parse_checked(bytes(ex.payload))
            except ValueError as e:
                raise SystemExit(f"live reader: torn excerpt at {ex.index:#x}: {e}") from None
            self.seen.append([ex.index, rnd, n])


def main() -> None:
    path, rounds, seed, block_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    live = LiveReader(path)
    acks, blocks = {}, {}
    for r in range(rounds + 1):
        acks[r], blocks[r] = run_round(path, r, seed, block_size, rng, final=r == rounds, live=live)
        if live.tailer is not None or any(acks.values()):
            live.poll()
    print(json.dumps({"acks": acks, "blocks": blocks, "live": live.seen, "kills": rounds}))


if __name__ == "__main__":
    main()
