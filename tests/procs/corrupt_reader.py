"""Opens damaged queues on request and reports what happened, one JSON line per request.

stdin: one JSON object per line: {"dir": queue_dir, "mode": "read" | "append" | "dump", "named": [names]}
("dump": the text dump and the JSON records of the whole directory, as `chronq dump` prints them).
stdout: {"status": "ok", "count": n} or {"status": "error", "type": ..., "chronq": bool, "file": ...,
"position": ..., "message": ...} or {"status": "wrong", "message": ...} when the queue contradicted itself.
It runs in its own process so that a segfault or a hang is seen by the test as exactly that.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from qhelp import BASE_MS

import chronq
from chronq import dump
from chronq.errors import ChronqError, CorruptQueueError
from chronq.rollcycles import FixedClock
from chronq.table import TableStore

LIMIT = 1_000_000  # more excerpts than a 200 KB file can hold means the reader is going round in circles

# A read-only open of an empty table store waits for the process creating it (10 s by default:
# tests/test_table_store.py checks that wait). Nothing creates these damaged copies, so that wait would
# only be waited out before the same CorruptQueueError: every open in this process waits this long.
CREATOR_WAIT = 0.2
_table_store_open = TableStore.open.__func__


def _open_without_a_creator(cls: type[TableStore], path: Any, *, timeout: float = CREATOR_WAIT,
                            **options: Any) -> TableStore:
    return _table_store_open(cls, path, timeout=timeout, **options)


TableStore.open = classmethod(_open_without_a_creator)  # type: ignore[method-assign,assignment]


def read_everything(q: Any, named: list[str]) -> int:
    t = q.tailer()
    forward = []
    while (ex := t.read()) is not None:
        forward.append((ex.index, bytes(ex.payload)))
        if len(forward) > LIMIT:
            raise AssertionError("reader does not terminate")
    if forward:
        # Whatever was readable must be found again by its index: anything else is silent corruption.
        for index, payload in forward[:: max(1, len(forward) // 50)]:
            if not t.move_to_index(index):
                raise AssertionError(f"move_to_index({index:#x}) failed for an excerpt just read")
            ex = t.read()
            if ex is None or ex.index != index or bytes(ex.payload) != payload:
                raise AssertionError(f"re-read at {index:#x} differs")
    t.direction = chronq.Direction.BACKWARD
    t.to_end()
    backward = 0
    while t.read() is not None:
        backward += 1
        if backward > LIMIT:
            raise AssertionError("backward reader does not terminate")
    for name in named:
        nt = q.tailer(name)
        while nt.read() is not None:
            pass
    return len(forward)


def append_one(q: Any) -> int:
    """Append, then find the message again; if it cannot be found the damage must at least be reported."""
    index = q.appender().write(b"written after the damage")
    t = q.tailer()
    if t.move_to_index(index):
        ex = t.read()
        if ex is None or bytes(ex.payload) != b"written after the damage":
            raise AssertionError(f"appended excerpt {index:#x} reads back differently")
        return 1
    t.to_start()
    while (ex := t.read()) is not None:  # a ChronqError raised here reports the damage: acceptable
        if ex.index == index:
            raise AssertionError(f"move_to_index({index:#x}) is False for an excerpt a forward read finds")
    raise AssertionError(f"appended excerpt {index:#x} is lost: neither found nor any error raised")


def dump_everything(directory: str) -> int:
    lines = sum(1 for _ in dump.dump_lines(directory))
    records = sum(1 for _ in dump.dump_records(directory))
    if lines > 10 * LIMIT or records > LIMIT:
        raise AssertionError("dump does not terminate")
    return records


def handle(req: dict[str, Any]) -> dict[str, Any]:
    try:
        if req["mode"] == "dump":
            return {"status": "ok", "count": dump_everything(req["dir"])}
        if req["mode"] == "read":
            with chronq.open(req["dir"], readonly=True) as q:
                return {"status": "ok", "count": read_everything(q, req.get("named", []))}
        with chronq.open(req["dir"], clock=FixedClock(BASE_MS)) as q:
            return {"status": "ok", "count": append_one(q)}
    except AssertionError as e:
        return {"status": "wrong", "message": str(e)}
    except Exception as e:
        out = {"status": "error", "type": type(e).__name__, "chronq": isinstance(e, ChronqError),
               "message": str(e)}
        if isinstance(e, CorruptQueueError):
            out.update(file=e.file, position=e.position)
        return out


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(handle(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
