"""Checked by mypy --strict in tests/test_chronq_typing.py: every `type: ignore` below must be needed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_type

import chronq
import wire
from chronq.rollcycles import FixedClock
from wire import binary

q = chronq.open("q", "FAST_DAILY", clock=FixedClock(0), block_size=1 << 20, epoch=0, lock_timeout=1.0)
assert_type(q, chronq.Queue)
ro = chronq.open(Path("q"), readonly=True, on_acquired=lambda cycle, path: None)
assert_type(ro, chronq.Queue)
chronq.open("q", lock_timeout="soon")  # type: ignore[arg-type]
chronq.open("q", rollcycle="DAILY")  # type: ignore[call-arg]
chronq.open("q", "FAST_DAILY", 7)  # type: ignore[call-arg]

with chronq.open("q") as q2:
    assert_type(q2, chronq.Queue)

a = q.appender()
assert_type(a, chronq.Appender)
assert_type(a.write(b"x"), int)
assert_type(a.last_index_appended, int)
with a.writing_document() as dc:
    assert_type(dc, chronq.DocumentContext)
    assert_type(dc.index, int)
a.write("text")  # type: ignore[arg-type]

t = q.tailer("reader")
# on a codec queue the tailer is a CodecTailer: its data excerpts are decoded ones
assert_type(t, chronq.Tailer[chronq.QueueExcerpt])
assert_type(t.index, int)
assert_type(t.direction, chronq.Direction)
assert_type(t.to_start(), chronq.Tailer[chronq.QueueExcerpt])
assert_type(t.move_to_index(0), bool)
ex = t.read()
assert_type(ex, chronq.QueueExcerpt | None)
assert ex is not None
assert_type(ex.payload, memoryview)
assert_type(ex.index, int)
assert_type(ex.cycle, int)
assert_type(ex.seq, int)
assert_type(ex.position, int)
assert_type(ex.metadata, bool)
assert_type(ex.bytes(), bytes)
for e in t:
    assert_type(e, chronq.QueueExcerpt)
for e in q:
    assert_type(e, chronq.QueueExcerpt)
assert_type(t.wait_read(0.1), chronq.QueueExcerpt | None)
plain: chronq.Tailer = chronq.Tailer(q)  # a plain tailer reads the stored excerpts
assert_type(plain.read(), chronq.Excerpt | None)
plain = t  # type: ignore[assignment]
ex.index = 3  # type: ignore[misc]


@dataclass
class Quote:
    symbol: str
    price: float


wire.register(Quote)
assert_type(binary.decode(b"", type=Quote), Quote)
assert_type(binary.decode(b"", Quote), Quote)
assert_type(binary.decode(b""), Any)
assert_type(binary.decode_document(b"", type=Quote), Quote)
assert_type(binary.decode_document(b""), dict[Any, Any])
price: float = binary.decode(b"", type=Quote).volume  # type: ignore[attr-defined]
