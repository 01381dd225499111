"""BINARY wire throughput for a 6-field trade DTO, as a ratio to msgspec.msgpack measured in the same run.

    python benchmarks/bench_wire.py [--seconds 1.0]

Targets: BINARY encode and decode >= 2,000,000 messages/s, WireType.MSGSPEC >= 3,000,000.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import msgspec
from trade import TRADE, Trade

from wire import WireType, binary

Loop = Callable[[int], Any]


def loop(statement: str, **names: Any) -> Loop:
    """`statement` run n times inline, as `timeit` does: the measurement is the operation itself, not
    the cost of calling a Python wrapper around it (which would be charged to every row alike)."""
    namespace = dict(names)
    exec(f"def run(n):\n    for _ in range(n):\n        {statement}\n", namespace)
    return namespace["run"]  # type: ignore[no-any-return]


def _batch(run: Loop) -> int:
    """A batch size for `run` that takes about 10 ms."""
    n = 1000
    while True:
        t0 = time.perf_counter()
        run(n)
        if time.perf_counter() - t0 > 0.01:
            return n
        n *= 2


def rates(loops: dict[str, Loop], seconds: float, rounds: int = 5) -> dict[str, float]:
    """Operations per second of each loop, best of `rounds`. The loops take turns within every round,
    so a baseline and the code compared with it see the same machine load (the ratios stay meaningful
    on a busy machine, where absolute numbers do not)."""
    batches = {name: _batch(run) for name, run in loops.items()}
    best = dict.fromkeys(loops, 0.0)
    slot = seconds / rounds
    for _ in range(rounds):
        for name, run in loops.items():
            n, done, t0 = batches[name], 0, time.perf_counter()
            while time.perf_counter() - t0 < slot:
                run(n)
                done += n
            best[name] = max(best[name], done / (time.perf_counter() - t0))
    return best


BINARY_TARGET, MSGSPEC_TARGET = 2_000_000, 3_000_000


def rows(seconds: float) -> list[tuple[str, float, float, int | None]]:
    encode_trade = binary.encoder_for(Trade)
    decode_trade = binary.decoder_for(Trade)
    buf = bytearray()
    encode_trade(buf, TRADE)
    data = bytes(buf)
    assert decode_trade(binary.Reader(data)) == TRADE
    assert binary.encode(TRADE) == data and binary.decode(data, type=Trade) == TRADE
    mp_encoder = msgspec.msgpack.Encoder()
    mp_decoder = msgspec.msgpack.Decoder(Trade)
    mp_data = mp_encoder.encode(TRADE)
    wt_encode, wt_decode = WireType.MSGSPEC.encoder(), WireType.MSGSPEC.decoder(Trade)
    wt_data = wt_encode(TRADE)
    assert wt_decode(wt_data) == TRADE
    reused = bytearray()
    names = dict(
        TRADE=TRADE, Trade=Trade, data=data, binary=binary, encode_trade=encode_trade, reused=reused,
        decode_trade=decode_trade, Reader=binary.Reader, mp_encode=mp_encoder.encode,
        mp_decode=mp_decoder.decode, mp_data=mp_data, encode=binary.encode, decode=binary.decode,
        wt_encode=wt_encode, wt_decode=wt_decode, wt_data=wt_data,
    )
    cases = {
        "enc": "mp_encode(TRADE)",
        "dec": "mp_decode(mp_data)",
        "bytes": "encode(TRADE)",
        "reused": "reused.clear(); encode_trade(reused, TRADE)",  # what a method writer does
        "decode": "decode(data, type=Trade)",
        "reader": "decode_trade(Reader(data))",  # what the general method-reader path does
        "wt_enc": "wt_encode(TRADE)",
        "wt_dec": "wt_decode(wt_data)",
    }
    r = rates({k: loop(stmt, **names) for k, stmt in cases.items()}, seconds * 2)
    base_enc, base_dec = r["enc"], r["dec"]
    return [
        ("msgspec.msgpack encode (baseline)", base_enc, 1.0, None),
        ("msgspec.msgpack decode (baseline)", base_dec, 1.0, None),
        ("BINARY encode(TRADE) -> bytes", r["bytes"], r["bytes"] / base_enc, BINARY_TARGET),
        ("BINARY encode into reused buffer", r["reused"], r["reused"] / base_enc, BINARY_TARGET),
        ("BINARY decode(bytes, type=Trade)", r["decode"], r["decode"] / base_dec, BINARY_TARGET),
        ("BINARY decoder_for(Trade)(Reader)", r["reader"], r["reader"] / base_dec, None),
        ("WireType.MSGSPEC encode", r["wt_enc"], r["wt_enc"] / base_enc, MSGSPEC_TARGET),
        ("WireType.MSGSPEC decode", r["wt_dec"], r["wt_dec"] / base_dec, MSGSPEC_TARGET),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    print(f"6-field trade DTO, {len(binary.encode(TRADE))} bytes as BINARY wire")
    print(f"{'operation':<36} {'msgs/s':>12} {'vs msgspec':>11} {'target':>8}")
    for name, per_second, ratio, target in rows(args.seconds):
        met = "" if target is None else "met" if per_second >= target else f"{per_second / target:.0%}"
        print(f"{name:<36} {per_second:>12,.0f} {ratio:>10.2f}x {met:>8}")


if __name__ == "__main__":
    main()
