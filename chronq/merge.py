"""`merge`: one iterator over several queues in key order, deterministic on replay.

Each input is a `Tailer` (or a `Queue`, read from its start by a new tailer). `key(excerpt)` gives the
sort key of an excerpt; the excerpt is a buffer (`struct.unpack_from(fmt, excerpt)`,
`excerpt.payload`, `bytes(excerpt)`) with its `index`. Items come out in key order; equal keys in input
order (the position in `inputs`), then in index order (an input's own order) — so the same queues
merge to the same sequence on every replay, whatever the timing of the writers was.

Yields `(source, index, payload)`: `source` the input's position in `inputs`, `index` the excerpt's
queue index, `payload` per `copy`:

* ``copy=True`` (default): `bytes`, a copy the caller may keep.
* ``copy=False``: the `Excerpt` itself (a zero-copy buffer over the mapped file). Like any excerpt
  it is valid until its tailer's next read, which the merge makes when the next item is asked for:
  use it (or copy it) before advancing the iterator.

Finished or live (`follow`):

* ``follow=False`` (default): an input is finished when its tailer has nothing more to read right
  now; the merge ends when every input is finished. An item is yielded once every input either has
  its next item read or is finished, so the output is in key order over what the queues held when
  each input was last read. Items appended later to a finished input are not waited for: use this to
  replay.
* ``follow=True``: no input is ever finished: an item is yielded only when *every* input has a next
  item, so a quiet input holds the merge back (a later key elsewhere cannot be passed before it is
  known that the quiet input has nothing earlier). While an input is empty, the merge sleeps on that
  input's doorbell (`Tailer.wait`: woken by its appender), or pauses with `pauser` if one is given.
  With `timeout`, the merge ends when one input has stayed
  empty that many seconds; without, it runs until the caller stops iterating.

When the merge ends or the caller stops (`break`, `close()`), every tailer is left just after the
last item yielded from it: the items read ahead but not yielded are given back (`move_to_index`), so a
later merge over the same tailers carries on where this one stopped. Tailers must read forward.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from chronq import _native
from chronq.pausers import Pauser
from chronq.queue import Queue, QueueExcerpt
from chronq.tailer import Tailer

__all__ = ["merge"]

Item = tuple[int, int, Any]


def merge(
    inputs: Sequence[Tailer[QueueExcerpt] | Queue],
    key: Callable[[QueueExcerpt], Any],
    *,
    follow: bool = False,
    copy: bool = True,
    pauser: Pauser | None = None,
    timeout: float | None = None,
) -> Iterator[Item]:
    """`(source, index, payload)` of every excerpt of `inputs` in `key` order; see the module
    docstring for ties, `copy`, `follow` and where the tailers are left."""
    tailers: list[Tailer[QueueExcerpt]] = [x.tailer() if isinstance(x, Queue) else x for x in inputs]
    if follow:
        return _live(tailers, key, copy, pauser, timeout)
    return _replay(tailers, key, copy)


def _give_back(tailers: list[Tailer[QueueExcerpt]], heap: list[list[Any]], skip: int) -> None:
    """Move each tailer back to its pending (read, not yielded) item; `skip`: the source whose item
    was yielded and not yet replaced (its tailer is already where it must be), or -1."""
    for entry in heap:
        if entry[1] != skip:
            tailers[entry[1]].move_to_index(entry[2][1])


def _entry(tailers: list[Tailer[QueueExcerpt]], key: Callable[[QueueExcerpt], Any], copy: bool, src: int,
           ex: QueueExcerpt) -> Any:
    """The heap entry of `ex`, read from input `src`: (key, src, item). If `key` fails, the excerpt
    is given back to its tailer first."""
    try:
        return (key(ex), src, (src, ex.index, ex.bytes() if copy else ex))
    except BaseException:
        tailers[src].move_to_index(ex.index)
        raise


def _replay(
    tailers: list[Tailer[QueueExcerpt]], key: Callable[[QueueExcerpt], Any], copy: bool
) -> Iterator[Item]:
    """The finished mode in C (`_native.Merge`): one read, one key call and one heap step per item,
    without a Python frame; the same rules and heap algorithm as `_live` below (which waits, so stays
    in Python). A tailer whose `read` is TailerCore's own is read without a Python call."""
    native = bytes(t.document_source() is not None for t in tailers)
    it: Iterator[Item] = _native.Merge(tuple(tailers), native, key, copy)
    return it


def _live(
    tailers: list[Tailer[QueueExcerpt]], key: Callable[[QueueExcerpt], Any], copy: bool,
    pauser: Pauser | None, timeout: float | None,
) -> Iterator[Item]:
    reads = [t.read for t in tailers]
    heap: list[Any] = []
    yielded = -1

    def wait(src: int) -> Any:
        """The next item of `src`, polling until there is one; None when `timeout` runs out."""
        read = reads[src]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ex = read()
            if ex is not None:
                if pauser is not None:
                    pauser.reset()
                return _entry(tailers, key, copy, src, ex)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if pauser is None:
                tailers[src].wait(left)  # on that input's doorbell: woken by its appender
            else:
                pauser.pause()

    try:
        for src in range(len(reads)):
            entry = wait(src)
            if entry is None:
                return
            heap.append(entry)
        heapq.heapify(heap)
        replace = heapq.heapreplace
        while heap:
            item = heap[0][2]
            src = yielded = item[0]
            yield item
            ex = reads[src]()
            if ex is not None:
                entry = _entry(tailers, key, copy, src, ex)
            else:
                entry = wait(src)
                if entry is None:
                    heapq.heappop(heap)  # the yielded item: its tailer is already past it
                    yielded = -1
                    return
            try:
                replace(heap, entry)
            except BaseException:  # keys that do not compare: the item goes back to its tailer
                tailers[src].move_to_index(entry[2][1])
                raise
            yielded = -1
    finally:
        _give_back(tailers, heap, yielded)
