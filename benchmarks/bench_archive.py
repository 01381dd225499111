"""Archiving one finished cycle with zstd (`chronq.archive.archive`), beside `zstd -3` of the same file.

    python benchmarks/bench_archive.py [--mb 64] [--rounds 3]

The queue holds one FAST_DAILY cycle of about `--mb` MB of trade-like JSON messages (timestamps, a few
symbols, prices), closed by a message in the next cycle. A round archives it with zstd level 3 into a
fresh local directory: scanning the documents, compressing and hashing 1 MiB frames in one pass, fsync,
checking the stored size and publishing the manifest (the cycle is copied back into the queue between
rounds); and once more with `read_back=True`, which also decompresses and hashes the stored archive (the
two-pass check archiving did before), so both are measured under the same load.
MB/s is of the input file (its size on disk, holes included, as both tools read it) on one core.
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
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "q"
        cycle = build(q, args.mb)
        keep = Path(tmp) / "original.cq4"
        shutil.copy(cycle, keep)
        size = keep.stat().st_size
        best_archive, ratio, best_zstd, zstd_size = float("inf"), 0.0, float("inf"), 0
        best_read_back = float("inf")
        for r in range(args.rounds):
            for read_back in (False, True):
                dest = Path(tmp) / f"arch{r}{'r' if read_back else ''}"
                start = time.perf_counter()
                (entry,) = archive.archive(q, dest, compress="zstd", clock=FixedClock(DAY * 20_002),
                                           read_back=read_back)
                took = time.perf_counter() - start
                if read_back:
                    best_read_back = min(best_read_back, took)
                else:
                    best_archive = min(best_archive, took)
                ratio = size / entry["archive_size"]
                shutil.copy(keep, cycle)  # back into the queue for the next round
                shutil.rmtree(dest)
            seconds, zstd_size = zstd_baseline(keep)
            best_zstd = min(best_zstd, seconds)
        tool = "zstd -3 -T1" if shutil.which("zstd") else "zstandard level 3"
        print(f"cycle file: {size / 1e6:.1f} MB ({entry['count']} messages, {len(entry['frames'])} frames)")
        print(f"{'case':<36}{'MB/s':>10}{'ratio':>10}")
        print(f"{'chronq archive --compress zstd':<36}{size / 1e6 / best_archive:>10.1f}{ratio:>10.2f}")
        print(f"{'  the same with read_back=True':<36}{size / 1e6 / best_read_back:>10.1f}{ratio:>10.2f}")
        print(f"{tool:<36}{size / 1e6 / best_zstd:>10.1f}{size / zstd_size:>10.2f}")


if __name__ == "__main__":
    main()
