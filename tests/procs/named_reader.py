"""A consumer with a named tailer: prints each index inside ``reading_document()``, until the end.

argv: queue_dir name
Prints ``start`` once the tailer exists; spends about half a millisecond inside each block, which is
where most kills land.
The stored position moves only when the block finishes, so a kill inside the block makes the next
run read that excerpt again and a kill after it makes the next run continue after it.
"""

from __future__ import annotations

import sys
import time

import chronq


def main() -> None:
    with chronq.open(sys.argv[1]) as q:
        t = q.tailer(sys.argv[2])
        print("start", flush=True)
        while True:
            with t.reading_document() as ex:
                if ex is None:
                    break
                print(ex.index, flush=True)
                time.sleep(0.0005)
    print("end", flush=True)


if __name__ == "__main__":
    main()
