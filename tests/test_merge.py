"""chronq.merge: several queues as one iterator in key order, ties by input position then index; the
tailers resume where a stopped merge left them; `follow=True` waits for every input."""

from __future__ import annotations

import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq

KEY = struct.Struct("<q")


def key(ex: chronq.Excerpt) -> int:
    return KEY.unpack_from(ex)[0]  # type: ignore[no-any-return]


def fill(q: chronq.Queue, keys: list[int], tag: int = 0) -> list[int]:
    a = q.appender()
    return [a.write(KEY.pack(k) + bytes([tag, n % 256])) for n, k in enumerate(keys)]


def model(inputs: list[list[int]], indexes: list[list[int]]) -> list[tuple[int, int, bytes]]:
    items = [
        (k, src, idx, KEY.pack(k) + bytes([src, n % 256]))
        for src, keys in enumerate(inputs)
        for n, (k, idx) in enumerate(zip(keys, indexes[src], strict=True))
    ]
    return [(src, idx, payload) for _, src, idx, payload in sorted(items)]


sorted_keys = st.lists(st.integers(-5, 5), max_size=12).map(sorted)


@settings(max_examples=60, deadline=None)
@given(inputs=st.lists(sorted_keys, min_size=1, max_size=5), stop=st.integers(0, 30))
def test_merge_is_sorted_by_key_then_input_then_index(tmp_path_factory, inputs, stop):
    base = tmp_path_factory.mktemp("merge")
    queues = [chronq.open(base / f"q{i}") for i in range(len(inputs))]
    try:
        indexes = [fill(q, keys, i) for i, (q, keys) in enumerate(zip(queues, inputs, strict=True))]
        expected = model(inputs, indexes)
        assert list(chronq.merge(queues, key)) == expected
        # stopped after `stop` items, a second merge over the same tailers carries on exactly
        tailers = [q.tailer() for q in queues]
        first = []
        it = chronq.merge(tailers, key)
        for item in it:
            first.append(item)
            if len(first) == stop:
                break
        it.close()
        assert first + list(chronq.merge(tailers, key)) == expected
        views = [(s, i, bytes(p)) for s, i, p in chronq.merge(queues, key, copy=False)]
        assert views == expected
    finally:
        for q in queues:
            q.close()


def test_view_payloads_are_excerpts(tmp_path):
    with chronq.open(tmp_path / "a") as a, chronq.open(tmp_path / "b") as b:
        fill(a, [1, 3])
        fill(b, [2])
        for _, index, ex in chronq.merge([a, b], key, copy=False):
            assert isinstance(ex, chronq.Excerpt) and ex.index == index
        assert [key(ex) for _, _, ex in chronq.merge([a, b], key, copy=False)] == [1, 2, 3]


def test_follow_waits_for_every_input_and_gives_back_what_it_read_ahead(tmp_path):
    with chronq.open(tmp_path / "fast") as fast, chronq.open(tmp_path / "slow") as slow:
        fill(fast, [1, 3, 5])
        tailers = [fast.tailer(), slow.tailer()]
        t0 = time.monotonic()
        # the slow input never has an item: nothing may pass it, and the merge ends on the timeout
        assert list(chronq.merge(tailers, key, follow=True, timeout=0.2)) == []
        assert time.monotonic() - t0 >= 0.2

        def late() -> None:
            time.sleep(0.3)
            fill(slow, [2], 1)

        writer = threading.Thread(target=late)
        writer.start()
        got = [key(p) for _, _, p in chronq.merge(tailers, key, follow=True, copy=False, timeout=1.0)]
        writer.join()
        assert got == [1, 2]  # then slow is empty again: 3 waits for it, until the timeout
        # replayed: every input is finished when it has nothing more, so 3 and 5 come out
        assert [key(p) for _, _, p in chronq.merge(tailers, key)] == [3, 5]


def test_follow_yields_each_item_once_every_input_has_one(tmp_path):
    with chronq.open(tmp_path / "a") as a, chronq.open(tmp_path / "b") as b:
        fill(a, [1, 2, 10])
        fill(b, [5, 6])
        it = chronq.merge([a, b], key, follow=True, pauser=chronq.BusyPauser(), timeout=0.1)
        assert [key(memoryview(p)) for _, _, p in it] == [1, 2, 5, 6]  # 10 waits for b's next


