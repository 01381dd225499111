"""The checks on what a replication peer says about its queue (`chronq.replication.bounds`)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from chronq.replication import ProtocolError
from chronq.replication.bounds import (
    CLOCK_SLACK_MS,
    MAX_CYCLE_SHIFT,
    MAX_EPOCH_MS,
    IndexBound,
    queue_roll_cycle,
)
from chronq.replication.protocol import QueueInfo
from chronq.rollcycles import FAST_DAILY, ROLL_CYCLES, FixedClock, RollCycle

NOW = 1_790_000_000_000  # 2026-09-21
YEAR_MS = 365 * 86_400_000


def info_of(rc: RollCycle, epoch: int = 0, host: int = 1) -> QueueInfo:
    return QueueInfo(rc.format, rc.length_ms, rc.index_count, rc.index_spacing, epoch, host)


@pytest.mark.parametrize("rc", ROLL_CYCLES.values(), ids=list(ROLL_CYCLES))
def test_every_known_roll_cycle_passes(rc: RollCycle) -> None:
    assert queue_roll_cycle(info_of(rc, rc.default_epoch)) == rc


@pytest.mark.parametrize(("info", "error"), [
    (info_of(FAST_DAILY, epoch=1 << 62), "epoch 4611686018427387904 ms is outside"),
    (info_of(FAST_DAILY, epoch=-(1 << 62)), "epoch -4611686018427387904 ms is outside"),
    (QueueInfo("yyyyMMdd'F'", 0, 4096, 256, 0, 1), "cycle length 0 ms"),
    (QueueInfo("yyyyMMdd'F'", 1 << 62, 4096, 256, 0, 1), "cycle length"),
    (QueueInfo("yyyyMMdd'F'", 86_400_000, 4095, 256, 0, 1), "indexCount 4095 is not a power of two"),
    (QueueInfo("yyyyMMdd'F'", 86_400_000, -(1 << 31), 256, 0, 1), "indexCount"),
    (QueueInfo("yyyyMMdd'F'", 86_400_000, 4096, 0, 0, 1), "indexSpacing 0"),
    (QueueInfo("yyyyMMdd'F'", 86_400_000, 1 << 20, 1 << 20, 0, 1), "need 60 sequence bits"),
    (QueueInfo("yyyyMMdd'Q'", 86_400_000, 4096, 256, 0, 0), "host id 0"),
    (QueueInfo("yyyyMMdd-HHmm'V'", 1, 8, 1, 0, 1), "the present cycle 17\\d+ has no index in 31 cycle bits"),
    (QueueInfo("yyyyMMddQ", 86_400_000, 4096, 256, 0, 1), "unusable roll cycle .*letter 'Q'"),
])
def test_a_bad_queue_info_is_refused_naming_the_field(info: QueueInfo, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        queue_roll_cycle(info, FixedClock(NOW))


@given(st.sampled_from([rc.format for rc in ROLL_CYCLES.values()]) | st.text(max_size=20),
       st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-(1 << 31), (1 << 31) - 1),
       st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1),
       st.integers(0, (1 << 32) - 1))
@example("yyyyMMdd-HHmm'V'", 1, 8, 1, 0, 1)  # (a cycle of 1 ms: today's cycle number has no index)
def test_any_queue_info_is_a_usable_roll_cycle_or_a_protocol_error(
        fmt: str, length: int, count: int, spacing: int, epoch: int, host: int) -> None:
    try:
        rc = queue_roll_cycle(QueueInfo(fmt, length, count, spacing, epoch, host), FixedClock(NOW))
    except ProtocolError:
        return
    assert abs(epoch) <= MAX_EPOCH_MS and rc.cycle_shift <= MAX_CYCLE_SHIFT
    # what the sink then does with it: name today's cycle file and make an index of it
    cycle = rc.cycle_at(NOW, epoch)
    assert rc.file_name(cycle, epoch).endswith(".cq4")
    assert rc.to_cycle(rc.to_index(cycle, 0)) == cycle


def test_index_bound_refuses_the_far_future_and_the_last_cycle() -> None:
    rc = FAST_DAILY
    bound = IndexBound(rc, 0, "peer:1", FixedClock(NOW))
    today = rc.cycle_at(NOW)
    bound.check(rc.to_index(today, 5), "Run")
    bound.check(rc.to_index(rc.cycle_at(NOW + CLOCK_SLACK_MS), 0), "Run")  # a clock a little ahead
    with pytest.raises(ProtocolError, match=f"Run from peer:1 holds index .* in cycle {today + 365_250}, "
                                            f"beyond cycle {today}"):
        bound.check(rc.to_index(today + 365_250, 0), "Run")  # a thousand years on
    with pytest.raises(ProtocolError, match="in cycle 2147483647"):
        bound.check(rc.to_index((1 << 31) - 1, 0), "Run")
    with pytest.raises(ProtocolError, match="negative index"):
        bound.check(-1, "Run")
    with pytest.raises(ProtocolError, match="Excerpts from peer:1 holds index"):
        bound.check_items([(rc.to_index(today, 0), False, b"a"), (rc.to_index(today + 1000, 0), False, b"b")])


def test_index_bound_follows_the_clock() -> None:
    clock = FixedClock(NOW)
    bound = IndexBound(FAST_DAILY, 0, "peer:1", clock)
    tomorrow = FAST_DAILY.to_index(FAST_DAILY.cycle_at(NOW) + 1, 0)
    with pytest.raises(ProtocolError):
        bound.check(tomorrow, "Run")
    clock.advance(86_400_000)
    bound.check(tomorrow, "Run")


@given(st.sampled_from(list(ROLL_CYCLES.values())), st.integers(0, (1 << 63) - 1),
       st.integers(0, 1000 * YEAR_MS))
def test_index_bound_accepts_exactly_the_cycles_up_to_now_plus_slack(rc: RollCycle, index: int,
                                                                     now: int) -> None:
    bound = IndexBound(rc, rc.default_epoch, "peer:1", FixedClock(now))
    limit = rc.cycle_at(now + CLOCK_SLACK_MS, rc.default_epoch)
    try:
        bound.check(index, "Run")
    except ProtocolError:
        assert rc.to_cycle(index) > limit
    else:
        assert rc.to_cycle(index) <= limit
