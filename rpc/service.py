"""Event-sourced services: input queue -> handler -> output queue, restartable without duplicates.

The output queue is the service's checkpoint. Every output document carries a MessageHistory whose
sources include (input source id, input index) of the message that caused it, so after a crash the
service can rebuild its state by replaying the input up to that index with outputs suppressed, and
continue with exactly the messages it missed.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chronq.errors import IndexNotFoundError
from chronq.pausers import Pauser, WakeupPauser
from chronq.tailer import Direction
from rpc import _codec
from rpc._reader import MethodReader, UnknownHook, UnknownTypeHook

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from chronq.appender import Appender
    from chronq.queue import Queue

__all__ = ["Output", "Service", "Start", "last_source_index"]


class Start(enum.Enum):
    """Where a service starts reading its input (an int index is also accepted: start there)."""

    ALL = "all"  # every input message from the first, outputs written
    NEW = "new"  # only messages appended after start
    MISSED = "missed"  # replay up to the last one reflected in the output silently, then continue


class Output:
    """What the handler factory gets to build its writers on: the output queue's appender, gated.

    While the service replays to rebuild state `enabled` is False and writes are dropped.
    """

    def __init__(self, appender: Appender, source_id: int) -> None:
        self._write = appender.write
        self.source_id = source_id
        self.enabled = True
        self.dropped = 0

    def write(self, data: Buffer) -> int | None:
        """The index written, or None: dropped while replaying."""
        if self.enabled:
            return self._write(data)
        self.dropped += 1
        return None


def last_source_index(output: Queue, input_source_id: int) -> int | None:
    """The input index recorded in the newest output document whose history names `input_source_id`.

    Scans backwards from the end, so it costs one document when the service owns its output queue.
    """
    t = output.tailer()
    t.direction = Direction.BACKWARD
    t.to_end()
    while (ex := t.read()) is not None:
        if not ex.metadata:
            found = _source_in(ex.payload, input_source_id)
            if found is not None:
                return found
    return None


def _source_in(payload: Any, source_id: int) -> int | None:
    h, _ = _codec.read_history(payload)
    if h is None:
        return None
    for sid, index in reversed(h.sources):
        if sid == source_id:
            return int(index)
    return None


class Service:
    """Runs `handler_factory(output)` over `input`, writing to `output` with history id `source_id`.

    `input_source_id` (default: the input queue's source id) is what output histories record as the
    origin; it must be non-zero for `Start.MISSED`. `stop()` is graceful: the current message finishes.
    `on_unknown`, `on_unknown_type` and `interfaces` are the method reader's (see `rpc.MethodReader`):
    only methods of the Protocols the handler declares, or of `interfaces`, are called.
    """

    def __init__(
        self,
        input: Queue,
        output: Queue,
        handler_factory: Callable[[Output], object],
        source_id: int,
        *,
        start: Start | int = Start.MISSED,
        input_source_id: int | None = None,
        pauser: Pauser | None = None,
        on_unknown: UnknownHook | None = None,
        on_unknown_type: UnknownTypeHook | None = None,
        interfaces: Sequence[type] = (),
    ) -> None:
        if not source_id:
            raise ValueError("a service needs a non-zero source_id to record history in its output")
        if input_source_id is None:
            input_source_id = int(getattr(input, "source_id", 0) or 0)
        if not input_source_id:
            raise ValueError("the input needs a non-zero source id (chronq.open(..., source_id=N)) "
                             "or pass input_source_id=N")
        self.input = input
        self.output = output
        self.source_id = source_id
        self.input_source_id = input_source_id
        self.out = Output(output.appender(), source_id)
        self.handler = handler_factory(self.out)
        self.tailer = input.tailer()
        self.reader = MethodReader(
            self.tailer, self.handler, interfaces=interfaces, source_id=input_source_id,
            on_unknown=on_unknown, on_unknown_type=on_unknown_type,
        )
        # idle, the service sleeps on the input queue's doorbell: no CPU while nothing comes, woken by
        # the appender of the next message (and looking at least every `max_wait` for appenders that
        # do not ring, as Java's)
        self.pauser: Pauser = pauser or WakeupPauser(input.doorbell)
        self._stop = threading.Event()
        self.replay_until: int | None = None  # outputs are suppressed up to this input index
        self.processed = 0
        self._position(start)

    def _position(self, start: Start | int) -> None:
        if start is Start.NEW:
            self.tailer.to_end()
        elif start is Start.ALL:
            self.tailer.to_start()
        elif start is Start.MISSED:
            self.tailer.to_start()
            self.replay_until = last_source_index(self.output, self.input_source_id)
        elif isinstance(start, int) and not isinstance(start, bool):
            if not self.tailer.move_to_index(start):
                raise IndexNotFoundError(f"{self.input.path}: start index {start:#x} is not in the queue")
        else:
            raise TypeError(f"start must be a Start or an index, not {start!r}")
        self.out.enabled = self.replay_until is None

    @property
    def replaying(self) -> bool:
        return not self.out.enabled

    def poll(self) -> bool:
        """Handle one input message if one is ready; False if none was."""
        ex = self.tailer.read()
        if ex is None:
            return False
        if ex.metadata:
            return True
        index = ex.index
        if not self.out.enabled and self.replay_until is not None and index > self.replay_until:
            self.out.enabled = True
        self.reader.dispatch(ex.payload, index)
        self.processed += 1
        return True

    def run(self, *, until_idle: bool = False) -> int:
        """Handle messages until `stop()` (or, with `until_idle`, until none is ready); returns the count."""
        n0 = self.processed
        pauser = self.pauser
        while not self._stop.is_set():
            if self.poll():
                pauser.reset()
            elif until_idle:
                break
            else:
                pauser.pause()
        return self.processed - n0

    def stop(self) -> None:
        """Ask `run` to return after the message in hand; safe from another thread or a signal handler."""
        self._stop.set()
