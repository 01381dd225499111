"""`metadata.cq4t` survives a process killed (SIGKILL, or SIGBUS on a full disk) while it adds a key or
updates a value: the queue opens, writable and read-only, every key that was completed is there with its
value, and new keys can be added. Java reads what is left behind.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest

import chronq
from chronq.table import TABLE_STORE_FILE, TableStore, tailer_index_key
from tests.conftest import skip_unless_strict
from tests.procs.qhelp import child_env, script
from tests.test_full_disk import require_tmpfs

JAVA = Path(__file__).resolve().parents[2] / "shared" / "java" / "run.sh"
SEED = int(os.environ.get("CHRONQ_CRASH_SEED", "20261122"))
#: the steps of adding a key, in order (chronq.table._step); "cleared", over a dead header, is tested in
#: test_shorter_key_after_a_dead_longer_one
STEPS = ("reserved", "filled", "terminated", "published")


def java(*args: str) -> str:
    """Run the Java Chronicle tool; skip (or fail under CHRONQ_STRICT) when it cannot run here."""
    if not JAVA.is_file():
        skip_unless_strict(f"the Java tool {JAVA} is absent")
    p = subprocess.run([str(JAVA), *args], capture_output=True, text=True, timeout=300)
    if p.returncode == 3:
        skip_unless_strict(f"the Java tool cannot run here: {p.stderr.strip()}")
    assert p.returncode == 0, f"Java failed on {args}: {p.stdout}{p.stderr}"
    return p.stdout


def java_tailers(queue: Path, names: dict[str, int]) -> dict[str, int]:
    """Where Java Chronicle resumes each of these named tailers of `queue`."""
    lines = java("tailers", str(queue), *names).splitlines()
    return {name: int(index, 16) for name, index, _ in (line.split("\t") for line in lines)}


def make_queue(path: Path, excerpts: int = 8) -> None:
    with chronq.open(path) as q:
        a = q.appender()
        for n in range(excerpts):
            a.write(b"excerpt %d" % n)


def run_add(queue: Path, prefix: str, count: int, *kill: str) -> dict[str, int]:
    """Run the adder; return the names it reported complete, with their stored positions."""
    p = subprocess.run([*script("table_keys"), "add", str(queue), prefix, str(count), *kill],
                       capture_output=True, text=True, env=child_env(), timeout=120)
    if kill:
        assert p.returncode == -signal.SIGKILL, f"adder was not killed at {kill}: {p.returncode} {p.stderr}"
    else:
        assert p.returncode == 0, p.stderr
    return parse_acks(p.stdout)


def parse_acks(out: str) -> dict[str, int]:
    acks = {}
    for line in out.splitlines():
        if "\t" in line:
            name, value = line.split("\t")
            acks[name] = int(value)
    return acks


def check_keys(queue: Path, acks: dict[str, int], tailers: bool = True) -> None:
    """The queue opens read-only and writable with every acknowledged key at its value (and, with
    `tailers`, every named tailer resumes there); a new key and a new named tailer can be added."""
    for readonly in (True, False):
        with chronq.open(queue, readonly=readonly) as q:
            assert q.table is not None
            for name, value in acks.items():
                assert q.table.get(tailer_index_key(name)) == value, (name, readonly)
                assert not tailers or q.tailer(name).index == value or value == 0
    with chronq.open(queue) as q:
        t = q.tailer(f"after-{len(acks)}")
        assert t.read() is not None
    with TableStore.open(queue / TABLE_STORE_FILE, readonly=True) as table:
        assert tailer_index_key(f"after-{len(acks)}") in table


def entry_end(queue: Path) -> int:
    """Where the table store's chain of documents ends (the next key is written there)."""
    data = (queue / TABLE_STORE_FILE).read_bytes()
    pos = 0
    while (h := struct.unpack_from("<I", data, pos)[0]) != 0 and not h & 0x8000_0000:
        pos = (pos + 4 + (h & 0x3FFF_FFFF) + 3) & ~3
    return pos


# -- a dead adder's bytes, exactly as a kill leaves them ---------------------------------------------
def write_dead_key(queue: Path, header: int) -> None:
    """What a writer killed after writing a long key's body, before publishing, leaves past the chain
    end: the body, with a 0 header (as chronq and Java leave it) or a not-complete one."""
    pos = entry_end(queue)
    dead_key = "index.a-consumer-with-quite-a-long-name-that-died-while-its-key-was-added"
    w = struct.pack("<BB", 0xB9, len(dead_key)) + dead_key.encode() + b"\x8f" * 8 + b"\xa7" + bytes(8)
    with open(queue / TABLE_STORE_FILE, "r+b") as f:
        f.seek(pos + 4)
        f.write(w)
        f.seek(pos)
        f.write(struct.pack("<I", header))


