"""Records of six positional values (`wire.record`) written to and read from a queue, against `struct`
packing the same six values (fixed-width fields, the text and decimal as padded bytes) in the same run.

    python benchmarks/bench_record.py [--n 300000] [--rounds 3]

Two records: "with decimal" (int32, int64, float64, text, boolean, decimal) and "numeric"
(int32, int64, float64, float64, text, boolean). Rows: `Layout.pack` + `appender.write`, the
`appender.record()` builder, and the struct baseline written; `Layout.unpack(excerpt.payload)`,
`excerpt.record()` value by value, and `struct.unpack_from` read. Each row is the best of `--rounds`
passes over `--n` records, the cases interleaved within every round so they see the same machine load.

Target: >= 2,000,000 six-value records/s written and read (Layout rows).
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import chronq
from wire.record import Layout

TARGET = 2_000_000
WITH_DECIMAL = ("int32", "int64", "float64", "text", "boolean", "decimal")
NUMERIC = ("int32", "int64", "float64", "float64", "text", "boolean")
VALUES = {
    WITH_DECIMAL: (7, 1_700_000_000_123, 1.0875, "EURUSD", True, Decimal("1.0875")),
    NUMERIC: (7, 1_700_000_000_123, 1.0875, 1.0877, "EURUSD", True),
}
BASE = {WITH_DECIMAL: struct.Struct("<iqd8s?16s"), NUMERIC: struct.Struct("<iqdd8s?")}


def write_cases(kinds: tuple[str, ...], app: Any, n: int) -> dict[str, Callable[[], None]]:
    layout, vals, base = Layout(*kinds), VALUES[kinds], BASE[kinds]
    write, pack, spack = app.write, layout.pack, base.pack
    a, b, c, d, e, f = vals
    record = app.record

    def layout_write() -> None:
        for _ in range(n):
            write(pack(a, b, c, d, e, f))

    def builder_write() -> None:
        if kinds == WITH_DECIMAL:
            for _ in range(n):
                with record() as r:
                    r.int32(a).int64(b).float64(c).text(d).boolean(e).decimal(f)
        else:
            for _ in range(n):
                with record() as r:
                    r.int32(a).int64(b).float64(c).float64(d).text(e).boolean(f)

    def struct_write() -> None:
        if kinds == WITH_DECIMAL:
            for _ in range(n):
                write(spack(a, b, c, d.encode(), e, str(f).encode()))
        else:
            for _ in range(n):
                write(spack(a, b, c, d, e.encode(), f))

    return {
        "Layout.pack + write": layout_write,
        "appender.record() builder": builder_write,
        "struct.pack + write (baseline)": struct_write,
    }


def read_cases(kinds: tuple[str, ...], queues: dict[str, Any]) -> dict[str, Callable[[], None]]:
    layout, base = Layout(*kinds), BASE[kinds]
    unpack, sunpack = layout.unpack, base.unpack_from

    def over(q: Any, each: Callable[[Any], Any]) -> Callable[[], None]:
        def run() -> None:
            t = q.tailer()
            read = t.read
            ex = read()
            while ex is not None:
                each(ex)
                ex = read()

        return run

    def by_value(ex: Any) -> Any:
        r = ex.record()
        if kinds == WITH_DECIMAL:
            return r.int32(), r.int64(), r.float64(), r.text(), r.boolean(), r.decimal()
        return r.int32(), r.int64(), r.float64(), r.float64(), r.text(), r.boolean()

    def struct_each(ex: Any) -> Any:
        v = sunpack(ex)
        if kinds == WITH_DECIMAL:
            return v[0], v[1], v[2], v[3].rstrip(b"\0").decode(), v[4], Decimal(v[5].rstrip(b"\0").decode())
        return v[0], v[1], v[2], v[3], v[4].rstrip(b"\0").decode(), v[5]

    first = queues["Layout.pack + write"].tailer().read()
    assert unpack(first.payload) == by_value(first) == VALUES[kinds], "the rows must read what was written"
    return {
        "Layout.unpack(excerpt.payload)": over(queues["Layout.pack + write"], lambda ex: unpack(ex.payload)),
        "excerpt.record() value by value": over(queues["Layout.pack + write"], by_value),
        "struct.unpack_from (baseline)": over(queues["struct.pack + write (baseline)"], struct_each),
    }


def measure(
    cases: dict[str, Callable[[], None]], n: int, rounds: int, fresh: Callable[[], None] | None = None
) -> dict[str, float]:
    best = dict.fromkeys(cases, 0.0)
    for _ in range(rounds):
        if fresh is not None:
            fresh()
        for name, run in cases.items():
            t0 = time.perf_counter()
            run()
            best[name] = max(best[name], n / (time.perf_counter() - t0))
    return best


WRITERS = ("Layout.pack + write", "appender.record() builder", "struct.pack + write (baseline)")


def bench(
    tmp: Path, label: str, kinds: tuple[str, ...], n: int, rounds: int
) -> list[tuple[str, str, float, float]]:
    """The write rows (each round into new, empty queues) then the read rows (over the last round's)."""
    queues: dict[str, Any] = {}
    writers: dict[str, Callable[[], None]] = {}
    made = [0]

    def fresh() -> None:
        for q in queues.values():
            q.close()
        for name in WRITERS:
            made[0] += 1
            q = chronq.open(tmp / f"{label}-{made[0]}")
            queues[name] = q
            writers[name] = write_cases(kinds, q.appender(), n)[name]

    def run_writer(name: str) -> Callable[[], None]:
        return lambda: writers[name]()

    w = measure({name: run_writer(name) for name in WRITERS}, n, rounds, fresh)
    r = measure(read_cases(kinds, queues), n, rounds)
    for q in queues.values():
        q.close()
    rows = [
        (label, "write " + nm, rate, rate / w["struct.pack + write (baseline)"]) for nm, rate in w.items()
    ]
    rows += [(label, "read " + nm, rate, rate / r["struct.unpack_from (baseline)"]) for nm, rate in r.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300_000, help="records per pass")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows: list[tuple[str, str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-record-") as tmp:
        for label, kinds in (("with decimal", WITH_DECIMAL), ("numeric", NUMERIC)):
            rows += bench(Path(tmp), label, kinds, args.n, args.rounds)
    print(f"six-value records, {args.n:,} per pass, best of {args.rounds}")
    print("| record | case | records/s | vs struct | target |\n| --- | --- | ---: | ---: | ---: |")
    for label, case, rate, ratio in rows:
        target = ""
        if "Layout" in case:
            target = f"{TARGET / 1e6:.1f} M: {'met' if rate >= TARGET else 'NOT met'}"
        print(f"| {label} | {case} | {rate / 1e6:.2f} M | {ratio:.2f} | {target} |")


if __name__ == "__main__":
    main()
