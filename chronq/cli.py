"""The `chronq` command: dump, append and tail a queue from the shell.

Exit status: 0 success, 2 bad usage, 1 a queue error (one line on stderr naming the file and offset).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from chronq.errors import ChronqError, IndexNotFoundError
from wire.errors import WireError

__all__ = ["main"]


class _UsageError(Exception):
    """Bad input from the command line or stdin (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _index(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an index: {text!r} (decimal or 0x hex)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an index is not negative: {text}")
    return value


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
    t = sub.add_parser("tail", help="print messages with their index")
    t.add_argument("path", type=Path)
    t.add_argument("-f", "--follow", action="store_true", help="keep waiting for new messages")
    t.add_argument("--from", dest="start", type=_index, metavar="INDEX", help="start at this index")
    t.add_argument("--named", metavar="NAME", help="named tailer: resume where it stopped, and persist")
    t.add_argument("--json", action="store_true", help="one JSON object per message")
    r = sub.add_parser("replicate", help="run this host's part of a replication cluster until SIGTERM/SIGINT")
    r.add_argument("config", type=Path, help="QueueReplicationCfg YAML file (see docs/replication.md)")
    r.add_argument("--host-id", type=int, required=True, metavar="N", help="this host's hostId")
    r.add_argument("--status", action="store_true",
                   help="print the links of the running host N (replicated and acknowledged indexes, lag) "
                        "and exit")
    _history_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `chronq dump q | head` ends quietly
    try:
        if args.command == "dump":
            _dump(args.path, args.json)
        elif args.command == "replicate":
            _replicate(args.config, args.host_id, args.status)
        elif args.command == "history":
            _history(args)
        elif args.command == "append":
            _append(args.path, args.roll_cycle, args.hex)
        else:
            _tail(args.path, args.follow, args.start, args.named, args.json)
    except _UsageError as e:
        print(f"chronq {args.command}: {e}", file=sys.stderr)
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
    from chronq import history

    if args.ignore < 0:
        raise _UsageError(f"--ignore must be >= 0, not {args.ignore}")
    if args.interval is not None and not args.interval > 0:
        raise _UsageError(f"--interval must be > 0 seconds, not {args.interval}")
    rep = history.analyze(args.queues, ignore=args.ignore, interval=args.interval, by_method=args.by_method)
    sys.stdout.write(history.format_table(rep, args.unit))
    if args.csv is not None:
        history.write_csv(rep, args.csv, args.unit)
    if args.plot is not None:
        try:
            history.plot(rep, args.plot, args.unit)
        except ChronqError as e:  # the table and CSV are still worth having without the plot extra
            print(f"chronq history: plot skipped: {_one_line(e)}", file=sys.stderr)


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return " ".join(text.split())


def _dump(path: Path, as_json: bool) -> None:
    from chronq import dump

    out = sys.stdout
    if as_json:
        for record in dump.dump_records(path):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        for chunk in dump.dump_lines(path):
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
            raise _UsageError(str(e)) from None
    payloads = []
    for number, line in enumerate(sys.stdin.buffer, 1):
        line = line.rstrip(b"\r\n")
        if as_hex:
            try:
                line = bytes.fromhex(line.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                raise _UsageError(f"stdin line {number} is not hex: {line[:40]!r}") from None
        payloads.append(line)
    with chronq.open(path, roll_cycle=roll_cycle) as q:
        appender = q.appender()
        with appender.atomic():
            indexes = [appender.write(p) for p in payloads]
    sys.stdout.writelines(f"0x{i:x}\n" for i in indexes)


def _replicate(config: Path, host_id: int, status: bool = False) -> None:
    """Runs until SIGTERM or SIGINT, then stops every connection before returning (exit status 0).
    With `status`, prints what the running host last wrote to its status file instead."""
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
    with ReplicatedQueue(config, host_id, status_file=status_file_path(config, host_id)) as rq:
        print(f"chronq replicate: host {host_id} running" +
              (f", source listening on {rq.address[0]}:{rq.address[1]}" if rq.address else ""), flush=True)
        while not done.wait(0.5):
            pass


def _tail(path: Path, follow: bool, start: int | None, named: str | None, as_json: bool) -> None:
    import chronq

    if not path.is_dir():
        raise ChronqError(f"{path}: no queue directory")
    with chronq.open(path, readonly=named is None) as q:
        tailer = q.tailer(named) if named else q.tailer()
        if start is not None and not tailer.move_to_index(start):
            raise IndexNotFoundError(f"{path}: index 0x{start:x} is not in the queue")
        while True:
            excerpt = tailer.read()
            if excerpt is None:
                if not follow:
                    return
                time.sleep(0.01)
                continue
            sys.stdout.write(_excerpt_line(excerpt, as_json))
            sys.stdout.flush()


def _excerpt_line(excerpt: Any, as_json: bool) -> str:
    from wire import text as wire_text

    body = bytes(excerpt.payload)
    value: Any = None
    if wire_text.looks_binary(body):
        try:
            value = wire_text.json_value(body)
        except WireError:
            value = None
    try:
        text: str | None = body.decode("utf-8") if not wire_text.looks_binary(body) else None
    except UnicodeDecodeError:
        text = None
    if as_json:
        record = {"index": excerpt.index, "cycle": excerpt.cycle, "seq": excerpt.seq, "length": len(body),
                  "text": text, "hex": body.hex() if text is None else None, "value": value}
        return json.dumps(record, ensure_ascii=False) + "\n"
    if text is not None:
        shown = text.replace("\n", "\\n")
    elif value is not None:
        shown = json.dumps(value, ensure_ascii=False)
    else:
        shown = body.hex()
    return f"0x{excerpt.index:x}\t{shown}\n"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
