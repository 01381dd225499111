"""Roll cycles: how a queue splits time into cycle files and a 64-bit index into (cycle, sequence).

Every constant mirrors Chronicle Queue's `RollCycles` (and the legacy/large/sparse/test enums) so that a
queue written by Java names its files and numbers its excerpts exactly as chronq does. Time is UTC only.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "DEFAULT",
    "FAST_DAILY",
    "ROLL_CYCLES",
    "WEEKLY",
    "Clock",
    "FixedClock",
    "RollCycle",
    "SystemClock",
    "by_format",
    "by_name",
    "file_splits",
]

_DAY_MS = 86_400_000
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


@runtime_checkable
class Clock(Protocol):
    """Where the queue gets "now" from; injectable so that tests can roll cycles deterministically."""

    def millis(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds since the Unix epoch (what Java's default time provider returns)."""

    def millis(self) -> int:
        return time.time_ns() // 1_000_000


class FixedClock:
    """A clock that only moves when told to: for tests and for replaying at a chosen time."""

    def __init__(self, millis: int = 0) -> None:
        self._millis = millis

    def millis(self) -> int:
        return self._millis

    def set(self, millis: int) -> None:
        self._millis = millis

    def advance(self, millis: int) -> None:
        self._millis += millis


# -- the subset of java.time.format.DateTimeFormatter patterns that roll cycles use ----------------------

_TOKEN = re.compile(r"'([^']*)'|([A-Za-z])\2*|(.)")
_FIELDS = {"y": "year", "M": "month", "d": "day", "H": "hour", "m": "minute", "s": "second",
           "Y": "week_year", "w": "week"}


#: what a literal part of a format must not hold: a cycle file's name comes from the format, and a
#: format comes from outside (a replication peer, a table store or archive manifest on disk), so it must
#: not name a path outside the queue's directory (nor one the OS cuts short at NUL)
_PATH_PARTS = ("/", "\\", "..", "\0")


def _tokens(pattern: str) -> list[tuple[str, str]]:
    """Split a pattern into ("lit", text) and (letter, run) tokens; reject letters we cannot honour and
    literal text that would make a file name a path. Every RollCycle checks its format here when it is
    made, and every name is formatted and parsed through here: so a format from any source (a peer's
    QueueInfo, a table store or cycle header on disk, an archive manifest) is refused before it names
    a file."""
    out = _split(pattern)
    literal = ""  # adjacent literals make one run of the name: `'.''.'` is `..` too
    for kind, text in [*out, ("end", "")]:
        if kind == "lit":
            literal += text
            continue
        bad = next((part for part in _PATH_PARTS if part in literal), None)
        if bad is not None:
            raise ValueError(f"roll-cycle format {pattern!r} holds {bad!r} in its literal text "
                             f"{literal!r}: its file names would be paths, not names in the queue's "
                             "directory")
        literal = ""
    return out


