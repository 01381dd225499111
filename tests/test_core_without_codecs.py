"""The queue core without chronq._codecs: that module links OpenSSL's libcrypto, so a plain queue (the
core a wheel of chronq must run with nothing but the interpreter) never imports it; only a codec
queue does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Runs in a fresh interpreter whose import system refuses chronq._codecs, as one without the module
# (or without the libcrypto it links) would.
BLOCKED = textwrap.dedent("""
    import sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name == "chronq._codecs":
                raise ImportError("chronq._codecs is blocked by this test", name=name)
            return None

    sys.meta_path.insert(0, Refuse())
    try:
        import chronq._codecs
    except ImportError:
        pass
    else:
        raise SystemExit("the blocker did not block chronq._codecs")

    import chronq

    import json

    with chronq.open(sys.argv[1]) as q:
        a = q.appender()
        for i in range(10):
            a.write(b"one %d" % i)
        a.write_many([b"many %d" % i for i in range(3000)])
        t = q.tailer()
        first = [t.read().bytes() for _ in range(3)]
        batches = []
        while batch := t.read_many(1000, max_bytes=6000):
            batches.append(batch)
        back = q.tailer()
        back.direction = chronq.Direction.BACKWARD
        last = back.to_end().read_many(2)
    print(json.dumps({
        "read": [b.decode() for b in first],
        "batches": [len(b) for b in batches],
        "many": [b.decode() for batch in batches for b in batch],
        "backward": [b.decode() for b in last],
        "codecs loaded": "chronq._codecs" in sys.modules,
    }))
""")


def test_plain_queue_reads_and_writes_with_chronq_codecs_blocked(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", BLOCKED, str(tmp_path / "q")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    written = [f"one {i}" for i in range(10)] + [f"many {i}" for i in range(3000)]
    assert got["read"] == written[:3]
    assert got["many"] == written[3:]
    assert len(got["batches"]) > 3 and max(got["batches"]) <= 1000  # max_bytes cut the batches short
    assert got["backward"] == ["many 2999", "many 2998"]
    assert got["codecs loaded"] is False


def test_codec_queue_loads_chronq_codecs_when_used(tmp_path: Path) -> None:
    """The other side: chronq._codecs is still what a codec queue's batches go through."""
    pytest.importorskip("zstandard")
    code = textwrap.dedent("""
        import sys
        import chronq
        from chronq.codecs import Codec
        assert "chronq._codecs" not in sys.modules
        with chronq.open(sys.argv[1], codec=Codec(compression="zstd")) as q:
            q.appender().write_many([b"x" * 100] * 10)
            print(len(q.tailer().read_many()), "chronq._codecs" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["10", "True"]
