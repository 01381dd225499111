"""chronq.codecs' batch paths (`write_many`, `read_many`, chronq._codecs): the same frames as the
one-message paths, byte for byte where the codec is deterministic and through either AES-GCM
implementation; a damaged, foreign-key or oversized frame in a batch is reported with its index after
the good payloads before it, never returned."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("zstandard")
pytest.importorskip("lz4")
pytest.importorskip("cryptography")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chronq
from chronq import _codecs, _native
from chronq.codecs import (
    Codec,
    CodecError,
    Keys,
    MessageTooLargeError,
    MissingKeyError,
    TamperedMessageError,
)
from chronq.rollcycles import FixedClock
from chronq.tailer import Tailer
from tests.codec_support import (
    CLOCK_MS,
    KEY1,
    KEY2,
    KEYS,
    flip,
    open_q,
    raw_frames,
    trade,
)
from tests.conftest import skip_unless_strict


@pytest.fixture
def openssl_aes() -> None:
    """Skip where chronq._codecs was built without OpenSSL's headers (it falls back to `cryptography`),
    or fail under CHRONQ_STRICT=1: CI's build has them, and a build that quietly went without must not
    pass these tests by skipping them."""
    if not _codecs.HAVE_AES:
        skip_unless_strict("chronq._codecs was built without OpenSSL (no AES-GCM through libcrypto)")


needs_openssl = pytest.mark.usefixtures("openssl_aes")


def make_codec(name: str, path: Path, dictionary_dir: tuple[Path, int]) -> Codec:
    comp, _, enc = name.partition("+")
    did = 0
    if comp == "dict":
        src, did = dictionary_dir
        os.link(src / f"codec-dictionary-{did}.zdict", path / f"codec-dictionary-{did}.zdict")
    return Codec("zstd" if comp == "dict" else (comp or None), enc or None, dictionary=did)


def read_all(t: Tailer, max_count: int) -> list[bytes]:
    out: list[bytes] = []
    while batch := t.read_many(max_count):
        assert len(batch) <= max_count
        out += batch
    return out


CODECS = ["", "zstd", "lz4", "dict", "+aes-gcm", "zstd+aes-gcm", "lz4+aes-gcm", "dict+aes-gcm"]
payload = st.one_of(st.binary(max_size=600), st.builds(trade, st.integers(0, 10**6)),
                    st.just(b""), st.just(bytes(2000)))


@pytest.mark.parametrize("name", CODECS)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(payload, max_size=40), max_count=st.integers(1, 50))
def test_batch_round_trip(name: str, payloads: list[bytes], max_count: int,
                          dictionary_dir: tuple[Path, int]) -> None:
    """write_many then read_many, and each against the one-message path of the other side."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        codec = make_codec(name, path, dictionary_dir)
        with open_q(path, codec=codec, keys=KEYS) as q:
            a = q.appender()
            a.write_many(payloads)
            for p in payloads:
                a.write(p)
            assert read_all(q.tailer(), max_count) == payloads * 2
            assert [ex.bytes() for ex in q.tailer()] == payloads * 2
            frames = raw_frames(q)
            assert [f[:12] for f in frames[:len(payloads)]] == [f[:12] for f in frames[len(payloads):]]
            if not codec.encryption:  # deterministic: the batch frames are the one-message frames
                assert frames[:len(payloads)] == frames[len(payloads):]


@pytest.mark.parametrize("key", [KEY1[:16], KEY1[:24], KEY1], ids=["aes128", "aes192", "aes256"])
@needs_openssl
@settings(max_examples=25, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=10),
       counter=st.integers(0, 2**32 - 10), prefix=st.binary(min_size=8, max_size=8))
