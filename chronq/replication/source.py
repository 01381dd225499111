"""The source side of replication on disk: read a queue's documents in order from where a sink ends."""

from __future__ import annotations

from typing import Any

import chronq
from chronq import _native
from chronq.codecs import CODEC_KEY, dictionary_ids, dictionary_path
from chronq.replication.errors import ReplicationError
from chronq.replication.sink import RELEASE_EVERY, Excerpt, Position, is_store_document
from chronq.tailer import Tailer

__all__ = ["CodecState", "SourceReader"]


class SourceReader:
    """A plain tailer over the source queue yielding (index, metadata, bytes), the store's own documents
    (header, index arrays) left out: every queue writes those itself."""

    def __init__(self, queue: chronq.Queue, position: Position, at_end: bool = False) -> None:
        """`at_end`: past the queue's last document instead (`position` unused): a multicast group's."""
        self.queue = queue
        self._tailer: Any = Tailer(queue)  # the stored bytes: a codec queue's payloads are not decoded
        self._tailer.release_pages_every(RELEASE_EVERY)  # flat RSS while a sink catches up a backlog
        if at_end:
            self._tailer.to_end()
        else:
            self._seek(position)

    def _seek(self, position: Position) -> None:
        """Put the tailer right after the sink's last document; raise if the sink holds something this
        source does not (a sink ahead of its source is back-filled from before it is replicated to)."""
        q, t = self.queue, self._tailer
        nxt = position.next_index
        if nxt is None:
            t.to_start()
            return
        rc = q.roll_cycle
        cycle, seq = rc.split(nxt)
        if seq:
            if not t.move_to_index(nxt - 1):
                raise ReplicationError(f"{q.path}: the sink holds excerpt {nxt - 1:#x}, which this source "
                                       "does not have (a sink ahead of its source)")
            t.read()
        elif cycle not in q.fresh_cycles() or not t.move_to_cycle(cycle):
            raise ReplicationError(f"{q.path}: the sink holds cycle {cycle}, which this source does not have")
        skipped = 0
        while skipped < position.metadata:
            ex = t.read(True)
            if ex is None or not ex.metadata or ex.index != nxt:
                raise ReplicationError(f"{q.path}: the sink holds {position.metadata} metadata documents at "
                                       f"{nxt:#x}, this source {skipped}")
            if not is_store_document(ex.payload):
                skipped += 1

    @property
    def next_index(self) -> int:
        """The index of the next document this reader reads (0 before the queue's first cycle)."""
        return int(self._tailer.index)

    def read_batch(self, max_count: int, max_bytes: int) -> list[Excerpt]:
        """Up to `max_count` documents (at least one if any is ready) totalling about `max_bytes`."""
        out: list[Excerpt] = []
        size = 0
        t = self._tailer
        while len(out) < max_count and size < max_bytes:
            ex = t.read(True)
            if ex is None:
                break
            meta = ex.metadata
            if meta and is_store_document(ex.payload):
                continue
            body = ex.bytes()
            out.append((ex.index, meta, body))
            size += len(body) + 16
        return out

    def read_run(self, out: bytearray, start: int, limit: int, max_count: int) -> tuple[int, int, int, int]:
        """Copy the ready documents of one cycle (at most `max_count`) into `out[start:limit]` as a run
        (`chronq.replication.protocol.Run`) in one native call: (documents, data documents, end offset,
        index of the first). ReplicationError if the next document alone does not fit."""
        docs, data, end, first, blocked = _native.read_run(self._tailer, out, start, limit, max_count)
        if blocked:
            raise ReplicationError(f"{self.queue.path}: a document of {blocked - 4} bytes does not fit in a "
                                   f"frame of at most {limit - start} bytes of documents (maxFrameSize)")
        return docs, data, end, first

    def read_runs(self, out: bytearray | memoryview, size: int, start: int, stop: int, max_runs: int,
                  max_count: int) -> tuple[int, int, int, list[int]]:
        """Copy the ready documents of one cycle (at most `max_count`) as runs into the slots of `out`,
        at most `max_runs` (slot k holds its run in `out[k * size + start:k * size + stop]`: a datagram's
        documents each), in one native call: (documents, data documents, index of the first, each run's
        end offset). ReplicationError if the next document alone does not fit in a slot."""
        docs, data, first, blocked, ends = _native.read_runs(self._tailer, out, size, start, stop, max_runs,
                                                             max_count)
        if blocked:
            raise ReplicationError(f"{self.queue.path}: a document of {blocked - 4} bytes does not fit in a "
                                   f"datagram of at most {stop - start} bytes of documents")
        return docs, data, first, ends

    def close(self) -> None:
        self._tailer.close()


class CodecState:
    """What a sink must learn of a codec queue before it holds documents that need it: the queue's
    `chronq.codec` key and each zstd dictionary stored beside the queue, each told once per connection.

    Call `news()` after reading documents and before sending them: whatever a document needs was in
    place before it was written, so it is seen then. A codec is only ever recorded on a queue without
    data, so once data has been read from a queue without the key it is plain for good and no longer
    looked up (a missing key costs the table store a rescan)."""

    def __init__(self, queue: chronq.Queue, max_dictionary: int) -> None:
        self.queue = queue
        self.max_dictionary = max_dictionary
        self.codec: int | None = None
        self._plain = False
        self._told: set[int] = set()

    def news(self, data_read: int) -> list[tuple[int, int, bytes]]:
        """(codec, dictionary id, dictionary) to tell the sink (id 0: the codec key alone), after reading
        documents of which `data_read` were data documents."""
        if self._plain:
            return []
        if self.codec is None:
            table = self.queue.table
            value = table.get(CODEC_KEY) if table is not None else None
            if value is None:
                self._plain = data_read > 0
                return []
            self.codec = value
            out = [(value, 0, b"")]
        else:
            out = []
        for dict_id in dictionary_ids(self.queue.path):
            if dict_id in self._told or not 0 < dict_id < 1 << 32:
                continue
            data = dictionary_path(self.queue.path, dict_id).read_bytes()
            if len(data) > self.max_dictionary:
                raise ReplicationError(f"{self.queue.path}: dictionary {dict_id} ({len(data)} bytes) does "
                                       f"not fit in a frame of {self.max_dictionary} bytes (maxFrameSize)")
            out.append((self.codec, dict_id, data))
            self._told.add(dict_id)
        return out
