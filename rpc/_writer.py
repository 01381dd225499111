"""Method writers: a Protocol becomes a generated class whose calls append Chronicle method documents.

The class source is generated once per (Protocol, history on/off, chained) and compiled with `exec`,
registered in `linecache` so tracebacks show it: real signatures, no `__getattr__`, no `*args` packing.
"""

from __future__ import annotations

import linecache
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from rpc import _codec
from rpc._history import current, current_get, first_hop, history_prefix
from rpc._interface import MethodSpec, describe
from wire import WireType

if TYPE_CHECKING:
    from typing_extensions import TypeForm

P = TypeVar("P")

Write = Callable[[bytearray], Any]
Clock = Callable[[], int]

_classes: dict[tuple[type, str, WireType], type] = {}
# names the generated code uses
_RESERVED = frozenset(
    {"self", "b_", "s_", "e_", "p_", "bytearray", "_seq_end", "_current_get", "_first_hop", "_argument_error"}
)


def writer(
    target: object,
    protocol: TypeForm[P],
    /,
    *,
    source_id: int | None = None,
    clock: Clock | None = None,
    wire: WireType = WireType.BINARY,
) -> P:
    """A writer that appends one document per call of a `protocol` method to `target`.

    `target` is a queue (its appender is used) or anything with `write(bytes-like)` (or
    `write_owned(bytes-like)`, preferred: it is handed a new object per document, never touched again,
    so it may keep it without a copy; a service's `Output` has one). With a non-zero
    `source_id` (default: the queue's) each document starts with a binary MessageHistory that carries
    forward the history of the message being handled on this thread, plus a timing from `clock`
    (default `time.monotonic_ns`, Java's `System.nanoTime` clock on Linux). `wire` other than BINARY
    encodes the arguments with that Python-only codec inside a BINARY bytes value (see docs/rpc.md).
    """
    proto: type = protocol  # type: ignore[assignment]
    write = _write_of(target)
    if source_id is None:
        queue = getattr(target, "queue", None)
        source_id = int(getattr(target, "source_id", None) or getattr(queue, "source_id", 0) or 0)
    if source_id:
        cls = _class(proto, "history", wire)
        now = clock or time.monotonic_ns
        return cls(write, now)  # type: ignore[no-any-return]  # `_start` is the clock here
    return _class(proto, "plain", wire)(write, None)  # type: ignore[no-any-return]


def _write_of(target: object) -> Write:
    """The target's `write`, or its `write_owned`: a generated writer hands over a new object per
    document and never touches it again, so a target that keeps documents (a service's output) can
    take that instead of copying through a Python `write`."""
    if hasattr(target, "appender"):
        target = target.appender()
    write = getattr(target, "write_owned", None) or getattr(target, "write", None)
    if not callable(write):
        kind = type(target).__name__
        raise TypeError(f"rpc.writer needs a queue or an object with write(bytes), got {kind}")
    return write  # type: ignore[no-any-return]


def _class(proto: type, mode: str, wire: WireType) -> type:
    key = (proto, mode, wire)
    cls = _classes.get(key)
    if cls is None:
        cls = _generate(proto, mode, wire)
        _classes[key] = cls
    return cls


def _chained(proto: type, wire: WireType) -> Callable[[Write, bytearray], object]:
    """Deferred so that Protocols may chain to each other (or themselves) without recursion at build."""

    def make(write: Write, buf: bytearray) -> object:
        return _class(proto, "chain", wire)(write, buf)

    return make


def _generate(proto: type, mode: str, wire: WireType) -> type:
    spec = describe(proto)
    cls_name = f"{proto.__name__}Writer" if mode != "chain" else f"{proto.__name__}ChainedWriter"
    namespace: dict[str, Any] = {"_seq_end": _codec.seq_end, "_current_get": current_get,
                                 "_first_hop": first_hop}
    lines = [
        f"class {cls_name}:",
        f'    """Generated method writer for {proto.__module__}.{proto.__qualname__} ({mode})."""',
        '    __slots__ = ("_write", "_start")',
        "    def __init__(self, write, start):",
        "        self._write = write",
        "        self._start = start",
    ]
    for m in spec.methods:
        lines += _method_source(m, mode, wire, namespace)
    if not spec.methods:
        lines.append("    pass")
    source = "\n".join(lines) + "\n"
    filename = f"<rpc generated {mode} {wire.name} writer {proto.__module__}.{proto.__qualname__}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    cls: type = namespace[cls_name]
    cls.__module__ = proto.__module__
    for m in spec.methods:
        method = cls.__dict__[m.name]
        if m.defaults:
            method.__defaults__ = m.defaults
        if mode == "history" and m.chain is None and not _codec.framed(wire):
            # the usual service answer in one C step (history, event, values, write), this method
            # for what it does not take (keywords, defaults)
            fast = _codec.history_call(m.event, tuple(tp for _, tp in m.params), wire, current,
                                       history_prefix, partial(_argument_error, m=m), method)
            if fast is not None:
                setattr(cls, m.name, fast)
    return cls


