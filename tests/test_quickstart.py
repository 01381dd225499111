"""examples/quickstart.py runs as documented (the docs pages themselves run in test_docs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import chronq

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_runs_and_leaves_a_readable_queue(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path / "q")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "6 excerpts seen by another process" in r.stdout
    assert "audit resumed at" in r.stdout
    with chronq.open(tmp_path / "q", readonly=True) as q:
        bodies = [bytes(ex.payload) for ex in q.tailer()]
    assert bodies[:4] == [b"hello", b"a", b"b", b"c"]

