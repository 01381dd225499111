"""Snapshot planning: which bytes of which cycle files one DataFrame (or one micro-batch) reads.

Plans run on the driver and only touch store headers, index arrays and the few documents after
``writePosition``; executors then walk exactly the planned ranges. Every range carries the sequence
bound pinned at planning time, so documents appended later never leak into a planned DataFrame.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from chronq import _directory
from chronq.spark import _files
from chronq.spark._files import CyclePath, LiveLayout


@dataclass(frozen=True)
class CycleState:
    """A cycle file as seen at planning time: its layout and the complete data documents it holds."""

    cycle: int
    path: str
    layout: LiveLayout
    count: int  # complete data documents (next sequence number)
    end_pos: int  # first byte after the last complete document
    closed: bool  # EOF seen: nothing more will ever be appended


@dataclass(frozen=True)
class Range:
    """Data sequences ``[lo, hi)`` of one cycle, walked from ``start_pos`` (sequence ``start_seq``).

    Picklable; one is shipped to an executor per Spark partition.
    """

    path: str
    cycle: int
    shift: int
    aligned: bool
    start_pos: int
    start_seq: int
    lo: int
    hi: int
    end_pos: int


def cycle_state(cf: CyclePath, aligned_headerless: bool = True) -> CycleState | None:
    """Count the complete documents of one cycle file, or None if the file has no header yet.

    `aligned_headerless`: whether a headerless (libchronicle) file pads its documents (v5 queues).
    """
    buf = _directory.open_map(cf.path)
    if buf is None:
        return None
    try:
        layout = _files.read_layout(buf, cf.path, aligned_headerless=aligned_headerless)
        if layout is None:
            return None
        seq = layout.hinted_seq()
        pos = layout.write_position
        if seq is None:  # no valid hint (no message yet, or an old writer): count from the start
            pos, seq = layout.data_start, 0
        w = _files.walk(buf, cf.path, layout.aligned, pos, seq, end_pos=len(buf))
        return CycleState(cf.cycle, cf.path, layout, w.next_seq, w.next_pos, w.stop == _files.STOP_EOF)
    finally:
        _directory.close_map(buf)


def snapshot(queue_dir: str, first_cycle: int | None = None, last_cycle: int | None = None,
             ) -> list[CycleState]:
    """Every readable cycle of the queue within the cycle bounds (inclusive), in cycle order."""
    states = []
    lowest = -1 if first_cycle is None else first_cycle
    highest = 1 << 62 if last_cycle is None else last_cycle
    directory = _files.queue_directory(queue_dir)
    assert directory.roll is not None
    for cycle, path in directory.cycle_files():
        if not lowest <= cycle <= highest:
            continue
        st = cycle_state(CyclePath(cycle, str(path)), directory.headerless_aligned)
        if st is not None:
            # rows take their index from the file's own split: one of another roll cycle is refused
            _directory.check_split(st.layout.store, directory.roll)
            states.append(st)
    return states


def ranges(state: CycleState, lo: int, hi: int, rows_per_range: int) -> list[Range]:
    """Split ``[lo, hi)`` of one cycle into equal ranges of at most about ``rows_per_range`` messages.

    Equal sizes keep every core busy to the end (a 5M-message cycle with a 4M limit becomes 2 x 2.5M,
    not 4M + 1M). Cuts are at whole index steps (each size within one step of equal), so every range
    starts at an indexed message found through the cycle's index: the driver never walks the data.
    """
    hi = min(hi, state.count)
    if lo >= hi and not (lo == 0 and state.count == 0):
        return []
    layout = state.layout
    count, spacing = hi - lo, layout.index_spacing
    parts = max(1, min(-(-count // max(rows_per_range, 1)), -(-count // spacing)))
    cuts = sorted({(lo + k * count // parts) // spacing * spacing for k in range(1, parts)})
    cuts = [c for c in cuts if c > lo]
    bounds = [lo, *cuts, max(hi, lo)]
    # each range starts where a tailer's move_to_index would put it: the native index lookup
    found = _directory.seek(state.path, state.cycle, layout.store, [b for b in bounds[:-1] if b > 0])
    starts = iter(found)
    out = []
    for start, stop in itertools.pairwise(bounds):
        pos, seq = 0, 0  # from the file start, so the queue's own metadata is readable too
        if start > 0:
            at = next(starts)
            if at is not None:
                pos, seq = at, start
        out.append(Range(state.path, state.cycle, layout.shift, layout.aligned, pos, seq, start, stop,
                         state.end_pos))
    return out
