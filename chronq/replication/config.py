"""The replication configuration: a YAML file in the shape of Chronicle's `QueueReplicationCfg`.

    !QueueReplicationCfg {
      cluster: {
        context: !QueueClusterContext {
          heartbeatIntervalMs: 1000,
          heartbeatTimeoutMs: 5000,
          baseSourcePath: replica/source,
          baseSinkPath: replica/sink,
          keyFile: replication.key,          # chronq: the pre-shared key
          busySpinMicros: 100,               # chronq: an idle link spins this long before sleeping
          tlsCaFile: ca.pem,                 # chronq: TLS (optional): the CA that signs every host,
          tlsCertFile: host.pem,             #   this host's certificate (a host may override both)
          tlsKeyFile: host.key,
        },
        host1: { hostId: 1, connectUri: "127.0.0.1:9001" },
        host2: { hostId: 2, connectUri: "127.0.0.1:9002", baseSinkPath: replica/sink2 },
      },
      queues: {
        queue1: { path: queue1, acknowledge: false, masterId: 1, rollCycle: FAST_DAILY },
        queue2: { path: queue2, masterId: 1, transport: udp },   # chronq: data as datagrams (below)
      }
    }

Relative paths are taken from the configuration file's folder. A host may override `baseSourcePath`
and `baseSinkPath` (several hosts on one machine). A queue's name (its key under `queues`) is what
travels on the network; its `path` must be relative and stay inside the base folders.

At least one of `keyFile` (a pre-shared key: both sides prove it with an HMAC) and TLS (`tlsCaFile`,
`tlsCertFile`, `tlsKeyFile`: both sides present a certificate the CA signed) is required; both can be
used together.

`transport: udp` (per queue; `tcp` is the default) sends the queue's data as authenticated datagrams
beside the TCP link, which stays the control channel (`chronq.replication._udp`). A sink receives them on
its host's `udpBind` (host:port; default the address of its `connectUri`, any free port), announced to
the source over the TCP link; the source sends them to the sink's `udpUri` where one is configured (a
relay, a NAT) and else to the sink's address with the announced port. `udpDatagramSize` (bytes of a
datagram, headers and tag included; default the path's MTU less the IP and UDP headers), `udpWindow`
(datagrams in flight per sink) and `udpRetransmitBuffer` (bytes a source keeps per sink for
retransmission) are context keys. `udpGroup` (per queue, a multicast
host:port) sends each datagram once to the group whatever the number of sinks, each sink joining it
(on its host's `udpInterface`, an IP address; default the kernel's route for the group).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from chronq.replication.errors import ConfigError
from chronq.replication.protocol import DEFAULT_MAX_FRAME, MAX_HOST_ID, MAX_MAX_FRAME, MAX_TEXT, MIN_MAX_FRAME
from chronq.rollcycles import by_name

__all__ = ["HostCfg", "QueueCfg", "ReplicationConfig", "UdpCfg", "load_config", "parse_config"]

MIN_KEY_BYTES = 16
DEFAULT_BUSY_SPIN_US = 100
MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few lines: a bigger file is a mistake, refused unread
MAX_MS = 86_400_000  # heartbeats and the back-fill wait: a day at most (a timer beyond overflows threads)
MAX_BUSY_SPIN_US = 1_000_000
TRANSPORTS = ("tcp", "udp")
DEFAULT_DATAGRAM = 1472  # an Ethernet MTU of 1500 less the IPv4 and UDP headers (a path's MTU unknown)
MIN_DATAGRAM, MAX_DATAGRAM = 512, 65507  # the largest UDP payload over IPv4
DEFAULT_WINDOW, MAX_WINDOW = 1024, 1 << 16
DEFAULT_RETRANSMIT = 16 << 20
MIN_RETRANSMIT, MAX_RETRANSMIT = 64 << 10, 1 << 30
_ROOT_KEYS = ("cluster", "queues")
_CONTEXT_KEYS = ("heartbeatIntervalMs", "heartbeatTimeoutMs", "baseSourcePath", "baseSinkPath", "keyFile",
                 "busySpinMicros", "tlsCaFile", "tlsCertFile", "tlsKeyFile", "maxFrameSize",
                 "backfillTimeoutMs", "udpDatagramSize", "udpWindow", "udpRetransmitBuffer")
_HOST_KEYS = ("hostId", "connectUri", "baseSourcePath", "baseSinkPath", "tlsCertFile", "tlsKeyFile",
              "udpInterface", "udpBind", "udpUri")
_QUEUE_KEYS = ("path", "acknowledge", "masterId", "rollCycle", "transport", "udpGroup")
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True)
class HostCfg:
    name: str
    host_id: int
    host: str
    port: int
    base_source_path: Path
    base_sink_path: Path
    tls_cert: Path | None = None
    tls_key: Path | None = None
    udp_bind: tuple[str, int] | None = None  # where this host's UDP sinks receive (None: connectUri's host)
    udp_uri: tuple[str, int] | None = None  # where a source sends them (None: the sink's address)
    udp_interface: str | None = None  # the address of the interface it sends and joins groups on


@dataclass(frozen=True)
class QueueCfg:
    name: str
    path: str
    master_id: int
    acknowledge: bool
    roll_cycle: str | None
    transport: str = "tcp"  # "udp": data as datagrams beside the TCP control link
    udp_group: tuple[str, int] | None = None  # a multicast group: one send for every sink (udpGroup)


@dataclass(frozen=True)
class UdpCfg:
    """The datagram settings of the queues with `transport: udp` (context keys)."""

    datagram_size: int = 0  # 0: the path's MTU less the IP and UDP headers, as the source finds it
    window: int = DEFAULT_WINDOW
    retransmit_buffer: int = DEFAULT_RETRANSMIT


@dataclass(frozen=True)
class ReplicationConfig:
    hosts: dict[int, HostCfg]
    queues: dict[str, QueueCfg]
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    key: bytes | None
    max_frame: int
    tls_ca: Path | None = None
    backfill_timeout_ms: int = 0  # 0: no back-fill (a sink ahead of its source is refused)
    busy_spin_us: int = DEFAULT_BUSY_SPIN_US  # how long an idle link spins before it sleeps
    udp: UdpCfg = field(default_factory=UdpCfg)

    def host(self, host_id: int) -> HostCfg:
        try:
            return self.hosts[host_id]
        except KeyError:
            raise ConfigError(f"host id {host_id} is not in the cluster "
                              f"(hosts: {sorted(self.hosts)})") from None

    def source_path(self, queue: QueueCfg, host_id: int) -> Path:
        return self.host(host_id).base_source_path / queue.path

    def sink_path(self, queue: QueueCfg, host_id: int) -> Path:
        return self.host(host_id).base_sink_path / queue.path


def _untag(v: Any) -> Any:
    """`!Type {...}` reads as a wire.types.Typed; the tag adds nothing here."""
    from wire.types import Typed

    return v.value if isinstance(v, Typed) else v


def _map(v: Any, where: str) -> dict[str, Any]:
    v = _untag(v)
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: expected a map, got {type(v).__name__}")
    return v


def _known(m: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """Refuse a key the configuration does not define: a misspelt `acknowledge` or `tlsCaFile` would
    otherwise silently change what is guaranteed (no acks; a key instead of TLS)."""
    for key in m:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")


def _int(m: dict[str, Any], key: str, where: str, default: int | None = None, low: int = 0,
         high: int = 2**31 - 1) -> int:
    """An integer setting within [low, high]: every one is bounded, so that no value from a file can
    overflow a timer, a struct field or an allocation later, in a thread far from the configuration."""
    v = _untag(m.get(key, default))
    if v is None:
        raise ConfigError(f"{where}: {key} is missing")
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise ConfigError(f"{where}: {key} must be an integer >= {low} and <= {high}, got {v!r}")
    return v


def _str(m: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = _untag(m.get(key, default))
    if v is None:
        raise ConfigError(f"{where}: {key} is missing")
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise ConfigError(f"{where}: {key} must be text, got {v!r}")
    return str(v)


def _path(m: dict[str, Any], key: str, where: str, base: Path) -> Path | None:
    """An optional file path (relative ones are taken from `base`)."""
    return None if m.get(key) is None else base / _str(m, key, where)


def _address(m: dict[str, Any], key: str, where: str, any_port: bool = False) -> tuple[str, int] | None:
    """An optional host:port (port 0 only where `any_port`)."""
    if m.get(key) is None:
        return None
    uri = _str(m, key, where)
    addr, sep, port_text = uri.rpartition(":")
    if not sep or not addr or not port_text.isdigit() or not (0 if any_port else 1) <= int(port_text) < 65536:
        raise ConfigError(f"{where}: {key} {uri!r} is not host:port")
    return addr.strip("[]"), int(port_text)


def _interface(m: dict[str, Any], where: str) -> str | None:
    """An optional udpInterface: the IP address of the interface multicast goes out and is joined on."""
    if m.get("udpInterface") is None:
        return None
    text = _str(m, "udpInterface", where)
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise ConfigError(f"{where}: udpInterface {text!r} is not an IP address") from None
    return text


def _relative(text: str, where: str) -> str:
    p = PurePosixPath(text)
    if not text or p.is_absolute() or ".." in p.parts:
        raise ConfigError(f"{where}: path {text!r} must be relative and stay inside the base folder")
    return text


def parse_config(text: str, base_dir: str | os.PathLike[str] = ".") -> ReplicationConfig:
    """Parse and validate a configuration; relative paths are taken from `base_dir`."""
    from wire import WireError
    from wire.text import from_yaml

    base = Path(base_dir)
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"configuration of {len(text)} characters is larger than {MAX_CONFIG_BYTES}")
    try:
        root = _map(from_yaml(text, max_size=MAX_CONFIG_BYTES), "configuration")
    except WireError as e:
        raise ConfigError(f"configuration is not valid YAML: {e}") from None
    _known(root, _ROOT_KEYS, "configuration")
    cluster = _map(root.get("cluster"), "cluster")
    ctx = _map(cluster.get("context"), "cluster.context")
    where = "cluster.context"
    _known(ctx, _CONTEXT_KEYS, where)
    interval = _int(ctx, "heartbeatIntervalMs", where, 1000, 1, MAX_MS)
    timeout = _int(ctx, "heartbeatTimeoutMs", where, max(5000, 3 * interval), 1, MAX_MS)
    if timeout <= interval:
        raise ConfigError(f"{where}: heartbeatTimeoutMs ({timeout}) must exceed heartbeatIntervalMs "
                          f"({interval})")
    max_frame = _int(ctx, "maxFrameSize", where, DEFAULT_MAX_FRAME, MIN_MAX_FRAME, MAX_MAX_FRAME)
    backfill = _int(ctx, "backfillTimeoutMs", where, 0, 0, MAX_MS)
    spin = _int(ctx, "busySpinMicros", where, DEFAULT_BUSY_SPIN_US, 0, MAX_BUSY_SPIN_US)
    size = 0  # the path's (`_udp.datagram_size`)
    if ctx.get("udpDatagramSize") is not None:
        size = _int(ctx, "udpDatagramSize", where, None, MIN_DATAGRAM, MAX_DATAGRAM)
    udp = UdpCfg(size,
                 _int(ctx, "udpWindow", where, DEFAULT_WINDOW, 1, MAX_WINDOW),
                 _int(ctx, "udpRetransmitBuffer", where, DEFAULT_RETRANSMIT, MIN_RETRANSMIT, MAX_RETRANSMIT))
    if udp.retransmit_buffer < udp.datagram_size:
        raise ConfigError(f"{where}: udpRetransmitBuffer ({udp.retransmit_buffer}) must hold at least one "
                          f"datagram (udpDatagramSize {udp.datagram_size})")
    src_base = _str(ctx, "baseSourcePath", where, "replica/source")
    sink_base = _str(ctx, "baseSinkPath", where, "replica/sink")
    tls_ca = _path(ctx, "tlsCaFile", where, base)
    ctx_cert, ctx_key = _path(ctx, "tlsCertFile", where, base), _path(ctx, "tlsKeyFile", where, base)
    key: bytes | None = None
    if "keyFile" in ctx or tls_ca is None:
        if ctx.get("keyFile") is None:
            raise ConfigError(f"{where}: keyFile is missing: replication needs a pre-shared key (keyFile) "
                              "or TLS (tlsCaFile, tlsCertFile and tlsKeyFile), or both")
        key_file = base / _str(ctx, "keyFile", where)
        try:
            key = key_file.read_bytes().strip()
        except OSError as e:
            raise ConfigError(f"{where}: keyFile {key_file}: {e}") from None
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"{where}: keyFile {key_file} holds {len(key)} bytes; a key has at least "
                              f"{MIN_KEY_BYTES}")
    hosts: dict[int, HostCfg] = {}
    for name, value in cluster.items():
        if name == "context":
            continue
        where = f"cluster.{name}"
        h = _map(value, where)
        _known(h, _HOST_KEYS, where)
        host_id = _int(h, "hostId", where, low=1, high=MAX_HOST_ID)
        connect = _address(h, "connectUri", where)
        if connect is None:
            raise ConfigError(f"{where}: connectUri is missing")
        if host_id in hosts:
            raise ConfigError(f"{where}: hostId {host_id} is used twice")
        cert = _path(h, "tlsCertFile", where, base) or ctx_cert
        cert_key = _path(h, "tlsKeyFile", where, base) or ctx_key
        if tls_ca is not None and (cert is None or cert_key is None):
            raise ConfigError(f"{where}: with tlsCaFile every host needs tlsCertFile and tlsKeyFile")
        if tls_ca is None and (cert is not None or cert_key is not None):
            raise ConfigError(f"{where}: tlsCertFile and tlsKeyFile need tlsCaFile in cluster.context")
        hosts[host_id] = HostCfg(name, host_id, connect[0], connect[1],
                                 base / _str(h, "baseSourcePath", where, src_base),
                                 base / _str(h, "baseSinkPath", where, sink_base), cert, cert_key,
                                 _address(h, "udpBind", where, any_port=True), _address(h, "udpUri", where),
                                 _interface(h, where))
    if not hosts:
        raise ConfigError("cluster: no hosts (entries with hostId and connectUri)")
    queues: dict[str, QueueCfg] = {}
    for name, value in _map(root.get("queues"), "queues").items():
        where = f"queues.{name}"
        if not _QUEUE_NAME.match(name) or len(name.encode()) > MAX_TEXT:
            raise ConfigError(f"{where}: a queue name is letters, digits, '_', '.' and '-'")
        q = _map(value, where)
        _known(q, _QUEUE_KEYS, where)
        master = _int(q, "masterId", where, low=1, high=MAX_HOST_ID)
        if master not in hosts:
            raise ConfigError(f"{where}: masterId {master} is not a host of the cluster")
        ack = _untag(q.get("acknowledge", False))
        if not isinstance(ack, bool):
            raise ConfigError(f"{where}: acknowledge must be true or false, got {ack!r}")
        roll = q.get("rollCycle")
        if roll is not None:
            roll = _str(q, "rollCycle", where)
            try:
                by_name(roll)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
        transport = _str(q, "transport", where, "tcp")
        if transport not in TRANSPORTS:
            raise ConfigError(f"{where}: transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        group = _address(q, "udpGroup", where)
        if group is not None:
            try:
                multicast = ipaddress.IPv4Address(group[0]).is_multicast
            except ValueError:
                multicast = False
            if not multicast:
                raise ConfigError(f"{where}: udpGroup {group[0]!r} is not an IPv4 multicast address "
                                  "(224.0.0.0/4)")
            if transport != "udp":
                raise ConfigError(f"{where}: udpGroup needs transport: udp")
        queues[name] = QueueCfg(name, _relative(_str(q, "path", where, name), where), master, ack, roll,
                                transport, group)
    if not queues:
        raise ConfigError("queues: no queue to replicate")
    if any(qc.transport == "udp" for qc in queues.values()):
        try:
            import cryptography  # noqa: F401  (datagrams are authenticated with its AES-GCM)
        except ImportError:
            raise ConfigError("queues: transport udp needs the cryptography package "
                              "(pip install 'chronq[codecs]')") from None
    return ReplicationConfig(hosts, queues, interval, timeout, key, max_frame, tls_ca, backfill, spin, udp)


def load_config(path: str | os.PathLike[str]) -> ReplicationConfig:
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # a huge file is refused without reading it all
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: the configuration is larger than {MAX_CONFIG_BYTES} bytes")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read the configuration: {e}") from None
    try:
        return parse_config(text, p.parent)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