def test_openssl_frames_are_cryptographys(key: bytes, payloads: list[bytes], counter: int,
                                          prefix: bytes) -> None:
    """The C batch seals exactly what `cryptography` seals, and opens what it sealed."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    frames = _codecs.frame_many(payloads, None, 1, 0, 1 << 20, key, 9, prefix, counter)
    assert isinstance(frames, list)
    aead = AESGCM(key)
    for i, (p, f) in enumerate(zip(payloads, frames, strict=True)):
        head = struct.pack("<2sBBIII12s", b"\xc5\x1c", 1, 0x10, 0, len(p), 9,
                           prefix + (counter + i).to_bytes(4, "little"))
        assert f == head + aead.encrypt(head[16:], p, head)
        assert aead.decrypt(head[16:], f[28:], head) == p


def test_cryptography_frames_read_in_batches_and_back(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames of the `cryptography` path (a build without OpenSSL) and of the C path read either way."""
    msgs = [trade(i) for i in range(300)] + [b""]
    with open_q(tmp_path, codec=Codec("zstd", "aes-gcm"), keys=KEYS) as q:
        q.appender().write_many(msgs)  # the C path where built
        with monkeypatch.context() as m:
            m.setattr(_codecs, "HAVE_AES", False)
            a = q.appender(codec=Codec(None, "aes-gcm"))  # a new encoder: per message, `cryptography`
            a.write_many(msgs)
            assert read_all(q.tailer(), 64) == msgs * 2  # a new decoder: AES-GCM frames one by one
        assert read_all(q.tailer(), 1000) == msgs * 2
        assert [ex.bytes() for ex in q.tailer()] == msgs * 2


def test_nonces_are_not_reused_across_write_and_write_many(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec(None, "aes-gcm"), keys=KEYS) as q:
        a = q.appender()
        a.write(b"one")
        a.write_many([b"two", b"three"])
        a.write(b"four")
        a.write_many([b"five"] * 50)
        nonces = [f[16:28] for f in raw_frames(q)]
    assert len(set(nonces)) == len(nonces) == 54
    assert len({n[:8] for n in nonces}) == 1
    assert [int.from_bytes(n[8:], "little") for n in nonces] == list(range(54))


@settings(max_examples=30, deadline=None)
@given(payload=st.binary(max_size=300), name=st.sampled_from(["+aes-gcm", "zstd+aes-gcm", "lz4+aes-gcm"]),
       bit=st.integers(0, 10_000), before=st.integers(0, 20), after=st.integers(0, 20),
       max_count=st.integers(1, 60))
