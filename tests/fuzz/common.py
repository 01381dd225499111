"""Shared by the atheris harnesses (``fuzz_*.py``): the sparse file encoding, seeds and the runner.

Chronicle files are mostly zeros (a 192 KiB cycle file holds a few hundred meaningful bytes), so a
harness does not take the file itself as its input: mutations would land in the zeros and every run
would copy 200 KiB. The input is a *sparse file* instead: ``u32 size`` then segments ``u32 offset,
u16 length, bytes``; whatever the segments leave out is zero. A mutated size truncates or grows the
file, a mutated offset moves a structure, and the seeds (the Java-written vectors, split at runs of
zeros) start the search at real files.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO.parent / "shared" / "testdata" / "chronicle" / "generated-cq5.26"
#: Larger files than any vector are still interesting (a grown file), larger than this only slow.
MAX_FILE = 1 << 20
_SEG = struct.Struct("<IH")


def load_queues(names: list[str]) -> list[tuple[str, dict[str, bytes]]]:
    """The files (.cq4, .cq4t) of these Java-written queues, the seeds a harness starts from and mutates.
    A missing one is named on stderr, and under ``CHRONQ_STRICT=1`` (CI) ends the harness with exit 1:
    without its vectors a harness returns at once on every input, and `make fuzz` would pass having
    fuzzed nothing."""
    out, missing = [], []
    for name in names:
        d = VECTORS / name
        if d.is_dir():
            out.append((name, {p.name: p.read_bytes() for p in sorted(d.iterdir())
                               if p.suffix in (".cq4", ".cq4t")}))
        else:
            missing.append(name)
    if missing:
        message = f"Java-written vectors missing from {VECTORS}: {', '.join(missing)}"
        if os.environ.get("CHRONQ_STRICT") == "1":
            raise SystemExit(f"CHRONQ_STRICT=1 but {message}")
        print(f"warning: {message}; fuzzing without them", file=sys.stderr)
    return out
_NONZERO = re.compile(rb"[^\x00](?:\x00{0,32}[^\x00])*")


def pack_sparse(data: bytes) -> bytes:
    """``data`` in the sparse encoding (runs of more than 32 zeros left out)."""
    out = bytearray(struct.pack("<I", len(data)))
    for m in _NONZERO.finditer(data):
        for start in range(m.start(), m.end(), 0xFFFF):
            chunk = data[start : min(m.end(), start + 0xFFFF)]
            out += _SEG.pack(start, len(chunk)) + chunk
    return bytes(out)


def unpack_sparse(blob: bytes) -> bytes:
    """The file a sparse input describes; segments past its size are cut, a torn last one kept."""
    if len(blob) < 4:
        return blob
    size = struct.unpack_from("<I", blob)[0] % (MAX_FILE + 1)
    out = bytearray(size)
    pos = 4
    while pos + _SEG.size <= len(blob):
        offset, length = _SEG.unpack_from(blob, pos)
        pos += _SEG.size
        chunk = blob[pos : pos + length]
        pos += length
        if offset < size:
            out[offset : offset + len(chunk)] = chunk[: size - offset]
    return bytes(out)


def scratch_dir() -> Path:
    """A private directory on tmpfs when there is one: every run rewrites the files."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="chronq-fuzz-", dir=base))


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with a new file (a fresh inode, so no mapping of the old one is reused)."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def run(test_one_input: Callable[[bytes], None], seeds: Callable[[], list[bytes]]) -> None:
    """``fuzz_x.py --seeds DIR`` writes the seed corpus; ``fuzz_x.py --replay DIR|FILE...`` runs every
    input once without libFuzzer (how ``make fuzz`` replays the corpus on the sanitizer build, whose
    libasan would otherwise take libFuzzer's coverage hooks); anything else goes to atheris/libFuzzer."""
    if len(sys.argv) == 3 and sys.argv[1] == "--seeds":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        for n, seed in enumerate(seeds()):
            (out / f"seed-{n:04d}").write_bytes(seed)
        return
    if len(sys.argv) >= 2 and sys.argv[1] == "--replay":
        files = sorted(f for arg in sys.argv[2:] for f in (Path(arg).iterdir() if Path(arg).is_dir()
                                                          else [Path(arg)]))
        for f in files:
            try:
                test_one_input(f.read_bytes())
            except BaseException:
                print(f"finding: {f}", file=sys.stderr)
                raise
        print(f"replayed {len(files)} inputs", file=sys.stderr)
        return
    import atheris

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
