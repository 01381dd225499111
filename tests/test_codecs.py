"""chronq.codecs: compressed and encrypted payloads round-trip through every reader, and damaged,
foreign-key or oversized ones are reported with their index, never returned."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

pytest.importorskip("zstandard")
pytest.importorskip("lz4")
pytest.importorskip("cryptography")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chronq
import rpc
from chronq import _native
from chronq.codecs import (
    CODEC_KEY,
    Codec,
    CodecError,
    Keys,
    MessageTooLargeError,
    MissingKeyError,
    TamperedMessageError,
)
from chronq.errors import ChronqError
from chronq.tailer import Tailer
from tests.codec_support import (
    KEY1,
    KEY2,
    KEYS,
    flip,
    open_q,
    raw_frames,
    trade,
)


def codecs() -> list[Codec]:
    return [Codec(c, e) for c in (None, "zstd", "lz4") for e in (None, "aes-gcm")]


@pytest.mark.parametrize("codec", [*codecs(), "dict", "dict+aes"], ids=str)  # type: ignore[list-item]
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.one_of(st.binary(max_size=600), st.builds(trade, st.integers(0, 10**6))),
                         max_size=12))
def test_round_trip_every_codec(codec: Codec | str, payloads: list[bytes],
                                dictionary_dir: tuple[Path, int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        if isinstance(codec, str):
            src, did = dictionary_dir
            os.link(src / f"codec-dictionary-{did}.zdict", path / f"codec-dictionary-{did}.zdict")
            codec = Codec("zstd", "aes-gcm" if "aes" in codec else None, dictionary=did)
        with open_q(path, codec=codec, keys=KEYS) as q:
            a = q.appender()
            half = len(payloads) // 2
            for p in payloads[:half]:
                a.write(p)
            a.write_many(payloads[half:-1])
            for p in payloads[-1:] if half < len(payloads) else []:
                with a.writing_document() as dc:
                    dc.write(p)
            assert [ex.bytes() for ex in q.tailer()] == payloads
            if codec.encryption or codec.compression:
                assert len(raw_frames(q)) == len(payloads)
        with open_q(path, readonly=True, keys=KEYS) as q:  # a reader learns the codec from the queue
            t = q.tailer()
            got = []
            while (ex := t.read()) is not None:
                got.append(bytes(ex.payload))
            assert got == payloads


def test_dictionary_compresses_small_messages_better(
    dictionary_dir: tuple[Path, int], tmp_path: Path
) -> None:
    src, did = dictionary_dir
    os.link(src / f"codec-dictionary-{did}.zdict", tmp_path / f"codec-dictionary-{did}.zdict")
    msgs = [trade(i) for i in range(5000, 5500)]
    with open_q(tmp_path, codec=Codec("zstd", dictionary=did)) as q:
        q.appender().write_many(msgs)
        with_dict = sum(map(len, raw_frames(q)))
    with open_q(src) as q:
        plain_zstd = sum(map(len, raw_frames(q)[:500]))
    assert with_dict < plain_zstd * 0.7 < sum(map(len, msgs))


@settings(max_examples=20, deadline=None)
@given(payload=st.binary(min_size=0, max_size=300), compression=st.sampled_from([None, "zstd", "lz4"]),
       bit=st.integers(0, 10_000))
def test_flipped_bit_is_reported_never_returned(payload: bytes, compression: str | None, bit: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        with open_q(path, codec=Codec(compression, "aes-gcm"), keys=KEYS) as q:
            q.appender().write(b"first")
            index = q.appender().write(payload)
            frame = raw_frames(q)[1]
        flip(path, frame, bit % (len(frame) * 8))
        with open_q(path, keys=KEYS) as q:
            t = q.tailer()
            assert t.read().bytes() == b"first"  # type: ignore[union-attr]
            with pytest.raises(CodecError) as err:
                t.read()
            assert err.value.index == index and f"{index:#x}" in str(err.value)
            byte = bit % (len(frame) * 8) // 8
            if 12 <= byte < 16:  # the key id: now names a key the reader lacks
                assert isinstance(err.value, MissingKeyError) and err.value.key_id != 1
            elif byte >= 4:  # past magic/version/codec id: the tag check catches it
                assert isinstance(err.value, TamperedMessageError)
                assert err.value.key_id == 1 and "key id 1" in str(err.value)
            assert KEY1.hex() not in str(err.value) and repr(KEY1) not in str(err.value)


def test_key_rotation_old_messages_stay_readable(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec("zstd", "aes-gcm"), keys=Keys({1: KEY1})) as q:
        first = q.appender().write(b"under key 1")
    rotated = Keys({1: KEY1, 2: KEY2}, current=2)
    with open_q(tmp_path, keys=rotated) as q:
        q.appender().write(b"under key 2")
        assert [ex.bytes() for ex in q.tailer()] == [b"under key 1", b"under key 2"]
    with open_q(tmp_path, keys=Keys({2: KEY2})) as q:  # key 1 retired: its messages name it
        t = q.tailer()
        with pytest.raises(MissingKeyError, match="key id 1") as err:
            t.read()
        assert err.value.index == first and err.value.key_id == 1
        assert t.move_to_index(first + 1)
        assert t.read().bytes() == b"under key 2"  # type: ignore[union-attr]


def test_wrong_key_is_reported_as_tampering(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec(None, "aes-gcm"), keys=Keys({1: KEY1})) as q:
        q.appender().write(b"secret")
    with open_q(tmp_path, keys=Keys({1: KEY2})) as q, pytest.raises(TamperedMessageError, match="key id 1"):
        q.tailer().read()
    with open_q(tmp_path, readonly=True) as q, pytest.raises(MissingKeyError):
        q.tailer().read()
    with open_q(tmp_path) as q, pytest.raises(ChronqError, match="keys="):
        q.appender().write(b"x")  # a writer without keys cannot encrypt


def test_keys_never_appear_in_files_reprs_or_errors(tmp_path: Path) -> None:
    keys = Keys({7: KEY1, 8: KEY2})
    assert repr(keys) == "Keys(ids=[7, 8], current=8)" and KEY1.hex() not in repr(keys)
    with open_q(tmp_path, codec=Codec("lz4", "aes-gcm"), keys=keys) as q:
        q.appender().write_many([trade(i) for i in range(100)])
        assert "Keys(" not in repr(q)
    for f in tmp_path.iterdir():
        data = f.read_bytes()
        assert KEY1 not in data and KEY2 not in data, f


def test_decompression_bomb_names_the_index(tmp_path: Path) -> None:
    import zstandard

    with open_q(tmp_path, codec=Codec("zstd"), keys=KEYS, max_message_size=1 << 20) as q:
        a = q.appender()
        ok = a.write(b"fine")
        bomb = zstandard.ZstdCompressor().compress(bytes(512 << 20))  # 512 MiB of zeros in ~16 KiB
        import struct

        # an honest header is refused before any byte is decompressed
        honest = _native.AppenderCore.write(a, struct.pack("<2sBBII", b"\xc5\x1c", 1, 1, 0, 512 << 20) + bomb)
        # a lying header: decompression stops at the size it claims
        lying = _native.AppenderCore.write(a, struct.pack("<2sBBII", b"\xc5\x1c", 1, 1, 0, 100) + bomb)
        t = q.tailer()
        assert t.read().bytes() == b"fine"  # type: ignore[union-attr]
        assert ok + 1 == honest
        with pytest.raises(MessageTooLargeError, match=f"{honest:#x}.*maximum message size 1048576"):
            t.read()
        assert t.move_to_index(lying)
        with pytest.raises(CodecError, match=f"{lying:#x}"):
            t.read()
        with pytest.raises(ChronqError, match="max_message_size"):
            a.write(bytes(2 << 20))


@pytest.mark.parametrize("batch", [False, True], ids=["read", "read_many"])
def test_a_small_frame_declaring_a_huge_size_is_refused_before_allocating(tmp_path: Path,
                                                                          batch: bool) -> None:
    """A 100-byte payload whose zstd frame declares 1 GiB of content (its codec header says 10 bytes):
    refused by the frame's declared size, naming the index, with no allocation near what it declares
    (python-zstandard allocates a frame's declared size whatever `max_output_size` says)."""
    import struct
    import tracemalloc

    from tests.codec_support import declaring

    with open_q(tmp_path, codec=Codec("zstd")) as q:
        a = q.appender()
        ok = a.write(b"fine")
        frame = declaring(b"x" * 10, 1 << 30)
        payload = struct.pack("<2sBBII", b"\xc5\x1c", 1, 1, 0, 10) + frame
        assert len(payload) < 100
        bomb = _native.AppenderCore.write(a, payload)
        t = q.tailer()
        tracemalloc.start()
        try:
            if batch:
                assert t.read_many(10) == [b"fine"]  # what came before, then the error on its own
                with pytest.raises(CodecError, match=f"{bomb:#x}.*declares 1073741824 bytes"):
                    t.read_many(10)
            else:
                assert t.read().bytes() == b"fine"  # type: ignore[union-attr]
                with pytest.raises(CodecError, match=f"{bomb:#x}.*declares 1073741824 bytes"):
                    t.read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert ok + 1 == bomb and peak < 16 << 20, peak


def test_plain_payload_in_a_codec_queue_is_reported(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec("lz4")) as q:
        index = _native.AppenderCore.write(q.appender(), b"not a frame")
        with pytest.raises(CodecError, match=f"{index:#x}: payload is not a codec frame"):
            q.tailer().read()


def test_codec_is_refused_on_a_queue_with_plain_messages(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        q.appender().write(b"plain")
    with pytest.raises(ChronqError, match="empty queue"):
        open_q(tmp_path, codec=Codec("zstd"))


def test_codec_is_recorded_in_the_table_store(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec("zstd", "aes-gcm", level=5), keys=KEYS) as q:
        assert q.table is not None
        assert Codec.unpack(q.table.get(CODEC_KEY)) == Codec("zstd", "aes-gcm", level=5)  # type: ignore[arg-type]
    with open_q(tmp_path, readonly=True, keys=KEYS) as q:  # every reader learns it
        assert q.tailer().document_source() is None
    with open_q(tmp_path / "plain") as q:
        assert q.table is not None and CODEC_KEY not in q.table


def test_per_appender_codec(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec("zstd"), keys=KEYS) as q:
        q.appender().write(b"a" * 100)
        got: list[int] = []

        def other() -> None:
            got.append(q.appender(codec=Codec("lz4", "aes-gcm")).write(b"b" * 100))

        th = threading.Thread(target=other)
        th.start()
        th.join()
        q.appender().write(b"c" * 100)
        frames = raw_frames(q)
        assert [f[3] for f in frames] == [1, 0x12, 1]  # zstd; lz4 + AES-GCM; zstd
        assert [ex.bytes() for ex in q.tailer()] == [b"a" * 100, b"b" * 100, b"c" * 100]


def test_plain_queue_keeps_the_native_paths(tmp_path: Path) -> None:
    with open_q(tmp_path) as q:
        q.appender().write(b"x")
        t = q.tailer()
        assert type(t) is Tailer and t.document_source() is not None
        assert type(t.read()) is chronq.Excerpt
    with open_q(tmp_path / "c", codec=Codec("lz4")) as q:
        assert q.tailer().document_source() is None  # rpc's C fast path must take the decoded path


def test_named_tailer_and_move_to_index(tmp_path: Path) -> None:
    msgs = [trade(i) for i in range(50)]
    with open_q(tmp_path, codec=Codec("zstd", "aes-gcm"), keys=KEYS) as q:
        idx = [q.appender().write(m) for m in msgs]
        t = q.tailer("reader")
        for i in range(10):
            assert t.read().bytes() == msgs[i]  # type: ignore[union-attr]
        with t.reading_document() as ex:
            assert ex is not None and ex.bytes() == msgs[10]
        t.close()
    with open_q(tmp_path, keys=KEYS) as q:
        t = q.tailer("reader")
        assert t.read().bytes() == msgs[11]  # type: ignore[union-attr]
        assert t.move_to_index(idx[40]) and t.read().bytes() == msgs[40]  # type: ignore[union-attr]
        t.direction = chronq.Direction.BACKWARD
        assert t.read().bytes() == msgs[41]  # type: ignore[union-attr]
        assert t.read().bytes() == msgs[40]  # type: ignore[union-attr]
        assert q.bisect(lambda p: bytes(p), msgs[5]) is not None


@rpc.interface
class Ticks(Protocol):
    def tick(self, symbol: str, price: float) -> None: ...


def test_rpc_method_reader_reads_encoded_queue(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec("zstd", "aes-gcm"), keys=KEYS) as q:
        w = rpc.writer(q, Ticks)
        for i in range(20):
            w.tick(f"S{i}", i / 2)

        class H:
            def __init__(self) -> None:
                self.seen: list[tuple[str, float]] = []

            def tick(self, symbol: str, price: float) -> None:
                self.seen.append((symbol, price))

        h = H()
        assert rpc.reader(q.tailer(), h, interfaces=[Ticks]).read_many(100) == 20
        assert h.seen == [(f"S{i}", i / 2) for i in range(20)]
        h2 = H()
        r = rpc.reader(q.tailer(), h2, interfaces=[Ticks])
        while r.read_one():
            pass
        assert h2.seen == h.seen
        assert all(f[:2] == b"\xc5\x1c" for f in raw_frames(q))


def _unused() -> Iterator[None]:  # keeps the module's imports honest for ruff
    yield None


def spark_keys() -> Keys:
    """The Spark source's codecKeys option names this function: the keys never travel in options."""
    return KEYS


@pytest.mark.spark
def test_spark_source_returns_plain_payloads(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from tests.spark_support import spark_session

    msgs = [trade(i) for i in range(300)] + [b""]
    with open_q(tmp_path, codec=Codec("zstd", "aes-gcm"), keys=KEYS) as q:
        q.appender().write_many(msgs)
    spark = spark_session()
    df = spark.read.format("chronq").option("codecKeys", "tests.test_codecs:spark_keys").load(str(tmp_path))
    rows = df.orderBy("index").collect()
    assert [bytes(r.payload) for r in rows] == msgs


@pytest.mark.interop
def test_java_lists_encoded_documents_as_stored(tmp_path: Path) -> None:
    """Java Chronicle sees a codec queue's frames as opaque bytes: the same documents, lengths and sha256."""
    import hashlib
    import json

    from tests.test_java_interop import java

    qdir = tmp_path / "q"
    with open_q(qdir, codec=Codec("zstd", "aes-gcm"), keys=KEYS) as q:
        q.appender().write_many([trade(i) for i in range(50)] + [b""])
        t = Tailer(q, None)
        stored = [(ex.index, ex.bytes()) for ex in t]
        t.close()
    out = tmp_path / "java.jsonl"
    java("list", qdir, out)
    theirs = [j for j in map(json.loads, out.read_text().splitlines()) if not j["metadata"]]
    assert [(j["index"], j["length"], j["sha256"]) for j in theirs] == [
        (i, len(b), hashlib.sha256(b).hexdigest()) for i, b in stored]
