"""A full disk is a clear error, and nothing committed before it is lost.

Two ways to run out of space: RLIMIT_FSIZE (any user, any file system: growing or creating a file past
the limit fails with EFBIG) and, where the test may mount one, a 1 MiB tmpfs (pages of a sparse mapped
file cannot be allocated: a writer that does not reserve space first dies of SIGBUS).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import skip_unless_strict
from tests.procs.qhelp import child_env, script


def check_writer_output(out: str, code: int) -> int:
    lines = out.splitlines()
    assert code == 0, f"writer died (status {code}) instead of raising; last lines: {lines[-3:]}"
    assert lines and lines[-1].startswith("error "), f"no error reported: {lines[-3:]}"
    acked = len(lines) - 1
    assert acked > 0, f"nothing could be written at all: {lines[-1]}"
    return acked


def test_file_size_limit(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    env = child_env()
    w = subprocess.run([*script("full_disk"), "writer", str(queue), str(600_000), str(128 * 1024), "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    check_writer_output(w.stdout, w.returncode)
    error = w.stdout.splitlines()[-1]
    assert ".cq4" in error, f"the error should name the file that could not grow: {error}"
    acks = tmp_path / "acks"
    acks.write_text(w.stdout)
    v = subprocess.run([*script("full_disk"), "verify", str(queue), str(acks)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert v.returncode == 0 and v.stdout.startswith("ok"), v.stdout + v.stderr


def require_tmpfs(where: Path) -> None:
    """Skip the calling test where a private tmpfs cannot be mounted at `where` (a full disk is tested
    on one), or fail it under CHRONQ_STRICT=1: CI runs as root, where the mount works."""
    if shutil.which("unshare") is None:
        skip_unless_strict("cannot mount a private tmpfs here: no `unshare` command")
    probe = subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        skip_unless_strict("cannot mount a private tmpfs here (needs unshare -m and CAP_SYS_ADMIN): "
                           + probe.stderr.strip())


@pytest.mark.parametrize(("block_size", "roll_every"), [(0, 0), (128 * 1024, 0), (128 * 1024, 30)])
def test_tmpfs_full(tmp_path: Path, block_size: int, roll_every: int) -> None:
    """On tmpfs even *reading* a hole of a mapped file allocates a page, so a full tmpfs SIGBUSes.

    The rolling case creates a cycle file on the full disk: its header/index prefix can only be
    partly written, and a writer or reader that maps such a file and looks at a hole dies.
    """
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    require_tmpfs(mnt)
    acks, rc = tmp_path / "acks", tmp_path / "rc"
    queue = mnt / "queue"
    # The mount lives only in this private mount namespace, so writer and verifier both run inside it.
    shell = (
        'mount -t tmpfs -o size=1m tmpfs "$1" || exit 9\n'
        '"$4" "$5" writer "$2" 0 "$7" "$8" > "$3"; echo $? > "$6"\n'
        '"$4" "$5" verify "$2" "$3"\n'
    )
    interp, path = script("full_disk")
    argv = ["unshare", "-m", "sh", "-c", shell, "sh", str(mnt), str(queue), str(acks), interp, path, str(rc),
            str(block_size), str(roll_every)]
    v = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=300)
    check_writer_output(acks.read_text(), int(rc.read_text()))
    assert v.returncode == 0 and v.stdout.startswith("ok"), v.stdout + v.stderr


def test_new_queue_on_a_full_disk_names_the_table_store(tmp_path: Path) -> None:
    """Creating the table store of a new queue on a full disk escaped as a bare OSError."""
    queue = tmp_path / "queue"
    w = subprocess.run([*script("full_disk"), "writer", str(queue), "4096", "0", "0"],
                       capture_output=True, text=True, env=child_env(), timeout=120)
    assert w.returncode == 0, w.stderr
    want = f"error ChronqError: {queue}/metadata.cq4t: cannot create the table store: "
    assert w.stdout.startswith(want), w.stdout
    assert not (queue / "metadata.cq4t").exists(), "a half-made table store was left behind"
