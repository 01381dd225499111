"""Retention: delete old cycle files of a queue under a policy, never one that is still needed.

A policy keeps the last N cycles, the cycles newer than a duration, or the newest cycles that fit a
byte budget (any combination: a cycle is deleted only if every given limit lets it go). Whatever the
policy says, these cycles are *protected* and never deleted:

* the newest cycle file, and any cycle at or after the clock's current cycle (an appender writes there);
* every cycle from the one a named tailer's stored position (`index.NAME` in `metadata.cq4t`) is in
  onward: the tailer has not finished it;
* for a replication source, every cycle from the one holding ``chronicle.lastAcknowledgedIndexReplicated``
  onward (all of them while nothing is acknowledged): a sink may still need it;
* every cycle from the one a *hold* names onward (`hold`: ``retention.hold.HOLDER`` in `metadata.cq4t`):
  a reader that is not a named tailer still needs it, such as an `rpc.Service` whose newest snapshot
  was taken at that input index.

Only the oldest cycles are candidates: retention stops at the first protected or kept cycle, so the
queue never gets a hole in its middle. Each deletion is atomic per file: the file is renamed to a
temporary name in the same directory (the name `chronq.store.remove_abandoned_files` cleans up should
the process die right then), then unlinked, so a reader either opens the whole file or finds it gone.
Processes that have it mapped keep reading their mapping and then move on to the next cycle. Afterwards
the table store's listing (``listing.lowestCycle``, ``listing.modCount``) is refreshed as Java's
directory listing refresh does, so `first_index` and new tailers start at the oldest cycle left.

Deleting is all retention does; moving cycles elsewhere before deleting them is archiving's job, which
can run first and pass its own predicate of what has been archived as `may_delete`.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chronq.errors import ChronqError
from chronq.table import LAST_ACKNOWLEDGED_INDEX_REPLICATED, LAST_INDEX_REPLICATED, TableStore

if TYPE_CHECKING:
    from chronq.queue import Queue

__all__ = ["HOLD_PREFIX", "Policy", "RetentionResult", "delete_cycle_file", "hold", "holds", "parse_duration",
           "protected_from", "release", "retain"]

#: Table-store key prefix of holds (see `hold`).
HOLD_PREFIX = "retention.hold."

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


@dataclass(frozen=True)
class Policy:
    """What to keep. Every limit given must allow a deletion; no limit at all deletes nothing.

    `keep_cycles`: the newest N cycle files. `max_age_ms`: cycles whose end is less than this long
    ago (by the queue's clock). `max_bytes`: the newest cycles whose files' allocated sizes add up to
    at most this many bytes (the newest cycle is always kept, even if it alone is larger).
    """

    keep_cycles: int | None = None
    max_age_ms: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("keep_cycles", "max_age_ms", "max_bytes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"retention {name} must be a non-negative integer, not {v!r}")
        if self.keep_cycles == 0:
            raise ValueError("retention keep_cycles must be at least 1 (the current cycle is never deleted)")


@dataclass
class RetentionResult:
    """What a retention run did: the cycles deleted (with their files) and why others were kept."""

    deleted: list[tuple[int, Path]] = field(default_factory=list)
    protected_from: int | None = None  # the oldest protected cycle (None: nothing protected)
    reasons: list[str] = field(default_factory=list)


def parse_duration(text: str) -> int:
    """Milliseconds of a duration such as ``90s``, ``12h``, ``7d``, ``1.5w`` (no unit: seconds)."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r} (a number with ms, s, m, h, d or w)")
    return int(float(m[1]) * _UNIT_MS[m[2] or "s"])


def _named_positions(table: TableStore) -> dict[str, int]:
    """Stored positions of the named tailers (`index.NAME`, not Java's `.version`/`.lock` companions)."""
    out = {}
    for key in table.keys():  # noqa: SIM118 (a TableStore is not iterable)
        if not key.startswith("index."):
            continue
        if key.startswith("index.replicated:") and key.endswith((".version", ".lock")):
            continue
        v = table.get(key)
        if v is not None:
            out[key[len("index."):]] = v
    return out


def hold(queue: Queue, holder: str, index: int) -> None:
    """Keep the cycle of `index` and every later one from retention and archiving, for `holder`.

    For readers that are not named tailers but still need the queue from some index on: a service
    holds its input from the position its newest snapshot reflects, so that a restart can replay what
    follows. The hold lives in the queue's table store (``retention.hold.HOLDER``), where every
    process running retention or archiving on the queue sees it; a later `hold` by the same holder
    moves it (an index of 0 holds every cycle) and `release` drops it.
    """
    if index < 0:
        raise ValueError(f"a hold needs an index >= 0, not {index}")
    _hold_table(queue).set(HOLD_PREFIX + holder, index)


def release(queue: Queue, holder: str) -> None:
    """Drop `holder`'s hold (a table store cannot delete a key: it is kept at -1, meaning none)."""
    table = _hold_table(queue)
    if HOLD_PREFIX + holder in table:
        table.set(HOLD_PREFIX + holder, -1)


def holds(queue: Queue) -> dict[str, int]:
    """The holds on `queue`: holder -> the index it holds from."""
    table = queue.table
    if table is None:
        return {}
    out = {}
    for key in table.keys():  # noqa: SIM118 (a TableStore is not iterable)
        if key.startswith(HOLD_PREFIX):
            v = table.get(key)
            if v is not None and v >= 0:
                out[key[len(HOLD_PREFIX):]] = v
    return out


