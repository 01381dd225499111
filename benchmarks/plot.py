"""chronq beside its baselines and Java Chronicle Queue, measured in one run: a JSON of the figures, PNG
plots and the figures section of docs/benchmarks.md.

    python benchmarks/plot.py [--n 1000000] [--latency-samples 200000] [--no-java] [--force]

The chronq rows come from the benchmarks' own measurement functions (bench_queue, bench_rpc, bench_wire)
with their baselines; the Java rows from Chronicle's own benchmark, `../shared/java/run.sh bench DIR N`,
run in the same process tree right after them, so both see the same machine. When Java or the tool is
absent the Java rows are left out and the page says why. Figures are only comparable within one run:
the page records the load average beside them.

A busy machine measures its other work, not chronq (a reader takes the page as chronq's speed), so the
run starts only when the 1-minute load average is below QUIET_LOAD; `--force` (`make bench-plots
FORCE=1`) runs anyway and the page then says, above the figures, under what load they were taken.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_queue
import bench_rpc
import bench_wire

ROOT = Path(__file__).resolve().parents[1]
RUN_SH = ROOT.parent / "shared" / "java" / "run.sh"
BEGIN, END = "<!-- figures:begin (benchmarks/plot.py writes this section) -->", "<!-- figures:end -->"

# -- Java Chronicle's own benchmark (ChronicleBench.java), one line per case --------------------------
_JAVA = [
    (re.compile(r"^W1 append (\d+)B: median ([\d.]+) M msg/s"), "append"),
    (re.compile(r"^W2 read +(\d+)B: median ([\d.]+) M msg/s"), "read"),
    (re.compile(r"^W4 random read 40B: ([\d.]+) reads/s"), "random_read"),
    (re.compile(r"^MW method writer .*?: ([\d.]+) M calls/s; method reader: ([\d.]+) M msg/s"), "methods"),
    (
        re.compile(
            r"^W3 latency 40B @(\d+)/s \(threads\): p50 ([\d.]+) us p90 ([\d.]+) p99 ([\d.]+) "
            r"p99\.9 ([\d.]+) max ([\d.]+) us"
        ),
        "latency",
    ),
]


def parse_java(text: str) -> dict[str, Any]:
    """Chronicle's benchmark output as figures: rates in operations/s, latencies in ns.

    Keys: append_40, read_40, append_256, read_256, random_read, method_writer, method_reader, and
    latency_100000 / latency_1000000 ({p50, p90, p99, p99.9, max}). Raises ValueError when a line the
    benchmark always prints is missing, so a changed format fails loudly instead of plotting nothing."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        for pattern, kind in _JAVA:
            m = pattern.match(line.strip())
            if not m:
                continue
            g = m.groups()
            if kind in ("append", "read"):
                out[f"{kind}_{g[0]}"] = float(g[1]) * 1e6
            elif kind == "random_read":
                out["random_read"] = float(g[0])
            elif kind == "methods":
                out["method_writer"], out["method_reader"] = float(g[0]) * 1e6, float(g[1]) * 1e6
            else:
                keys = ("p50", "p90", "p99", "p99.9", "max")
                out[f"latency_{g[0]}"] = {k: float(v) * 1e3 for k, v in zip(keys, g[1:], strict=True)}
    expected = {"append_40", "read_40", "random_read", "method_writer", "method_reader", "latency_100000"}
    if missing := expected - out.keys():
        raise ValueError(f"Java benchmark output lacks {sorted(missing)}:\n{text}")
    return out


