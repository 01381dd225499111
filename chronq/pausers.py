"""Ways to wait for the next excerpt: the trade-off between latency and CPU is the caller's choice."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from typing_extensions import Buffer

if TYPE_CHECKING:
    from chronq.doorbell import Doorbell
    from chronq.tailer import Tailer

__all__ = ["DEFAULT_MAX_WAIT", "MAX_ALSO", "SPACED_IDLE_WAIT", "WATCH_LINGER", "BackoffPauser", "BusyPauser",
           "Pauser", "SleepingPauser", "WakeupPauser", "YieldingPauser"]

#: how long a reader sleeping on a doorbell sleeps at most before it looks anyway: what a queue's
#: appenders that do not ring (Java, an older chronq, a copy from another host) can cost in latency
DEFAULT_MAX_WAIT = 0.001
#: a `max_idle_wait` to give a reader whose looks are made in C (`Tailer.wait`, `WakeupPauser(watch=...)`)
#: where idle CPU matters more than appenders that do not ring: its looks then space out while nothing
#: moves (each that finds nothing doubles the next sleep) up to this, which keeps an idle reader's timer
#: wake-ups (about 2% of a core on a small VM at one per millisecond) to about 1/8 of that, and is what
#: such an appender's first excerpt after a quiet spell can wait. Not the default: by default a reader
#: looks every `max_wait`, so every appender is seen within it.
SPACED_IDLE_WAIT = 0.008
#: how long one `WakeupPauser.pause()` given a tailer to `watch` sleeps at most while nothing moves (its
#: `max_wait` looks are made in C meanwhile): how soon its owner's loop sees a stop flag
WATCH_LINGER = 0.05


class Pauser(Protocol):
    """Called between polls that found nothing; `reset` after a poll that found something."""

    def pause(self) -> None: ...
    def reset(self) -> None: ...


class BusyPauser:
    """Never gives the CPU away: lowest latency, one core at 100 %."""

    def pause(self) -> None:
        pass

    def reset(self) -> None:
        pass


class YieldingPauser:
    """Spins `spins` times, then yields the CPU to other runnable threads/processes."""

    def __init__(self, spins: int = 1000) -> None:
        self.spins = spins
        self._count = 0

    def pause(self) -> None:
        self._count += 1
        if self._count > self.spins:
            os.sched_yield()

    def reset(self) -> None:
        self._count = 0


class SleepingPauser:
    """Spin, then yield, then sleep with a doubling back-off up to `max_sleep` seconds."""

    def __init__(
        self, spins: int = 100, yields: int = 100, min_sleep: float = 20e-6, max_sleep: float = 0.02
    ):
        self.spins = spins
        self.yields = yields
        self.min_sleep = min_sleep
        self.max_sleep = max_sleep
        self._count = 0
        self._sleep = min_sleep

    def pause(self) -> None:
        self._count += 1
        if self._count <= self.spins:
            return
        if self._count <= self.spins + self.yields:
            os.sched_yield()
            return
        time.sleep(self._sleep)
        self._sleep = min(self._sleep * 2, self.max_sleep)

    def reset(self) -> None:
        self._count = 0
        self._sleep = self.min_sleep


class BackoffPauser:
    """Spin for `spin` seconds (yielding the CPU to any runnable process at each look), then wait with a
    doubling back-off from `min_sleep` to `max_sleep` seconds.

    Timed rather than counted, for a loop whose looks cost different amounts. `next_wait()` takes the
    spinning step and returns the wait without taking it (0.0 while spinning), for a caller that waits on
    something that can end the wait early: a socket's `select`, a stop `Event`.
    """

    def __init__(self, spin: float = 0.0, min_sleep: float = 50e-6, max_sleep: float = 0.002) -> None:
        self.spin = spin
        self.min_sleep = min_sleep
        self.max_sleep = max_sleep
        self._since = 0.0
        self._sleep = min_sleep

    def next_wait(self) -> float:
        """0.0 after a yield while the spin lasts, then the next back-off wait (which doubles)."""
        now = time.monotonic()
        if not self._since:
            self._since = now
        if now - self._since < self.spin:
            os.sched_yield()  # spinning, but a runnable process sharing the core goes first
            return 0.0
        wait, self._sleep = self._sleep, min(self._sleep * 2, self.max_sleep)
        return wait

    def pause(self) -> None:
        wait = self.next_wait()
        if wait:
            time.sleep(wait)

    def reset(self) -> None:
        self._since = 0.0
        self._sleep = self.min_sleep


#: how many doorbells besides its own a `WakeupPauser` may sleep on (`Doorbell.wait_any` takes 128)
MAX_ALSO = 127


class WakeupPauser:
    """Sleeps on a queue's doorbell (`Queue.doorbell`): woken within microseconds when an appender
    publishes, and after at most `max_wait` seconds in any case (appenders that do not ring). An idle
    reader costs no CPU but those `max_wait` looks.

    Race-free: the first pause arms the doorbell and reads its sequence without sleeping (the caller
    looks once more); each later pause sleeps only while the sequence is still the one read before the
    caller's looks since (a publication after that read moved it on: the sleep returns at once), and
    reads it again on waking. `reset()` keeps it: the pause after the first empty look that follows
    reading sleeps at once, instead of arming and costing every message's path a second look. With
    `spin` > 0 it first spins (yielding the CPU at each look) for that many seconds, as BackoffPauser.

    `watch`, the tailer the owner reads the doorbell's queue with, makes the `max_wait` looks cheap: they
    compare, in C and without returning to Python, the words an appender that does not ring must change
    (`Tailer.wait`'s); `pause()` then returns when the doorbell rang, one of them moved, or after
    `WATCH_LINGER` seconds (so its owner's loop sees a stop flag). Only for an owner that waits for
    nothing but that tailer's next excerpt. With a `max_idle_wait` above `max_wait` (e.g.
    `SPACED_IDLE_WAIT`) those looks space out within a pause while nothing moves, doubling from
    `max_wait` up to it: an idle reader then costs less CPU, and an appender that does not ring is seen
    within `max_wait` of a pause's start but only within `max_idle_wait` later in it. None (the
    default) keeps a look every `max_wait`.

    `also`: the doorbells of other queues its owner reads (a service with several inputs, a standby
    reading its output too): a pause sleeps on all of them at once (`Doorbell.wait_any`), so a
    publication on any wakes it.
    """

    def __init__(self, doorbell: Doorbell, *, max_wait: float = DEFAULT_MAX_WAIT, spin: float = 0.0,
                 watch: Tailer[Any] | None = None, max_idle_wait: float | None = None,
                 also: Sequence[Doorbell] = ()) -> None:
        if not max_wait > 0:
            raise ValueError(f"max_wait must be positive, not {max_wait!r}")
        if max_idle_wait is not None and not max_idle_wait >= max_wait:
            raise ValueError(f"max_idle_wait must be at least max_wait ({max_wait!r}), not {max_idle_wait!r}")
        if also and watch is not None:
            raise ValueError("watch is for an owner that waits for one tailer only, not with `also`")
        if len(also) > MAX_ALSO:
            raise ValueError(f"a pause sleeps on at most {MAX_ALSO + 1} doorbells, not {len(also) + 1}")
        self.doorbell = doorbell
        self.also = tuple(also)
        self._also_seen: tuple[int, ...] = ()
        self.max_wait = max_wait
        self.max_idle_wait = max_wait if max_idle_wait is None else max_idle_wait
        self.spin = spin
        self.watch = watch
        self._since = 0.0
        self._seen: int | None = None
        self._words: tuple[tuple[Buffer, int, int, int], ...] | None = None

    def _arm(self) -> int:
        """The sequence, and the watched words, read before the caller's next look."""
        seen = self.doorbell.sequence()
        self._words = None if self.watch is None else self.watch.watch_words()
        self._also_seen = tuple(bell.sequence() for bell in self.also)
        return seen

    def next_wait(self) -> float:
        """0.0 while spinning (after a yield) and at the arming pause, then `max_wait`: for a caller that
        waits on something else instead (a socket's `select`, a stop `Event`) and gives up the doorbell."""
        if self.spin:
            now = time.monotonic()
            if not self._since:
                self._since = now
            if now - self._since < self.spin:
                os.sched_yield()
                return 0.0
        if self._seen is None:
            self._seen = self._arm()
            return 0.0
        return self.max_wait

    def pause(self) -> None:
        if self.next_wait():
            assert self._seen is not None
            if self.also:  # one kernel wait on every doorbell
                armed = ((self.doorbell, self._seen), *zip(self.also, self._also_seen, strict=True))
                type(self.doorbell).wait_any(armed, self.max_wait)
            elif self._words is None:
                self.doorbell.wait(self._seen, self.max_wait)
            else:
                self.doorbell.wait_watching(self._seen, WATCH_LINGER, self.max_wait, self._words,
                                            self.max_idle_wait)
            self._seen = self._arm()  # before the caller's next look

    def reset(self) -> None:
        self._since = 0.0  # the sequence stays armed (see the class's docstring)
