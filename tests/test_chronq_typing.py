"""Static typing of chronq: `open()`, appenders, tailers, excerpts and typed `wire.binary.decode` as mypy
sees them (tests/typing/chronq_typing.py, checked by mypy --strict; never run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = Path("tests/typing/chronq_typing.py")


def test_queue_api_is_typed_under_mypy_strict() -> None:
    # warn_unused_ignores (part of --strict) turns every undetected wrong call into an error
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
         str(CHECKED)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    # judge only the typing module: errors elsewhere belong to those modules' own checks
    ours = [ln for ln in proc.stdout.splitlines() if ln.startswith(str(CHECKED))]
    assert not ours, proc.stdout
    assert "Success" in proc.stdout or "Found" in proc.stdout, proc.stdout + proc.stderr
