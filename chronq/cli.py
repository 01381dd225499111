"""The `chronq` command: dump, append, tail, write, archive, trim (retain) and inspect a queue from the
shell.

Exit status: 0 success, 2 bad usage, 1 a queue error (one line on stderr naming the file and offset).

Layering: chronq must not import rpc (rpc -> chronq -> wire), yet two things the command line offers
need rpc's typed Protocols: decoding messages as method calls through an interface (`tail
--interface`) and writing method calls (`chronq write`). They are found through entry points, so this
module never names rpc and works (without them) when only chronq and wire are present:

- ``[project.entry-points."chronq.commands"]``: each entry is ``register(subparsers)``, adding one
  subcommand whose parser sets ``run=callable(args)``; `rpc.cli` registers ``write`` this way.
- ``[project.entry-points."chronq.decoders"]``: ``interface`` names ``factory("module:Class")``
  returning ``decode(payload, index) -> [{"method": name, "args": [...]}]`` (`rpc.cli` again);
  ``interface_calls`` is the Spark source's (see `chronq.plugins`).

Subcommands raise `UsageError` for bad input (exit 2); chronq's own errors exit 1.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from chronq import plugins
from chronq.errors import ChronqError, IndexNotFoundError
from chronq.plugins import entry_point, entry_points
from wire.errors import WireError

__all__ = ["UsageError", "load_object", "main", "queue_stats"]

FOLLOW_WAIT = 0.5  # s `tail -f` sleeps on the doorbell at most per wait (woken at once by an append)


class UsageError(Exception):
    """Bad input from the command line, stdin or a file named on it (exit status 2, one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # one line, as for every other failure: scripts read stderr, people have --help
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _index(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an index: {text!r} (decimal or 0x hex)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an index is not negative: {text}")
    return value


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number no smaller than `minimum` (counts, sizes, how many to keep)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {text}")
        return value

    return parse


_count = _at_least(0)


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"bad regular expression {text!r}: {e}") from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="chronq", description="Inspect and use Chronicle Queue v5 directories.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("dump", help="print every document of a queue, cycle file or table store")
    d.add_argument("path", type=Path)
    d.add_argument("--json", action="store_true", help="one JSON object per document")
    a = sub.add_parser("append", help="append each stdin line as one message; prints each index")
    a.add_argument("path", type=Path)
    a.add_argument("--roll-cycle", default=None, metavar="NAME",
                   help="roll cycle of a new queue (default FAST_DAILY; an existing queue keeps its own)")
    a.add_argument("--hex", action="store_true", help="lines are hex-encoded bytes")
    t = sub.add_parser("tail", help="print messages with their index (Chronicle's queue reader)")
    t.add_argument("path", type=Path)
    t.add_argument("-f", "--follow", action="store_true", help="keep waiting for new messages")
    start = t.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", type=_index, metavar="INDEX",
                       help="start at this index (decimal or 0x hex)")
    start.add_argument("--last", type=_count, metavar="N", help="start N messages before the end")
    start.add_argument("--search", nargs=2, metavar=("KEYFN", "TARGET"),
                       help="start at the first message whose KEYFN(payload) >= TARGET (binary search; "
                            "KEYFN is module:function, TARGET a Python literal or text)")
    t.add_argument("--max", type=_count, metavar="N", help="stop after printing N messages")
    t.add_argument("-r", "--reverse", action="store_true", help="newest first")
    t.add_argument("--named", metavar="NAME", help="named tailer: resume where it stopped, and persist")
    t.add_argument("-i", "--include", type=_regex, action="append", default=[], metavar="REGEX",
                   help="print only messages whose rendering matches (repeatable: all must match)")
    t.add_argument("-e", "--exclude", type=_regex, action="append", default=[], metavar="REGEX",
                   help="skip messages whose rendering matches (repeatable: any skips)")
    t.add_argument("--until", metavar="MODULE:PREDICATE",
                   help="stop before the first message for which PREDICATE(payload) is true")
    t.add_argument("--interface", metavar="MODULE:CLASS", help="decode messages as calls of this Protocol")
    t.add_argument("--history", action="store_true", help="show each message's MessageHistory")
    t.add_argument("--time", action="store_true",
                   help="show history timings as local wall-clock times (implies --history)")
    form = t.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON object per message")
    form.add_argument("--yaml", action="store_true", help="each message as a YAML document")
    ar = sub.add_parser("archive", help="move finished cycles to an archive (a path or fsspec URL)")
    ar.add_argument("path", type=Path, help="queue directory")
    ar.add_argument("dest", help="archive location: a directory, file://..., s3://bucket/prefix, ...")
    ar.add_argument("--compress", choices=["zstd"], default=None, help="zstd frames (seekable)")
    ar.add_argument("--keep", type=int, default=0, metavar="N",
                    help="leave the newest N finished cycles in the queue")
    ar.add_argument("--read-back", action="store_true",
                    help="read each archive file back and check its sha256 before publishing it")
    r = sub.add_parser("replicate", help="run this host's part of a replication cluster until SIGTERM/SIGINT")
    r.add_argument("config", type=Path, help="QueueReplicationCfg YAML file (see docs/replication.md)")
    r.add_argument("--host-id", type=int, required=True, metavar="N", help="this host's hostId")
    r.add_argument("--promote", action="store_true",
                   help="fail-over: promote this host's sinks of the queues the configuration says it "
                        "masters to writable sources, then run")
    r.add_argument("--status", action="store_true",
                   help="print the links of the running host N (replicated and acknowledged indexes, lag) "
                        "and exit")
    k = sub.add_parser("retain", help="delete the oldest cycle files beyond a retention policy "
                       "(never the current cycle, one a named tailer or a replication sink still needs)")
    k.add_argument("path", type=Path)
    k.add_argument("--keep-cycles", type=_at_least(1), metavar="N", help="keep the newest N cycles")
    k.add_argument("--max-age", type=_duration, metavar="DURATION",
                   help="keep cycles that ended less than this long ago (90s, 12h, 7d, 2w)")
    k.add_argument("--max-bytes", type=_count, metavar="N",
                   help="keep the newest cycles within N bytes on disk")
    k.add_argument("--replication-source", action="store_true",
                   help="protect cycles sinks have not acknowledged even before anything was replicated")
    k.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    u = sub.add_parser("unlock", help="release a write lock left by a process that died")
    u.add_argument("path", type=Path, metavar="QUEUE")
    u.add_argument("--force", action="store_true", help="release it even though its owner is alive")
    f = sub.add_parser("refresh", help="rebuild the table store's listing (lowest/highest cycle) from files")
    f.add_argument("path", type=Path, metavar="QUEUE")
    s = sub.add_parser("stats", help="cycles, indexes, counts, bytes and named tailers of a queue")
    s.add_argument("path", type=Path, metavar="QUEUE")
    s.add_argument("--json", action="store_true", help="one JSON object")
    for ep in entry_points("chronq.commands"):
        ep.load()(sub)
    _history_parser(sub)
    return p


