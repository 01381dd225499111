"""`chronq tail` reader options and `chronq write`, run as the installed console script on real queues
(ours and one Java wrote)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHRONQ = str(Path(sys.executable).parent / "chronq")
JAVA_METHODS = "generated-cq5.26/method_writer"
JAVA_HISTORY = "generated-cq5.26/method_writer_history/out"


def run(*args: str | Path, stdin: str = "", cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHRONQ, *map(str, args)], input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def texts(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line.split("\t")[1] for line in result.stdout.splitlines()]


@pytest.fixture
def numbers(tmp_path: Path) -> Path:
    """A queue of "1 msg", "3 msg", ... "11 msg" (ordered by the leading number)."""
    q = tmp_path / "q"
    r = run("append", q, stdin="".join(f"{i} msg\n" for i in range(1, 12, 2)))
    assert r.returncode == 0, r.stderr
    (tmp_path / "keyfns.py").write_text(
        "def first(payload):\n    return int(bytes(payload).split(b' ')[0])\n"
        "def at_seven(payload):\n    return bytes(payload).startswith(b'7 ')\n")
    return q


def test_include_exclude_repeatable(numbers: Path) -> None:
    assert texts(run("tail", numbers, "--include", "1", "--include", "msg")) == ["1 msg", "11 msg"]
    assert texts(run("tail", numbers, "-e", "3", "--exclude", "^5")) == ["1 msg", "7 msg", "9 msg", "11 msg"]


def test_from_decimal_and_hex_last_max_reverse(numbers: Path) -> None:
    first = int(run("tail", numbers).stdout.split("\t")[0], 16)
    assert texts(run("tail", numbers, "--from", hex(first + 4))) == ["9 msg", "11 msg"]
    assert texts(run("tail", numbers, "--from", str(first + 5))) == ["11 msg"]
    assert texts(run("tail", numbers, "--last", "2")) == ["9 msg", "11 msg"]
    assert texts(run("tail", numbers, "--max", "2")) == ["1 msg", "3 msg"]
    assert texts(run("tail", numbers, "--reverse", "--max", "2")) == ["11 msg", "9 msg"]
    assert texts(run("tail", numbers, "-r", "--from", hex(first + 1))) == ["3 msg", "1 msg"]


def test_search_and_until_load_functions_by_import_path(numbers: Path) -> None:
    cwd = numbers.parent
    found = texts(run("tail", numbers, "--search", "keyfns:first", "6", cwd=cwd))
    assert found == ["7 msg", "9 msg", "11 msg"]
    assert texts(run("tail", numbers, "--search", "keyfns:first", "99", cwd=cwd)) == []
    assert texts(run("tail", numbers, "--until", "keyfns:at_seven", cwd=cwd)) == ["1 msg", "3 msg", "5 msg"]
    bad = run("tail", numbers, "--until", "keyfns:absent", cwd=cwd)
    assert bad.returncode == 2 and "keyfns:absent" in bad.stderr and bad.stderr.count("\n") == 1


def test_named_tailer_resumes(numbers: Path) -> None:
    assert texts(run("tail", numbers, "--named", "reader", "--max", "2")) == ["1 msg", "3 msg"]
    assert texts(run("tail", numbers, "--named", "reader", "--max", "1")) == ["5 msg"]


def test_follow_prints_messages_appended_later(numbers: Path) -> None:
    with subprocess.Popen([CHRONQ, "tail", "-f", "--last", "1", str(numbers)], stdout=subprocess.PIPE,
                          text=True) as p:
        assert p.stdout is not None
        try:
            assert p.stdout.readline().endswith("\t11 msg\n")
            run("append", numbers, stdin="13 msg\n")
            assert p.stdout.readline().endswith("\t13 msg\n")
        finally:
            p.terminate()
            p.stdout.close()


def test_java_vector_json_yaml_and_interface(vectors: Path) -> None:
    q = vectors / JAVA_METHODS
    records = [json.loads(line) for line in run("tail", q, "--json").stdout.splitlines()]
    assert records[3]["value"] == {"trade": ["EURUSD", 1000000, 1.0875]}
    assert set(records[0]) == {"index", "cycle", "seq", "length", "text", "hex", "value"}
    calls = run("tail", q, "--json", "--interface", "tests.rpc_support:Events")
    assert [json.loads(x)["calls"] for x in calls.stdout.splitlines()][3:] == [
        [{"method": "trade", "args": ["EURUSD", 1000000, 1.0875]}],
        [{"method": "noArgs", "args": []}],
        [{"method": "ping", "args": [1234567890]}],  # @method_id(7): named through the Protocol
    ]
    said = texts(run("tail", q, "--interface", "tests.rpc_support:Events", "-i", "^say"))
    assert said == ['say["hi there"]']
    yaml = run("tail", q, "--yaml", "--max", "1")
    assert yaml.stdout.startswith("--- # index: 0x4d1900000000") and "method1: {" in yaml.stdout
    bad = run("tail", q, "--interface", "tests.rpc_support:Message1")
    assert bad.returncode == 2 and "not a typing.Protocol" in bad.stderr


def test_java_vector_history_and_local_times(vectors: Path) -> None:
    q = vectors / JAVA_HISTORY
    rec = json.loads(run("tail", q, "--json", "--history", "--time", "--max", "1").stdout)
    h = rec["history"]
    assert h["sources"] == [[1, 0x4D1900000000]] and len(h["timings"]) == len(h["times"]) == 3
    assert all(t[:4].isdigit() and "T" in t for t in h["times"])  # ISO local times
    line = run("tail", q, "--history", "--max", "1").stdout
    assert "\thistory: sources=[[1, 84769769521152]]" in line


def test_bad_usage_exits_2_with_one_line(numbers: Path) -> None:
    bad = (["--max", "x"], ["--from", "zz"], ["-r", "-f"], ["--include", "("], ["--last", "1", "--from", "0"])
    for args in bad:
        r = run("tail", numbers, *args)
        assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.stderr)


def test_queue_error_exits_1_naming_the_path(numbers: Path, tmp_path: Path) -> None:
    r = run("tail", numbers, "--from", "0x5")
    assert r.returncode == 1 and "index 0x5" in r.stderr and str(numbers.name) in r.stderr
    r = run("tail", tmp_path / "absent")
    assert r.returncode == 1 and "absent" in r.stderr


# ------------------------------------------------------------------------------------------ write
JAVA_CALLS = """\
method1: {text: hello}
---
method2: {number: 42, price: 1.25, flag: true}
---
say: hi there
---
trade: [EURUSD, 1000000, 1.0875]
---
noArgs: ""
---
ping: 1234567890
"""


def _bodies(q: Path) -> list[bytes]:
    return [bytes.fromhex(json.loads(x)["hex"]) for x in run("tail", q, "--json").stdout.splitlines()]


def test_write_through_interface_is_byte_identical_to_javas_writer(vectors: Path, tmp_path: Path) -> None:
    from tests.rpc_support import data_documents

    calls = tmp_path / "calls.yaml"
    calls.write_text(JAVA_CALLS)
    q = tmp_path / "q"
    r = run("write", q, calls, "--interface", "tests.rpc_support:Events")
    assert r.returncode == 0, r.stderr
    assert _bodies(q) == [body for _, body in data_documents(vectors / JAVA_METHODS)]


def test_write_generic_method_and_keyword_arguments(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("say: one\n---\nsay: two\n")
    b.write_text("trade: {symbol: GBPUSD, qty: 5, price: 2}\n")
    q = tmp_path / "q"
    assert run("write", q, a).returncode == 0  # no interface: wire's generic encoding
    r = run("write", q, b, "--interface", "tests.rpc_support:Events")
    assert r.returncode == 0, r.stderr
    m = tmp_path / "m.yaml"
    m.write_text("hello\n---\nworld\n")
    assert run("write", q, m, "--method", "say").returncode == 0
    shown = texts(run("tail", q, "--interface", "tests.rpc_support:Events"))
    assert shown == ['say["one"]', 'say["two"]', 'trade["GBPUSD", 5, 2.0]', 'say["hello"]', 'say["world"]']


def test_write_checks_every_file_before_writing_anything(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("say: fine\n")
    bad.write_text("say: fine\n---\ntrade: {symbol: X, qty: many, price: 1}\n")
    q = tmp_path / "q"
    r = run("write", q, good, bad, "--interface", "tests.rpc_support:Events")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "bad.yaml document 2" in r.stderr and "trade()" in r.stderr and "'qty'" in r.stderr
    assert not q.exists() or _bodies(q) == []
    r = run("write", q, good, "--interface", "tests.rpc_support:Events", "--method", "nope")
    assert r.returncode == 2 and "no method 'nope'" in r.stderr
    r = run("write", q, tmp_path / "missing.yaml")
    assert r.returncode == 2 and "missing.yaml" in r.stderr
    bad.write_text("- just\n- a list\n")
    r = run("write", q, bad)
    assert r.returncode == 2 and "--method" in r.stderr


# ------------------------------------------------------------------------ unlock, refresh, stats
def _dead_pid() -> int:
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                       text=True, check=True)
    return int(p.stdout)


def test_unlock_releases_a_dead_owners_lock_and_refuses_a_live_one(numbers: Path) -> None:
    import os

    from chronq.table import UNLOCKED, WRITE_LOCK, TableStore

    store = numbers / "metadata.cq4t"
    with TableStore.open(store) as t:
        t.set(WRITE_LOCK, _dead_pid())
    r = run("unlock", numbers)
    assert r.returncode == 0 and "released (held by dead process" in r.stdout, r.stderr
    with TableStore.open(store, readonly=True) as t:
        assert t.get(WRITE_LOCK) == UNLOCKED
    with TableStore.open(store) as t:
        t.set(WRITE_LOCK, os.getpid())
    r = run("unlock", numbers)
    assert r.returncode == 1 and f"live process {os.getpid()}" in r.stderr and "--force" in r.stderr
    assert "metadata.cq4t" in r.stderr and r.stderr.count("\n") == 1
    r = run("unlock", numbers, "--force")
    assert r.returncode == 0 and "released (held by live process" in r.stdout
    assert run("append", numbers, stdin="13 msg\n").returncode == 0  # the queue is writable again
    assert texts(run("tail", numbers, "--last", "1")) == ["13 msg"]


def test_refresh_rebuilds_the_listing_of_a_java_queue(vectors: Path, tmp_path: Path) -> None:
    from chronq.table import HIGHEST_CYCLE, LOWEST_CYCLE, TableStore

    q = tmp_path / "rc"
    shutil.copytree(vectors / "generated-cq5.26/fast_hourly_roll_eof", q)
    cycles = sorted(int(x["cycle"]) for x in json.loads(run("stats", q, "--json").stdout)["cycles"])
    with TableStore.open(q / "metadata.cq4t") as t:
        t.set(LOWEST_CYCLE, 1)
        t.set(HIGHEST_CYCLE, 2)
    r = run("refresh", q)
    assert r.returncode == 0 and f"lowestCycle 1 -> {cycles[0]}, highestCycle 2 -> {cycles[-1]}" in r.stdout
    with TableStore.open(q / "metadata.cq4t", readonly=True) as t:
        assert (t.lowest_cycle, t.highest_cycle) == (cycles[0], cycles[-1])


def test_stats_of_a_java_queue_with_named_tailers(vectors: Path) -> None:
    q = vectors / "generated-cq5.26/named_tailer"
    st = json.loads(run("stats", q, "--json").stdout)
    assert (st["first_index"], st["last_index"], st["count"]) == (0x4D1900000000, 0x4D1900000004, 5)
    on_disk = (q / "20240115F.cq4").stat()
    assert st["cycles"] == [{"cycle": 19737, "file": "20240115F.cq4", "count": 5,
                             "bytes": on_disk.st_size, "allocated": on_disk.st_blocks * 512}]
    assert {t["name"]: t["behind"] for t in st["tailers"]} == {
        "myTailer": 2, "replicated:tailerOne": 3, "unreadTailer": 5}
    lines = run("stats", q).stdout.splitlines()
    assert lines[0].startswith(f"queue {q}  roll cycle FAST_DAILY  first 0x4d1900000000")
    rows = lines[lines.index("") + 1:]
    assert rows[0].split() == ["cycle", "file", "messages", "allocated", "bytes", "apparent", "bytes"]
    # aligned: every column of the tailer table starts at the same offset on each line
    tailer_rows = lines[len(lines) - 4:]
    assert len({r.index("0x") for r in tailer_rows[1:]}) == 1


def test_stats_unlock_refresh_on_no_queue_exit_1(tmp_path: Path) -> None:
    for cmd in ("stats", "unlock", "refresh"):
        r = run(cmd, tmp_path)
        assert r.returncode == 1 and "no queue directory" in r.stderr and str(tmp_path) in r.stderr


# ---------------------------------------------------------------------------------------- progress
def _with_tty_stderr(cmd: list[str], cwd: Path = REPO) -> tuple[str, str]:
    """Run `cmd` with stderr on a pseudo-terminal and stdout on a pipe: (stdout, what the terminal got)."""
    import os
    import pty
    import threading

    master, slave = pty.openpty()
    got: list[bytes] = []

    def drain() -> None:  # read as it comes: a full terminal buffer would block the writer
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                return
            if not chunk:
                return
            got.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        # 500 columns: the progress line names the queue's whole path (longer under xdist's basetemp,
        # popen-gwN/), which the default 80 would cut
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True, cwd=cwd,
                              env={**os.environ, "COLUMNS": "500"}) as p:
            os.close(slave)
            out, _ = p.communicate(timeout=120)
        reader.join(timeout=30)
    finally:
        os.close(master)
    return out, b"".join(got).decode("utf-8", "replace")


@pytest.fixture
def big(tmp_path: Path) -> Path:
    q = tmp_path / "big"
    assert run("append", q, stdin="".join(f"message {i}\n" for i in range(3000))).returncode == 0
    return q


def test_progress_on_a_terminal_only(big: Path) -> None:
    out, tty = _with_tty_stderr([CHRONQ, "tail", str(big)])
    assert out.count("\n") == 3000 and f"tail {big}" in tty
    quiet = run("tail", big)  # stderr a pipe: nothing but the output
    assert quiet.stderr == "" and quiet.stdout == out
    out, tty = _with_tty_stderr([CHRONQ, "dump", "--json", str(big)])
    assert out.count("\n") > 3000 and f"dump {big}" in tty
    out, tty = _with_tty_stderr([CHRONQ, "dump", str(big)])
    assert out.count("# position:") > 3000 and f"dump {big}" in tty
    assert run("dump", big).stderr == ""


def test_plain_progress_without_rich(big: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls.yaml"
    calls.write_text("---\n".join(f"say: m{i}\n" for i in range(500)))
    code = ("import sys; sys.modules['rich'] = None; from chronq.cli import main; "
            f"sys.exit(main(['tail', {str(big)!r}]))")
    out, tty = _with_tty_stderr([sys.executable, "-c", code])
    assert out.count("\n") == 3000 and f"\rtail {big}: " in tty and "/3000 (" in tty
    assert tty.endswith("\x1b[K")  # the line is erased at the end
    code = ("import sys; sys.modules['rich'] = None; from chronq.cli import main; "
            f"sys.exit(main(['write', {str(tmp_path / 'w')!r}, {str(calls)!r}]))")
    # (not run from the source tree, whose build metadata may predate the entry points)
    out, tty = _with_tty_stderr([sys.executable, "-c", code], cwd=tmp_path)
    assert "write " in tty and "calls.yaml: 500 calls" in tty


def test_a_damaged_cycle_file_exits_1_naming_file_and_position(numbers: Path) -> None:
    cycle = next(numbers.glob("*.cq4"))
    with cycle.open("r+b") as fh:
        data = fh.read(1 << 20)
        at = data.find(b"5 msg") - 4  # the header of the third message
        fh.seek(at)
        fh.write((0x3FFFFFFF).to_bytes(4, "little"))  # a length far past the end of the file
    for extra in ([], ["--json"], ["--interface", "tests.rpc_support:Events"]):
        r = run("tail", numbers, *extra)
        assert r.returncode == 1 and r.stdout.count("\n") == 2  # the two messages before the damage
        assert f"{cycle}: at position {at}:" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize(("document", "problem"), [
    ('--- !!python/object/apply:os.system ["echo hi"]', "unknown YAML tag !!python/object/apply:os.system"),
    ("say: !!python/name:os.system", "unknown YAML tag !!python/name:os.system"),
    ("--- !!map {say: 1}", "unknown YAML tag !!map"),
    ("say: 1e999999", "number 1e999999 is out of range"),
    ("say: -1e999", "number -1e999 is out of range"),
    ("say: " + "9" * 100_000, "integer of 100000 digits is out of range"),
    ("say: 123456789012345678901234567890", "does not fit in a signed 64-bit long"),
])
def test_write_refuses_what_it_cannot_write_faithfully(tmp_path: Path, document: str, problem: str) -> None:
    """A document chronq write cannot write as it reads (a tag it does not know, a number beyond its
    type) is a data error: exit 2, one line naming the file, the document and the problem, nothing
    written. It was dropped without a word, written as Infinity, or a traceback's exit 1."""
    f = tmp_path / "calls.yaml"
    f.write_text(f"say: first\n---\n{document}\n---\nsay: last\n")
    q = tmp_path / "q"
    r = run("write", q, f)
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and "calls.yaml" in r.stderr and "document 2" in r.stderr, r.stderr
    assert problem in r.stderr, r.stderr
    assert len(r.stderr) < 500
    assert not q.exists() or _bodies(q) == []


