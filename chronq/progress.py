"""Progress on stderr for the long commands (`dump`, `tail` of a large queue, `write`, `history`,
`archive`).

Internal to the command lines (chronq's, and rpc's ``chronq write``): public by name so that rpc,
which may not reach into chronq's private modules, shows the same progress.

Shown only when stderr is a terminal and stdout is not (the output goes to a file or a pipe, so the
bar does not interleave with it); otherwise, and in scripts, nothing is printed. With the ``cli``
extra installed (`rich`) it is a rich progress bar; without it, one plain line rewritten in place.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

__all__ = ["Progress", "wanted"]

_EVERY = 0.1  # s between redraws of the plain line: redrawing per message would cost more than reading it


def wanted() -> bool:
    return sys.stderr.isatty() and not sys.stdout.isatty()


class Progress:
    """`with Progress(total, "reading") as p: p.advance(n)`; `total` None when not known."""

    def __init__(self, total: int | None, what: str, *, force: bool | None = None) -> None:
        self.total, self.what, self.done = total, what, 0
        self._on = wanted() if force is None else force
        self._rich: Any = None
        self._task: Any = None
        self._last = 0.0

    def __enter__(self) -> Progress:
        if self._on:
            try:
                from rich.console import Console
                from rich.progress import Progress as RichProgress
            except ImportError:
                pass
            else:
                self._rich = RichProgress(console=Console(file=sys.stderr), transient=True,
                                          redirect_stdout=False, redirect_stderr=False)
                self._rich.start()
                self._task = self._rich.add_task(self.what, total=self.total)
        return self

    def update(self, done: int, total: int | None) -> None:
        """Set where the work is (for work whose size is known only once it starts)."""
        self.total = total
        if self._rich is not None:
            self._rich.update(self._task, total=total)
        self.advance(done - self.done)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if not self._on:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done)
            return
        now = time.monotonic()
        if now - self._last >= _EVERY:
            self._last = now
            self._draw()

    def _draw(self) -> None:
        if self.total:
            text = f"{self.what}: {self.done}/{self.total} ({100 * self.done // self.total}%)"
        else:
            text = f"{self.what}: {self.done}"
        sys.stderr.write(f"\r{text}\x1b[K")
        sys.stderr.flush()

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._on:
            return
        if self._rich is not None:
            self._rich.stop()
        else:
            sys.stderr.write("\r\x1b[K")  # leave the terminal as it was
            sys.stderr.flush()
