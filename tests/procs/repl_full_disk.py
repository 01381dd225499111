"""Replication onto a full disk, run in a private mount namespace whose small tmpfs holds the sink.

argv: CONFIG BALLAST. Host 1 serves queue1 (its source is not on the tmpfs) and host 2 keeps its sink on
the tmpfs, which BALLAST fills to a few hundred KiB short of full. Excerpts are appended until the sink's
link reports `failing`; then the ballast goes (space comes back), more excerpts are appended, and the
sink must come to hold every one of them. Prints what it saw ("failing: ERROR", "converged") and exits 0
when the sink converged, 1 when it did not.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import chronq
from chronq.replication import ReplicatedQueue

LEFT = 384 * 1024  # bytes the ballast leaves free


def main() -> int:
    config, ballast = Path(sys.argv[1]), Path(sys.argv[2])
    st = os.statvfs(ballast.parent)
    with open(ballast, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - LEFT))
    with ReplicatedQueue(config, 1) as source, ReplicatedQueue(config, 2) as sink:
        queue, sink_path = source.source_path("queue1"), sink.sink_path("queue1")

        def link() -> tuple[str, str | None]:
            (s,) = [s for s in sink.status() if s.role == "sink"]
            return s.state, getattr(s, "error", None)  # (a status without errors: older chronq)

        body = os.urandom(2000)
        deadline = time.monotonic() + 120
        with chronq.open(queue) as q:
            appender = q.appender()
            while link()[0] != "failing":
                if time.monotonic() > deadline:
                    print(f"the sink never reported failing: {link()}")
                    return 1
                appender.write(body)
                time.sleep(0.001)
            print(f"failing: {link()[1]}")
            ballast.unlink()
            last = [appender.write(body) for _ in range(100)][-1]
        while True:
            with chronq.open(sink_path, readonly=True) as s:
                if s.last_index == last:
                    break
            if time.monotonic() > deadline:
                print(f"the sink did not converge: {link()}")
                return 1
            time.sleep(0.05)
        print(f"converged: {link()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