def _hold_table(queue: Queue) -> TableStore:
    table = queue.table
    if table is None:
        raise ChronqError(f"{queue.path}: holds need the queue's metadata.cq4t")
    return table


def protected_from(queue: Queue, replication_source: bool | None = None,
                   newest: bool = True) -> tuple[int | None, list[str]]:
    """The oldest cycle retention must not delete (every later one is protected too), with the reasons.

    `replication_source` None detects a source by its table store having recorded a replicated or
    acknowledged index; pass True for a source that has not sent anything yet. `newest` False leaves
    out the newest and the current cycle, keeping only what readers still need (named tailers, sinks):
    archiving, which has its own rule for the cycles still being written, moves nothing they need.
    """
    cycles = queue.fresh_cycles()
    if not cycles:
        return None, []
    rc = queue.roll_cycle
    limits: list[tuple[int, str]] = []
    if newest:
        now = queue.cycle_now()
        limits += [(cycles[-1], f"cycle {cycles[-1]} is the newest"),
                   (now, f"cycle {now} is the current cycle")]
    table = queue.table
    if table is not None:
        for name, index in _named_positions(table).items():
            c = rc.to_cycle(index) if index > 0 else cycles[0]
            limits.append((c, f"named tailer {name!r} is in cycle {c}"))
        for holder, index in holds(queue).items():
            c = rc.to_cycle(index) if index > 0 else cycles[0]
            limits.append((c, f"held by {holder} from cycle {c} (index {index:#x})"))
        acked = table.get(LAST_ACKNOWLEDGED_INDEX_REPLICATED, -1)
        sent = table.get(LAST_INDEX_REPLICATED, -1)
        acked = -1 if acked is None else acked
        source = replication_source
        if source is None:
            source = acked >= 0 or (sent is not None and sent >= 0)
        if source:
            c = rc.to_cycle(acked) if acked >= 0 else cycles[0]
            limits.append((c, f"sinks acknowledged up to cycle {c} (index {acked:#x})"))
    if not limits:
        return None, []
    oldest = min(c for c, _ in limits)
    return oldest, [why for c, why in limits if c == oldest]


def _allocated(path: Path) -> int:
    try:
        return os.stat(path).st_blocks * 512  # sparse files: what the disk holds, not the nominal size
    except FileNotFoundError:
        return 0


def _candidates(queue: Queue, policy: Policy, cycles: list[int]) -> list[int]:
    """The oldest cycles the policy lets go (a prefix of `cycles`)."""
    if policy.keep_cycles is None and policy.max_age_ms is None and policy.max_bytes is None:
        return []
    n = len(cycles)
    allowed = n - 1  # the newest cycle stays whatever the policy
    if policy.keep_cycles is not None:
        allowed = min(allowed, max(0, n - policy.keep_cycles))
    if policy.max_age_ms is not None:
        horizon = queue.clock.millis() - policy.max_age_ms
        rc, epoch = queue.roll_cycle, queue.epoch
        old = 0
        while old < n and rc.cycle_end(cycles[old], epoch) <= horizon:
            old += 1
        allowed = min(allowed, old)
    if policy.max_bytes is not None:
        total, keep = 0, 0
        for c in reversed(cycles):
            total += _allocated(queue.file_for(c))
            if keep and total > policy.max_bytes:
                break
            keep += 1
        allowed = min(allowed, n - keep)
    return cycles[:allowed]


def delete_cycle_file(path: Path) -> bool:
    """Delete one cycle file atomically: rename it aside in its directory, then unlink it.

    False if it was already gone (another retention run got there first)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        os.rename(path, tmp)
    except FileNotFoundError:
        return False
    os.unlink(tmp)
    return True


def retain(
    queue: Queue,
    policy: Policy,
    *,
    replication_source: bool | None = None,
    may_delete: Callable[[int, Path], bool] | None = None,
    dry_run: bool = False,
) -> RetentionResult:
    """Delete the oldest cycle files `policy` lets go, except protected ones (see the module doc).

    `may_delete(cycle, path)` can veto a deletion (say, until the file is archived); a veto stops the
    run there, as a protected cycle does. `dry_run` reports what would be deleted without deleting.
    """
    if queue.readonly:
        raise ChronqError(f"{queue.path}: retention deletes files; open the queue writable")
    queue.check_open()
    result = RetentionResult()
    cycles = queue.fresh_cycles()
    limit, reasons = protected_from(queue, replication_source)
    result.protected_from, result.reasons = limit, reasons
    for c in _candidates(queue, policy, cycles):
        if limit is not None and c >= limit:
            break
        path = queue.file_for(c)
        if may_delete is not None and not may_delete(c, path):
            result.reasons.append(f"cycle {c} was vetoed by may_delete")
            break
        if dry_run:
            result.deleted.append((c, path))
            continue
        try:
            gone = delete_cycle_file(path)
        except OSError as e:
            raise ChronqError(f"{path}: cannot delete cycle {c}: {e}") from e
        if gone:
            log.info("retention deleted cycle %d: %s", c, path)
            result.deleted.append((c, path))
    if result.deleted and not dry_run and queue.table is not None:
        queue.table.refresh_listing(queue.fresh_cycles)  # lowestCycle moves on, modCount tells readers
    return result
