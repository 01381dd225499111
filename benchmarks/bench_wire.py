"""BINARY wire throughput for a 6-field trade DTO, as a ratio to msgspec.msgpack measured in the same run.

    python benchmarks/bench_wire.py [--seconds 1.0]

Targets (issue #2): BINARY encode and decode >= 2,000,000 messages/s.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import msgspec
from trade import TRADE, Trade

from wire import binary


def _batch(fn: Callable[[], Any]) -> int:
    """A batch size for `fn` that takes about 10 ms."""
    n = 1000
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 > 0.01:
            return n
        n *= 2


def rates(fns: dict[str, Callable[[], Any]], seconds: float, rounds: int = 5) -> dict[str, float]:
    """Calls per second of each function, best of `rounds`. The functions take turns within every round,
    so a baseline and the code compared with it see the same machine load (the ratios stay meaningful
    on a busy machine, where absolute numbers do not)."""
    batches = {name: _batch(fn) for name, fn in fns.items()}
    best = dict.fromkeys(fns, 0.0)
    slot = seconds / rounds
    for _ in range(rounds):
        for name, fn in fns.items():
            n, done, t0 = batches[name], 0, time.perf_counter()
            while time.perf_counter() - t0 < slot:
                for _ in range(n):
                    fn()
                done += n
            best[name] = max(best[name], done / (time.perf_counter() - t0))
    return best


def rate(fn: Callable[[], Any], seconds: float) -> float:
    """Calls per second of one function (best of 3)."""
    return rates({"fn": fn}, seconds, rounds=3)["fn"]


def rows(seconds: float) -> list[tuple[str, float, float]]:
    encode_trade = binary.encoder_for(Trade)
    decode_trade = binary.decoder_for(Trade)
    buf = bytearray()
    encode_trade(buf, TRADE)
    data = bytes(buf)
    assert decode_trade(binary.Reader(data)) == TRADE

    def binary_encode() -> bytes:
        b = bytearray()
        encode_trade(b, TRADE)
        return bytes(b)

    reused = bytearray()

    def binary_encode_reused() -> None:  # what a method writer does: append to a reusable buffer
        reused.clear()
        encode_trade(reused, TRADE)

    def binary_decode() -> Trade:
        return binary.decode(data, type=Trade)  # type: ignore[no-any-return]

    def binary_decode_reader() -> Trade:  # what a method reader does: read from a Reader
        return decode_trade(binary.Reader(data))  # type: ignore[no-any-return]

    mp_encoder = msgspec.msgpack.Encoder()
    mp_decoder = msgspec.msgpack.Decoder(Trade)
    mp_data = mp_encoder.encode(TRADE)
    r = rates(
        {
            "enc": lambda: mp_encoder.encode(TRADE),
            "dec": lambda: mp_decoder.decode(mp_data),
            "bytes": binary_encode,
            "reused": binary_encode_reused,
            "decode": binary_decode,
            "reader": binary_decode_reader,
        },
        seconds * 2,
    )
    base_enc, base_dec = r["enc"], r["dec"]
    return [
        ("msgspec.msgpack encode (baseline)", base_enc, 1.0),
        ("msgspec.msgpack decode (baseline)", base_dec, 1.0),
        ("BINARY encode -> bytes", r["bytes"], r["bytes"] / base_enc),
        ("BINARY encode into reused buffer", r["reused"], r["reused"] / base_enc),
        ("BINARY decode(bytes, type=Trade)", r["decode"], r["decode"] / base_dec),
        ("BINARY decoder_for(Trade)(Reader)", r["reader"], r["reader"] / base_dec),
        *wiretype_rows(seconds, base_enc, base_dec),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    print(f"6-field trade DTO, {len(binary.encode(TRADE))} bytes as BINARY wire")
    print(f"{'operation':<36} {'msgs/s':>12} {'vs msgspec':>11}")
    for name, per_second, ratio in rows(args.seconds):
        print(f"{name:<36} {per_second:>12,.0f} {ratio:>10.2f}x")


def wiretype_rows(seconds: float, base_enc: float, base_dec: float) -> list[tuple[str, float, float]]:
    """`WireType.MSGSPEC` through the common codec interface (target >= 3,000,000/s each way):
    the ratio shows what the interface costs over calling msgspec directly."""
    from wire import WireType

    encode, decode = WireType.MSGSPEC.encoder(), WireType.MSGSPEC.decoder(Trade)
    data = encode(TRADE)
    assert decode(data) == TRADE
    return [
        ("WireType.MSGSPEC encode", (r := rate(lambda: encode(TRADE), seconds)), r / base_enc),
        ("WireType.MSGSPEC decode", (r := rate(lambda: decode(data), seconds)), r / base_dec),
    ]


if __name__ == "__main__":
    main()