def _split(pattern: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for m in _TOKEN.finditer(pattern):
        if m.group(1) is not None:
            out.append(("lit", m.group(1) if m.group(1) else "'"))
        elif m.group(2) is not None:
            if m.group(2) not in _FIELDS:
                letter = m.group(2)
                raise ValueError(f"unsupported pattern letter {letter!r} in roll-cycle format {pattern!r}")
            out.append((m.group(2), m.group(0)))
        else:
            out.append(("lit", m.group(3)))
    return out


def _week1_start(week_year: int) -> _dt.date:
    """Sunday that starts week 1 of a week-based year (weeks start Sunday, week 1 holds 1 January)."""
    jan1 = _dt.date(week_year, 1, 1)
    return jan1 - _dt.timedelta(days=(jan1.weekday() + 1) % 7)


def _week_fields(day: _dt.date) -> tuple[int, int]:
    # Java's YYYY/ww are locale week fields; the vectors (2024W03 for Sunday 2024-01-14) were written with
    # Sunday-first weeks and minimal-days 1, which also makes every WEEKLY cycle (Sunday epoch) one week.
    sunday = day - _dt.timedelta(days=(day.weekday() + 1) % 7)
    week_year = (sunday + _dt.timedelta(days=6)).year
    return week_year, (sunday - _week1_start(week_year)).days // 7 + 1


def _format(pattern: str, millis: int) -> str:
    t = _EPOCH + _dt.timedelta(milliseconds=millis)
    values = {"year": t.year, "month": t.month, "day": t.day, "hour": t.hour, "minute": t.minute,
              "second": t.second}
    if "Y" in pattern or "w" in pattern:
        values["week_year"], values["week"] = _week_fields(t.date())
    parts = []
    for kind, text in _tokens(pattern):
        if kind == "lit":
            parts.append(text)
        else:
            parts.append(str(values[_FIELDS[kind]]).zfill(len(text)))
    return "".join(parts)


def _parse(pattern: str, text: str) -> int:
    """Milliseconds of the instant a name stands for; raises ValueError naming what did not match."""
    regex = []
    names = []
    for kind, run in _tokens(pattern):
        if kind == "lit":
            regex.append(re.escape(run))
        else:
            regex.append(rf"(\d{{{len(run)}}})" if len(run) > 1 else r"(\d+)")
            names.append(_FIELDS[kind])
    m = re.fullmatch("".join(regex), text)
    if m is None:
        raise ValueError(f"file name {text!r} does not match roll-cycle format {pattern!r}")
    v = dict(zip(names, map(int, m.groups()), strict=True))
    try:
        if "week" in v:
            day = _week1_start(v.get("week_year", 1970)) + _dt.timedelta(weeks=v["week"] - 1)
        else:
            day = _dt.date(v.get("year", 1970), v.get("month", 1), v.get("day", 1))
        t = _dt.datetime(day.year, day.month, day.day, v.get("hour", 0), v.get("minute", 0),
                         v.get("second", 0), tzinfo=_dt.UTC)
    except ValueError as e:
        raise ValueError(f"file name {text!r} is not a valid date for format {pattern!r}: {e}") from None
    return (t - _EPOCH) // _dt.timedelta(milliseconds=1)


def _pow2_at_least(n: int, minimum: int) -> int:
    return max(minimum, 1 << max(0, n - 1).bit_length())


@dataclass(frozen=True, slots=True)
class RollCycle:
    """One roll cycle: file period, file-name pattern and the index split (stored values win over these)."""

    name: str
    format: str
    length_ms: int
    index_count: int
    index_spacing: int
    default_epoch: int = 0
    cycle_shift: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.length_ms <= 0:
            raise ValueError(f"roll cycle {self.name}: length must be positive, not {self.length_ms}")
        for what, n in (("indexCount", self.index_count), ("indexSpacing", self.index_spacing)):
            if n <= 0 or n & (n - 1):
                raise ValueError(f"roll cycle {self.name}: {what} must be a power of two, not {n}")
        _tokens(self.format)
        bits = 2 * (self.index_count.bit_length() - 1) + self.index_spacing.bit_length() - 1
        object.__setattr__(self, "cycle_shift", max(32, bits))

    @classmethod
    def custom(cls, format: str, length_ms: int, index_count: int = 4096, index_spacing: int = 256,
               name: str | None = None) -> RollCycle:
        """A cycle not in the table (e.g. from a foreign queue); index parameters rounded as Java does."""
        return cls(name or f"CUSTOM[{format}/{length_ms}]", format, length_ms,
                   _pow2_at_least(index_count, 8), _pow2_at_least(index_spacing, 1))

    # -- index arithmetic -------------------------------------------------------------------------------
    @property
    def sequence_mask(self) -> int:
        return (1 << self.cycle_shift) - 1

    @property
    def max_messages_per_cycle(self) -> int:
        """Hard limit of one cycle file: the index arrays' capacity, capped by the sequence bits."""
        return min(self.sequence_mask, self.index_count * self.index_count * self.index_spacing)

    def to_index(self, cycle: int, seq: int) -> int:
        if not 0 <= seq <= self.sequence_mask:
            raise ValueError(f"sequence {seq} does not fit {self.cycle_shift} bits of roll cycle {self.name}")
        if not 0 <= cycle < 1 << (63 - self.cycle_shift):
            raise ValueError(f"cycle {cycle} does not fit the index of roll cycle {self.name}")
        return (cycle << self.cycle_shift) | seq

    def to_cycle(self, index: int) -> int:
        return index >> self.cycle_shift

    def to_sequence(self, index: int) -> int:
        return index & self.sequence_mask

    def split(self, index: int) -> tuple[int, int]:
        """(cycle, sequence) of an index."""
        return index >> self.cycle_shift, index & self.sequence_mask

    # -- time -------------------------------------------------------------------------------------------
    def epoch(self, epoch: int = 0) -> int:
        """The epoch actually used: a builder epoch of 0 means this cycle's default (only WEEKLY has one)."""
        return epoch or self.default_epoch

    def cycle_at(self, millis: int, epoch: int = 0) -> int:
        return (millis - self.epoch(epoch)) // self.length_ms

    def cycle_start(self, cycle: int, epoch: int = 0) -> int:
        """First millisecond of a cycle."""
        return cycle * self.length_ms + self.epoch(epoch)

    def cycle_end(self, cycle: int, epoch: int = 0) -> int:
        """First millisecond after a cycle (start of the next)."""
        return (cycle + 1) * self.length_ms + self.epoch(epoch)

    def _name_epoch(self, epoch: int) -> int:
        # Java names files after the epoch truncated to whole days, so a 05:00 roll keeps calendar names.
        e = self.epoch(epoch)
        return e - e % _DAY_MS

    def file_stem(self, cycle: int, epoch: int = 0) -> str:
        return _format(self.format, cycle * self.length_ms + self._name_epoch(epoch))

    def file_name(self, cycle: int, epoch: int = 0) -> str:
        """`<formatted cycle>.cq4`, e.g. `20240115F.cq4` for FAST_DAILY cycle 19737."""
        return self.file_stem(cycle, epoch) + ".cq4"

    def parse_file_name(self, name: str, epoch: int = 0) -> int:
        """Cycle of a cycle file name (with or without `.cq4`); ValueError if it is not one of ours.

        A name that formats a time before the epoch, or a cycle too large for this roll cycle's
        indexes, is not one of ours either: no appender could have written it, and the queue's
        index arithmetic could not name its excerpts.
        """
        stem = name.removesuffix(".cq4")
        cycle = (_parse(self.format, stem) - self._name_epoch(epoch)) // self.length_ms
        for candidate in (cycle, cycle + 1):
            if self.file_stem(candidate, epoch) == stem:
                if not 0 <= candidate < 1 << (63 - self.cycle_shift):
                    raise ValueError(f"file name {name!r} names cycle {candidate}, outside the indexes of "
                                     f"roll cycle {self.name}")
                return candidate
        raise ValueError(f"file name {name!r} is not a cycle start of roll cycle {self.name}")


_ALL = (
    RollCycle("FIVE_MINUTELY", "yyyyMMdd-HHmm'V'", 300_000, 2048, 256),
    RollCycle("TEN_MINUTELY", "yyyyMMdd-HHmm'X'", 600_000, 2048, 256),
    RollCycle("TWENTY_MINUTELY", "yyyyMMdd-HHmm'XX'", 1_200_000, 2048, 256),
    RollCycle("HALF_HOURLY", "yyyyMMdd-HHmm'H'", 1_800_000, 2048, 256),
    RollCycle("FAST_HOURLY", "yyyyMMdd-HH'F'", 3_600_000, 4096, 256),
    RollCycle("TWO_HOURLY", "yyyyMMdd-HH'II'", 7_200_000, 4096, 256),
    RollCycle("FOUR_HOURLY", "yyyyMMdd-HH'IV'", 14_400_000, 4096, 256),
    RollCycle("SIX_HOURLY", "yyyyMMdd-HH'VI'", 21_600_000, 4096, 256),
    RollCycle("FAST_DAILY", "yyyyMMdd'F'", 86_400_000, 4096, 256),
    RollCycle("WEEKLY", "YYYY'W'ww", 604_800_000, 4096, 256, default_epoch=259_200_000),
    RollCycle("MINUTELY", "yyyyMMdd-HHmm", 60_000, 2048, 16),
    RollCycle("HOURLY", "yyyyMMdd-HH", 3_600_000, 4096, 16),
    RollCycle("DAILY", "yyyyMMdd", 86_400_000, 8192, 64),
    RollCycle("LARGE_HOURLY", "yyyyMMdd-HH'L'", 3_600_000, 8192, 64),
    RollCycle("LARGE_DAILY", "yyyyMMdd'L'", 86_400_000, 32768, 128),
    RollCycle("XLARGE_DAILY", "yyyyMMdd'X'", 86_400_000, 32768, 256),
    RollCycle("HUGE_DAILY", "yyyyMMdd'H'", 86_400_000, 32768, 1024),
    RollCycle("SMALL_DAILY", "yyyyMMdd'S'", 86_400_000, 8192, 8),
    RollCycle("LARGE_HOURLY_SPARSE", "yyyyMMdd-HH'LS'", 3_600_000, 4096, 1024),
    RollCycle("LARGE_HOURLY_XSPARSE", "yyyyMMdd-HH'LX'", 3_600_000, 2048, 1 << 20),
    RollCycle("HUGE_DAILY_XSPARSE", "yyyyMMdd'HX'", 86_400_000, 16384, 1 << 20),
    RollCycle("TEST_SECONDLY", "yyyyMMdd-HHmmss'T'", 1_000, 32768, 4),
    RollCycle("TEST4_SECONDLY", "yyyyMMdd-HHmmss'T4'", 1_000, 32, 4),
    RollCycle("TEST_HOURLY", "yyyyMMdd-HH'T'", 3_600_000, 16, 4),
    RollCycle("TEST_DAILY", "yyyyMMdd'T1'", 86_400_000, 8, 1),
    RollCycle("TEST2_DAILY", "yyyyMMdd'T2'", 86_400_000, 16, 2),
    RollCycle("TEST4_DAILY", "yyyyMMdd'T4'", 86_400_000, 32, 4),
    RollCycle("TEST8_DAILY", "yyyyMMdd'T8'", 86_400_000, 128, 8),
)

ROLL_CYCLES: Mapping[str, RollCycle] = {rc.name: rc for rc in _ALL}
_BY_FORMAT = {(rc.format, rc.length_ms): rc for rc in _ALL}
FAST_DAILY = ROLL_CYCLES["FAST_DAILY"]
WEEKLY = ROLL_CYCLES["WEEKLY"]
DEFAULT = FAST_DAILY


# Index parameters Java gave a cycle before it changed them: before 5.24 XLARGE_DAILY had indexCount
# 128 << 10 and HUGE_DAILY 512 << 10. A file with one of these is that cycle's, not another cycle's.
_OLD_SPLITS: Mapping[str, tuple[tuple[int, int], ...]] = {
    "XLARGE_DAILY": ((128 << 10, 256),),
    "HUGE_DAILY": ((512 << 10, 1024),),
}


def file_splits(rc: RollCycle) -> tuple[tuple[int, int], ...] | None:
    """The (indexCount, indexSpacing) pairs a cycle file of `rc` can have been written with; None for a
    cycle not in Java's table (a custom one), whose split can only be learnt from its files."""
    known = _BY_FORMAT.get((rc.format, rc.length_ms))
    if known is None:
        return None
    return ((known.index_count, known.index_spacing), *_OLD_SPLITS.get(known.name, ()))


def by_name(name: str | RollCycle) -> RollCycle:
    """Look a cycle up by its Java constant name (case-insensitive); a RollCycle is returned as is."""
    if isinstance(name, RollCycle):
        return name
    try:
        return ROLL_CYCLES[name.upper()]
    except KeyError:
        raise ValueError(f"unknown roll cycle {name!r}; known: {', '.join(ROLL_CYCLES)}") from None


def by_format(format: str, length_ms: int, index_count: int | None = None,
              index_spacing: int | None = None) -> RollCycle:
    """The cycle a queue stored as (format, length); unknown pairs become a custom cycle.

    A known pair whose file uses other index parameters (e.g. XLARGE_DAILY written before 5.24) also
    becomes a custom cycle, because the index split must follow what is on disk.
    """
    known = _BY_FORMAT.get((format, length_ms))
    if known is not None and index_count in (None, known.index_count) \
            and index_spacing in (None, known.index_spacing):
        return known
    base = known or FAST_DAILY
    return RollCycle.custom(format, length_ms,
                            base.index_count if index_count is None else index_count,
                            base.index_spacing if index_spacing is None else index_spacing,
                            name=known.name if known else None)
