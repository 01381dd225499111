"""Writing a file whole or not at all, durably: the one way chronq replaces a file beside a queue (a
codec dictionary, an archive's manifest and extracted cycles, a replication host's status).

Durability, for every writer alike: the data goes to a temporary file in the same directory
(``.NAME.PID.XXXXXXXX.tmp``, the name `chronq.store.remove_abandoned_files` clears after a writer
killed half-way), which is flushed and fsynced, then renamed over NAME, then the directory is
fsynced. A reader sees the old file or the new one, never part of one; once the call returns the new
file survives a crash of the machine (a codec dictionary is needed for as long as the queue exists).
If writing fails the temporary file is removed and NAME is left as it was.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["replacing", "write_file"]


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], mode: int = 0o666) -> Iterator[BinaryIO]:
    """``with replacing(path) as f: f.write(...)``: `path` is replaced by what the block wrote when
    it finishes (see the module docstring for the durability), and not at all if it raises. `mode`:
    the new file's permissions (less the umask), as `os.open` takes them."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with builtins.open(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str | os.PathLike[str], data: bytes, mode: int = 0o666) -> None:
    """Replace `path` with `data`, whole or not at all (see the module docstring)."""
    with replacing(path, mode) as f:
        f.write(data)
