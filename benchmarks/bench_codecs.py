"""Codec throughput and compression ratio on 256-byte trade-like messages, beside the plain path.

Each codec writes the same messages (``write_many`` in batches of 1,000) to a fresh queue and reads them
back (iteration, decoded payloads); the plain queue is measured in the same run, so the ratios are what
to compare. ``stored B/msg`` is the payload bytes on disk (frame header included). The last rows time
the libraries' own calls without a queue: the ceiling on the same machine in the same run.
Run: ``python benchmarks/bench_codecs.py [--n 200000]``. Needs the ``codecs`` extra.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import chronq
from chronq.codecs import Codec, Keys, train_dictionary
from chronq.tailer import Tailer

MSG_LEN = 256
BATCH = 1000
RUNS = 3  # best of


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


def best(fn: object, runs: int = RUNS) -> float:
    t_best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        t_best = min(t_best, time.perf_counter() - t)
    return t_best


def measure(root: Path, name: str, msgs: list[bytes], codec: Codec | None, keys: Keys | None,
            dict_src: Path | None) -> tuple[float, float, float]:
    """(write msg/s, read msg/s, stored bytes per message)."""
    n = len(msgs)
    batches = [msgs[i:i + BATCH] for i in range(0, n, BATCH)]
    runs = iter(range(RUNS))
    qs: list[chronq.Queue] = []

    def write() -> None:
        d = root / f"{name}-{next(runs)}"
        d.mkdir()
        if dict_src is not None:
            for f in dict_src.glob("codec-dictionary-*"):
                os.link(f, d / f.name)
        q = chronq.open(d, codec=codec, keys=keys)
        qs.append(q)
        a = q.appender()
        for b in batches:
            a.write_many(b)

    w = best(write)
    q = qs[-1]

    def read() -> None:
        t = q.tailer()
        k = 0
        for ex in t:
            k += len(ex.payload)
        assert k == n * MSG_LEN, k
        t.close()

    r = best(read)
    raw = Tailer(q, None)
    stored = sum(len(ex.payload) for ex in raw)
    raw.close()
    for x in qs:
        x.close()
    return n / w, n / r, stored / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=200_000, help="messages per run")
    args = p.parse_args()
    msgs = trades(args.n)
    keys = Keys({1: os.urandom(32)})
    with tempfile.TemporaryDirectory(prefix="chronq-codecs-") as d:
        root = Path(d)
        src = root / "train"
        with chronq.open(src) as q:  # dictionaries are trained on a queue's own (plain) messages
            q.appender().write_many(trades(20_000, seed=99))
            did = train_dictionary(q, size=16 << 10)
        cases: list[tuple[str, Codec | None, str]] = [
            ("plain (no codec)", None, ""),
            ("zstd", Codec("zstd", level=1), ""),
            ("zstd + trained dictionary", Codec("zstd", dictionary=did, level=1), ">= 1.0 M / 2.0 M"),
            ("lz4", Codec("lz4"), ""),
            ("AES-GCM", Codec(None, "aes-gcm"), ">= 0.7 M / 0.7 M"),
            ("zstd + dictionary + AES-GCM", Codec("zstd", "aes-gcm", dictionary=did, level=1), ""),
        ]
        print(f"\n## Codecs ({args.n:,} x {MSG_LEN} B trade-like messages; rates in messages/s)\n")
        print("| codec | write | read | write/plain | read/plain | stored B/msg | size ratio "
              "| target (w / r) |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        base: tuple[float, float, float] | None = None
        for name, codec, target in cases:
            slug = name.split()[0] + str(len(name))
            w, r, size = measure(root, slug, msgs, codec, keys, src if codec and codec.dictionary else None)
            base = base or (w, r, size)
            print(f"| {name} | {w / 1e6:.3f} M | {r / 1e6:.3f} M | {w / base[0]:.2f}x | {r / base[1]:.2f}x | "
                  f"{size:.1f} | {MSG_LEN / size:.2f}x | {target} |")
        assert base is not None
        for name, w, r in library_alone(msgs, src):
            print(f"| {name} | {w / 1e6:.3f} M | {r / 1e6:.3f} M | {w / base[0]:.2f}x | {r / base[1]:.2f}x | "
                  "- | - | |")


def library_alone(msgs: list[bytes], dict_src: Path) -> list[tuple[str, float, float]]:
    """The libraries' own per-message calls, without a queue: the ceiling a codec can reach here."""
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
