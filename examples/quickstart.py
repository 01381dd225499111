"""chronq in one screen: append, read, seek, resume a named tailer, read from another process.

Run: ``python examples/quickstart.py [queue_dir]`` (a temporary directory by default).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

import chronq

READER = """
import sys, chronq
with chronq.open(sys.argv[1], readonly=True) as q:
    print(len([ex.index for ex in q.tailer()]), "excerpts seen by another process")
"""


def main(path: str) -> None:
    with chronq.open(path) as q:  # FAST_DAILY cycles, Java-compatible files
        appender = q.appender()
        first = appender.write(b"hello")
        appender.write_many([b"a", b"b", b"c"])
        appender.write_document({"msg": "Hello World"})  # self-describing BINARY wire, as Java writes
        with appender.writing_document() as dc:  # rolled back if the block raises
            dc.write(b"index known while writing: ")
            dc.write(b"%#x" % dc.index)

        tailer = q.tailer()
        for ex in tailer:  # stops at the current end; ex.payload is a zero-copy memoryview
            print(f"{ex.index:#x} seq={ex.seq} {bytes(ex.payload)!r}")

        tailer.move_to_index(first + 2)
        ex = tailer.read()
        assert ex is not None and bytes(ex.payload) == b"b"

        named = q.tailer("audit")  # position stored in metadata.cq4t as index.audit
        named.read()
        named.read()
        print("excerpts:", q.count_excerpts(q.first_index or 0, (q.last_index or 0) + 1))

    with chronq.open(path) as q:
        ex = q.tailer("audit").read()  # resumes after the two it finished before
        assert ex is not None and bytes(ex.payload) == b"b"
        print("audit resumed at", hex(ex.index))

    subprocess.run([sys.executable, "-c", READER, path], check=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