def _method_source(m: MethodSpec, mode: str, wire: WireType, ns: dict[str, Any]) -> list[str]:
    args = [name for name, _ in m.params]
    clash = [a for a in args if a in _RESERVED or a.startswith(("_E_", "_V_", "_C_", "_D_", "_M_"))]
    if clash:
        raise TypeError(f"{m.name}: parameter name {clash[0]!r} is reserved by the generated writer")
    ns[f"_E_{m.name}"] = _codec.event_bytes(m.event)
    ns["_argument_error"] = _argument_error
    ns[f"_M_{m.name}"] = m
    head = f"    def {m.name}(self{''.join(', ' + a for a in args)}):"
    body = _body_source(m, mode, wire, ns, args)
    # A try costs nothing until something raises (3.11+), so the fast path stays one C call; on a
    # failure the error is re-raised naming the method, the parameter and the type it expects.
    return [head, "        try:", *("    " + line for line in body),
            "        except (AttributeError, TypeError, ValueError, OverflowError) as e_:",
            f"            raise _argument_error(e_, ({''.join(a + ', ' for a in args)}), _M_{m.name})"]


def _argument_error(e: Exception, values: tuple[Any, ...], m: MethodSpec) -> Exception:
    """`e` with the method, parameter and expected type named: a TypeError when an argument is not
    of its declared type, else `e` itself with a note (a value out of range, say)."""
    import typing

    for (name, tp), value in zip(m.params, values, strict=True):
        origin = typing.get_origin(tp) or tp
        try:
            ok = isinstance(value, origin) or (origin is float and isinstance(value, int))
        except TypeError:  # a type isinstance cannot check (a Literal, a TypeVar): try encoding it
            try:
                _codec.value_encoder(tp)(bytearray(), value)
                ok = True
            except Exception:
                ok = False
        if not ok:
            expected = getattr(tp, "__name__", None) or str(tp)
            err = TypeError(f"{m.name}(): parameter {name!r} expects {expected}, got "
                            f"{type(value).__name__} {value!r:.60}")
            err.__cause__ = e
            return err
    e.add_note(f"while writing {m.name}({', '.join(n for n, _ in m.params)})")
    return e


def _body_source(m: MethodSpec, mode: str, wire: WireType, ns: dict[str, Any], args: list[str]) -> list[str]:
    body: list[str] = []
    whole: Callable[[bytes, Any], Any] | None = None
    if len(args) == 1:
        tp = m.params[0][1]
        whole = (
            _codec.document_encoder(tp)
            if wire is WireType.BINARY
            else _codec.framed_document(wire)
            if _codec.framed(wire)
            else None
        )
    if mode == "plain" and m.chain is None and whole is not None:  # the usual call: one C step
        ns[f"_D_{m.name}"] = whole
        body.append(f"        self._write(_D_{m.name}(_E_{m.name}, {args[0]}))")
        return body
    if mode == "plain":
        body.append(f"        b_ = bytearray(_E_{m.name})")
    elif mode == "history":
        # (`_history.history_prefix`, inlined: the history of the message being handled, if any)
        body.append("        p_ = _current_get()")
        body.append("        b_ = _first_hop(self._start()) if p_ is None else p_.prefix(self._start())")
        body.append(f"        b_ += _E_{m.name}")
    else:
        body.append("        b_ = self._start")
        body.append(f"        b_ += _E_{m.name}")
    if _codec.framed(wire):
        ns[f"_V_{m.name}"] = _codec.framed_encoder(wire)
        value = "None" if not args else args[0] if len(args) == 1 else f"({', '.join(args)},)"
        body.append(f"        _V_{m.name}(b_, {value})")
    elif not args:
        body.append("        b_ += b'\\xe0'")
    elif len(args) == 1:
        ns[f"_V_{m.name}_0"] = _codec.value_encoder(m.params[0][1], wire)
        body.append(f"        _V_{m.name}_0(b_, {args[0]})")
    else:
        body.append("        b_ += b'\\x82\\x00\\x00\\x00\\x00'")
        body.append("        s_ = len(b_)")
        for i, (a, tp) in enumerate(m.params):
            ns[f"_V_{m.name}_{i}"] = _codec.value_encoder(tp, wire)
            body.append(f"        _V_{m.name}_{i}(b_, {a})")
        body.append("        _seq_end(b_, s_)")
    if m.chain is None:
        body.append("        self._write(b_)")
    else:
        ns[f"_C_{m.name}"] = _chained(m.chain, wire)
        body.append(f"        return _C_{m.name}(self._write, b_)")
    return body
