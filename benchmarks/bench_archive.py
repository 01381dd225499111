"""Archiving one finished cycle with zstd (`chronq.archive.archive`), beside `zstd -3` of the same file.

    python benchmarks/bench_archive.py [--mb 928] [--rounds 3] [--quick]

The queue holds one FAST_DAILY cycle of about `--mb` MB of trade-like JSON messages (timestamps, a few
symbols, prices), closed by a message in the next cycle. A round archives it with zstd level 3 into a
fresh local directory: scanning the documents, compressing 1 MiB frames (each one's crc32 of the
original, the sha256 of the compressed bytes) in one pass, fsync, checking the stored size and
publishing the manifest (the cycle is copied back into the queue between
rounds); and once more with `read_back=True`, which also reads back, hashes and decompresses the stored
archive, so both are measured under the same load.
MB/s is of the input file (its size on disk, holes included, as both tools read it) on one core, by
wall time and by the process's CPU time (which other load on the machine disturbs less).
Beside it, in the same run: `zstd -3 -T1` of the same file (the `zstd` command if present, else the
zstandard module at level 3 over the whole file as one frame), its speed and ratio.
Each row is the best of `--rounds`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import chronq
from chronq import archive
from chronq.rollcycles import FixedClock

DAY = 86_400_000
TARGET = 500  # MB/s of input, one core


def build(path: Path, mb: int) -> Path:
    clock = FixedClock(DAY * 20_000)
    symbols = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "META", "IBM"]
    with chronq.open(path, "FAST_DAILY", clock=clock) as q:
        a = q.appender()
        written, i = 0, 0
        while written < mb << 20:
            body = (f'{{"ts":{1_700_000_000_000_000 + i * 137},"sym":"{symbols[i % 8]}",'
                    f'"px":{100 + (i * 7919 % 10_000) / 100:.2f},"qty":{(i * 31) % 500 + 1},'
                    f'"side":"{"BS"[i % 2]}"}}').encode()
            a.write(body)
            written += len(body) + 4
            i += 1
        clock.advance(DAY)
        a.write(b"next cycle")
    return next(iter(sorted(path.glob("*.cq4"))))


def zstd_baseline(file: Path) -> tuple[float, int]:
    """(seconds, compressed bytes) of `zstd -3` over the file on one thread."""
    exe = shutil.which("zstd")
    start = time.perf_counter()
    if exe:
        out = subprocess.run([exe, "-3", "-T1", "-c", str(file)], capture_output=True, check=True).stdout
        size = len(out)
    else:
        import zstandard

        size = len(zstandard.ZstdCompressor(level=3).compress(file.read_bytes()))
    return time.perf_counter() - start, size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=928, help="MB of messages (928: a cycle file of about 1 GB)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="--mb 64 --rounds 2")
    args = p.parse_args()
    if args.quick:
        args.mb, args.rounds = 64, 2
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "q"
        cycle = build(q, args.mb)
        keep = Path(tmp) / "original.cq4"
        shutil.copy(cycle, keep)
        size = keep.stat().st_size
        best = {False: (float("inf"), float("inf")), True: (float("inf"), float("inf"))}  # (wall, cpu)
        ratio, best_zstd, zstd_size = 0.0, float("inf"), 0
        for r in range(args.rounds):
            for read_back in (False, True):
                dest = Path(tmp) / f"arch{r}{'r' if read_back else ''}"
                start, cpu = time.perf_counter(), time.process_time()
                (entry,) = archive.archive(q, dest, compress="zstd", clock=FixedClock(DAY * 20_002),
                                           read_back=read_back)
                took, cpu = time.perf_counter() - start, time.process_time() - cpu
                best[read_back] = (min(best[read_back][0], took), min(best[read_back][1], cpu))
                ratio = size / entry["archive_size"]
                shutil.copy(keep, cycle)  # back into the queue for the next round
                shutil.rmtree(dest)
            seconds, zstd_size = zstd_baseline(keep)
            best_zstd = min(best_zstd, seconds)
        tool = "zstd -3 -T1" if shutil.which("zstd") else "zstandard level 3"
        mb = size / 1e6
        print(f"cycle file: {mb:.1f} MB ({entry['count']} messages, {len(entry['frames'])} frames of "
              f"{archive.FRAME >> 20} MiB)")
        print(f"{'case':<34}{'MB/s':>8}{'MB/s cpu':>10}{'target':>8}{'vs target':>11}{'ratio':>8}"
              f"{'vs zstd -3':>12}")
        zstd_ratio = size / zstd_size
        for label, (wall, cpu) in [("chronq archive --compress zstd", best[False]),
                                   ("  the same with read_back=True", best[True])]:
            target = f"{TARGET:>8}{mb / wall / TARGET:>10.2f}x" if not label.startswith(" ") else f"{'':>19}"
            print(f"{label:<34}{mb / wall:>8.0f}{mb / cpu:>10.0f}{target}{ratio:>8.2f}"
                  f"{ratio / zstd_ratio:>11.2f}x")
        print(f"{tool:<34}{mb / best_zstd:>8.0f}{'':>10}{'':>19}{zstd_ratio:>8.2f}{1:>11.2f}x")
        verdict = "met" if mb / best[False][0] >= TARGET else "NOT met"
        print(f"\ntarget >= {TARGET} MB/s of input on one core (archive, zstd level 3): {verdict}")


if __name__ == "__main__":
    main()
