"""Latency histograms from message history, in one pass and bounded memory (no Spark).

A method writer puts a `wire.history.MessageHistory` first in every document: a writer with no
input adds one timing when it writes; a service adds (source id, input index) plus its read timing
when it reads and its write timing when it writes. So a message of a chain's last queue carries
``written, read, written, read, written, ...`` and each hop can be measured from the message alone:

* ``queue``   = read by the service - written to its input queue (transport through the queue)
* ``service`` = written to the output - read (the handler's time)
* ``hop``     = both; ``end_to_end`` = last timing - first timing.

With several queues (a chain ``q0 -> q1 -> ...``) hop ``k`` is measured on queue ``k``'s messages
from their last three timings, which is what `chronq.spark.latency` computes with a join (the
input's write time is the timing the service carried forward). With one queue every hop recorded
in its histories is unrolled. Values go into `Histogram`, a log-bucketed histogram (2^n ranges, each
split into 2^7 sub-buckets: under 0.8 % relative error) whose memory does not grow with the queue.

This module is the one home of the latency report's percentiles, their labels and their plot:
`chronq.spark.latency` aggregates its joined hops into the same histograms (bucket counts computed
by Spark) and draws with `draw_percentiles`.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chronq.errors import ChronqError, CorruptQueueError
from wire.errors import WireError
from wire.history import read_history
from wire.methods import event_at

PERCENTILES: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999, 0.9999)
METRICS: tuple[str, ...] = ("queue", "service", "hop")
UNITS: dict[str, int] = {"ns": 1, "us": 1_000, "ms": 1_000_000}
FRACTION_BITS = 7
_REPORT_EVERY = 1024  # messages between `on_read` calls: a call per message would cost more than the bar

Key = tuple[int | None, str | None, str, str]  # (window, method, hop, metric)


class Histogram:
    """Counts of non-negative integers in buckets of bounded relative error (HdrHistogram-like).

    Values below 2^FRACTION_BITS have a bucket each; above, each power-of-two range is split into
    2^FRACTION_BITS equal buckets, so a bucket is at most 1/128 of its values wide. The count, the
    smallest and the largest value are exact.
    """

    __slots__ = ("count", "counts", "max", "min")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.min: int | None = None
        self.max: int | None = None

    @staticmethod
    def bucket_of(value: int) -> int:
        """The bucket number of `value` (negative values count as 0); buckets grow with values."""
        v = max(0, value)
        shift = v.bit_length() - 1 - FRACTION_BITS
        if shift <= 0:
            return v
        return ((shift + 1) << FRACTION_BITS) + (v >> shift) - (1 << FRACTION_BITS)

    @staticmethod
    def bucket_range(bucket: int) -> tuple[int, int]:
        """(lowest, highest) value of a bucket."""
        if bucket < 2 << FRACTION_BITS:
            return bucket, bucket
        shift = (bucket >> FRACTION_BITS) - 1
        low = ((bucket & ((1 << FRACTION_BITS) - 1)) + (1 << FRACTION_BITS)) << shift
        return low, low + (1 << shift) - 1

    def add(self, value: int) -> None:
        v = max(0, value)  # clocks of different hosts can disagree; a latency is never below zero
        b = self.bucket_of(v)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.count += 1
        if self.min is None or v < self.min:
            self.min = v
        if self.max is None or v > self.max:
            self.max = v

    def merge_bucket(self, bucket: int, count: int, low: int, high: int) -> None:
        """Add `count` values of `bucket` whose smallest is `low` and largest `high` (counted elsewhere,
        as Spark does for `chronq.spark.latency`)."""
        self.counts[bucket] = self.counts.get(bucket, 0) + count
        self.count += count
        if self.min is None or low < self.min:
            self.min = low
        if self.max is None or high > self.max:
            self.max = high

    def percentile(self, p: float) -> int | None:
        """A value of the bucket holding the ``ceil(p * count)``-th smallest value (None if empty):
        the middle of that bucket, kept within the exact min and max."""
        if not self.count or self.min is None or self.max is None:
            return None
        rank = max(1, math.ceil(p * self.count))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                low, high = self.bucket_range(b)
                return min(max((low + high) // 2, self.min), self.max)
        return self.max


@dataclass
class HistoryReport:
    """Histograms keyed by (window, method, hop, metric); window and method are None when not asked
    for, and the window-None histograms always hold every message."""

    histograms: dict[Key, Histogram] = field(default_factory=dict)
    hops: list[str] = field(default_factory=list)  # in the order first seen
    messages: int = 0  # messages read (after the ignored ones)
    without_history: int = 0
    interval_ns: int | None = None

    def _add(self, window: int | None, method: str | None, hop: str, metric: str, value: int) -> None:
        if hop not in self.hops:
            self.hops.append(hop)
        for w in (None, window) if window is not None else (None,):
            key = (w, method, hop, metric)
            h = self.histograms.get(key)
            if h is None:
                h = self.histograms[key] = Histogram()
            h.add(value)

    def rows(self) -> Iterator[tuple[Key, Histogram]]:
        """Histograms ordered by window (overall first), method, hop (as first seen) and metric."""
        order = {h: i for i, h in enumerate(self.hops)}
        def sort_key(k: Key) -> tuple[int, int, str, int, int]:
            w, m, hop, metric = k
            return (-1 if w is None else 0, w or 0, m or "", order[hop], METRICS.index(metric))
        for k in sorted(self.histograms, key=sort_key):
            yield k, self.histograms[k]


def analyze(queues: Sequence[str | os.PathLike[str]], *, ignore: int = 0, interval: float | None = None,
            by_method: bool = False, on_read: Callable[[int], None] | None = None) -> HistoryReport:
    """Latency histograms of a chain ``queues[0] -> ... -> queues[-1]`` (or of one queue's histories).

    `ignore` skips the first messages of each queue read (warm-up); `interval` (seconds) adds a
    histogram per window of that length, counted from the first message's write time; `by_method`
    keys by the message's first event (the method called). `on_read(n)` is told of every `n` messages
    read (skipped ones included), a thousand or so at a time, for a progress bar over
    `queues_read(queues)`.
    """
    import chronq

    if ignore < 0:
        raise ValueError(f"ignore must be >= 0, not {ignore}")
    if interval is not None and not interval > 0:
        raise ValueError(f"interval must be > 0 seconds, not {interval}")
    paths = [Path(q) for q in queues]
    if not paths:
        raise ValueError("no queue given")
    for p in paths:
        if not p.is_dir():
            raise ChronqError(f"{p}: no queue directory")
    rep = HistoryReport(interval_ns=None if interval is None else max(1, round(interval * 1e9)))
    origin: list[int] = []
    chain = len(paths) > 1
    for k, path in enumerate(paths):
        if chain and k == 0:
            continue  # the chain's input: its messages are measured by the hop that reads them
        hop = f"{paths[k - 1].name}->{path.name}" if chain else None
        end_to_end = chain and k == len(paths) - 1 and len(paths) > 2
        with chronq.open(path, readonly=True) as q:
            tailer = q.tailer()
            skipped = pending = 0
            while (ex := tailer.read()) is not None:
                pending += 1
                if pending == _REPORT_EVERY and on_read is not None:
                    on_read(pending)
                    pending = 0
                if skipped < ignore:
                    skipped += 1
                    continue
                body = ex.payload
                try:
                    history, pos = read_history(body)
                    method = None
                    if by_method:
                        key, _ = event_at(body, pos)
                        method = "-" if key is None else str(key)
                    timings = history.timings if history is not None else []
                    sources = history.sources if history is not None else []
                except (WireError, IndexError) as e:
                    cf = getattr(tailer, "_file", None)
                    file = str(cf.path) if cf is not None else str(path)
                    detail = f"index 0x{ex.index:x}: bad message history: {e}"
                    raise CorruptQueueError(file, ex.position, detail) from None
                rep.messages += 1
                if not timings:
                    rep.without_history += 1
                    continue
                window = None
                if rep.interval_ns is not None:
                    if not origin:
                        origin.append(timings[-1])
                    window = (timings[-1] - origin[0]) // rep.interval_ns
                if hop is not None:
                    _add_hop(rep, window, method, hop, timings[-3:])
                    if end_to_end and len(timings) >= 2:
                        rep._add(window, method, "end_to_end", "hop", timings[-1] - timings[0])
                    continue
                hops = (len(timings) - 1) // 2
                regular = len(timings) % 2 == 1 and len(sources) == hops
                for j in range(1, hops + 1):
                    name = f"source {sources[j - 1][0]}" if regular else f"hop {j}"
                    _add_hop(rep, window, method, name, timings[2 * j - 2: 2 * j + 1])
                if hops >= 2:
                    rep._add(window, method, "end_to_end", "hop", timings[-1] - timings[0])
            if on_read is not None and pending:
                on_read(pending)
    return rep


def queues_read(queues: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The queues `analyze` reads: all of a chain but its input (whose messages its first hop measures)."""
    paths = [Path(q) for q in queues]
    return paths[1:] if len(paths) > 1 else paths


def _add_hop(rep: HistoryReport, window: int | None, method: str | None, hop: str, t: Sequence[int]) -> None:
    """`t` = (input written, read, output written), or its last two or one when the history is short."""
    if len(t) >= 2:
        rep._add(window, method, hop, "service", t[-1] - t[-2])
    if len(t) >= 3:
        rep._add(window, method, hop, "queue", t[-2] - t[-3])
        rep._add(window, method, hop, "hop", t[-1] - t[-3])


def percentile_label(p: float) -> str:
    """How the reports name a percentile: 0.99 is ``p99``, 0.999 ``p99.9``."""
    return f"p{p * 100:g}"



def _fmt(value: int | None, unit: str) -> str:
    if value is None:
        return "-"
    return str(value) if unit == "ns" else f"{value / UNITS[unit]:.3f}"


def format_table(rep: HistoryReport, unit: str = "us") -> str:
    """The report as a text table, one line per histogram, values in `unit`."""
    header = ["window_s", "method", "hop", "metric", "count", *(percentile_label(p) for p in PERCENTILES),
              "worst"]
    lines = [header]
    for (w, m, hop, metric), h in rep.rows():
        if w is None and rep.interval_ns is not None:
            wl = "all"
        else:
            wl = "-" if w is None or rep.interval_ns is None else f"{w * rep.interval_ns / 1e9:g}"
        lines.append([wl, m or "-", hop, metric, str(h.count),
                      *(_fmt(h.percentile(p), unit) for p in PERCENTILES), _fmt(h.max, unit)])
    keep = [i for i, col in enumerate(header)
            if not ((col == "window_s" and rep.interval_ns is None) or
                    (col == "method" and all(k[1] is None for k in rep.histograms)))]
    widths = [max(len(line[i]) for line in lines) for i in keep]
    out = [f"latency in {unit}: {rep.messages} messages, {rep.without_history} without history"]
    out += ["  ".join(line[i].rjust(wd) for i, wd in zip(keep, widths, strict=True)) for line in lines]
    return "\n".join(out) + "\n"


def write_csv(rep: HistoryReport, path: str | os.PathLike[str], unit: str = "us") -> Path:
    """One row per histogram: window start (s, empty for all messages), method, hop, metric, unit,
    count, percentiles and worst."""
    out = Path(path)
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["window_s", "method", "hop", "metric", "unit", "count",
                    *(percentile_label(p) for p in PERCENTILES), "worst"])
        for (win, m, hop, metric), h in rep.rows():
            start = "" if win is None or rep.interval_ns is None else f"{win * rep.interval_ns / 1e9:g}"
            w.writerow([start, m or "", hop, metric, unit, h.count,
                        *(_fmt(h.percentile(p), unit) for p in PERCENTILES), _fmt(h.max, unit)])
    return out