@pytest.mark.parametrize("header", [0, 0x8000_0000 | 200])
@pytest.mark.parametrize("while_open", [False, True])
def test_shorter_key_after_a_dead_longer_one(tmp_path: Path, header: int, while_open: bool) -> None:
    """The next, shorter key must not leave the chain pointing into a dead writer's bytes; a writer
    that died while this queue was open is handled when the key is added, one that died before by the
    writable open."""
    queue = tmp_path / "q"
    make_queue(queue)
    if not while_open:
        write_dead_key(queue, header)
        with chronq.open(queue, readonly=True) as q:  # a read-only open skips the dead entry
            assert q.table is not None and "a-consumer" not in "".join(q.table.keys())
    with chronq.open(queue) as q:
        if while_open:
            write_dead_key(queue, header)
        t = q.tailer("short")
        t.read()
    check_keys(queue, {"short": (queue_first(queue) + 1)})
    tail = (queue / TABLE_STORE_FILE).read_bytes()[entry_end(queue):]
    assert not any(tail), "stale bytes left after the chain end"


def queue_first(queue: Path) -> int:
    with chronq.open(queue, readonly=True) as q:
        first = q.first_index
        assert first is not None
        return first


def test_writable_open_clears_a_dead_entry(tmp_path: Path) -> None:
    """Other writers (older releases) do not clear the header after their entry: a writable open zeroes
    a dead writer's leftovers so that they can never be linked into the chain."""
    queue = tmp_path / "q"
    make_queue(queue)
    pos = entry_end(queue)
    with open(queue / TABLE_STORE_FILE, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack("<I", 0x8000_0000 | 40) + b"\xb9\x20" + b"garbage!" * 4)
    with chronq.open(queue, readonly=True):
        pass
    assert any((queue / TABLE_STORE_FILE).read_bytes()[pos:]), "a read-only open must not write"
    with chronq.open(queue):
        pass
    assert not any((queue / TABLE_STORE_FILE).read_bytes()[pos:])


# -- real processes killed at every step ---------------------------------------------------------------
def test_kill_at_each_step_of_adding_a_key(tmp_path: Path) -> None:
    """SIGKILL at each step of adding the n-th key (names of varying length, so a shorter key follows
    the dead one), then a new process adds more keys; everything completed survives, and Java resumes
    every named tailer where chronq left it."""
    queue = tmp_path / "q"
    make_queue(queue)
    acks: dict[str, int] = {}
    for r, step in enumerate(STEPS):
        kill_at = 2 + r  # vary which key dies: each is longer than the next one added
        acks |= run_add(queue, f"k{r}", 6, step, str(kill_at))
        acks |= run_add(queue, f"ok{r}", 3)
        check_keys(queue, acks)
    assert java_tailers(queue, acks) == acks