def _duration(text: str) -> int:
    from chronq.retention import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `chronq dump q | head` ends quietly
    try:
        if getattr(args, "run", None) is not None:
            args.run(args)
        elif args.command == "dump":
            _dump(args.path, args.json)
        elif args.command == "archive":
            _archive(args.path, args.dest, args.compress, args.keep, args.read_back)
        elif args.command == "replicate":
            _replicate(args.config, args.host_id, args.status, args.promote)
        elif args.command == "retain":
            _retain(args)
        elif args.command == "history":
            _history(args)
        elif args.command == "append":
            _append(args.path, args.roll_cycle, args.hex)
        elif args.command == "unlock":
            _unlock(args.path, args.force)
        elif args.command == "refresh":
            _refresh(args.path)
        elif args.command == "stats":
            _stats(args.path, args.json)
        else:
            _tail(args)
    except UsageError as e:
        print(f"chronq {args.command}: {_one_line(e)}", file=sys.stderr)
        return 2
    except (ChronqError, WireError, OSError, ValueError) as e:
        print(f"chronq {args.command}: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def _history_parser(sub: Any) -> None:
    h = sub.add_parser("history", help="latency histograms per hop from message history")
    h.add_argument("queues", nargs="+", type=Path, metavar="QUEUE",
                   help="one queue (every hop in its histories) or a chain input -> ... -> output")
    h.add_argument("-i", "--ignore", type=int, default=0, metavar="N",
                   help="skip the first N messages of each queue (warm-up)")
    h.add_argument("-u", "--unit", choices=("ns", "us", "ms"), default="us", help="time unit (default us)")
    h.add_argument("-w", "--interval", type=float, metavar="SECONDS",
                   help="also a histogram per time window")
    h.add_argument("-m", "--by-method", action="store_true", help="a histogram per method called")
    h.add_argument("--csv", type=Path, metavar="FILE", help="write the summary as CSV")
    h.add_argument("--plot", type=Path, metavar="FILE",
                   help="write a PNG of the percentiles (needs matplotlib)")


def _history(args: argparse.Namespace) -> None:
    from chronq import latency

    if args.ignore < 0:
        raise UsageError(f"--ignore must be >= 0, not {args.ignore}")
    if args.interval is not None and not args.interval > 0:
        raise UsageError(f"--interval must be > 0 seconds, not {args.interval}")
    from chronq.progress import Progress, wanted

    total = sum(_messages_in(q) for q in latency.queues_read(args.queues)) if wanted() else None
    names = " ".join(str(q) for q in args.queues)
    with Progress(total, f"history {names}", force=None if total is not None else False) as bar:
        rep = latency.analyze(args.queues, ignore=args.ignore, interval=args.interval,
                              by_method=args.by_method, on_read=bar.advance)
    sys.stdout.write(latency.format_table(rep, args.unit))
    if args.csv is not None:
        latency.write_csv(rep, args.csv, args.unit)
    if args.plot is not None:
        try:
            latency.plot(rep, args.plot, args.unit)
        except ChronqError as e:  # the table and CSV are still worth having without the plot extra
            print(f"chronq history: plot skipped: {_one_line(e)}", file=sys.stderr)


def _messages_in(path: Path) -> int:
    """How many messages a queue holds (0 for what is not a queue: the command reports that itself)."""
    import chronq

    if not path.is_dir():
        return 0
    with chronq.open(path, readonly=True) as q:
        first, last = q.first_index, q.last_index
        return 0 if first is None or last is None else q.count_excerpts(first, last + 1)


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return " ".join(text.split())


def _require_queue(path: Path) -> None:
    """UsageError for a directory that holds no queue: reading it would print nothing and look like
    an empty queue, hiding a mistyped path."""
    from chronq import _directory

    if path.is_dir():
        d = _directory.read(path)
        if d.table is None and not d.listing():
            raise UsageError(f"{path}: not a queue (no metadata.cq4t and no .cq4 cycle files)")


def _dump(path: Path, as_json: bool) -> None:
    from chronq import dump
    from chronq.progress import Progress

    _require_queue(path)

    out = sys.stdout
    sizes = {str(f): f.stat().st_size for f in dump.queue_files(path)}
    done: dict[str, int] = {}
    with Progress(sum(sizes.values()), f"dump {path}") as bar:

        def at(file: str, position: int) -> None:
            done[file] = position
            bar.advance(sum(done.values()) - bar.done)

        if as_json:
            for record in dump.dump_records(path):
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                at(record["file"], record["position"])
        else:
            for chunk in dump.dump_lines(path, at):
                out.write(chunk)
    out.flush()


def _append(path: Path, roll_cycle: str | None, as_hex: bool) -> None:
    """All of stdin is one atomic commit: a bad line (or an interrupted run) writes nothing."""
    import chronq
    from chronq import rollcycles

    if roll_cycle is not None:
        try:
            rollcycles.by_name(roll_cycle)
        except ValueError as e:
            raise UsageError(str(e)) from None
    payloads = []
    for number, line in enumerate(sys.stdin.buffer, 1):
        line = line.rstrip(b"\r\n")
        if as_hex:
            try:
                line = bytes.fromhex(line.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                raise UsageError(f"stdin line {number} is not hex: {line[:40]!r}") from None
        payloads.append(line)
    with chronq.open(path, roll_cycle=roll_cycle) as q:
        appender = q.appender()
        with appender.atomic():
            indexes = [appender.write(p) for p in payloads]
    sys.stdout.writelines(f"0x{i:x}\n" for i in indexes)


def _retain(args: argparse.Namespace) -> None:
    """Prints one line per deleted cycle (`deleted CYCLE PATH`), then what stopped the run."""
    import logging

    import chronq
    from chronq.retention import Policy, retain

    if args.keep_cycles is None and args.max_age is None and args.max_bytes is None:
        raise UsageError("give at least one of --keep-cycles, --max-age, --max-bytes")
    if not args.path.is_dir():
        raise ChronqError(f"{args.path}: no queue directory")
    # each deletion is printed once, on stdout; the library's INFO line for it stays out of stderr
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s chronq retain: %(message)s")
    policy = Policy(keep_cycles=args.keep_cycles, max_age_ms=args.max_age, max_bytes=args.max_bytes)
    with chronq.open(args.path) as q:
        result = retain(q, policy, replication_source=args.replication_source or None, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    sys.stdout.writelines(f"{verb} {c} {p}\n" for c, p in result.deleted)
    if result.reasons:
        why = "; ".join(result.reasons)
        sys.stdout.write(f"protected from cycle {result.protected_from}: {why}\n")


def _archive(path: Path, dest: str, compress: str | None, keep: int, read_back: bool = False) -> None:
    """One line per cycle moved; the destination is printed as given (credentials never come from
    the command line but from the filesystem library's configuration)."""
    from chronq import archive

    if keep < 0:
        raise UsageError(f"--keep is not negative: {keep}")
    if not path.is_dir():
        raise ChronqError(f"{path}: no queue directory")
    from chronq.progress import Progress

    with Progress(None, f"archive {path} (bytes)") as bar:
        entries = archive.archive(path, dest, compress=compress, keep=keep, read_back=read_back,
                                  on_bytes=bar.update)
    for entry in entries:
        print(f"archived cycle {entry['cycle']} {entry['file']}: {entry['count']} excerpts, "
              f"{entry['size']} -> {entry['archive_size']} bytes", flush=True)
    from chronq.queue import open as open_queue
    from chronq.retention import protected_from

    with open_queue(path, readonly=True) as q:  # what readers still need stays, and why (on stderr:
        # stdout lists the cycles archived, one a line)
        limit, why = protected_from(q, newest=False)
    if limit is not None:
        print(f"protected from cycle {limit}: {'; '.join(why)}", file=sys.stderr, flush=True)


def _replicate(config: Path, host_id: int, status: bool = False, promote: bool = False) -> None:
    """Runs until SIGTERM or SIGINT, then stops every connection before returning (exit status 0).
    With `status`, prints what the running host last wrote to its status file instead. A configuration
    that does not fit exits 2, as any bad usage."""
    from chronq.replication.errors import ConfigError

    try:
        _replicate_run(config, host_id, status, promote)
    except ConfigError as e:  # a configuration that does not fit is bad usage, as a bad option is
        raise UsageError(f"{config}: {e}") from None


def _replicate_run(config: Path, host_id: int, status: bool, promote: bool) -> None:
    import logging
    import threading

    from chronq.replication import ReplicatedQueue
    from chronq.replication.status import format_status, read_status_file, status_file_path

    if status:
        print(format_status(read_status_file(status_file_path(config, host_id))))
        return

    logging.basicConfig(level=logging.INFO, format="%(asctime)s chronq replicate: %(message)s")
    # a peer gone mid-send must end that connection only: over TLS, OpenSSL writes to the socket itself
    # (no MSG_NOSIGNAL), so SIGPIPE's default action (set by `main` for pipes) would kill the host
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with ReplicatedQueue(config, host_id, status_file=status_file_path(config, host_id),
                         promote=promote) as rq:
        # one write of the whole line: other commands in the same terminal (the documented example
        # appends beside it) must not land between the text and its newline, as with print() unbuffered
        where = f", source listening on {rq.address[0]}:{rq.address[1]}" if rq.address else ""
        sys.stdout.write(f"chronq replicate: host {host_id} running{where}\n")
        sys.stdout.flush()
        while not done.wait(0.5):
            pass


def _table(path: Path) -> Path:
    from chronq.table import find_table_store

    store = find_table_store(path) if path.is_dir() else None
    if store is None:
        raise ChronqError(f"{path}: no queue directory (no metadata.cq4t)")
    return store


def _unlock(path: Path, force: bool) -> None:
    """Java's UnlockMain: clear a write (and append) lock whose owner died without releasing it.

    Without --force only an owner proven dead is unlocked: one that is alive, or that cannot be seen
    from here (a process in another PID namespace, such as a container sharing the volume), is not."""
    from chronq.table import APPEND_LOCK, UNLOCKED, WRITE_LOCK, TableStore

    with TableStore.open(_table(path)) as table:
        for key in (WRITE_LOCK, APPEND_LOCK):
            holder = table.get(key)
            if holder is None or holder == UNLOCKED:
                print(f"{key}: not locked")
                continue
            owner = table.lock_owner(holder)
            if not owner.dead and not force:
                raise ChronqError(f"{table.path}: {key} is held by {owner.description}; "
                                  "stop it first, or pass --force if it is not writing to this queue")
            if table.cas(key, holder, UNLOCKED):
                print(f"{key}: released (held by {owner.description})")
            else:
                print(f"{key}: changed while unlocking, left alone (run again)")


def _refresh(path: Path) -> None:
    """Java's RefreshMain: the listing keys say again which cycle files exist."""
    import chronq
    from chronq.table import TableStore

    # read before opening the queue: a writable open refreshes the listing itself
    with TableStore.open(_table(path), readonly=True) as store:
        before = (store.lowest_cycle, store.highest_cycle)
    with chronq.open(path) as q:
        table = q.table
        assert table is not None
        table.refresh_listing(q.fresh_cycles)
        after = (table.lowest_cycle, table.highest_cycle)
    print(f"lowestCycle {before[0]} -> {after[0]}, highestCycle {before[1]} -> {after[1]}")


def queue_stats(path: Path) -> dict[str, Any]:
    """What `chronq stats` shows (its --json object; docs/cli.md lists the fields)."""
    import chronq

    _table(path)
    with chronq.open(path, readonly=True) as q:
        cycles = []
        for c in q.fresh_cycles():
            f = q.file_for(c)
            st = f.stat() if f.exists() else None
            # a cycle file is sparse: its apparent size (`bytes`) is the mapping Java sizes it to, what
            # it takes on disk (`allocated`, st_blocks * 512) is what a user counts against a volume
            cycles.append({"cycle": c, "file": f.name, "count": q.count_in(c),
                           "bytes": st.st_size if st else 0, "allocated": st.st_blocks * 512 if st else 0})
        first, last = q.first_index, q.last_index
        end = last + 1 if last is not None else 0
        tailers = []
        table = q.table
        for key, value in sorted(table.items()) if table is not None else ():
            name = key[len("index."):]
            if not key.startswith("index.") or name.endswith((".version", ".lock")):
                continue  # (a replicated tailer's update counter and pid lock sit beside its index)
            behind = q.count_excerpts(value, end) if last is not None else 0
            tailers.append({"name": name, "index": value, "behind": behind})
        return {"queue": str(path), "roll_cycle": q.roll_cycle.name, "cycles": cycles,
                "first_index": first, "last_index": last, "count": sum(c["count"] for c in cycles),
                "bytes": sum(c["bytes"] for c in cycles), "allocated": sum(c["allocated"] for c in cycles),
                "tailers": tailers}


def _stats(path: Path, as_json: bool) -> None:
    st = queue_stats(path)
    if as_json:
        print(json.dumps(st))
        return
    hexed = {k: "-" if st[k] is None else f"0x{st[k]:x}" for k in ("first_index", "last_index")}
    print(f"queue {st['queue']}  roll cycle {st['roll_cycle']}  first {hexed['first_index']}  "
          f"last {hexed['last_index']}  messages {st['count']}  allocated bytes {st['allocated']}  "
          f"apparent bytes {st['bytes']}")
    _table_out(["cycle", "file", "messages", "allocated bytes", "apparent bytes"],
               [[c["cycle"], c["file"], c["count"], c["allocated"], c["bytes"]] for c in st["cycles"]])
    if st["tailers"]:
        _table_out(["named tailer", "next index", "behind"],
                   [[t["name"], f"0x{t['index']:x}", t["behind"]] for t in st["tailers"]])


def _table_out(header: list[str], rows: list[list[Any]]) -> None:
    """An aligned plain-text table: numbers right-aligned, text left-aligned."""
    cells = [header, *[[str(v) for v in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [all(isinstance(r[i], int) for r in rows) for i in range(len(header))]
    print()
    for r in cells:
        print("  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(r, widths, numeric, strict=True))
              .rstrip())


def load_object(spec: str, what: str) -> Any:
    """`module:name` (dots allowed in name) imported; a UsageError naming `what` if it is not there.

    The current directory is searched first, as `python -m` does, so a module next to the queue's
    scripts loads without installing it.
    """
    import os

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return plugins.load_object(spec, what)
    except plugins.LoadError as e:
        raise UsageError(_one_line(e)) from None


def _literal(text: str) -> Any:
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _decoder(spec: str) -> Callable[[bytes, int], list[dict[str, Any]]]:
    factory = entry_point("chronq.decoders", "interface")
    if factory is None:
        raise UsageError("--interface needs the rpc package (no 'chronq.decoders' entry point 'interface')")
    decode: Callable[[bytes, int], list[dict[str, Any]]] = factory(spec)
    return decode


def _start_last(q: Any, n: int) -> int | None:
    """The index N messages before the end (the first one for a shorter queue); None if empty."""
    from chronq.tailer import Direction

    back = q.tailer()
    back.direction = Direction.BACKWARD
    back.to_end()
    start = None
    for _ in range(n):
        ex = back.read()
        if ex is None:
            break
        start = ex.index
    back.close()
    return start


def _tail(args: argparse.Namespace) -> None:
    import chronq
    from chronq.tailer import Direction

    path: Path = args.path
    if args.reverse and (args.follow or args.named):
        raise UsageError("--reverse reads a finished range: not with -f or --named")
    if not path.is_dir():
        raise ChronqError(f"{path}: no queue directory")
    _require_queue(path)
    until = load_object(args.until, "--until predicate") if args.until else None
    decode = _decoder(args.interface) if args.interface else None
    with chronq.open(path, readonly=args.named is None) as q:
        tailer = q.tailer(args.named) if args.named else q.tailer()
        start: int | None = args.start
        if args.search is not None:
            key = load_object(args.search[0], "--search key function")
            start = q.bisect(key, _literal(args.search[1]))
            if start is None:  # every key is smaller: nothing to show
                tailer.direction = Direction.FORWARD
                tailer.to_end()
        elif args.last is not None:
            start = _start_last(q, args.last)
            if start is None or args.last == 0:
                tailer.to_end()
                start = None
        if args.reverse:
            tailer.direction = Direction.BACKWARD
            if start is None:
                tailer.to_end()
        if start is not None and not tailer.move_to_index(start):
            raise IndexNotFoundError(f"{path}: index 0x{start:x} is not in the queue")
        with _tail_progress(q, tailer, args) as bar:
            _tail_loop(tailer, args, until, decode, bar)


def _tail_loop(tailer: Any, args: argparse.Namespace, until: Callable[[Any], bool] | None,
               decode: Callable[[bytes, int], Any] | None, bar: Any) -> None:
    shown = 0
    out = sys.stdout
    while args.max is None or shown < args.max:
        excerpt = tailer.read()
        if excerpt is None:
            if not args.follow:
                return
            # asleep on the queue's doorbell until the next message is readable (bounded, so that an
            # interrupt is taken between waits whatever the platform's wait does with signals)
            tailer.wait(FOLLOW_WAIT)
            continue
        bar.advance()
        if until is not None and until(excerpt.payload):
            return
        message = _message(excerpt, decode, args.history or args.time, args.time)
        if args.include or args.exclude:  # on the message as the text form shows it, index left out
            one = _shown(message)
            if not all(r.search(one) for r in args.include) or any(r.search(one) for r in args.exclude):
                continue
        out.write(_render(message, "json" if args.json else "yaml" if args.yaml else "text",
                          bytes(excerpt.payload)))
        out.flush()
        shown += 1


def _tail_progress(q: Any, tailer: Any, args: argparse.Namespace) -> Any:
    """A progress bar over the messages a finite tail has to read (none while following)."""
    from chronq.progress import Progress, wanted

    total = None
    if wanted() and not args.follow:
        last = q.last_index
        if last is not None:
            start = tailer.index if tailer.index else (q.first_index or 0)
            total = (q.count_excerpts(start, last + 1) if not args.reverse
                     else q.count_excerpts(q.first_index or 0, start + 1))
    return Progress(total, f"tail {args.path}", force=None if total is not None else False)


def _local_time(nanos: int) -> str:
    """A history timing (System.nanoTime / time.monotonic_ns, this machine since boot) as local time."""
    import datetime

    wall = time.time_ns() - time.monotonic_ns() + nanos
    return datetime.datetime.fromtimestamp(wall / 1e9).astimezone().isoformat(timespec="microseconds")


def _message(excerpt: Any, decode: Callable[[bytes, int], list[dict[str, Any]]] | None,
             with_history: bool, with_time: bool) -> dict[str, Any]:
    """The JSON object `tail --json` prints (docs/cli.md lists its fields)."""
    from wire import text as wire_text
    from wire.history import read_history

    body = bytes(excerpt.payload)
    binary = wire_text.looks_binary(body)
    value: Any = None
    if binary:
        try:
            value = wire_text.json_value(body)
        except WireError:
            value = None
    try:
        text: str | None = body.decode("utf-8") if not binary else None
    except UnicodeDecodeError:
        text = None
    record: dict[str, Any] = {"index": excerpt.index, "cycle": excerpt.cycle, "seq": excerpt.seq,
                              "length": len(body), "text": text,
                              "hex": body.hex() if text is None else None, "value": value}
    if with_history:
        history = None
        if binary:
            try:
                h, _ = read_history(body)
            except WireError:
                h = None
            if h is not None:
                history = {"sources": [list(s) for s in h.sources], "timings": list(h.timings)}
                if with_time:
                    history["times"] = [_local_time(t) for t in h.timings]
        record["history"] = history
    if decode is not None:
        record["calls"] = decode(body, excerpt.index) if binary else None
    return record


def _shown(m: dict[str, Any]) -> str:
    """The message as one line: its calls, its text, its wire value as JSON, or its bytes in hex."""
    if m.get("calls") is not None:
        return "; ".join(f"{c['method']}{json.dumps(c['args'], ensure_ascii=False)}" for c in m["calls"])
    if m["text"] is not None:
        return str(m["text"]).replace("\n", "\\n")
    if m["value"] is not None:
        return json.dumps(m["value"], ensure_ascii=False)
    return str(m["hex"])


def _render(m: dict[str, Any], form: str, body: bytes) -> str:
    if form == "json":
        return json.dumps(m, ensure_ascii=False) + "\n"
    if form == "yaml":
        from wire import text as wire_text

        lines = [f"--- # index: 0x{m['index']:x}, cycle: {m['cycle']}, seq: {m['seq']}"]
        if m.get("calls"):
            for call in m["calls"]:
                lines.append(f"{call['method']}: {json.dumps(call['args'], ensure_ascii=False)}")
        elif m["value"] is not None or (m["text"] is None and wire_text.looks_binary(body)):
            try:
                lines.append(wire_text.render(body).rstrip("\n"))
            except WireError:
                lines.append(f"!!binary {m['hex']}")
        elif m["text"] is not None:
            lines.append(wire_text.quote(m["text"]))
        else:
            lines.append(f"!!binary {m['hex']}")
        if m.get("history"):
            lines.append(f"# history: {json.dumps(m['history'])}")
        return "\n".join(lines) + "\n"
    shown = _shown(m)
    extra = ""
    h = m.get("history")
    if h is not None:
        extra = f"\thistory: sources={h['sources']} timings={h.get('times', h['timings'])}"
    return f"0x{m['index']:x}\t{shown}{extra}\n"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
