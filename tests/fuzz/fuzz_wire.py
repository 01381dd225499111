"""Fuzz the wire decoders: ``wire.binary.decode`` with and without a type, ``decode_document``, the
low-level ``Reader``, each ``WireType``'s decode, the BINARY-to-text renderers, the YAML parser, and a
MessageHistory's last source read in place (``last_source``, in C) against ``read_history``.

Input: byte 0 picks the decoder, byte 1 the target type, the rest is the body. ``WireError`` (with an
offset inside the body for the BINARY reader) is the documented outcome for bad input; any other
exception, a crash, a hang or a huge allocation is a finding.

    python tests/fuzz/fuzz_wire.py CORPUS_DIR -max_total_time=60 -timeout=20 -rss_limit_mb=2048
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import struct
import uuid
from decimal import Decimal
from typing import Any

import atheris
import attrs
import msgspec
from common import VECTORS, run

with atheris.instrument_imports(include=["wire"]):
    from wire import WireError, WireType, text
    from wire.binary import Reader, decode, decode_document, encode, encode_document
    from wire.history import last_source, read_history


class Side(enum.Enum):
    BUY = "BUY"
    SELL = "SELL"


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Trade(msgspec.Struct):  # scalar fields only: MSGSPEC decodes it with the C plan
    timestamp: int
    symbol: str
    price: float
    quantity: int
    side: Side
    flag: bool = False


class Outer(msgspec.Struct):
    inner: Trade | None = None
    items: list[int] = []
    names: dict[str, str] = {}


@dataclasses.dataclass
class Leg:
    venue: str
    qty: int = 0


@attrs.define
class Order:
    id: int
    legs: list[Leg]
    side: Side = Side.BUY
    note: str | None = None


TARGETS: list[Any] = [Trade, Outer, Leg, Order, dict[str, int], dict[int, list[str]], list[float],
                      tuple[int, str], set[str], Trade | None, uuid.UUID, dt.datetime, dt.date, dt.time,
                      Decimal, Color, Side, int, str, float, bool, bytes]
WIRE_TYPES = list(WireType)
OPS = 9


def _walk(body: bytes) -> None:
    r = Reader(body)
    while r.has_more():
        r.read_field()
        if r.has_more():
            r.skip_value()


def _check_offset(e: WireError, body: bytes) -> None:
    if e.offset is not None and not 0 <= e.offset <= len(body):
        raise AssertionError(f"WireError offset {e.offset} outside the {len(body)}-byte input: {e}")


def test_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    op, target, body = data[0] % OPS, TARGETS[data[1] % len(TARGETS)], data[2:]
    try:
        if op == 0:
            decode(body)
        elif op == 1:
            decode_document(body)
        elif op == 2:
            decode(body, target)
        elif op == 3:
            decode_document(body, target if target in (Trade, Outer, Leg, Order) else Outer)
        elif op == 4:
            _walk(body)
        elif op == 5:
            wt = WIRE_TYPES[data[1] % len(WIRE_TYPES)]
            wt.decode(body, TARGETS[(data[1] // len(WIRE_TYPES)) % 4])
        elif op == 6:
            text.render(body)
            text.to_json(body)
        elif op == 7:
            text.from_yaml_all(body.decode("utf-8", "replace"))
        else:
            _last_sources_agree(body)
    except WireError as e:
        if op <= 4:
            _check_offset(e, body)


def _last_sources_agree(body: bytes) -> None:
    """`last_source` (read in place) says what `read_history` says, or fails as it does."""
    try:
        h, _ = read_history(body)
        expected: Any = None if h is None or not h.sources else tuple(h.sources[-1])
    except WireError:
        expected = WireError
    try:
        got: Any = last_source(body)
    except WireError:
        got = WireError
    if got != expected:
        raise AssertionError(f"last_source gave {got!r}, read_history {expected!r}")


def _bodies() -> list[bytes]:
    """Document bodies of the Java-written vectors (from the first message of a FAST_DAILY file)."""
    out: list[bytes] = []
    for name in ("wire_types", "method_writer", "method_writer_history", "method_writer_history_text"):
        for path in sorted((VECTORS / name).rglob("*.cq4")):
            data = path.read_bytes()
            pos = 65808
            while pos + 4 <= len(data):
                header = struct.unpack_from("<I", data, pos)[0]
                if header == 0 or header & 0x80000000:
                    break
                length = header & 0x3FFFFFFF
                out.append(data[pos + 4 : pos + 4 + length])
                pos += 4 + length
                pos += -pos & 3
    return out


def seeds() -> list[bytes]:
    values: list[Any] = [
        Trade(1_700_000_000_000_000_000, "EURUSD", 1.0875, 1_000_000, Side.SELL, True),
        Outer(Trade(1, "X", 2.5, 3, Side.BUY), [1, 2, 3], {"a": "b"}),
        Leg("X", 3),
        Order(7, [Leg("A", 1), Leg("B")], Side.SELL, "note"),
    ]
    out: list[bytes] = []
    for body in _bodies():
        out += [bytes([op, 0]) + body for op in (0, 1, 3, 4, 6, 8)]
    for n, v in enumerate(values):
        out.append(bytes([2, TARGETS.index(type(v))]) + encode(v))
        out.append(bytes([3, TARGETS.index(type(v))]) + encode_document(v))
        for w, wt in enumerate(WIRE_TYPES):
            out.append(bytes([5, n * len(WIRE_TYPES) + w]) + wt.encode(v))
    for value in (None, True, -1, 1 << 40, 2.5, "text", b"\x00\x01", [1, "a", None], {"k": [1.5, {"x": 2}]},
                  uuid.UUID(int=5), dt.datetime(2024, 1, 15, 10), Decimal("1.25")):
        out.append(bytes([0, 0]) + encode(value))
    for path in sorted(VECTORS.glob("*/dump.yaml"))[:6]:
        out.append(bytes([7, 0]) + path.read_bytes()[:4000])
    return out


if __name__ == "__main__":
    run(test_one_input, seeds)