def run_java(n: int, tmp: Path) -> tuple[dict[str, Any] | None, str]:
    """Chronicle's figures and the command that made them, or None and why there are none."""
    if not RUN_SH.is_file():
        return None, f"the Java tool is absent ({RUN_SH.relative_to(ROOT.parent)} not found)"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return None, "no Java on PATH (a JDK 17 is needed)"
    cmd = [str(RUN_SH), "bench", str(tmp / "java"), str(n)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode == 3:  # a prerequisite is missing; run.sh names it last
        return None, "Java Chronicle could not run: " + p.stderr.strip().splitlines()[-1]
    if p.returncode != 0:
        raise RuntimeError(f"run.sh bench exited {p.returncode}:\n{p.stderr[-4000:]}")
    return parse_java(p.stdout), f"../shared/java/run.sh bench DIR {n}"


# -- the machine's load ------------------------------------------------------------------------------
QUIET_LOAD = 0.5  # the 1-minute load average from which the machine counts as busy


def check_load(load: float, force: bool) -> None:
    """Print the 1-minute load average `load` taken at the start; refuse to measure when it is
    QUIET_LOAD or more (SystemExit naming it), unless `force`, which only warns. Judged as printed (two
    decimals), as the page records it, so the page and the check never disagree."""
    load = round(load, 2)
    print(f"load average (1 min) at the start: {load:.2f}", file=sys.stderr)
    if load < QUIET_LOAD:
        return
    if not force:
        raise SystemExit(
            f"bench-plots: the machine is busy (1-minute load average {load:.2f}, quiet is below "
            f"{QUIET_LOAD}): its figures would measure the other work, not chronq. Run it on a quiet "
            "machine, or force it (--force, make bench-plots FORCE=1) and the page says it was busy."
        )
    print(f"warning: measuring on a busy machine (load {load:.2f} >= {QUIET_LOAD}), forced; "
          "the page will say so above the figures", file=sys.stderr)


def busy_at_start(figures: dict[str, Any]) -> float | None:
    """The run's 1-minute load average at its start when it was QUIET_LOAD or more, else None."""
    load = float(figures["loadavg_start"].split(" / ")[0])
    return load if load >= QUIET_LOAD else None


# -- chronq and its baselines ------------------------------------------------------------------------
def loadavg(load: tuple[float, float, float] | None = None) -> str:
    """The 1, 5 and 15-minute load averages (now, or `load`): how busy the machine was while the figures
    were taken."""
    return " / ".join(f"{x:.2f}" for x in (load or os.getloadavg()))


def measure(args: argparse.Namespace, load_start: tuple[float, float, float]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "n": args.n,
        "loadavg_start": loadavg(load_start),  # the reading check_load judged
    }
    with tempfile.TemporaryDirectory(prefix="chronq-plot-") as d:
        tmp = Path(d)
        print(f"queue throughput, n={args.n:,} ...", file=sys.stderr)
        figures["queue"] = [
            {"operation": name, "chronq": c, "naive": b1, "sqlite": b2}
            for name, c, b1, b2, _ in bench_queue.throughput(args.n, tmp)
        ]
        print("rpc ...", file=sys.stderr)
        size, rows = bench_rpc.measure(args.rpc_n)
        figures["rpc"] = {"n": args.rpc_n, "document_bytes": size, "rows": {k: ops for k, ops, _ in rows}}
        print("wire ...", file=sys.stderr)
        figures["wire"] = {name: ops for name, ops, _, _ in bench_wire.rows(args.wire_seconds)}
        print(f"latency, {args.latency_samples:,} samples ...", file=sys.stderr)
        lat: dict[str, Any] = {}
        row = bench_queue.latency(args.latency_samples, tmp, args.latency_rate, pinned=True)
        lat["chronq, 2 processes (pinned)"] = _percentiles(row)
        floor = bench_queue.build_floor(tmp)
        if not isinstance(floor, str):
            row = bench_queue.latency_floor(floor, args.latency_samples, tmp, args.latency_rate, True)
            lat["C floor, 2 processes (pinned)"] = _percentiles(row)
        figures["latency"] = {"rate": args.latency_rate, "samples": args.latency_samples, "rows": lat}
        if args.no_java:
            java, how = None, "left out of this run (--no-java)"
        else:
            print(f"Java Chronicle, n={args.n:,} ...", file=sys.stderr)
            java, how = run_java(args.n, tmp)
        figures["java"], figures["java_how"] = java, how
    figures["loadavg_end"] = loadavg()
    return figures


def _percentiles(row: bench_queue.Latency) -> dict[str, float]:
    return {"p50": row.p50, "p99": row.p99, "p99.9": row.p999, "max": row.worst}


# -- the plots -----------------------------------------------------------------------------------------
CHRONQ, BASE, JAVA = "#1f77b4", "#bbbbbb", "#d62728"


def panels(figures: dict[str, Any]) -> dict[str, list[tuple[str, list[tuple[str, float, str]]]]]:
    """Per plot, its panels: (title, [(bar label, ops/s, colour)]); chronq's bar first in each panel."""
    q = {r["operation"]: r for r in figures["queue"]}
    java = figures["java"] or {}

    def queue_panel(title: str, op: str, java_key: str | None) -> tuple[str, list[tuple[str, float, str]]]:
        r = q[op]
        bars = [("chronq", r["chronq"], CHRONQ), ("naive\nmmap log", r["naive"], BASE),
                ("sqlite\nWAL", r["sqlite"], BASE)]
        if java_key and java_key in java:
            bars.append(("Java\nChronicle", java[java_key], JAVA))
        return title, [b for b in bars if b[1] == b[1]]  # NaN: the baseline has no such operation

    rpc, wire = figures["rpc"]["rows"], figures["wire"]
    java_writer = [("Java\nChronicle", java["method_writer"], JAVA)] if java else []
    java_reader = [("Java\nChronicle", java["method_reader"], JAVA)] if java else []
    msgpack_enc = ("msgspec\n.msgpack", wire["msgspec.msgpack encode (baseline)"], BASE)
    msgpack_dec = ("msgspec\n.msgpack", wire["msgspec.msgpack decode (baseline)"], BASE)
    return {
        "queue_throughput": [
            queue_panel("append 40 B\n(a.write, Python loop)", "append 40 B, Python loop", "append_40"),
            queue_panel("append 40 B, batched\n(write_many)", "write_many 40 B", None),
            queue_panel("sequential read 40 B\n(tailer.read())", "sequential read()", "read_40"),
            queue_panel("sequential read 40 B\n(for ex in tailer)", "for ex in tailer", "read_40"),
            queue_panel("random read\n(move_to_index + read)", "move_to_index + read", "random_read"),
        ],
        "rpc_throughput": [
            ("method writer\n(6-field trade DTO)", [
                ("chronq", rpc["method writer: trade(Trade) -> queue"], CHRONQ),
                ("raw append of\nthe same bytes", rpc["raw append of the encoded document (baseline)"], BASE),
                *java_writer,
            ]),
            ("method reader\n(read_one + dispatch)", [
                ("chronq", rpc["reader: read_one + dispatch from the queue"], CHRONQ),
                *java_reader,
            ]),
            ("method reader\n(read_many(1024) batches)", [
                ("chronq", rpc["reader: read_many(1024) batches from the queue"], CHRONQ),
                *java_reader,
            ]),
        ],
        "wire_throughput": [
            ("BINARY encode\n(6-field trade DTO)", [
                ("chronq", wire["BINARY encode(TRADE) -> bytes"], CHRONQ), msgpack_enc]),
            ("BINARY decode\n(6-field trade DTO)", [
                ("chronq", wire["BINARY decode(bytes, type=Trade)"], CHRONQ), msgpack_dec]),
            ("WireType.MSGSPEC\nencode", [("chronq", wire["WireType.MSGSPEC encode"], CHRONQ), msgpack_enc]),
            ("WireType.MSGSPEC\ndecode", [("chronq", wire["WireType.MSGSPEC decode"], CHRONQ), msgpack_dec]),
        ],
    }


def micros(ns: float) -> str:
    return f"{ns / 1e3:.2f} µs" if ns < 10_000 else f"{ns / 1e3:,.0f} µs"


def human(ops: float) -> str:
    return f"{ops / 1e6:.2f} M" if ops >= 1e6 else f"{ops / 1e3:.0f} k"


def bar_chart(path: Path, plots: list[tuple[str, list[tuple[str, float, str]]]], title: str) -> None:
    """One panel per operation (each with its own scale), bars in ops/s, every bar after the first
    labelled with chronq's rate (the first bar) as a multiple of it."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(plots), figsize=(2.8 * len(plots) + 0.6, 4.4), squeeze=False)
    for ax, (panel, bars) in zip(axes[0], plots, strict=True):
        labels, values, colours = zip(*bars, strict=True)
        xs = range(len(bars))
        ax.bar(xs, values, color=colours)
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_title(panel, fontsize=9)
        ax.set_ylim(0, max(values) * 1.3)
        ax.yaxis.set_major_formatter(lambda y, _: f"{y / 1e6:g} M")
        ax.tick_params(axis="y", labelsize=8)
        for x, v in zip(xs, values, strict=True):
            label = human(v) if x == 0 else f"{human(v)}\n{values[0] / v:.1f}x"
            ax.annotate(label, (x, v), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                        textcoords="offset points")
    axes[0][0].set_ylabel("operations/s (more is better)")
    fig.suptitle(f"{title}\n(under each baseline's rate: chronq's rate as a multiple of it)", fontsize=9.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_chart(path: Path, figures: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = dict(figures["latency"]["rows"])
    java = figures["java"] or {}
    if "latency_100000" in java:
        rows["Java Chronicle, 2 threads"] = java["latency_100000"]
    keys = ["p50", "p99", "p99.9", "max"]
    colours = [CHRONQ, BASE, JAVA]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / len(rows)
    for k, (name, row) in enumerate(rows.items()):
        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(keys))]
        vals = [row[key] / 1e3 for key in keys]
        ax.bar(xs, vals, width, label=name, color=colours[k % len(colours)])
        for x, v in zip(xs, vals, strict=True):
            shown = f"{v:.3g}" if v < 1000 else f"{v:,.0f}"
            ax.annotate(shown, (x, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                        textcoords="offset points")
    ax.set_yscale("log")
    top = max(row[key] for row in rows.values() for key in keys) / 1e3
    ax.set_ylim(top=top * 30)  # room for the legend above the tallest bar
    ax.set_xticks(range(len(keys)), keys)
    ax.set_ylabel("one-way latency, µs (log scale, less is better)")
    lat = figures["latency"]
    ax.set_title(f"40-byte messages at {lat['rate']:,}/s, writer to busy-spinning reader", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the page --------------------------------------------------------------------------------------------
def markdown(figures: dict[str, Any], img: str) -> str:
    """The figures section of the page: the machine's state, each plot and its numbers."""
    out = []
    if (busy := busy_at_start(figures)) is not None:
        out += [f"**Taken on a busy machine:** the 1-minute load average was {busy:.2f} when this run "
                f"started (quiet is below {QUIET_LOAD}: `make bench-plots` refuses a busier machine unless "
                "forced). Other work shared the CPUs, so "
                "these figures understate chronq and Java alike: compare the ratios within this run, not "
                "the absolute rates.", ""]
    out += [
        f"Measured {figures['date']} on {figures['cpus']} CPUs (Python {figures['python']}), "
        f"N = {figures['n']:,} messages per throughput case. Load average (1, 5, 15 min) "
        f"{figures['loadavg_start']} at the start and {figures['loadavg_end']} at the end.",
        "",
    ]
    if figures["java"] is None:
        out += [f"**No Java rows in this run:** {figures['java_how']}.", ""]
    else:
        out += [f"Java Chronicle Queue 5.26 ran `{figures['java_how']}` in the same run, after chronq.", ""]
    for name, panel_list in panels(figures).items():
        out += [f"![{name}]({img}/{name}.png)", "",
                "| case | chronq | compared with | its rate | chronq ÷ it |", "|---|---:|---|---:|---:|"]
        for title, bars in panel_list:
            head, (_, mine, _) = title.replace("\n", " "), bars[0]
            for label, ops, _ in bars[1:] or [("", float("nan"), "")]:
                other = f"{human(ops)}/s | {mine / ops:.2f}x" if ops == ops else " | "
                out.append(f"| {head} | {human(mine)}/s | {label.replace(chr(10), ' ')} | {other} |")
        out.append("")
    out += [f"![latency]({img}/latency.png)", "",
            "| processes | p50 | p99 | p99.9 | max |", "|---|---:|---:|---:|---:|"]
    rows = dict(figures["latency"]["rows"])
    java = figures["java"] or {}
    for rate in (100_000, 1_000_000):
        if f"latency_{rate}" in java:
            rows[f"Java Chronicle, 2 threads, {rate:,}/s"] = java[f"latency_{rate}"]
    for name, row in rows.items():
        out.append(f"| {name} | " + " | ".join(micros(row[k]) for k in ("p50", "p99", "p99.9", "max")) + " |")
    return "\n".join(out) + "\n"


def write_page(page: Path, section: str) -> None:
    text = page.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{page} has no {BEGIN} ... {END} section to fill")
    page.write_text(text[: start + len(BEGIN)] + "\n" + section + text[end:], encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000, help="messages per queue case (and Java's N)")
    p.add_argument("--rpc-n", type=int, default=200_000, help="calls per rpc case")
    p.add_argument("--wire-seconds", type=float, default=0.5, help="time per wire measurement")
    p.add_argument("--latency-samples", type=int, default=200_000)
    p.add_argument("--latency-rate", type=int, default=100_000, help="messages/s (Java's row is at 100,000)")
    p.add_argument("--no-java", action="store_true", help="leave the Java rows out")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the JSON and PNGs go")
    p.add_argument("--page", type=Path, default=ROOT / "docs" / "benchmarks.md",
                   help="the page whose figures section is rewritten")
    p.add_argument("--replot", type=Path, metavar="JSON",
                   help="draw the plots and the page from an earlier run's benchmarks.json, measure nothing")
    p.add_argument("--force", action="store_true",
                   help=f"measure even at a 1-minute load average of {QUIET_LOAD} or more (the page says so)")
    args = p.parse_args()
    if args.replot:
        figures = json.loads(args.replot.read_text())
    else:
        load_start = os.getloadavg()
        check_load(load_start[0], args.force)
        figures = measure(args, load_start)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "benchmarks.json").write_text(json.dumps(figures, indent=2) + "\n")
    titles = {
        "queue_throughput": "Queue: chronq, its baselines and Java Chronicle (40-byte messages)",
        "rpc_throughput": "Method writers and readers: chronq and Java Chronicle",
        "wire_throughput": "BINARY wire codec against msgspec.msgpack",
    }
    for name, plots in panels(figures).items():
        bar_chart(args.out / f"{name}.png", plots, titles[name])
    latency_chart(args.out / "latency.png", figures)
    section = markdown(figures, os.path.relpath(args.out, args.page.parent))
    write_page(args.page, section)
    print(section)


if __name__ == "__main__":
    main()