def test_keys_that_do_not_compare_leave_the_tailers_where_they_were(tmp_path):
    with chronq.open(tmp_path / "a") as a, chronq.open(tmp_path / "b") as b:
        fill(a, [1, 2])
        fill(b, [3])
        tailers = [a.tailer(), b.tailer()]
        odd = iter([1, 3, "two"])
        it = chronq.merge(tailers, lambda ex: next(odd))
        next(it)
        with pytest.raises(TypeError):
            next(it)
        assert [key(memoryview(p)) for _, _, p in chronq.merge(tailers, key)] == [2, 3]


def test_a_key_that_fails_leaves_the_tailers_where_they_were(tmp_path):
    with chronq.open(tmp_path / "a") as a, chronq.open(tmp_path / "b") as b:
        fill(a, [1, 2])
        fill(b, [3])
        tailers = [a.tailer(), b.tailer()]
        calls = []

        def flaky(ex: chronq.Excerpt) -> int:
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("bad key")
            return key(ex)

        it = chronq.merge(tailers, flaky)
        assert next(it)[2][:8] == KEY.pack(1)
        with pytest.raises(RuntimeError):
            next(it)
        assert [key(memoryview(p)) for _, _, p in chronq.merge(tailers, key)] == [2, 3]


F64 = struct.Struct("<d")


def heapq_reference(inputs: list[list[float]]) -> list[tuple[int, int]]:
    """The merge as heapq runs it over (key, source, item) tuples: what chronq.merge gives item for
    item, even for inputs out of order and keys such as NaN that order nothing."""
    import heapq

    pos = [0] * len(inputs)

    def entry(src: int) -> tuple[float, int, tuple[int, int]] | None:
        if pos[src] == len(inputs[src]):
            return None
        n = pos[src]
        pos[src] += 1
        return (F64.unpack(F64.pack(inputs[src][n]))[0], src, (src, n))

    heap = [e for e in (entry(s) for s in range(len(inputs))) if e is not None]
    heapq.heapify(heap)
    out = []
    while heap:
        out.append(heap[0][2])
        e = entry(heap[0][1])
        if e is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, e)
    return out


class PythonReadTailer(chronq.Tailer):
    """A tailer whose read() is Python's: the merge must call it rather than read natively."""

    def read(self, metadata: bool = False) -> chronq.Excerpt | None:  # type: ignore[override]
        return super().read(metadata)


@settings(max_examples=60, deadline=None)
@given(
    inputs=st.lists(
        st.lists(st.floats() | st.integers(-3, 3).map(float), max_size=8), min_size=1, max_size=4
    ),
    python_read=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_any_keys_merge_as_heapq_merges_them(tmp_path_factory, inputs, python_read):
    base = tmp_path_factory.mktemp("merge")
    queues = [chronq.open(base / f"q{i}") for i in range(len(inputs))]
    try:
        for q, keys in zip(queues, inputs, strict=True):
            a = q.appender()
            for k in keys:
                a.write(F64.pack(k))
        tailers = [PythonReadTailer(q) if python_read[i] else q.tailer() for i, q in enumerate(queues)]
        firsts = [q.tailer().read() for q in queues]
        got = chronq.merge(tailers, lambda ex: F64.unpack_from(ex)[0])
        # (source, position in its queue), as the reference numbers them
        assert [(src, idx - firsts[src].index) for src, idx, _ in got] == heapq_reference(inputs)
    finally:
        for q in queues:
            q.close()


def test_a_merge_dropped_part_way_gives_back_what_it_read_ahead(tmp_path):
    with chronq.open(tmp_path / "a") as a, chronq.open(tmp_path / "b") as b:
        fill(a, [1, 3, 5])
        fill(b, [2, 4])
        tailers = [a.tailer(), b.tailer()]
        it = chronq.merge(tailers, key)
        assert [key(memoryview(next(it)[2])) for _ in range(3)] == [1, 2, 3]
        del it  # no close(): dropping the iterator gives the read-ahead item back all the same
        assert [key(memoryview(p)) for _, _, p in chronq.merge(tailers, key)] == [4, 5]


def test_a_key_that_advances_its_own_merge_is_refused(tmp_path):
    with chronq.open(tmp_path / "a") as a:
        fill(a, [1, 2])
        its: list = []

        def reentrant(ex: chronq.Excerpt) -> int:
            if len(its) == 2:
                next(its[0])
            return key(ex)

        its.append(chronq.merge([a.tailer()], reentrant))
        assert next(its[0])[0] == 0
        its.append("now the key advances the merge")
        with pytest.raises(ValueError, match="already advancing"):
            next(its[0])
