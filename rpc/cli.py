"""The parts of the `chronq` command that need typed Protocols: `chronq write` and `tail --interface`.

chronq may not import rpc (imports point rpc -> chronq -> wire), so `chronq.cli` finds these through
the entry points this package declares in pyproject.toml: ``chronq.commands`` → `register` (adds the
``write`` subcommand), ``chronq.decoders`` → `interface_decoder` (what ``tail --interface`` calls) and
`interface_calls` (what the Spark source's typed ``args`` column decodes with).

`chronq write QUEUE FILE.yaml...` is Chronicle's ChronicleWriterMain: each YAML document becomes
method calls, the method named by the document's top-level key(s) (``say: hello``) or by
``--method NAME`` (then the whole document is the argument). With ``--interface module:Class`` the
arguments are converted to the Protocol's parameter types and written by `rpc.writer`, byte for byte
what a Python or Java method writer writes; without it they are written in wire's generic encoding.
Each file is one `atomic()` block: a bad document in it writes nothing of that file.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from chronq.cli import UsageError, load_object
from rpc._interface import MethodSpec, describe, is_protocol
from rpc._reader import MethodReader
from rpc._writer import writer
from wire import WireError
from wire.methods import encode_call
from wire.text import from_yaml_all

__all__ = ["interface_calls", "interface_decoder", "register"]


def _protocol(spec: str) -> type:
    proto = load_object(spec, "--interface")
    if not is_protocol(proto):
        raise UsageError(f"--interface {spec}: {proto!r} is not a typing.Protocol")
    try:
        describe(proto)
    except TypeError as e:
        raise UsageError(f"--interface {spec}: {e}") from None
    return proto  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    """An argument as JSON-able data (dataclasses, attrs classes and Structs become maps)."""
    try:
        return msgspec.to_builtins(value, str_keys=True, enc_hook=repr)
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def interface_decoder(spec: str) -> Callable[[bytes, int], list[dict[str, Any]] | None]:
    """``decode(payload, index)``: the calls a document holds, typed through the Protocol `spec`
    (``module:Class``), as ``[{"method": name, "args": [...]}]``; an event the Protocol does not
    declare is listed with ``"args": None``. None for a document that is not a method call."""
    proto = _protocol(spec)
    calls: list[dict[str, Any]] = []

    class _Recorder:
        # Records every call; returning itself lets a chained call (a.b().c()) record each step.
        def __getattr__(self, name: str) -> Callable[..., Any]:
            if name.startswith("_"):
                raise AttributeError(name)

            def record(*args: Any) -> _Recorder:
                calls.append({"method": name, "args": [_plain(a) for a in args]})
                return self

            return record

    def unknown(event: str | int, index: int) -> None:
        calls.append({"method": event, "args": None})

    reader = MethodReader(None, _Recorder(), interfaces=[proto], on_unknown=unknown, source_id=0)

    def decode(payload: bytes, index: int) -> list[dict[str, Any]] | None:
        calls.clear()
        try:
            reader.dispatch(payload, index)
        except (WireError, msgspec.ValidationError):
            return None
        return list(calls)

    return decode


class _Capture:
    """A handler for every method of a Protocol that records the decoded call instead of acting on it."""

    def __init__(self, names: list[str], got: list[tuple[str, tuple[Any, ...]]]) -> None:
        for name in names:
            setattr(self, name, functools.partial(self._call, got, name))

    @staticmethod
    def _call(got: list[tuple[str, tuple[Any, ...]]], name: str, *args: Any) -> None:
        got.append((name, args))


def _ignore(event: str | int, index: int) -> None:
    """An event the Protocol does not declare is no call of it."""


CallDecoder = Callable[[Any], "tuple[str, tuple[Any, ...]] | None"]


def interface_calls(proto: type) -> tuple[tuple[MethodSpec, ...], CallDecoder]:
    """The ``chronq.decoders`` entry point ``interface_calls``, for the Spark source's typed ``args``
    column: the methods of Protocol `proto`, and ``decode(body) -> (method, args)`` of the first call
    of one of them in a document body (None if it holds none); the values are those rpc's method
    reader passes a handler. A TypeError if `proto` is not an interface rpc can describe; `decode`
    raises when a call of the interface has arguments that do not decode."""
    methods = describe(proto).methods
    got: list[tuple[str, tuple[Any, ...]]] = []
    reader = MethodReader(None, _Capture([m.name for m in methods], got), interfaces=[proto],
                          on_unknown=_ignore, source_id=0)

    def decode(body: Any) -> tuple[str, tuple[Any, ...]] | None:
        got.clear()
        reader.dispatch(body)
        return got[0] if got else None

    return methods, decode


# ------------------------------------------------------------------------------------------- write
def register(sub: Any) -> None:
    """Add ``write`` and ``services`` to the `chronq` subcommands (the ``chronq.commands`` entry point)."""
    w = sub.add_parser("write", help="write YAML documents as method calls (Chronicle's queue writer)")
    w.add_argument("path", type=Path, metavar="QUEUE")
    w.add_argument("files", type=Path, nargs="+", metavar="FILE.yaml")
    w.add_argument("--method", metavar="NAME", help="call NAME with each whole document as its argument")
    w.add_argument("--interface", metavar="MODULE:CLASS",
                   help="convert arguments to this Protocol's parameter types and write with its writer")
    w.add_argument("--roll-cycle", default=None, metavar="NAME", help="roll cycle of a new queue")
    w.set_defaults(run=_write)
    from rpc.services.cli import register as services

    services(sub)  # `chronq services run|status|promote` (docs/services.md)


def _calls(doc: Any, method: str | None, where: str) -> list[tuple[str, Any]]:
    if method is not None:
        return [(method, doc)]
    if not isinstance(doc, dict) or not doc:
        raise UsageError(f"{where}: expected `method: argument` entries (or give --method NAME), "
                         f"got {type(doc).__name__}")
    return [(str(k), v) for k, v in doc.items()]


def _arguments(m: MethodSpec, value: Any, where: str) -> list[Any]:
    """The YAML value of a call as the method's typed arguments: one parameter takes the whole value,
    several take a sequence (positional) or a map (by parameter name)."""
    params = m.params
    if not params:
        raw: list[Any] = []
    elif len(params) == 1:
        raw = [value]
    elif isinstance(value, list):
        raw = value
    elif isinstance(value, dict):
        missing = [n for n, _ in params if n not in value]
        if missing:
            raise UsageError(f"{where}: {m.name}() is missing parameter {missing[0]!r}")
        raw = [value[n] for n, _ in params]
    else:
        names = ", ".join(n for n, _ in params)
        raise UsageError(f"{where}: {m.name}({names}) takes a sequence or a map of its parameters")
    if len(raw) > len(params):
        raise UsageError(f"{where}: {m.name}() takes {len(params)} arguments, got {len(raw)}")
    out = []
    for (name, tp), v in zip(params, raw, strict=False):
        try:
            out.append(msgspec.convert(v, tp, strict=False))
        except (msgspec.ValidationError, TypeError) as e:
            raise UsageError(f"{where}: {m.name}() parameter {name!r} expects "
                             f"{getattr(tp, '__name__', tp)}: {e}") from None
    return out


class _Discard:
    """A method writer's target that keeps nothing: encoding a call into it checks that it encodes."""

    def write(self, data: bytes) -> None:
        pass


