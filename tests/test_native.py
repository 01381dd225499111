"""The native primitives against the pure-Python reference (tests/native_model.py)."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chronq
from chronq import _native
from chronq.errors import CorruptQueueError
from chronq.rollcycles import FixedClock
from tests import native_model as model

SIZE = 64
offsets8 = st.integers(0, SIZE // 8 - 1).map(lambda i: i * 8)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
u32 = st.integers(0, (1 << 32) - 1)

op = st.one_of(
    st.tuples(st.just("store64"), offsets8, i64),
    st.tuples(st.just("cas64"), offsets8, i64, i64),
    st.tuples(st.just("set_max64"), offsets8, i64),
    st.tuples(st.just("add64"), offsets8, i64),
    st.tuples(st.just("cas32"), offsets8.map(lambda o: o + 4), u32, u32),
    st.tuples(st.just("store32"), st.integers(0, SIZE // 4 - 1).map(lambda i: i * 4), u32),
    st.tuples(st.just("set_min64"), offsets8, i64),
    st.tuples(st.just("load64"), offsets8),
    st.tuples(st.just("load32"), st.integers(0, SIZE // 4 - 1).map(lambda i: i * 4)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(op, max_size=40), st.binary(min_size=SIZE, max_size=SIZE))
def test_atomics_match_the_model(ops: list[tuple[object, ...]], init: bytes) -> None:
    real = mmap.mmap(-1, SIZE)
    real[:] = init
    ref = bytearray(init)
    for name, *args in ops:
        got = getattr(_native, str(name))(real, *args)
        want = getattr(model, str(name))(ref, *args)
        assert got == want, (name, args)
        assert bytes(real) == bytes(ref)
    # cas with the value just read always succeeds, with anything else fails
    cur = _native.load64(real, 0)
    assert _native.cas64(real, 0, cur ^ 1, 7) is False
    assert _native.cas64(real, 0, cur, 7) is True


@pytest.mark.parametrize(
    "name,args", [("load64", (4,)), ("load32", (2,)), ("store64", (12, 1)), ("cas32", (1, 0, 1))]
)
def test_misaligned_offsets_are_rejected(name: str, args: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="aligned"):
        getattr(_native, name)(bytearray(32), *args)


@pytest.mark.parametrize("off", [-8, 32, 1 << 40])
def test_out_of_range_offsets_are_rejected(off: int) -> None:
    with pytest.raises(IndexError, match="out of range"):
        _native.load64(bytearray(32), off)


def test_writes_need_a_writable_buffer() -> None:
    with pytest.raises((TypeError, BufferError)):
        _native.store64(bytes(16), 0, 1)
    assert _native.load64(bytes(16), 8) == 0  # loads accept read-only buffers


def test_write_lock_protocol_values() -> None:
    buf = bytearray(8)
    _native.store64(buf, 0, _native.UNLOCKED)
    assert struct.unpack("<q", buf)[0] == -(1 << 63)
    assert _native.cas64(buf, 0, _native.UNLOCKED, 1234)
    assert not _native.cas64(buf, 0, _native.UNLOCKED, 99)
    assert _native.load64(buf, 0) == 1234


def _docs() -> st.SearchStrategy[list[tuple[bytes, bool]]]:
    return st.lists(st.tuples(st.binary(max_size=40), st.booleans()), max_size=30)


@settings(max_examples=60, deadline=None)
@given(_docs(), st.booleans(), st.integers(0, 40), st.sampled_from([1, 4]))
def test_scan_matches_the_model(
    docs: list[tuple[bytes, bool]], include_meta: bool, max_rows: int, align: int
) -> None:
    buf = bytearray(4096)
    pos = 0
    for body, meta in docs:
        pos = model.append(buf, pos, body, meta, align)
    want = model.scan(buf, 0, -1, 10, max_rows, include_meta, align)
    got = _native.scan(bytes(buf), 0, -1, 10, max_rows, include_meta, align)
    positions, lengths, flags, next_pos, next_seq, status = got
    assert list(struct.unpack(f"<{len(positions) // 8}q", positions)) == want[0]
    assert list(struct.unpack(f"<{len(lengths) // 4}i", lengths)) == want[1]
    assert [bool(f) for f in flags] == want[2]
    assert (next_pos, next_seq, status) == want[3:]
    data, offsets = _native.gather(bytes(buf), positions, lengths)
    offs = struct.unpack(f"<{len(offsets) // 4}i", offsets)
    rows = [data[offs[i] : offs[i + 1]] for i in range(len(offs) - 1)]
    assert rows == [bytes(buf[p + 4 : p + 4 + n]) for p, n in zip(want[0], want[1], strict=True)]


def test_scan_stops_at_eof_and_not_ready_headers() -> None:
    buf = bytearray(256)
    pos = model.append(buf, 0, b"abc")
    struct.pack_into("<I", buf, pos, model.EOF)
    assert _native.scan(bytes(buf), 0, -1, 0, 10)[3:] == (pos, 1, 1)
    struct.pack_into("<I", buf, pos, model.NOT_COMPLETE | 5)
    assert _native.scan(bytes(buf), 0, -1, 0, 10)[3:] == (pos, 1, 0)


def test_scan_rejects_a_length_past_the_buffer() -> None:
    buf = bytearray(64)
    struct.pack_into("<I", buf, 0, 1000)
    with pytest.raises(Exception, match="past the end"):
        _native.scan(bytes(buf), 0, -1, 0, 10)


def test_gather_checks_bounds() -> None:
    with pytest.raises(IndexError):
        _native.gather(bytes(16), struct.pack("<q", 8), struct.pack("<i", 100))


def test_write_eof_walks_to_the_first_free_header() -> None:
    buf = bytearray(128)
    pos = model.append(buf, 0, b"hello")
    assert _native.write_eof(buf, 0, 4) == pos
    assert buf[pos : pos + 8] == b"\x00\x00\x00\xc0\xc3EOF"
    assert _native.write_eof(buf, 0, 4) == pos  # idempotent


def test_map_exports_a_buffer(tmp_path: Path) -> None:
    f = tmp_path / "x"
    f.write_bytes(bytes(8192))
    with open(f, "r+b") as fh:
        m = _native.Map(fh.fileno(), 8192, True, str(f))
    _native.store64(m, 16, 42)
    assert memoryview(m)[16] == 42
    m.release_pages(0, 8192)
    assert _native.load64(m, 16) == 42  # MADV_DONTNEED on a shared file mapping keeps the data
    assert f.read_bytes()[16] == 42


def _geometry_of(tmp_path: Path) -> _native.Geometry:
    with chronq.open(tmp_path / "q", "TEST_DAILY") as q:
        q.appender().write(b"x")
        cycle = q.cycles()[0]
        cf = q.open_cycle(cycle)
        assert cf is not None
        return cf.geometry()


def test_geometry_is_one_named_object(tmp_path: Path) -> None:
    # the attach arguments travel as named fields: appender and tailer cannot disagree on an order
    g = _geometry_of(tmp_path)
    assert isinstance(g.map, _native.Map)
    assert (g.align, g.headerless) == (4, False)
    assert g.write_position_offset > 0 and g.data_start > g.write_position_offset
    assert g.index_count > 0 and g.index_spacing > 0 and 1 <= g.shift <= 62
    assert f"cycle={g.cycle}" in repr(g)
    with pytest.raises(AttributeError):
        g.cycle = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        _native.Geometry(g.map, g.cycle)  # type: ignore[misc, call-arg]


def test_attach_takes_a_geometry_only(tmp_path: Path) -> None:
    g = _geometry_of(tmp_path)
    t = _native.TailerCore()
    with pytest.raises(TypeError, match="Geometry"):
        t._attach((g.map, g.cycle))  # type: ignore[arg-type]
    t._attach(g)
    assert t._cycle == g.cycle


def test_attach_checks_the_geometry_against_the_mapping(tmp_path: Path) -> None:
    g = _geometry_of(tmp_path)
    fields = {k: getattr(g, k) for k in ("map", "cycle", "shift", "align", "index_count", "index_spacing",
                                         "write_position_offset", "has_hint", "index2index_position",
                                         "last_index_offset", "data_start")}
    bad = _native.Geometry(**{**fields, "write_position_offset": g.map.size})
    with pytest.raises(CorruptQueueError):
        _native.TailerCore()._attach(bad)
    headerless = _native.Geometry(**{**fields, "headerless": True})
    with pytest.raises(ValueError, match="writePosition"):
        _native.TailerCore()._attach(headerless)
    with pytest.raises(ValueError, match="headerless"):
        _native.AppenderCore()._attach(headerless)


def _same(native: Callable[[], object], model_: Callable[[], object]) -> object:
    """Both calls return the same value or raise the same exception type (and message)."""
    try:
        want: object = model_()
    except Exception as e:
        with pytest.raises(type(e)) as got:
            native()
        assert str(got.value) == str(e)
        return e
    assert native() == want
    return want


def _document_buffer(docs: list[tuple[bytes, bool]], last: int, size: int, align: int) -> bytearray:
    """Documents written by the model, then the header `last` (free, EOF or not-complete) where they end."""
    buf = bytearray(size)
    pos = 0
    for body, meta in docs:
        if pos + 4 + max(len(body), 1) + 8 > size:
            break
        pos = model.append(buf, pos, body, meta, align)
    if pos + 4 <= size:
        struct.pack_into("<I", buf, pos, last)
    return buf


last_headers = st.sampled_from([0, model.EOF, model.NOT_COMPLETE | 12, model.NOT_COMPLETE | model.META | 3])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=24), st.booleans()), max_size=8), last_headers,
       st.integers(40, 200), st.sampled_from([1, 4]), st.integers(-1, 60), st.sampled_from([1, 2, 4]))
def test_write_eof_matches_the_model(docs: list[tuple[bytes, bool]], last: int, size: int, align: int,
                                     start: int, eof_align: int) -> None:
    ref = _document_buffer(docs, last, size, align)
    start = start if start < 0 else (start // align) * align
    real = bytearray(ref)
    _same(lambda: _native.write_eof(real, start, eof_align, "q.cq4"),
          lambda: model.write_eof(ref, start, eof_align, "q.cq4"))
    assert real == ref


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=0, max_size=64),
       st.lists(st.tuples(st.integers(-2, 70), st.integers(-2, 70)), max_size=6), st.booleans())
def test_gather_matches_the_model(buf: bytes, rows: list[tuple[int, int]], misshapen: bool) -> None:
    positions = struct.pack(f"<{len(rows)}q", *(p for p, _ in rows))
    lengths = struct.pack(f"<{len(rows)}i", *(n for _, n in rows))
    if misshapen:
        lengths += b"\0\0\0\0"
    _same(lambda: _native.gather(buf, positions, lengths), lambda: model.gather(buf, positions, lengths))


def _index_doc(count: int, pad: int, name: bytes = b"index") -> bytes:
    """An index document body as Java writes one: event name, `pad` bytes of alignment, the int64 array."""
    body = b"\xb9" + bytes([len(name)]) + name
    body += b"\x8f" * pad if pad <= 4 else b"\x8e" + struct.pack("<I", pad - 5) + bytes(pad - 5)
    return body + b"\x8d" + struct.pack("<qq", count, 0) + bytes(8 * count)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 8), st.integers(1, 8), st.integers(0, 8), st.integers(0, 7), st.booleans(),
       st.data())
def test_index_array_matches_the_model(at: int, count: int, want: int, pad: int, meta: bool,
                                       data: st.DataObject) -> None:
    doc_pos = at * 4
    body = bytearray(_index_doc(count, pad))
    for _ in range(data.draw(st.integers(0, 2), label="damage")):  # a damaged byte, anywhere
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    buf = bytearray(doc_pos + 4 + len(body) + data.draw(st.integers(-8, 8), label="slack") % 9)
    header = len(body) | (model.META if meta else 0)
    struct.pack_into("<I", buf, doc_pos, header)
    room = len(buf) - doc_pos - 4
    buf[doc_pos + 4 : doc_pos + 4 + min(room, len(body))] = body[:room]
    _same(lambda: _native.index_array(bytes(buf), doc_pos, want),
          lambda: model.index_array(bytes(buf), doc_pos, want))


def _cycle_file(q: chronq.Queue) -> tuple[bytearray, model.Geometry]:
    (cycle,) = q.cycles()
    cf = q.open_cycle(cycle)
    assert cf is not None
    geo = cf.geometry()
    name = str(q.file_for(cycle))
    buf = bytearray(memoryview(cf.map))
    g = model.Geometry(name, geo.align, geo.index_count, geo.index_spacing, geo.index2index_position,
                       geo.last_index_offset, geo.data_start)
    return buf, g


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=80),
       st.sampled_from(["TEST2_DAILY", "TEST4_DAILY"]))
def test_index_writes_and_seeks_match_the_model(sizes: list[int], roll: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d, \
            chronq.open(d, roll_cycle=roll, clock=FixedClock(1_705_276_800_000)) as q:
        a = q.appender()
        for n, size in enumerate(sizes):
            a.write(bytes([n & 0xFF]) * size)
        buf, g = _cycle_file(q)
        t = q.tailer()
        positions = []
        while (ex := t.read()) is not None:
            positions.append(ex.position)
        assert len(positions) == len(sizes)
        # index writes: every slot the native appender filled is what the model writes for the same documents
        replay = bytearray(buf)
        i2i = g.i2i_array(replay)
        for k in range(g.index_count):
            sec = struct.unpack_from("<q", replay, i2i + 16 + 8 * k)[0]
            if sec:
                arr = model.index_array(replay, sec, g.index_count)
                replay[arr + 16 : arr + 16 + 8 * g.index_count] = bytes(8 * g.index_count)
        for seq, pos in enumerate(positions):
            model.index(replay, g, seq, pos)
        assert replay == buf
        # seeks: the model finds every document where the native tailer does, and the next free position
        cycle = q.cycles()[0]
        for seq, pos in enumerate(positions):
            assert model.seek(buf, g, seq) == (1, pos)
            assert t.move_to_index(q.roll_cycle.to_index(cycle, seq)) and t.read().position == pos
        status, free = model.seek(buf, g, len(positions))
        assert status == 0 and free > positions[-1]
        assert model.seek(buf, g, len(positions) + 1)[0] == -1


def test_seek_raises_what_the_native_tailer_raises_for_a_bad_index_entry(tmp_path: Path) -> None:
    with chronq.open(tmp_path, roll_cycle="TEST2_DAILY", clock=FixedClock(1_705_276_800_000)) as q:
        a = q.appender()
        for n in range(8):
            a.write(bytes([n]) * 10)
        buf, g = _cycle_file(q)
    arr = model.index_array(buf, struct.unpack_from("<q", buf, g.i2i_array(buf) + 16)[0], g.index_count)
    slot = arr + 16 + 8 * 2  # the entry of seq 4 (spacing 2)
    struct.pack_into("<q", buf, slot, g.data_start + 4)  # inside the first document, not at a header
    with pytest.raises(CorruptQueueError, match="does not point at a data document") as want:
        model.seek(buf, g, 5)
    (path,) = tmp_path.glob("*.cq4")
    with open(path, "r+b") as f:
        f.seek(slot)
        f.write(struct.pack("<q", g.data_start + 4))
    with chronq.open(tmp_path, readonly=True) as q, pytest.raises(CorruptQueueError) as got:
        q.tailer().move_to_index(q.roll_cycle.to_index(q.cycles()[0], 5))
    assert (got.value.position, got.value.detail) == (want.value.position, want.value.detail)
