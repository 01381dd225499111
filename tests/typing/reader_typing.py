"""Checked by mypy --strict in tests/test_rpc_typing.py: the reader contract (`chronq.Reader`,
`chronq.ExcerptLike`) that every tailer and excerpt satisfies and rpc's seams take; every
`type: ignore` below must be needed (a wrong use mypy catches)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, assert_type

import chronq
import rpc
import rpc.aio
from chronq import archive
from chronq.codecs import CodecTailer, DecodedExcerpt
from chronq.replication import AcknowledgedTailer

q = chronq.open("q")
plain = chronq.Tailer(q)
codec = q.tailer()
acked = AcknowledgedTailer(plain)
archived = archive.open("a").tailer()

# every tailer-shaped class is a Reader of its own excerpt type, every excerpt is ExcerptLike
r1: chronq.Reader[chronq.Excerpt] = plain
r2: chronq.Reader[chronq.QueueExcerpt] = codec
r3: chronq.Reader[chronq.Excerpt] = acked
r4: chronq.Reader[archive.ArchivedExcerpt] = archived
any_reader: list[chronq.Reader] = [plain, codec, acked, archived]
likes: list[chronq.ExcerptLike] = []
for reader in any_reader:
    got = reader.read()
    if got is not None:
        likes.append(got)
        assert_type(got.index, int)
        got.index = 3  # type: ignore[misc]
bad_reader: chronq.Reader = q  # type: ignore[assignment]  # a queue is not a reader: it makes them
bad_plain: chronq.Reader[chronq.Excerpt] = archived  # type: ignore[assignment]  # archives copy out


def decoded(t: CodecTailer) -> chronq.Reader[DecodedExcerpt]:
    assert_type(t.read(), DecodedExcerpt | chronq.Excerpt | None)
    return t  # type: ignore[return-value]  # its metadata documents come as stored


class Trades(Protocol):
    def trade(self, symbol: str, qty: int) -> None: ...


class Desk(Trades):
    def trade(self, symbol: str, qty: int) -> None:
        pass


# rpc's seams take a Reader, a Queue, an Appender: any tailer, never a queue or an appender
for reader in (plain, codec, acked, archived):
    rpc.reader(reader, Desk())
rpc.reader(q, Desk())  # type: ignore[arg-type]
rpc.MethodReader(q.appender(), Desk())  # type: ignore[arg-type]
rpc.Service(q, q, lambda out: Desk(), 2)
rpc.Service(plain, q, lambda out: Desk(), 2)  # type: ignore[arg-type]
rpc.Output(q.appender(), 2)
rpc.Output(q, 2)  # type: ignore[arg-type]


async def replay() -> None:
    assert_type(rpc.aio.excerpts(archived), AsyncIterator[archive.ArchivedExcerpt])
    assert_type(rpc.aio.excerpts(plain), AsyncIterator[chronq.Excerpt])
    async for ex in rpc.aio.excerpts(codec):  # (mypy joins the union of a codec queue's excerpts)
        assert_type(ex, chronq.ExcerptLike)
    rpc.aio.excerpts(q)  # type: ignore[arg-type]
