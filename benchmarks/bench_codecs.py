"""Codec throughput and compression ratio on 256-byte trade-like messages, beside the plain path.

Each codec writes the same messages to a fresh queue and reads them back, two ways:

* per message: ``appender.write(m)`` for each, then iteration (``ex.payload`` decoded);
* batch: ``appender.write_many`` of 1,000, then ``tailer.read_many(1000)`` (a list of decoded payloads).

The plain queue is measured the same two ways in the same run: the ratios (``/plain``) are what to
compare on a busy machine. ``stored B/msg`` is the payload bytes on disk (frame header included),
``ratio`` the message size over it, ``vs zstd`` the stored size of zstd without a dictionary over this
row's. The last rows time the
libraries' own per-message calls without a queue (the ceiling of the per-message path).
Run: ``python benchmarks/bench_codecs.py [--n 200000] [--quick] [--clock cpu]``. Needs the ``codecs`` extra.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import chronq
from chronq import _codecs
from chronq.codecs import Codec, Keys, train_dictionary
from chronq.tailer import Tailer

MSG_LEN = 256
BATCH = 1000
TARGETS = {  # codec name -> (write, read) messages/s for the batch path
    "zstd + trained dictionary": (1_000_000, 2_000_000),
    "AES-GCM": (700_000, 700_000),
}
clock: Callable[[], float] = time.perf_counter
runs = 3  # best of


def trades(n: int, seed: int = 7) -> list[bytes]:
    """Trade-like JSON: recurring symbols, venues, accounts and field names; varying prices and ids."""
    r = random.Random(seed)
    syms = [f"SYM{i:03d}" for i in range(60)]
    venues = ["XNAS", "XNYS", "BATS"]
    out = []
    for i in range(n):
        s = (f'{{"id":{10_000_000 + i},"sym":"{r.choice(syms)}","side":"{r.choice("BS")}",'
             f'"px":{r.uniform(10, 500):.4f},"qty":{r.randint(1, 50_000)},"venue":"{r.choice(venues)}",'
             f'"acct":"ACC{r.randint(0, 200):05d}","ts":{1_700_000_000_000_000_000 + i * 1000},'
             f'"flags":"{r.choice(["IOC", "GTC", "DAY"])}","trader":"T{r.randint(0, 40):03d}"}}')
        out.append(s.encode().ljust(MSG_LEN)[:MSG_LEN])
    return out


def best(fn: Callable[[], object]) -> float:
    t_best = float("inf")
    for _ in range(runs):
        t = clock()
        fn()
        t_best = min(t_best, clock() - t)
    return t_best


def measure(root: Path, name: str, msgs: list[bytes], codec: Codec | None, keys: Keys | None,
            dict_src: Path | None, batch: bool) -> tuple[float, float, float]:
    """(write msg/s, read msg/s, stored bytes per message)."""
    n = len(msgs)
    batches = [msgs[i:i + BATCH] for i in range(0, n, BATCH)]
    made = iter(range(runs))
    qs: list[chronq.Queue] = []

    def write() -> None:
        d = root / f"{name}-{'b' if batch else 'm'}{next(made)}"
        d.mkdir()
        if dict_src is not None:
            for f in dict_src.glob("codec-dictionary-*"):
                os.link(f, d / f.name)
        q = chronq.open(d, codec=codec, keys=keys)
        qs.append(q)
        a = q.appender()
        if batch:
            for b in batches:
                a.write_many(b)
        else:
            w = a.write
            for m in msgs:
                w(m)

    w = best(write)
    q = qs[-1]

    def read() -> None:
        t = q.tailer()
        k = 0
        if batch:
            while got := t.read_many(BATCH):
                k += sum(map(len, got))
        else:
            for ex in t:
                k += len(ex.payload)
        assert k == n * MSG_LEN, k
        t.close()

    r = best(read)
    check = q.tailer()
    assert [bytes(ex.payload) for ex in check] == msgs  # what was timed decodes to what was written
    check.close()
    raw = Tailer(q, None)
    stored = sum(len(ex.payload) for ex in raw)
    raw.close()
    for x in qs:
        x.close()
        shutil.rmtree(x.path)  # dirty pages of earlier cases would slow the later ones' writes
    return n / w, n / r, stored / n


def main() -> None:
    global clock, runs
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200_000, help="messages per run (default 200,000)")
    p.add_argument("--quick", action="store_true", help="20,000 messages, best of 2")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: perf_counter (the figures to quote); cpu: this process's CPU time, steadier "
                        "on a machine other work shares")
    args = p.parse_args()
    n = 20_000 if args.quick else args.n
    runs = 2 if args.quick else 3
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    msgs = trades(n)
    keys = Keys({1: os.urandom(32)})
    with tempfile.TemporaryDirectory(prefix="chronq-codecs-") as d:
        root = Path(d)
        src = root / "train"
        with chronq.open(src) as q:  # dictionaries are trained on a queue's own (plain) messages
            q.appender().write_many(trades(20_000, seed=99))
            did = train_dictionary(q, size=16 << 10)
        cases: list[tuple[str, Codec | None]] = [
            ("plain (no codec)", None),
            ("zstd", Codec("zstd", level=1)),
            ("zstd + trained dictionary", Codec("zstd", dictionary=did, level=1)),
            ("lz4", Codec("lz4")),
            ("AES-GCM", Codec(None, "aes-gcm")),
            ("zstd + dictionary + AES-GCM", Codec("zstd", "aes-gcm", dictionary=did, level=1)),
        ]
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        aes = "OpenSSL" if _codecs.HAVE_AES else "cryptography (a build without OpenSSL)"
        print(f"\n## Codecs ({n:,} x {MSG_LEN} B trade-like messages; messages/s, best of {runs}, "
              f"{args.clock} clock; {os.cpu_count()} CPUs, load average {load:.2f} at start; "
              f"AES-GCM batches through {aes})\n")
        print("| codec | path | write | read | write/plain | read/plain | stored B/msg | ratio | vs zstd "
              "| target (w / r) | holds |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
        zstd_size = 0.0
        held: list[bool] = []
        for batch in (False, True):
            base: tuple[float, float, float] | None = None
            for name, codec in cases:
                slug = name.split()[0] + str(len(name))
                w, r, size = measure(root, slug, msgs, codec, keys,
                                     src if codec and codec.dictionary else None, batch)
                base = base or (w, r, size)
                zstd_size = size if name == "zstd" else zstd_size
                vs_zstd = f"{zstd_size / size:.2f}x" if codec and codec.compression == "zstd" else "-"
                target, holds = "", ""
                if batch and name in TARGETS:
                    tw, tr = TARGETS[name]
                    target = f">= {tw / 1e6:.1f} M / {tr / 1e6:.1f} M"
                    held.append(w >= tw and r >= tr)
                    holds = "yes" if held[-1] else f"no ({min(w / tw, r / tr):.2f} of it)"
                path = "batch" if batch else "per message"
                print(f"| {name} | {path} | {w / 1e6:.3f} M | {r / 1e6:.3f} M | {w / base[0]:.2f}x "
                      f"| {r / base[1]:.2f}x | {size:.1f} | {MSG_LEN / size:.2f}x | {vs_zstd} | {target} "
                      f"| {holds} |")
        for name, w, r in library_alone(msgs, src):
            print(f"| {name} | per message | {w / 1e6:.3f} M | {r / 1e6:.3f} M | | | | | | | |")
        print(f"\ntargets held: {sum(held)} of {len(held)}")
    sys.stdout.flush()


def library_alone(msgs: list[bytes], dict_src: Path) -> list[tuple[str, float, float]]:
    """The libraries' own per-message calls, without a queue: the ceiling of the per-message path."""
    import zstandard
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    n = len(msgs)
    d = zstandard.ZstdCompressionDict(next(dict_src.glob("codec-dictionary-*")).read_bytes())
    c = zstandard.ZstdCompressor(level=1, dict_data=d, write_checksum=False, write_content_size=False,
                                 write_dict_id=False)
    dc = zstandard.ZstdDecompressor(dict_data=d)
    out: list[tuple[str, float, float]] = []
    frames = [c.compress(m) for m in msgs]
    out.append(("zstd.compress / decompress, dictionary (library alone)",
                n / best(lambda: [c.compress(m) for m in msgs]),
                n / best(lambda: [dc.decompress(f, max_output_size=MSG_LEN) for f in frames])))
    a, nonce, aad = AESGCM(os.urandom(32)), os.urandom(12), bytes(28)
    sealed = [a.encrypt(nonce, m, aad) for m in msgs]
    out.append(("AESGCM.encrypt / decrypt (library alone)",
                n / best(lambda: [a.encrypt(nonce, m, aad) for m in msgs]),
                n / best(lambda: [a.decrypt(nonce, x, aad) for x in sealed])))
    return out


if __name__ == "__main__":
    main()
