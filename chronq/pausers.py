"""Ways to wait for the next excerpt: the trade-off between latency and CPU is the caller's choice."""

from __future__ import annotations

import os
import time
from typing import Protocol

__all__ = ["BusyPauser", "Pauser", "SleepingPauser", "YieldingPauser"]


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