def test_write_still_reads_chronicle_document_markers_and_infinity(tmp_path: Path) -> None:
    f = tmp_path / "calls.yaml"
    f.write_text("--- !!data #binary\nsay: one\n--- !!meta-data\nsay: .inf\n---\nsay: '1e999999'\n")
    q = tmp_path / "q"
    assert run("write", q, f).returncode == 0
    assert texts(run("tail", q)) == ['{"say": "one"}', '{"say": "Infinity"}', '{"say": "1e999999"}']


@pytest.mark.parametrize("command", ["tail", "dump"])
def test_reading_a_directory_that_is_not_a_queue_says_so(tmp_path: Path, command: str) -> None:
    """A mistyped path printed nothing and exited 0, as an empty queue would."""
    (tmp_path / "notes.txt").write_text("not a queue\n")
    r = run(command, tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    want = f"chronq {command}: {tmp_path}: not a queue (no metadata.cq4t and no .cq4 cycle files)\n"
    assert r.stderr == want
    empty = tmp_path / "empty"
    assert run("append", empty, stdin="").returncode == 0  # an empty queue is still a queue
    r = run(command, empty)
    assert r.returncode == 0, r.stderr


def test_history_shows_progress_on_a_terminal(big: Path) -> None:
    out, tty = _with_tty_stderr([CHRONQ, "history", str(big)])
    assert "3000 messages, 3000 without history" in out and f"history {big}" in tty
    quiet = run("history", big)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == out


def _three_cycles(q: Path) -> list[int]:
    """A queue of three 1970 cycles (TEST4_SECONDLY) of 200 messages each; the sizes of its files."""
    import chronq
    from chronq.rollcycles import FixedClock

    clock = FixedClock(0)
    with chronq.open(q, "TEST4_SECONDLY", clock=clock, block_size=64 << 10) as queue:
        a = queue.appender()
        for cycle in range(3):
            clock.advance(1000 if cycle else 0)
            for i in range(200):
                a.write(b"%d %d " % (cycle, i) + bytes(300))
    return [f.stat().st_size for f in sorted(q.glob("*.cq4"))]


def test_archive_reports_progress_inside_a_cycle(tmp_path: Path) -> None:
    """The bar of `chronq archive` moves frame by frame, not only from one cycle to the next."""
    pytest.importorskip("fsspec")
    from chronq.archive import archive

    q = tmp_path / "q"
    sizes = _three_cycles(q)[:2]  # the last cycle has no EOF and nothing after it: it stays
    seen: list[tuple[int, int]] = []
    moved = archive(q, str(tmp_path / "arch"), frame=4096, on_bytes=lambda d, t: seen.append((d, t)))
    assert [e["cycle"] for e in moved] == [0, 1]
    assert {t for _, t in seen} == {sum(sizes)}
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == sum(sizes)
    assert sum(1 for d in done if d < sizes[0]) >= sizes[0] // 4096 - 1  # inside the first cycle

    q2 = tmp_path / "q2"
    _three_cycles(q2)
    out, tty = _with_tty_stderr([CHRONQ, "archive", "q2", "arch2"], cwd=tmp_path)
    assert out.count("archived cycle") == 2 and "archive q2 (bytes)" in tty


def test_stats_reports_what_a_sparse_cycle_file_takes_on_disk(tmp_path: Path) -> None:
    """Five messages in a default FAST_DAILY queue: 83,886,080 bytes apparent, a few pages allocated."""
    q = tmp_path / "q"
    assert run("append", q, stdin="".join(f"m{i}\n" for i in range(5))).returncode == 0
    cycle = next(q.glob("*.cq4")).stat()
    st = json.loads(run("stats", q, "--json").stdout)
    assert st["cycles"][0]["bytes"] == cycle.st_size and st["bytes"] == cycle.st_size
    assert st["cycles"][0]["allocated"] == cycle.st_blocks * 512 == st["allocated"]
    assert st["allocated"] < st["bytes"] // 4  # sparse: the apparent size is not what the disk holds
    lines = run("stats", q).stdout.splitlines()
    assert f"allocated bytes {cycle.st_blocks * 512}  apparent bytes {cycle.st_size}" in lines[0]
    row = lines[lines.index("") + 2].split()
    assert row[-2:] == [str(cycle.st_blocks * 512), str(cycle.st_size)]