def test_flipped_bit_in_a_batch_is_reported_never_returned(payload: bytes, name: str, bit: int, before: int,
                                                           after: int, max_count: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        comp, _, enc = name.partition("+")
        msgs = [trade(i) for i in range(before + after)]
        with open_q(path, codec=Codec(comp or None, enc), keys=KEYS) as q:
            a = q.appender()
            a.write_many(msgs[:before])
            index = a.write(payload)
            a.write_many(msgs[before:])
            frame = raw_frames(q)[before]
        at = bit % (len(frame) * 8)
        flip(path, frame, at)
        with open_q(path, keys=KEYS) as q:
            t = q.tailer()
            got: list[bytes] = []
            with pytest.raises(CodecError) as err:
                while batch := t.read_many(max_count):
                    got += batch
            assert got == msgs[:before]  # everything before it, nothing of it
            assert err.value.index == index and f"{index:#x}" in str(err.value)
            if 12 <= at // 8 < 16:
                assert isinstance(err.value, MissingKeyError) and err.value.key_id != 1
            elif at // 8 >= 4:
                assert isinstance(err.value, TamperedMessageError) and err.value.key_id == 1
            assert KEY1.hex() not in str(err.value) and repr(KEY1) not in str(err.value)
            assert read_all(t, max_count) == msgs[before:]  # as `read`: the tailer is past it


def test_damaged_zstd_frame_in_a_run(tmp_path: Path, dictionary_dir: tuple[Path, int]) -> None:
    """A zstd batch call refused as a whole: its frames are decoded one by one, the bad one named."""
    codec = make_codec("dict", tmp_path, dictionary_dir)
    msgs = [trade(i) for i in range(100)]
    with open_q(tmp_path, codec=codec) as q:
        idx = [q.appender().write(m) for m in msgs]
        frame = raw_frames(q)[60]
    flip(tmp_path, frame, 8 * 14 + 3)  # inside the compressed body
    with open_q(tmp_path) as q:
        t = q.tailer()
        got = t.read_many(1000)
        try:
            got += t.read_many(1000)
        except CodecError as e:  # a damaged body may also decode to the right length: then it is returned
            assert e.index == idx[60] and len(got) == 60
            got += [b"?", *read_all(t, 1000)]
        assert got[:60] == msgs[:60] and got[61:] == msgs[61:]


def test_missing_and_wrong_key_in_a_batch(tmp_path: Path) -> None:
    with open_q(tmp_path, codec=Codec("zstd", "aes-gcm"), keys=Keys({1: KEY1})) as q:
        first = q.appender().write_many([trade(i) for i in range(10)])
        assert first == 10
    with open_q(tmp_path, keys=Keys({1: KEY1, 2: KEY2}, current=2)) as q:
        q.appender().write_many([b"under key 2"] * 5)
    with open_q(tmp_path, keys=Keys({2: KEY2})) as q:
        t = q.tailer()
        with pytest.raises(MissingKeyError, match="key id 1") as err:
            t.read_many()
        assert err.value.key_id == 1 and KEY2.hex() not in str(err.value)
        assert t.move_to_index(err.value.index + 10)
        assert t.read_many() == [b"under key 2"] * 5
    with open_q(tmp_path, keys=Keys({1: KEY2, 2: KEY1})) as q, pytest.raises(TamperedMessageError):
        q.tailer().read_many()
    with open_q(tmp_path, readonly=True) as q, pytest.raises(MissingKeyError):
        q.tailer().read_many()
    with open_q(tmp_path) as q, pytest.raises(chronq.ChronqError, match="keys="):
        q.appender().write_many([b"x"])


def test_batch_bounds(tmp_path: Path) -> None:
    """Declared sizes above the bound, lying sizes and empty compressed frames fail in a batch too;
    read_many stops at max_bytes; write_many refuses an oversized payload before writing any."""
    import zstandard

    with open_q(tmp_path, codec=Codec("zstd"), max_message_size=1 << 20) as q:
        a = q.appender()
        ok = a.write_many([b"fine"] * 3)
        bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))
        honest = _native.AppenderCore.write(a, struct.pack("<2sBBII", b"\xc5\x1c", 1, 1, 0, 64 << 20) + bomb)
        lying = _native.AppenderCore.write(a, struct.pack("<2sBBII", b"\xc5\x1c", 1, 1, 0, 100) + bomb)
        empty = _native.AppenderCore.write(a, struct.pack("<2sBBII", b"\xc5\x1c", 1, 1, 0, 0) + bomb)
        a.write_many([b"after"])
        t = q.tailer()
        assert t.read_many() == [b"fine"] * ok
        with pytest.raises(MessageTooLargeError, match=f"{honest:#x}"):
            t.read_many()
        with pytest.raises(CodecError, match=f"{lying:#x}"):
            t.read_many()
        with pytest.raises(CodecError, match=f"{empty:#x}"):
            t.read_many()
        assert t.read_many() == [b"after"]
        with pytest.raises(chronq.ChronqError, match="max_message_size"):
            a.write_many([b"small", bytes(2 << 20)])
        assert t.read_many() == []
        a.write_many([bytes(1000)] * 10)
        assert len(t.read_many(max_bytes=2500)) == 3  # stops after the one that reaches max_bytes
        assert len(t.read_many(max_count=2)) == 2
        assert len(t.read_many()) == 5


def test_plain_tailer_read_many(tmp_path: Path) -> None:
    clock = FixedClock(CLOCK_MS)
    msgs = [b"m%d" % i for i in range(500)] + [b""]
    with chronq.open(tmp_path, clock=clock, roll_cycle="FAST_HOURLY") as q:
        a = q.appender()
        a.write_many(msgs[:300])
        clock.advance(3_600_000)  # a roll in the middle of a batch
        a.write_many(msgs[300:])
        t = q.tailer("reader")
        assert type(t) is Tailer
        assert read_all(t, 128) == msgs
        assert t.read_many() == []
        t.close()
        a.write(b"new")
        t = q.tailer("reader")  # a named tailer resumes after what read_many returned
        assert t.read_many() == [b"new"]
        t.direction = chronq.Direction.BACKWARD
        assert t.move_to_index(q.last_index)  # type: ignore[arg-type]
        assert t.read_many(3) == [b"new", b"", b"m499"]


