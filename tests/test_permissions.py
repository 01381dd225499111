"""A queue's files and directory are never world-writable, whatever the umask, nor looser than it."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs.qhelp import child_env, script


@pytest.mark.parametrize("umask", [0o000, 0o002, 0o022, 0o077])
def test_new_files_are_not_world_writable(tmp_path: Path, umask: int) -> None:
    """The queue, its files and the parent directories `chronq.open` creates for it (these used to be
    0777 under umask 000: anyone could swap the queue directory for their own)."""
    queue = tmp_path / "parent" / "child" / "queue"
    # A separate process: the umask is process-wide and must not leak into the test run.
    proc = subprocess.run([*script("umask_writer"), str(queue), f"{umask:o}"], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    files = sorted(p for p in queue.rglob("*") if p.is_file())
    assert {p.suffix for p in files} >= {".cq4", ".cq4t"}
    assert len([p for p in files if p.suffix == ".cq4"]) == 2, "the roll should have made a second cycle file"
    for p in [queue.parent.parent, queue.parent, queue, *files]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert not mode & stat.S_IWOTH, f"{p.name} is world-writable: {mode:o} (umask {umask:o})"
        assert not mode & umask, f"{p.name} mode {mode:o} ignores umask {umask:o}"


def test_chronq_append_creates_parents_owner_writable_only(tmp_path: Path) -> None:
    """`chronq append` into a path whose parents do not exist, under umask 000."""
    queue = tmp_path / "a" / "b" / "queue"
    proc = subprocess.run(
        ["sh", "-c", 'umask 000 && exec "$0" -m chronq append "$1"', sys.executable, str(queue)],
        input="one line\n", capture_output=True, text=True, env=child_env(), timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    for p in (tmp_path / "a", tmp_path / "a" / "b", queue):
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == 0o755, f"{p} has mode {mode:o}"
