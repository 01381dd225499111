"""The services file (``services.yaml``): which queues exist and which services run between them.

    queues:
      orders:    { path: data/orders, sourceId: 1, rollCycle: FAST_DAILY }
      fills:     { path: data/fills, sourceId: 2, codec: { encryption: aes-gcm }, keys: "mypkg.keys:RING" }
      positions: { path: data/positions, sourceId: 3 }
      matching-snapshots: { path: data/matching-snapshots }
    services:
      matching:
        factory: examples.orders.matching:make_engine    # called factory(output, **config)
        inputs: [orders]
        output: fills
        start: missed                                     # all | new | missed | an index
        snapshot: { queue: matching-snapshots, messages: 10000, seconds: 5 }
        batch: 256                                        # messages per poll at most (what is ready)
        config: { symbols: [AAPL, MSFT] }
    runner: { maxCrashes: 5, crashWindowSeconds: 60, backoffSeconds: 0.1, maxBackoffSeconds: 5 }
    replication: { config: cluster.yaml }                 # optional: standby on the other hosts

Relative paths are taken from the file's folder. A queue of a replicated cluster is named by its
replication name instead of a path (``orders: { replicated: orders, sourceId: 1 }``): its folder is the
host's source or sink copy, as the replication configuration places it. Every mistake is a
`ServicesConfigError` naming the key: an unknown key (with the nearest known one), a queue a service
names that is not declared, a factory that does not import, a service whose output is one of its own
inputs, two services writing one output, two queues with one source id.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chronq.errors import ChronqError
from rpc.service import DEFAULT_BATCH

__all__ = ["QueueSpec", "RunnerSpec", "ServiceSpec", "ServicesConfig", "ServicesConfigError", "Snapshot",
           "load_services", "parse_services"]

MAX_BYTES = 1 << 20  # a services file is a few dozen lines: a bigger one is a mistake, refused unread
_ROOT = ("queues", "services", "runner", "replication", "statusDir")
_QUEUE = ("path", "replicated", "sourceId", "rollCycle", "codec", "keys")
_CODEC = ("compression", "encryption", "dictionary", "level")
_SERVICE = ("factory", "inputs", "output", "start", "snapshot", "batch", "config")
_SNAPSHOT = ("queue", "messages", "seconds")
_RUNNER = ("processes", "maxCrashes", "crashWindowSeconds", "backoffSeconds", "maxBackoffSeconds",
           "statusIntervalSeconds")
_REPLICATION = ("config",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
_STARTS = ("all", "new", "missed")


class ServicesConfigError(ChronqError, ValueError):
    """A services file that cannot run: the message names the file and the key at fault."""


@dataclass(frozen=True)
class QueueSpec:
    """A queue of the file: `path` (absolute, resolved from the file's folder) or `replicated` (its name
    in the replication configuration, placed per host by `ServicesConfig.queue_path`)."""

    name: str
    source_id: int  # 0: none (a snapshot queue's; a service's inputs and output need one)
    path: Path | None = None
    replicated: str | None = None
    roll_cycle: str | None = None
    keys: str | None = None  # module:Name of a chronq.codecs.Keys (or a callable returning one)
    codec: Mapping[str, Any] | None = None  # chronq.codecs.Codec's fields, for a new queue


@dataclass(frozen=True)
class Snapshot:
    """Write a snapshot to queue `queue` (a queue of the file the service owns) every `messages` messages
    and/or every `seconds` seconds (0: not by that measure); no queue: no snapshots."""

    queue: str | None = None
    messages: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class ServiceSpec:
    """One service: `factory(output, **config)` builds its handler; no inputs makes it a source, whose
    handler has ``run(stop: threading.Event)`` (an HTTP gateway, a feed)."""

    name: str
    factory: str
    inputs: tuple[str, ...]
    output: str
    start: str | int = "missed"
    snapshot: Snapshot = field(default_factory=Snapshot)
    config: Mapping[str, Any] = field(default_factory=dict)
    batch: int = DEFAULT_BATCH  # rpc.Service's `batch`: messages per poll at most

    def load_factory(self) -> Callable[..., object]:
        """The imported factory (a ServicesConfigError naming the service's `factory` key if it does not
        import)."""
        factory: Callable[..., object] = _load(self.factory, f"services.{self.name}.factory")
        return factory


@dataclass(frozen=True)
class RunnerSpec:
    """How the runner supervises: a service that crashes `max_crashes` times within
    `crash_window_seconds` stays down; before each restart it waits `backoff_seconds`, doubling per
    crash in the window up to `max_backoff_seconds`."""

    processes: bool = True
    max_crashes: int = 5
    crash_window_seconds: float = 60.0
    backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0
    status_interval_seconds: float = 0.5


@dataclass(frozen=True)
class ServicesConfig:
    file: Path
    queues: dict[str, QueueSpec]
    services: dict[str, ServiceSpec]
    runner: RunnerSpec
    replication: Path | None
    status_dir: Path

    def status_dir_for(self, host_id: int | None) -> Path:
        """Where the runner of `host_id` (None: no replication) keeps its status files."""
        return self.status_dir if host_id is None else self.status_dir.with_name(
            f"{self.status_dir.name}.host{host_id}")

    def queue_path(self, name: str, host_id: int | None) -> Path:
        """The folder of queue `name` on host `host_id`: a replicated queue is the host's source copy
        where it masters the queue, its sink copy elsewhere."""
        q = self.queues[name]
        if q.path is not None:
            return q.path
        assert q.replicated is not None and self.replication is not None
        if host_id is None:
            raise ServicesConfigError(f"{self.file}: queues.{name} is replicated: give the host id "
                                      "(--host-id N)")
        from chronq.replication.config import load_config
        from chronq.replication.errors import ConfigError

        try:
            cluster = load_config(self.replication)
            rq = cluster.queues[q.replicated]
            return (cluster.source_path(rq, host_id) if rq.master_id == host_id
                    else cluster.sink_path(rq, host_id))
        except ConfigError as e:
            raise ServicesConfigError(f"{self.file}: replication.config: {e}") from None

    def open_options(self, name: str) -> dict[str, Any]:
        """The `chronq.open` keyword arguments of queue `name` (its source id, roll cycle and key ring)."""
        q = self.queues[name]
        options: dict[str, Any] = {"source_id": q.source_id}
        if q.roll_cycle is not None:
            options["roll_cycle"] = q.roll_cycle
        if q.codec is not None:
            from chronq.codecs import Codec

            options["codec"] = Codec(**q.codec)
        if q.keys is not None:
            from chronq.codecs import Keys

            ring = _load(q.keys, f"queues.{name}.keys")
            ring = ring() if callable(ring) else ring
            if not isinstance(ring, Keys):
                raise ServicesConfigError(f"{self.file}: queues.{name}.keys: {q.keys} is a "
                                          f"{type(ring).__name__}, not a chronq.codecs.Keys (nor a "
                                          "callable returning one)")
            options["keys"] = ring
        return options


def _load(spec: str, where: str) -> Any:
    from chronq.plugins import LoadError, load_object

    try:
        return load_object(spec, where)
    except LoadError as e:
        raise ServicesConfigError(str(e)) from None


def _map(v: Any, where: str) -> dict[str, Any]:
    from wire.types import Typed

    v = v.value if isinstance(v, Typed) else v
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ServicesConfigError(f"{where}: expected a map, got {type(v).__name__}")
    return v


def _known(m: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in m:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
            raise ServicesConfigError(f"{where}: unknown key {key!r}{hint}")


def _number(m: Mapping[str, Any], key: str, where: str, default: float, low: float, high: float,
            integer: bool = False) -> Any:
    v: Any = m.get(key, default)
    ok = isinstance(v, int) or (isinstance(v, float) and not integer)
    if isinstance(v, bool) or not ok or not low <= v <= high:
        what = "an integer" if integer else "a number"
        raise ServicesConfigError(f"{where}.{key}: must be {what} >= {low} and <= {high}, got {v!r}")
    return v


def _text(m: Mapping[str, Any], key: str, where: str) -> str:
    v = m.get(key)
    if not isinstance(v, str) or not v:
        raise ServicesConfigError(f"{where}.{key}: expected text, got {v!r}")
    return v


def _name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ServicesConfigError(f"{where}: {name!r} is not a name (letters, digits, '_', '.', '-')")
    return name


def _queue(name: str, m: dict[str, Any], base: Path, replication: bool) -> QueueSpec:
    where = f"queues.{name}"
    _known(m, _QUEUE, where)
    if ("path" in m) == ("replicated" in m):
        raise ServicesConfigError(f"{where}: give exactly one of path or replicated")
    if "replicated" in m and not replication:
        raise ServicesConfigError(f"{where}.replicated: needs replication.config (the cluster's file)")
    roll = m.get("rollCycle")
    if roll is not None:
        from chronq.rollcycles import by_name

        roll = _text(m, "rollCycle", where)
        try:
            by_name(roll)
        except ValueError as e:
            raise ServicesConfigError(f"{where}.rollCycle: {e}") from None
    keys = _text(m, "keys", where) if "keys" in m else None
    codec = _map(m.get("codec"), f"{where}.codec") if "codec" in m else None
    if codec is not None:
        from chronq.codecs import Codec

        _known(codec, _CODEC, f"{where}.codec")
        try:
            Codec(**codec)
        except (TypeError, ValueError) as e:
            raise ServicesConfigError(f"{where}.codec: {e}") from None
        if codec.get("encryption") and keys is None:
            raise ServicesConfigError(f"{where}.keys: missing: an encrypted queue needs its key ring "
                                      "(keys: module:Name)")
    sid = _number(m, "sourceId", where, 0, 0, 2**31 - 1, integer=True)
    if "path" in m:
        return QueueSpec(name, sid, path=base / _text(m, "path", where), roll_cycle=roll, keys=keys,
                         codec=codec)
    return QueueSpec(name, sid, replicated=_text(m, "replicated", where), roll_cycle=roll, keys=keys,
                     codec=codec)


def _start(v: Any, where: str) -> str | int:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    if isinstance(v, str) and v in _STARTS:
        return v
    raise ServicesConfigError(f"{where}.start: expected all, new, missed or an index, got {v!r}")


def _service(name: str, m: dict[str, Any], queues: dict[str, QueueSpec]) -> ServiceSpec:
    where = f"services.{name}"
    _known(m, _SERVICE, where)
    inputs_raw = m.get("inputs", [])
    if isinstance(inputs_raw, str):
        inputs_raw = [inputs_raw]
    if not isinstance(inputs_raw, list) or not all(isinstance(i, str) for i in inputs_raw):
        raise ServicesConfigError(f"{where}.inputs: expected a list of queue names, got {inputs_raw!r}")
    output = _text(m, "output", where)
    for key, q in [*(("inputs", i) for i in inputs_raw), ("output", output)]:
        if q not in queues:
            raise ServicesConfigError(f"{where}.{key}: no queue {q!r} under queues "
                                      f"(declared: {', '.join(queues) or 'none'})")
    for key, q in [*(("inputs", i) for i in inputs_raw), ("output", output)]:
        if not queues[q].source_id:
            raise ServicesConfigError(f"queues.{q}.sourceId: missing: {where}.{key} names the queue, and a "
                                      "service's inputs and output need a source id (the histories name it)")
    if output in inputs_raw:
        raise ServicesConfigError(f"{where}.output: {output!r} is also one of its inputs: a service would "
                                  "read what it writes")
    if len(set(inputs_raw)) != len(inputs_raw):
        raise ServicesConfigError(f"{where}.inputs: a queue is named twice in {inputs_raw}")
    snap = _map(m.get("snapshot"), f"{where}.snapshot")
    _known(snap, _SNAPSHOT, f"{where}.snapshot")
    snap_queue = _text(snap, "queue", f"{where}.snapshot") if "queue" in snap else None
    snapshot = Snapshot(snap_queue, _number(snap, "messages", f"{where}.snapshot", 0, 0, 2**62, integer=True),
                        float(_number(snap, "seconds", f"{where}.snapshot", 0, 0, 86_400 * 365)))
    if snap_queue is None and (snapshot.messages or snapshot.seconds):
        raise ServicesConfigError(f"{where}.snapshot.queue: missing (the queue the snapshots are written to)")
    if snap_queue is not None:
        if snap_queue not in queues:
            raise ServicesConfigError(f"{where}.snapshot.queue: no queue {snap_queue!r} under queues")
        if snap_queue == output or snap_queue in inputs_raw:
            raise ServicesConfigError(f"{where}.snapshot.queue: {snap_queue!r} is also an input or the "
                                      "output: snapshots need a queue of their own")
        if not (snapshot.messages or snapshot.seconds):
            raise ServicesConfigError(f"{where}.snapshot: give messages and/or seconds (how often)")
    config = _map(m.get("config"), f"{where}.config")
    for key in config:
        if not isinstance(key, str) or not key.isidentifier():
            raise ServicesConfigError(f"{where}.config: key {key!r} is not a Python identifier (the "
                                      "factory takes the config as keyword arguments)")
    batch = _number(m, "batch", where, ServiceSpec.batch, 1, 1 << 20, integer=True)
    spec = ServiceSpec(name, _text(m, "factory", where), tuple(inputs_raw), output,
                       _start(m.get("start", "missed"), where), snapshot, config, batch)
    spec.load_factory()  # a factory that does not import is refused now, not in a restart loop later
    return spec


def parse_services(text: str, file: str | os.PathLike[str] = "services.yaml") -> ServicesConfig:
    """Parse and check a services file's text; relative paths are taken from `file`'s folder."""
    from wire import WireError
    from wire.text import from_yaml

    path = Path(file).absolute()
    base = path.parent
    try:
        root = _map(from_yaml(text, max_size=MAX_BYTES), "services file")
    except WireError as e:
        raise ServicesConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return _parse(root, path, base)
    except ServicesConfigError as e:
        raise ServicesConfigError(f"{path}: {e}") from None


def _parse(root: dict[str, Any], path: Path, base: Path) -> ServicesConfig:
    _known(root, _ROOT, "services file")
    rep = _map(root.get("replication"), "replication")
    _known(rep, _REPLICATION, "replication")
    replication = base / _text(rep, "config", "replication") if rep else None
    queues: dict[str, QueueSpec] = {}
    ids: dict[int, str] = {}
    for name, value in _map(root.get("queues"), "queues").items():
        q = _queue(_name(name, "queues"), _map(value, f"queues.{name}"), base, replication is not None)
        if q.keys is not None:
            _load(q.keys, f"queues.{name}.keys")  # a key ring that does not import is refused now
        if q.source_id and q.source_id in ids:
            raise ServicesConfigError(f"queues.{name}.sourceId: {q.source_id} is also queues."
                                      f"{ids[q.source_id]}'s (a source id names one queue in histories)")
        ids[q.source_id] = name
        queues[name] = q
    services: dict[str, ServiceSpec] = {}
    writers: dict[str, str] = {}
    raw_services = _map(root.get("services"), "services")
    if not raw_services:
        raise ServicesConfigError("services: no service declared")
    for name, value in raw_services.items():
        s = _service(_name(name, "services"), _map(value, f"services.{name}"), queues)
        for key, written in (("output", s.output), ("snapshot.queue", s.snapshot.queue)):
            if written is None:
                continue
            if written in writers:
                raise ServicesConfigError(f"services.{name}.{key}: {written!r} is also written by services."
                                          f"{writers[written]} (one writer per queue)")
            writers[written] = name
        services[name] = s
    r = _map(root.get("runner"), "runner")
    _known(r, _RUNNER, "runner")
    processes = r.get("processes", True)
    if not isinstance(processes, bool):
        raise ServicesConfigError(f"runner.processes: expected true or false, got {processes!r}")
    runner = RunnerSpec(
        processes,
        _number(r, "maxCrashes", "runner", 5, 1, 1_000_000, integer=True),
        float(_number(r, "crashWindowSeconds", "runner", 60.0, 0.001, 86_400)),
        float(_number(r, "backoffSeconds", "runner", 0.1, 0, 3600)),
        float(_number(r, "maxBackoffSeconds", "runner", 5.0, 0, 3600)),
        float(_number(r, "statusIntervalSeconds", "runner", 0.5, 0.01, 3600)),
    )
    status = base / _text(root, "statusDir", "services file") if "statusDir" in root \
        else base / f".{path.stem}.status"
    return ServicesConfig(path, queues, services, runner, replication, status)


def load_services(file: str | os.PathLike[str]) -> ServicesConfig:
    """Read and check a services file (a ServicesConfigError naming the file and key if it is wrong)."""
    p = Path(file)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ServicesConfigError(f"{p}: larger than {MAX_BYTES} bytes")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ServicesConfigError(f"{p}: cannot read the services file: {e}") from None
    return parse_services(text, p)
