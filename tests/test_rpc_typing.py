"""Static typing of rpc: `rpc.writer(q, Proto)` is a `Proto` to mypy, argument types checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_writer_is_typed_as_its_protocol_under_mypy_strict():
    # warn_unused_ignores (part of --strict) turns every undetected wrong call into an error
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
         "tests/typing/rpc_typing.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    # judge only the typing module: errors elsewhere belong to those modules' own checks
    ours = [ln for ln in proc.stdout.splitlines() if ln.startswith(str(Path("tests/typing/rpc_typing.py")))]
    assert not ours, proc.stdout
    assert "Success" in proc.stdout or "Found" in proc.stdout, proc.stdout + proc.stderr


def test_reader_contract_under_mypy_strict():
    # every tailer and excerpt class satisfies chronq.Reader / chronq.ExcerptLike without a
    # `type: ignore`, and rpc's seams refuse a queue, an appender or a tailer where the other is due
    checked = Path("tests/typing/reader_typing.py")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
         str(checked)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    ours = [ln for ln in proc.stdout.splitlines() if ln.startswith(str(checked))]
    assert not ours, proc.stdout
    assert "Success" in proc.stdout, proc.stdout + proc.stderr