def plot(rep: HistoryReport, path: str | os.PathLike[str], unit: str = "us") -> Path:
    """A PNG of the percentiles of every hop's ``hop`` metric over all messages (needs matplotlib:
    `ChronqError` when it is missing)."""
    try:
        import matplotlib
    except ImportError as e:
        raise ChronqError(f"the plot needs matplotlib, which is not installed ({e}): "
                          "pip install 'chronq[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    series: list[tuple[str, Sequence[float | None], str, str | None]] = []
    for (w, m, hop, metric), h in rep.rows():
        if w is not None or metric != "hop":
            continue
        ys = [*(h.percentile(p) for p in PERCENTILES), h.max]
        series.append((hop if m is None else f"{hop} {m}",
                       [None if y is None else max(y, 1) / UNITS[unit] for y in ys], "-", None))
    draw_percentiles(ax, series)
    ax.set_ylabel(f"latency ({unit})")
    ax.set_title("latency percentiles per hop")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def draw_percentiles(ax: Any, series: Sequence[tuple[str, Sequence[float | None], str, str | None]]) -> None:
    """Draw on matplotlib axes `ax` one line per (label, values, line style, colour or None): the
    values of `PERCENTILES` then the worst, on a log scale; a series with no value is left out."""
    xs = [*(percentile_label(p) for p in PERCENTILES), "worst"]
    for label, ys, style, color in series:
        if all(y is None for y in ys):
            continue
        ax.plot(xs, [float("nan") if y is None else y for y in ys], style, marker="o", color=color,
                label=label)
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


__all__ = ["FRACTION_BITS", "METRICS", "PERCENTILES", "UNITS", "Histogram", "HistoryReport", "analyze",
           "draw_percentiles", "format_table", "percentile_label", "plot", "queues_read", "write_csv"]