class ForkServer:
    """`table_keys.py serve`: the kill loops' adders and updaters, each forked from one process that has
    chronq imported (a new interpreter per round was most of the loop's time). Each is a process of its
    own, SIGKILLed just the same."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([*script("table_keys"), "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=child_env())

    def _ask(self, *fields: str) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\t".join(fields) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the fork server exited ({self.proc.wait()})"
        return int(answer)

    def start(self, out: Path, *args: str) -> int:
        """Fork a child running `table_keys.py ARGS` that prints to `out`; its pid once it printed `start`."""
        out.unlink(missing_ok=True)  # the last child's `start` is not this one's
        pid = self._ask(str(out), *args)
        deadline = time.monotonic() + 60
        while not (out.exists() and "start\n" in out.read_text()):
            if time.monotonic() > deadline:
                self.kill(pid)
                raise TimeoutError(f"{args} did not print 'start' within 60 s: {out.read_text()!r}")
            time.sleep(0.001)
        return pid

    def kill(self, pid: int) -> int:
        """SIGKILL the child and wait until it is gone; how it ended (minus the signal that killed it)."""
        os.kill(pid, signal.SIGKILL)
        return self._ask("reap", str(pid))

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        code = self.proc.wait(60)
        self.proc.stdout.close()
        assert code == 0, f"the fork server exited with {code}"


def kill_loop(tmp_path: Path, rounds: int, seed: int = SEED) -> None:
    """Kill adders and updaters at random: every acknowledged key keeps its value, and a value being
    updated is the one acknowledged last or the next."""
    queue = tmp_path / "q"
    make_queue(queue)
    rng = random.Random(seed)
    acks: dict[str, int] = {}
    value_key, value = "test.counter", 0
    server = ForkServer()
    out = tmp_path / "child.out"
    try:
        for r in range(rounds):
            # every third round a table-store value is being updated when the kill lands
            args = ["set", str(queue), value_key] if r % 3 == 2 else ["add", str(queue), f"r{r}", "100000"]
            pid = server.start(out, *args)
            time.sleep(rng.uniform(0, 0.15))
            ended = server.kill(pid)
            lines = out.read_text().splitlines()
            # killed, or done (an adder refused a key): not dead of an exception of its own
            assert ended in (-signal.SIGKILL, 0), f"round {r}: {args[0]} exited with {ended}: {lines[-3:]}"
            if args[0] == "set":
                done = [int(x) for x in lines if x.isdigit()]
                with TableStore.open(queue / TABLE_STORE_FILE, readonly=True) as table:
                    stored = table.get(value_key)
                # the value acknowledged last, or the one being stored when the kill landed
                allowed = (done[-1], done[-1] + 1) if done else (value, 1)
                assert stored in allowed, f"round {r}: {value_key} = {stored}, expected one of {allowed}"
                value = stored
            else:
                acks |= parse_acks("\n".join(lines))
            if r % 5 == 4 or r == rounds - 1:
                check_keys(queue, acks, tailers=r == rounds - 1)
    finally:
        server.close()
    assert len(acks) > rounds  # the kills landed while keys were being added, not before
    # Java resumes up to 100 of them, spread evenly (a JVM resolving the long loop's thousands of tailers
    # takes minutes, and their names overflow one command line); chronq checked every one above
    sample = dict(sorted(acks.items())[:: max(1, len(acks) // 100)])
    assert java_tailers(queue, sample) == sample, "Java resumes a named tailer elsewhere than chronq"


@pytest.mark.exclusive
def test_kill_loop(tmp_path: Path) -> None:
    kill_loop(tmp_path, 12)


@pytest.mark.slow
@pytest.mark.exclusive
@pytest.mark.parametrize("part", range(4))
def test_kill_loop_long(tmp_path: Path, part: int) -> None:
    """300 kills in four queues of 75 rounds (each its own seed) rather than one of 300: every check after
    every round costs in proportion to the keys already there, so one queue made the loop quadratic (four
    minutes); the kills and what is checked after each are the same."""
    kill_loop(tmp_path, 75, seed=SEED + part)


# -- a full disk ---------------------------------------------------------------------------------------
def test_full_tmpfs_while_adding_keys(tmp_path: Path) -> None:
    """On a full tmpfs a store into an unallocated page of the mapping is SIGBUS: adding keys until
    the disk is full must end in a clean error, and after space is freed the queue opens with every
    completed key and takes new ones."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    require_tmpfs(mnt)
    queue = mnt / "q"
    interp, path = script("table_keys")
    # the mount exists only in this mount namespace: everything that touches it runs inside
    shell = (
        'mount -t tmpfs -o size=1m tmpfs "$1" || exit 9\n'
        '"$3" -c "import chronq; q = chronq.open(\'$2\', block_size=131072); q.appender().write(b\'x\')"\n'
        '"$3" "$4" fill "$1" > /dev/null\n'
        '"$3" "$4" add "$2" full 100000 > "$5"; echo $? > "$6"\n'
        'rm "$1/filler"\n'
        '"$3" "$4" add "$2" free 30 > "$7" || exit 7\n'
        'tar -C "$1" -cf "$8" q\n'
    )
    acks_full, rc, acks_free, tar = (tmp_path / n for n in ("full", "rc", "free", "q.tar"))
    p = subprocess.run(["unshare", "-m", "sh", "-c", shell, "sh", str(mnt), str(queue), interp, path,
                        str(acks_full), str(rc), str(acks_free), str(tar)],
                       capture_output=True, text=True, env=child_env(), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = acks_full.read_text()
    assert rc.read_text().strip() == "0", f"adder died on the full disk: {out.splitlines()[-3:]}"
    last = out.splitlines()[-1]
    assert last.startswith("error ChronqError") and TABLE_STORE_FILE in last, last
    acks = parse_acks(out)
    assert acks, "no key could be added before the disk was full"
    acks |= parse_acks(acks_free.read_text())
    subprocess.run(["tar", "-C", str(tmp_path), "-xf", str(tar)], check=True)
    check_keys(tmp_path / "q", acks)


def test_file_size_limit_while_adding_keys(tmp_path: Path) -> None:
    """RLIMIT_FSIZE below the next chunk: growing the table store fails with a clean error."""
    queue = tmp_path / "q"
    make_queue(queue)
    code = (
        "import resource, sys, chronq\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
        "q = chronq.open(sys.argv[1])\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        q.tailer('consumer-%d' % n + 'y' * (n % 50)); n += 1\n"
        "except chronq.ChronqError as e:\n"
        "    print(n, e)\n"
    )
    p = subprocess.run([interp_of(), "-c", code, str(queue)], capture_output=True, text=True,
                       env=child_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    n, message = p.stdout.split(" ", 1)
    assert int(n) > 100 and "cannot reserve disk space" in message, p.stdout
    check_keys(queue, {f"consumer-{k}" + "y" * (k % 50): 0 for k in range(int(n))})


def interp_of() -> str:
    return script("table_keys")[0]

