"""A small service for the rpc.Service tests, the model they check it against, and a child process.

`Summer` adds amounts per key and keeps a count of every message it handled; it answers a third of the
messages with the running total and the count, so its outputs depend on the order in which it
interleaved its inputs (the count) and some messages leave no output of their own (the service's
`consumed` records say where those went). `reflected(output)` reads an output queue the way a model
reader would: the order of input messages it reflects, from histories and the service's records.

Run as a script: ``service_support.py OUT SNAPSHOTS SOURCE_ID IN...`` runs the service until killed,
printing ``ready`` once it is positioned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, Protocol

import msgspec

import chronq
import rpc
from rpc.service import ServiceLog
from wire import WireError
from wire.history import read_history

SERVICE_ID = 9


class Events(Protocol):
    def add(self, key: str, amount: int) -> None: ...


class Totals(Protocol):
    def total(self, key: str, value: int, count: int) -> None: ...


class State(msgspec.Struct):
    totals: dict[str, int] = {}
    count: int = 0


class Summer(Events):
    def __init__(self, out: Any) -> None:
        self.out = rpc.writer(out, Totals)
        self.state = State({}, 0)

    def add(self, key: str, amount: int) -> None:
        s = self.state
        s.count += 1
        v = s.totals[key] = s.totals.get(key, 0) + amount
        if amount % 3 == 0:
            self.out.total(key, v, s.count)

    def snapshot_state(self) -> State:
        return self.state

    def restore_state(self, state: State) -> None:
        self.state = state


class _Marks(ServiceLog):
    def __init__(self) -> None:
        self.found: list[tuple[int, int]] = []

    def consumed(self, service: int, source: int, index: int) -> None:
        self.found.append((source, index))

    def deadLetter(self, service: int, source: int, index: int, error: str) -> None:
        self.found.append((source, index))


class Twice(Events):
    """Answers every message with two outputs (count 1, then 2); with KILL_BETWEEN set in the
    environment, SIGKILLs its own process between the two answers to the key "kill"."""

    def __init__(self, out: Any) -> None:
        self.out = rpc.writer(out, Totals)

    def add(self, key: str, amount: int) -> None:
        self.out.total(key, amount, 1)
        if key == "kill" and os.environ.get("KILL_BETWEEN"):
            os.kill(os.getpid(), signal.SIGKILL)
        self.out.total(key, amount, 2)


def payloads(inputs: dict[int, chronq.Queue]) -> dict[int, dict[int, bytes]]:
    """Every input message: source -> index -> document."""
    return {sid: {ex.index: bytes(ex.payload) for ex in q.tailer()} for sid, q in inputs.items()}


def reflected(
    output: chronq.Queue, inputs: dict[int, dict[int, bytes]]
) -> tuple[list[tuple[int, int]], list[bytes]]:
    """The input messages (source, index) the output reflects, in the order it says they were consumed,
    and the output's data documents without their histories. Asserts no input message caused two
    outputs."""
    marks = _Marks()
    reader = rpc.MethodReader(None, marks, interfaces=[ServiceLog], source_id=0, on_unknown=lambda e, i: None)
    indexes = {sid: sorted(docs) for sid, docs in inputs.items()}
    causes: set[tuple[int, int]] = set()
    done = {sid: 0 for sid in inputs}
    order: list[tuple[int, int]] = []
    bodies: list[bytes] = []

    def upto(sid: int, index: int) -> None:
        ix = indexes[sid]
        while done[sid] < len(ix) and ix[done[sid]] <= index:
            order.append((sid, ix[done[sid]]))
            done[sid] += 1

    t = output.tailer()
    while (ex := t.read(True)) is not None:
        body = bytes(ex.payload)
        if ex.metadata:
            marks.found.clear()
            reader.dispatch(body)
            for sid, index in marks.found:
                upto(sid, index)
            continue
        h, pos = read_history(body)
        assert h is not None and h.sources, body
        sid, index = h.sources[-1]
        assert (sid, index) not in causes, f"input {sid} index {index:#x} was answered twice"
        causes.add((sid, index))
        upto(sid, index)
        bodies.append(body[pos:])
    return order, bodies


def model(inputs: dict[int, dict[int, bytes]], order: list[tuple[int, int]]) -> tuple[State, list[bytes]]:
    """State and output bodies of a Summer fed `order`, in memory (poison messages skipped)."""
    from rpc.testing import Recorder

    rec = Recorder()
    handler = Summer(rec)
    readers = {sid: rpc.MethodReader(None, handler) for sid in inputs}
    for sid, index in order:
        with contextlib.suppress(WireError):  # (a poison message: the service skipped it too)
            readers[sid].dispatch(inputs[sid][index], index)
    return handler.state, rec.documents


def main(argv: list[str]) -> None:
    out, snaps, sid_text, *ins = argv
    queues = {int(spec.split("=")[0]): chronq.open(spec.split("=")[1], source_id=int(spec.split("=")[0]))
              for spec in ins}
    with chronq.open(out, source_id=int(sid_text)) as outq, chronq.open(snaps) as snapq:
        svc = rpc.Service(queues, outq, Summer, int(sid_text), snapshots=snapq, snapshot_every=37, batch=5)
        print("ready", flush=True)
        svc.run()


if __name__ == "__main__":
    main(sys.argv[1:])