def test_codec_read_many_backward_and_across_a_roll(tmp_path: Path) -> None:
    clock = FixedClock(CLOCK_MS)
    msgs = [trade(i) for i in range(300)]
    with chronq.open(tmp_path, clock=clock, roll_cycle="FAST_HOURLY", codec=Codec("zstd", "aes-gcm"),
                     keys=KEYS) as q:
        a = q.appender()
        a.write_many(msgs[:100])
        clock.advance(3_600_000)
        a.write_many(msgs[100:])
        assert read_all(q.tailer(), 64) == msgs
        t = q.tailer()
        t.direction = chronq.Direction.BACKWARD
        assert t.move_to_index(q.last_index)  # type: ignore[arg-type]
        assert t.read_many(3) == msgs[:-4:-1]


def test_nonce_counter_takes_a_new_prefix_before_it_wraps() -> None:
    from chronq.codecs import _Nonces

    n = _Nonces()
    first, start = n.take(10)
    assert start == 0 and len(first) == 8
    n.next = 2**32 - 5
    assert n.take(5) == (first, 2**32 - 5)  # the last five of the prefix
    prefix, start = n.take(1)
    assert start == 0 and prefix != first and n.take(3) == (prefix, 1)


@pytest.mark.slow
def test_a_build_without_openssl_falls_back(tmp_path: Path) -> None:
    """setup.py without the OpenSSL headers (CHRONQ_OPENSSL=0) builds chronq._codecs without AES-GCM;
    codec queues then seal and open through `cryptography`, to the same frames."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    tree = tmp_path / "tree"
    for part in ("chronq", "wire", "rpc"):
        shutil.copytree(root / part, tree / part, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for f in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(root / f, tree / f)
    env = {**os.environ, "CHRONQ_OPENSSL": "0", "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, env=env,
                   check=True, capture_output=True, timeout=600)
    script = f"""
import chronq, chronq._codecs
from chronq.codecs import Codec, Keys
assert chronq.__file__.startswith({str(tree)!r}) and not chronq._codecs.HAVE_AES
keys = Keys({{1: bytes(range(32))}})
msgs = [b"m%d" % i for i in range(500)] + [b""]
with chronq.open({str(tmp_path / "q")!r}, codec=Codec("zstd", "aes-gcm"), keys=keys) as q:
    q.appender().write_many(msgs)
    got = q.tailer().read_many(10**6)
    assert got == msgs, len(got)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
    with open_q(tmp_path / "q", keys=KEYS) as q:  # and this build reads what that one wrote
        assert read_all(q.tailer(), 100) == [b"m%d" % i for i in range(500)] + [b""]


@pytest.mark.parametrize("codec", [None, Codec("zstd", "aes-gcm")], ids=["plain", "codec"])
def test_queue_error_after_some_payloads(tmp_path: Path, codec: Codec | None) -> None:
    """A queue error in the middle of a batch: the payloads before it are returned, the next call
    raises it (nothing read is dropped)."""
    clock = FixedClock(CLOCK_MS)
    msgs = [trade(i) for i in range(50)]
    with chronq.open(tmp_path, clock=clock, roll_cycle="FAST_HOURLY", codec=codec, keys=KEYS) as q:
        a = q.appender()
        a.write_many(msgs[:30])
        clock.advance(3_600_000)
        a.write_many(msgs[30:])
        raw = Tailer(q, None)
        ends = {ex.cycle: (ex.position + 4 + len(ex.payload) + 3) & ~3 for ex in raw}  # where each ends
        raw.close()
    assert len(ends) == 2
    first = min(ends)
    cycle_file = sorted(tmp_path.glob("*.cq4"))[0]
    data = bytearray(cycle_file.read_bytes())
    data[ends[first]:ends[first] + 4] = (0xC000_1000).to_bytes(4, "little")  # an EOF still "being written"
    cycle_file.write_bytes(data)
    with chronq.open(tmp_path, clock=clock, roll_cycle="FAST_HOURLY", keys=KEYS) as q:
        t = q.tailer()
        assert t.read_many(1000) == msgs[:30]
        with pytest.raises(chronq.CorruptQueueError, match="without an EOF marker"):
            t.read_many(1000)
