"""Method readers: decode each document's event and arguments once, call every handler that has it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from rpc import _codec
from rpc._codec import event_call as _event_call
from rpc._history import Pending, current
from rpc._interface import MethodSpec, describe, is_protocol
from wire import WireType, unknown_types

if TYPE_CHECKING:
    from chronq.tailer import ExcerptLike, Reader

log = logging.getLogger("rpc")

UnknownHook = Callable[[str | int, int], None]
UnknownTypeHook = Callable[[str, str | int, int], None]
MetadataHandler = Callable[[memoryview, int], None]
PoisonHook = Callable[[int, bytes, "_codec.WireError"], None]
"""`on_poison(index, document, error)`: a document that is not a method call or does not decode."""


def log_poison(index: int, document: bytes, error: Exception) -> None:
    """An `on_poison` hook that logs the document (as Java's method reader does) and carries on."""
    log.warning("skipped the document at index %#x (%d bytes, starts %r): %s", index, len(document),
                document[:16], error)


def _log_unknown(event: str | int, index: int) -> None:
    log.debug("no handler for event %r at index %#x; skipped", event, index)


def _log_unknown_type(type_name: str, event: str | int, index: int) -> None:
    log.debug("unregistered type !%s in event %r at index %#x; kept undecoded", type_name, event, index)


@dataclass
class _Entry:
    """How to decode one event's arguments and whom to call with them."""

    name: str
    event: str | int
    decode: Callable[[Any, int], tuple[tuple[Any, ...], int]]
    chain: type | None
    targets: list[Callable[..., Any]] = field(default_factory=list)


def _parameter_error(method: str, param: tuple[str, Any], e: Exception) -> Exception:
    """`e` (a value that does not convert to the parameter's type) naming the method, the parameter and
    its type; `_deliver` adds a note with the document's index."""
    name, tp = param
    return _codec.WireError(f"{method}() parameter {name!r} expects {getattr(tp, '__name__', tp)}: {e}")


def _decoder(
    params: Sequence[tuple[str, Any]], defaults: tuple[Any, ...] = (), wire: WireType = WireType.BINARY,
    method: str = "",
) -> Callable[[Any, int], tuple[tuple[Any, ...], int]]:
    """Arguments at `pos`: one value, a sequence of values, or (no parameters) one ignored value, as
    Java's method writer writes them (docs/rpc.md, Writing); returns them with the position after them.
    A sequence shorter than the parameters (an older writer) takes the trailing defaults; longer (a
    newer writer) has its extras ignored."""
    reader = _codec.reader_at
    if _codec.framed(wire) and params:
        types = tuple(tp for _, tp in params)
        get = _codec.framed_decoder(wire, types[0] if len(types) == 1 else tuple[types])  # type: ignore[valid-type]
        if len(types) == 1:

            def framed_one(buf: Any, pos: int) -> tuple[tuple[Any, ...], int]:
                v, end = get(buf, pos)
                return (v,), end

            return framed_one

        def framed(buf: Any, pos: int) -> tuple[tuple[Any, ...], int]:
            v, end = get(buf, pos)
            return tuple(v), end

        return framed
    if not params:

        def none(buf: Any, pos: int) -> tuple[tuple[Any, ...], int]:
            if pos < len(buf) and buf[pos] == 0xE0:  # the usual empty text
                return (), pos + 1
            r = reader(buf, pos)
            if r.has_more():
                r.skip_value()
            return (), r.position

        return none
    if len(params) == 1:
        one = _codec.value_decoder(params[0][1], wire)

        def single(buf: Any, pos: int) -> tuple[tuple[Any, ...], int]:
            r = reader(buf, pos)
            try:
                return (one(r),), r.position
            except _codec.WireError as e:
                raise _parameter_error(method, params[0], e) from None

        return single
    decs = [_codec.value_decoder(tp, wire) for _, tp in params]

    required = len(params) - len(defaults)

    def many(buf: Any, pos: int) -> tuple[tuple[Any, ...], int]:
        r = reader(buf, pos)
        s = _codec.enter_sequence(r)
        args = []
        for param, d in zip(params, decs, strict=True):
            if not s.has_more():
                break
            try:
                args.append(d(s))
            except _codec.WireError as e:
                raise _parameter_error(method, param, e) from None
        if len(args) < len(decs):
            if len(args) < required:
                raise _codec.WireError(f"{len(args)} arguments where {required} are needed", pos)
            args += defaults[len(args) - required :]
        return tuple(args), r.position

    return many


def _handler_specs(handler: object, interfaces: Sequence[type]) -> dict[str, MethodSpec]:
    """Message methods of `handler`: the methods of the Protocols its class declares (lists in its
    bases) and of `interfaces`, that the handler has.

    Only those: the event names come from the queue, which may hold anything anyone appended, so a
    handler's other public methods (`reset`, `close`, ...) must not be callable by naming them in a
    document, as Java's readers dispatch only the methods of the interfaces a handler implements.
    A handler with no Protocol at all is refused here rather than left to dispatch nothing."""
    declared = [c for c in type(handler).__mro__ if is_protocol(c)]
    protos = declared + [p for p in interfaces if p not in declared]
    if not protos:
        kind = type(handler).__name__
        raise TypeError(
            f"rpc.reader: {kind} declares no Protocol, so no event may call its methods; "
            f"declare the interface it implements (class {kind}(SomeProtocol): ...) "
            f"or pass it: rpc.reader(tailer, handler, interfaces=[SomeProtocol])"
        )
    specs: dict[str, MethodSpec] = {}
    for proto in protos:
        for m in describe(proto).methods:
            if m.name.startswith("_"):  # (describe skips them already; never let one through)
                continue
            if callable(getattr(handler, m.name, None)):
                specs.setdefault(m.name, m)
    if not specs and any(describe(p).methods for p in protos):  # (a typo, or the wrong handler)
        names = ", ".join(p.__name__ for p in protos)
        raise TypeError(f"rpc.reader: {type(handler).__name__} has no method of {names}")
    return specs


class MethodReader:
    """Reads documents from a tailer and calls the handlers' methods named by each document's event.

    The tailer is any `chronq.Reader` (a `chronq.Tailer`, an acknowledged or an archive tailer); with
    a `metadata_handler` it must be a `chronq.Tailer` (whose `read(metadata=True)` returns metadata
    documents too). None builds a reader fed only through `dispatch` (replay tests, decoders).

    Only methods of the Protocols a handler's class declares, or of `interfaces`, are ever called:
    event names are queue data, so no other method (public, `_private` or dunder) may be reachable
    from them. A handler with no Protocol either way is a TypeError here.

    Unknown events never stop the reader: they go to `on_unknown(event, index)` (default: a debug log)
    and nothing is instantiated for them. An argument whose `!type` names no registered class is kept
    (as a `wire.Typed`, or read field by field as the declared class), the handlers still run, and
    the name goes to `on_unknown_type(type_name, event, index)` first. With a `source_id` (default:
    the tailer's queue's), the message's history gains (source_id, index) and the read time, as
    Chronicle's readers do.

    A *poison* document (not a method call, or arguments that do not decode: a `WireError`) raises
    out of `read_one`/`read_many` by default, after it was consumed; with `on_poison` it goes to
    `on_poison(index, document, error)` instead (`rpc.log_poison` logs it, as Java's reader does) and
    reading goes on.
    """

    read_one: Callable[[], bool]
    """Consume one document if there is one (True), dispatching it; False when none is ready. While no
    history, metadata handler or source id needs Python per message, this is one native call."""

    def __init__(
        self,
        tailer: Reader | None,
        *handlers: object,
        interfaces: Sequence[type] = (),
        on_unknown: UnknownHook | None = None,
        on_unknown_type: UnknownTypeHook | None = None,
        metadata_handler: MetadataHandler | None = None,
        source_id: int | None = None,
        clock: Callable[[], int] | None = None,
        wire: WireType = WireType.BINARY,
        on_poison: PoisonHook | None = None,
    ) -> None:
        if not handlers:
            raise TypeError("rpc.reader needs at least one handler")
        self.tailer = tailer
        self.on_unknown = on_unknown or _log_unknown
        self.on_unknown_type = on_unknown_type or _log_unknown_type
        self.on_poison = on_poison
        if source_id is None:
            source_id = int(getattr(getattr(tailer, "queue", None), "source_id", 0) or 0)
        self.clock = clock or time.monotonic_ns
        self._entries: dict[str | int, _Entry] = {}
        fast: dict[bytes, tuple[_Entry, Any]] = {}
        for h in handlers:
            for name, m in _handler_specs(h, interfaces).items():
                entry = self._entries.get(m.event)
                if entry is None:
                    entry = _Entry(name, m.event, _decoder(m.params, m.defaults, wire, m.name), m.chain)
                    self._entries[m.event] = entry
                    if m.chain is None and isinstance(m.event, str):
                        plan = _codec.fast_plan(m.params, wire)
                        if plan is not None:
                            fast[m.event.encode("latin-1")] = (entry, plan)
                entry.targets.append(getattr(h, name))
        # events the C fast path looks up, decodes and delivers in one step: one structured argument or
        # scalar arguments (BINARY), or one framed argument (another wire type)
        self._fast = {name: (e, plan, tuple(e.targets)) for name, (e, plan) in fast.items()}
        self._by_name = {e.encode("latin-1"): v for e, v in self._entries.items() if isinstance(e, str)}
        self._chains: dict[type, dict[str | int, _Entry]] = {}
        self.wire = wire
        self._metadata_handler = metadata_handler
        self._source_id = source_id
        self._arm()

    @property
    def source_id(self) -> int:
        """Added with the read index to each message's history (0: none)."""
        return self._source_id

    @source_id.setter
    def source_id(self, value: int) -> None:
        self._source_id = value
        self._arm()

    @property
    def metadata_handler(self) -> MetadataHandler | None:
        """Called with metadata documents' bodies and indexes (None: they are skipped)."""
        return self._metadata_handler

    @metadata_handler.setter
    def metadata_handler(self, value: MetadataHandler | None) -> None:
        self._metadata_handler = value
        self._arm()

    def _arm(self) -> None:
        """Choose `read_one`: the native one when the fast table applies to plain data documents."""
        read = getattr(self.tailer, "read", None)
        if read is not None and self._fast and self._metadata_handler is None:
            # a chronq tailer whose read() is the native one is read without a Python call
            document_source = getattr(self.tailer, "document_source", None)
            source = document_source() if document_source is not None else None
            self.read_one = _codec.read_one(
                read, self._fast, current, self._read_slow, Pending, self.clock, self._source_id, source
            )
        else:
            self.read_one = self._read_general

    def read_many(self, limit: int) -> int:
        """Consume and dispatch up to `limit` ready documents, as that many `read_one()` calls would;
        returns how many (0: none was ready). Where `read_one` is native the whole batch runs in C,
        without a Python call per document: for catching up, replaying, an event loop's turn. A
        handler's exception propagates after the documents before it were consumed."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        many = getattr(self.read_one, "many", None)
        if many is not None:
            return int(many(limit))
        read_one, n = self.read_one, 0
        while n < limit and read_one():
            n += 1
        return n

    def _read_general(self) -> bool:
        tailer = self.tailer
        if tailer is None:
            raise TypeError("this MethodReader has no tailer to read: feed it with dispatch()")
        if self._metadata_handler is not None:
            # with a metadata handler the tailer is a chronq.Tailer (see the class docstring)
            ex = cast("Callable[[bool], ExcerptLike | None]", tailer.read)(True)
        else:
            ex = tailer.read()
        if ex is None:
            return False
        return self.take(ex)

    def _read_slow(self, got: Any) -> bool:
        """What the native `read_one` leaves to Python (see `rpc._codec.read_one`)."""
        if type(got) is tuple:  # a handler raised
            ex, err = got
            if isinstance(err, _codec.WireError):
                self._note(err, ex.payload, ex.index)
                if self.on_poison is not None:
                    self.on_poison(ex.index, bytes(ex.payload), err)
                    return True
            raise err
        return self.take(got)

    def take(self, ex: ExcerptLike) -> bool:
        """Dispatch one excerpt the caller read itself (a metadata one goes to the metadata handler),
        as `read_one` would have: for a caller that chooses which tailer to read next."""
        if ex.metadata:
            if self._metadata_handler is not None:
                self._metadata_handler(memoryview(ex.payload), ex.index)
            return True
        if self.on_poison is None:
            self.dispatch(ex.payload, ex.index)
            return True
        try:
            self.dispatch(ex.payload, ex.index)
        except _codec.WireError as e:
            self.on_poison(ex.index, bytes(ex.payload), e)
        return True

    def dispatch(self, payload: Any, index: int = 0) -> None:
        """Decode one document body and call the handlers; usable without a queue (replay tests)."""
        fast = self._fast
        if fast:
            if not self._source_id and current.get() is None:  # no history to set
                try:
                    if _event_call(payload, fast) is not None:  # (not for a document with a history)
                        return
                except _codec.WireError as e:
                    self._note(e, payload, index)
                    raise
            hit = _codec.event_value(payload, fast)
            if hit is not None:
                self._deliver(hit[0], hit[1], hit[3], index)  # hit[3]: a carried history's payload
                return
        self._dispatch(payload, index)

    def _note(self, e: Exception, payload: Any, index: int) -> None:
        """Name the event of a document the C fast path delivered (a handler raised `e`)."""
        _, pos = _codec.read_history(payload)  # (the document may start with one)
        event, _ = _codec.event_at(payload, pos)
        entry = self._entries.get(event) if event is not None else None
        name = entry.name if entry is not None else event
        e.add_note(f"while decoding event {name!r} of the document at index {index:#x}")

    def _dispatch(self, payload: Any, index: int) -> None:
        """Every document the C fast path does not take: history, method ids, several or unusual
        arguments, chained calls, unknown events, other wires, bad bytes (reported here)."""
        # inline fast path for the usual `B9 <short name>` start without history; the rest in _codec
        k = payload[1] if len(payload) > 1 and payload[0] == 0xB9 else 0
        if 0 < k < 0x80 and 2 + k <= len(payload) and (k != 7 or payload[2:9] != b"history"):
            pos = 2 + k
            carried, event, name = None, None, payload[2:pos]
            try:  # bytes and read-only memoryviews hash alike: no copy
                entry = self._by_name.get(name)
            except (TypeError, ValueError):  # bytearray, writable memoryview
                entry = self._by_name.get(bytes(name))
        else:
            try:
                carried, pos = _codec.read_history(payload)
                event, pos = _codec.event_at(payload, pos)
            except _codec.WireError as e:  # raw bytes or text someone appended: say which document
                head = bytes(payload[:16])
                raise _codec.WireError(
                    f"the document at index {index:#x} is not a method call (starts {head!r}): {e}"
                ) from e
            if event is None:
                return
            entry = self._entries.get(event)
        if entry is None:
            self.on_unknown(str(payload[2:pos], "latin-1") if event is None else event, index)
            return
        self._deliver(entry, None, carried, index, payload, pos)

    def _deliver(
        self,
        entry: _Entry,
        args: tuple[Any, ...] | None,
        carried: Any,
        index: int,
        payload: Any = None,
        pos: int = 0,
    ) -> None:
        """Call the entry's handlers with `args` (decoded here from `payload` at `pos` when None),
        with the message's history current on this thread while they run."""
        history = None
        if self._source_id:
            history = Pending(carried, (self._source_id, index), self.clock())
        elif carried is not None:
            history = Pending(carried, None, 0)
        token = current.set(history)
        try:
            if args is None:
                args, pos = self._decode(entry, payload, pos, index)
            if entry.chain is None:
                for t in entry.targets:
                    t(*args)
            else:
                self._chain(payload, pos, entry, [t(*args) for t in entry.targets], index)
        except _codec.WireError as e:
            e.add_note(f"while decoding event {entry.name!r} of the document at index {index:#x}")
            raise
        finally:
            current.reset(token)

    def _decode(self, entry: _Entry, payload: Any, pos: int, index: int) -> tuple[tuple[Any, ...], int]:
        """`entry`'s arguments at `pos`, reporting any unregistered `!type` in them. (The C fast paths
        give up on type prefixes, so every such document is decoded here.)"""
        with unknown_types() as names:
            decoded = entry.decode(payload, pos)
        for name in names:
            self.on_unknown_type(name, entry.event, index)
        return decoded

    def _chain(self, payload: Any, pos: int, entry: _Entry, results: list[Any], index: int) -> None:
        """Continue a chained call (`a.b().c()` in one document) on what each handler returned."""
        chain = entry.chain
        while chain is not None:
            nexts = [x for x in results if x is not None]
            if not nexts:
                return  # every handler chose to ignore the rest of the document
            event, pos = _codec.event_at(payload, pos)
            if event is None:
                return
            table = self._chains.get(chain)
            if table is None:
                wire = self.wire
                table = {
                    m.event: _Entry(m.name, m.event, _decoder(m.params, m.defaults, wire, m.name), m.chain)
                    for m in describe(chain).methods
                }
                self._chains[chain] = table
            step = table.get(event)
            if step is None:
                self.on_unknown(event, index)
                return
            args, pos = self._decode(step, payload, pos, index)
            steps = [f for x in nexts if callable(f := getattr(x, step.name, None))]
            if not steps:  # what the handlers returned does not take this step
                self.on_unknown(event, index)
                return
            results = [f(*args) for f in steps]
            chain = step.chain


reader = MethodReader
"""``rpc.reader(tailer, *handlers, ...)``: a `MethodReader` over `tailer` calling `handlers` (the same
callable, so its options are defined once; see `MethodReader`)."""