def _check_encodes(proto: type | None, name: str, value: Any, where: str) -> None:
    """UsageError (naming the document and method) for a call whose values wire cannot encode (an
    integer beyond 64 bits, say), found before anything is written rather than half-way."""
    try:
        if proto is not None:
            getattr(writer(_Discard(), proto, source_id=0), name)(*value)
        else:
            encode_call([(name, value)])
    except (WireError, ValueError, OverflowError, TypeError) as e:
        raise UsageError(f"{where}: {name}: {e}") from None


def _write(args: argparse.Namespace) -> None:
    import chronq

    proto = _protocol(args.interface) if args.interface else None
    methods = describe(proto).by_name() if proto is not None else {}
    batches: list[tuple[Path, list[tuple[str, Any]]]] = []
    for f in args.files:  # every file is read and checked before anything is written
        try:
            docs = from_yaml_all(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, WireError) as e:
            raise UsageError(f"{f}: {e}") from None
        calls = []
        for n, doc in enumerate(docs, 1):
            for name, value in _calls(doc, args.method, f"{f} document {n}"):
                if proto is not None:
                    if name not in methods:
                        raise UsageError(f"{f} document {n}: {proto.__name__} has no method {name!r}")
                    value = _arguments(methods[name], value, f"{f} document {n}")
                _check_encodes(proto, name, value, f"{f} document {n}")
                calls.append((name, value))
        batches.append((f, calls))
    from chronq.progress import Progress

    with chronq.open(args.path, roll_cycle=args.roll_cycle) as q, \
            Progress(sum(len(c) for _, c in batches), f"write {args.path}") as bar:
        appender = q.appender()
        typed = writer(appender, proto) if proto is not None else None
        for f, calls in batches:
            with appender.atomic():
                for name, value in calls:
                    if typed is not None:
                        getattr(typed, name)(*value)
                    else:
                        appender.write(encode_call([(name, value)]))
                    bar.advance()
            print(f"{f}: {len(calls)} calls", file=sys.stderr)
