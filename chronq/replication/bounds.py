"""What a peer may say about a queue: its `QueueInfo` checked whole before anything touches the disk, and
the indexes of its `Run` and `Excerpts` frames kept within the present.

A peer authenticated by key or certificate can still be wrong or hostile. A `QueueInfo` epoch of 2^62
would be written into the sink's `metadata.cq4t` and make every later open of the queue fail; an excerpt
dated a thousand years on would end today's cycle, create a cycle file of that year and take every later
local append with it. So the roll cycle and epoch are checked against the ranges a queue can hold, and
no document is accepted in a cycle later than the one the local clock is in, plus `CLOCK_SLACK_MS` for
clocks that disagree a little. A refusal is a `ProtocolError`: the link that brought it closes, the
queue and the other links are untouched.

The roll format's own check (no path in a cycle file name) is the roll cycle's: `by_format` applies it.
"""

from __future__ import annotations

from collections.abc import Sequence

from chronq.replication.errors import ProtocolError
from chronq.replication.protocol import MAX_HOST_ID, QueueInfo
from chronq.rollcycles import Clock, RollCycle, SystemClock, by_format

__all__ = [
    "CLOCK_SLACK_MS",
    "MAX_CYCLE_LENGTH_MS",
    "MAX_CYCLE_SHIFT",
    "MAX_EPOCH_MS",
    "MAX_INDEX_COUNT",
    "MAX_INDEX_SPACING",
    "IndexBound",
    "queue_roll_cycle",
]

CLOCK_SLACK_MS = 300_000  # how far ahead of this host's clock a peer's clock may be (5 minutes)
_DAY_MS = 86_400_000
MAX_CYCLE_LENGTH_MS = 366 * _DAY_MS  # Java's longest cycle is a week; a custom one up to a year
MAX_EPOCH_MS = 366 * _DAY_MS  # an epoch shifts cycle boundaries (a roll time, a week's start): by < a year
MAX_INDEX_COUNT = 1 << 20  # Java's largest, HUGE_DAILY before 5.24, has 512 Ki
MAX_INDEX_SPACING = 1 << 20  # the XSPARSE cycles'
MAX_CYCLE_SHIFT = 48  # sequence bits: with more, too few cycle bits are left for today's cycle numbers


def _power_of_two(n: int, low: int, high: int, what: str) -> None:
    if not low <= n <= high or n & (n - 1):
        raise ProtocolError(f"QueueInfo {what} {n} is not a power of two in {low}..{high}")


def queue_roll_cycle(info: QueueInfo, clock: Clock | None = None) -> RollCycle:
    """The roll cycle a source's `QueueInfo` describes, every field checked first: ProtocolError naming
    the field for anything a queue cannot hold (the sink writes the roll cycle and epoch to its table
    store, where a bad value would outlive the connection), including a roll cycle whose present cycle
    (by `clock`, this host's by default) has no index (a cycle of 1 ms with 32 sequence bits ran out
    of cycle numbers 24 days after its epoch)."""
    if not 1 <= info.length_ms <= MAX_CYCLE_LENGTH_MS:
        raise ProtocolError(f"QueueInfo cycle length {info.length_ms} ms is outside 1..{MAX_CYCLE_LENGTH_MS}")
    _power_of_two(info.index_count, 8, MAX_INDEX_COUNT, "indexCount")
    _power_of_two(info.index_spacing, 1, MAX_INDEX_SPACING, "indexSpacing")
    if not -MAX_EPOCH_MS <= info.epoch <= MAX_EPOCH_MS:
        raise ProtocolError(f"QueueInfo epoch {info.epoch} ms is outside -{MAX_EPOCH_MS}..{MAX_EPOCH_MS}")
    if not 1 <= info.host_id <= MAX_HOST_ID:
        raise ProtocolError(f"QueueInfo host id {info.host_id} is outside 1..{MAX_HOST_ID}")
    try:
        rc = by_format(info.roll_format, info.length_ms, info.index_count, info.index_spacing)
    except (ValueError, OverflowError) as e:
        raise ProtocolError(f"unusable roll cycle in QueueInfo: {e}") from None
    if rc.cycle_shift > MAX_CYCLE_SHIFT:
        raise ProtocolError(f"QueueInfo indexCount {info.index_count} and indexSpacing {info.index_spacing} "
                            f"need {rc.cycle_shift} sequence bits, more than {MAX_CYCLE_SHIFT}")
    now = rc.cycle_at((clock or SystemClock()).millis() + CLOCK_SLACK_MS, info.epoch)
    if not 0 <= now < 1 << (63 - rc.cycle_shift):
        raise ProtocolError(f"QueueInfo roll cycle {rc.name} (cycle length {info.length_ms} ms, epoch "
                            f"{info.epoch} ms): the present cycle {now} has no index in "
                            f"{63 - rc.cycle_shift} cycle bits")
    return rc


class IndexBound:
    """Refuses indexes from a peer in a cycle beyond this host's present (plus the slack): no frame from
    the network may create a future cycle file."""

    def __init__(self, roll_cycle: RollCycle, epoch: int, peer: str, clock: Clock | None = None,
                 slack_ms: int = CLOCK_SLACK_MS) -> None:
        self._rc, self._epoch, self._peer = roll_cycle, epoch, peer
        self._clock = clock or SystemClock()
        self._slack = slack_ms
        self._limit = self._now_limit()

    def _now_limit(self) -> int:
        return self._rc.cycle_at(self._clock.millis() + self._slack, self._epoch)

    @property
    def limit(self) -> int:
        """The latest cycle accepted now."""
        self._limit = self._now_limit()
        return self._limit

    def check(self, index: int, what: str) -> None:
        """ProtocolError unless `index` is in a cycle no later than the present (`what`: the frame)."""
        if index < 0:
            raise ProtocolError(f"{what} from {self._peer} holds the negative index {index}")
        cycle = index >> self._rc.cycle_shift
        if cycle > self._limit and cycle > self.limit:  # the cached limit only grows: the clock is read
            raise ProtocolError(                        # only when a cycle passes it
                f"{what} from {self._peer} holds index {index:#x} in cycle {cycle}, beyond cycle "
                f"{self._limit} (this host's clock plus {self._slack} ms of slack): refused")

    def check_items(self, items: Sequence[tuple[int, bool, bytes]], what: str = "Excerpts") -> None:
        """Every index of an `Excerpts` frame (their order and gaps are the writer's to check)."""
        if items:
            self.check(min(i for i, _, _ in items), what)
            self.check(max(i for i, _, _ in items), what)
