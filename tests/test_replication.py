"""Replication between real processes over real sockets on 127.0.0.1 (`chronq replicate`)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chronq
from chronq.replication import ConfigError, ReplicatedQueue, load_config, parse_config
from chronq.replication import protocol as p
from chronq.replication.config import MAX_CONFIG_BYTES
from tests.procs.qhelp import child_env
from tests.replication_support import (
    Host,
    RawPeer,
    cycle_files,
    excerpts,
    first_file_difference,
    last_index,
    wait_until,
    write_config,
)

PROCS = Path(__file__).resolve().parent / "procs"


def write(source: Path, first: int, count: int, per_cycle: int) -> int:
    out = subprocess.run([sys.executable, str(PROCS / "repl_writer.py"), str(source), str(first), str(count),
                          str(per_cycle)], check=True, capture_output=True, text=True, timeout=120,
                         env=child_env())
    return int(out.stdout.strip())


def _two_sinks_late_join_and_restart(tmp_path: Path, total: int) -> None:
    """`total` messages over 5+ cycles (gaps between them, metadata in each) reach two sink processes: one
    follows live and is killed mid-stream and restarted, the other joins only at the end. Both end with
    the source's excerpts (index, kind, bytes) and its cycle files byte for byte."""
    config = write_config(tmp_path)
    source, sink2, sink3 = tmp_path / "source/queue1", tmp_path / "sink2/queue1", tmp_path / "sink3/queue1"
    first, per_cycle = total * 2 // 5, total // 5
    hosts = [Host(config, 1), Host(config, 2)]
    try:
        last = write(source, 0, first, per_cycle)
        wait_until(lambda: last_index(sink2) == last, 30 + total / 10_000, "sink 2 to catch up")
        writer = subprocess.Popen([sys.executable, str(PROCS / "repl_writer.py"), str(source), str(first),
                                   str(total - first), str(per_cycle)], stdout=subprocess.PIPE, text=True,
                                  env=child_env())
        wait_until(lambda: (last_index(sink2) or 0) > last, 30, "sink 2 to follow live")
        hosts[1].kill()  # mid-stream: the writer may still be writing
        killed_at = last_index(sink2)  # the sink is dead: what it holds no longer changes
        out, _ = writer.communicate(timeout=120 + total / 5_000)
        assert writer.returncode == 0
        before, last = last, int(out.strip())
        # the kill landed mid-stream: the sink had followed the live writer, and had not got everything
        assert killed_at is not None and before < killed_at < last, (before, killed_at, last)
        hosts[1] = Host(config, 2)
        hosts.append(Host(config, 3))  # late: everything is already written
        for sink in (sink2, sink3):
            wait_until(lambda s=sink: last_index(s) == last, 60 + total / 10_000,  # type: ignore[misc]
                       f"{sink} to catch up")
    finally:
        codes = [h.stop() for h in hosts]
    assert codes == [0, 0, 0], [h.text() for h in hosts]
    expected = excerpts(source)
    assert sum(1 for d in expected if not d[1]) == total
    assert len(cycle_files(source)) >= 5
    for sink in (sink2, sink3):
        assert excerpts(sink) == expected
        assert first_file_difference(source, sink) is None, first_file_difference(source, sink)
    with chronq.open(source, readonly=True) as q:
        assert q.table is not None
        assert q.table.get("chronicle.lastIndexReplicated") == last
        assert q.table.get("chronicle.lastAcknowledgedIndexReplicated") == last
    with chronq.open(sink2) as q, pytest.raises(chronq.ChronqError, match="is a replication sink"):
        q.appender()


def test_a_million_messages_to_two_sinks_late_join_and_restart(tmp_path: Path) -> None:
    """Over 5 cycles of 200,000 messages each: every cycle crosses an index array boundary (TEST_SECONDLY
    indexes 131,072 messages per array), so the index documents written inline are compared too."""
    _two_sinks_late_join_and_restart(tmp_path, 1_000_000)


def test_wrong_key_is_refused_and_nothing_moves(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    # the same cluster (same ports and folders) with another key
    text = config.read_text().replace("baseSourcePath: source", "baseSourcePath: ../source")
    (bad / "cluster.yaml").write_text(text.replace("baseSinkPath: sink", "baseSinkPath: ../sink"))
    (bad / "cluster.yaml.key").write_text("another key of at least sixteen bytes\n")
    source = Host(config, 1)
    try:
        write(tmp_path / "source/queue1", 0, 100, 1000)
        intruder = Host(bad / "cluster.yaml", 2)
        try:
            wait_until(lambda: "refused 127.0.0.1:" in source.text(), 20, "the refusal in the source's log")
            wait_until(lambda: "wrong proof" in intruder.text(), 20, "the sink to see the refusal")
        finally:
            assert intruder.stop() == 0
    finally:
        assert source.stop() == 0
    assert "did not authenticate" in source.text()
    assert not (tmp_path / "sink2/queue1").exists() or last_index(tmp_path / "sink2/queue1") is None
    with chronq.open(tmp_path / "source/queue1", readonly=True) as q:
        assert q.table is not None and q.table.get("chronicle.lastIndexReplicated") == -1


def _raw_peer(address: tuple[str, int], frames: list[bytes]) -> bytes:
    """Connect, send raw bytes, return everything the source answers until it closes."""
    with socket.create_connection(address, timeout=10) as s:
        for f in frames:
            s.sendall(f)
            time.sleep(0.05)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_in_process_api_and_acknowledged_index(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = write_config(tmp_path, hosts=2)
    with ReplicatedQueue(config, 1) as src:
        assert src.address is not None
        # a peer without the key: a wrong proof is refused (and logged with its address)
        hello = p.encode(p.Hello(p.VERSION, "queue1", 7, b"n" * p.NONCE_SIZE))
        answer = p.FrameDecoder().feed(_raw_peer(src.address, [hello, p.encode(p.Auth(b"x" * 32))]))
        assert isinstance(answer[0], p.Challenge) and answer[1:] == [p.Error("authentication failed")]
        # a frame beyond the bound closes that connection only
        answer = p.FrameDecoder().feed(_raw_peer(src.address, [(1 << 30).to_bytes(4, "big")]))
        assert answer == [p.Error("authentication failed")]
        assert "refused 127.0.0.1:" in caplog.text and "host 7 sent a wrong proof" in caplog.text
        assert "frame length 1073741824 outside" in caplog.text
    with ReplicatedQueue(config, 1) as src, ReplicatedQueue(load_config(config), 2) as sink:
        assert src.address is not None and sink.address is None
        with chronq.open(src.source_path("queue1")) as q:
            index = q.appender().write(b"hello replica")
        wait_until(lambda: src.last_acknowledged("queue1") == index, 10, "the acknowledgement")
        with chronq.open(sink.sink_path("queue1"), readonly=True) as q:
            ex = q.tailer().read()
            assert ex is not None and (ex.index, ex.bytes()) == (index, b"hello replica")


def _cfg(context: str = "", host: str = "hostId: 1") -> str:
    """One host, one queue, the key file `k`, with `context` and `host` settings added."""
    return (f"cluster: {{context: {{keyFile: k, {context}}}, h: {{connectUri: 'a:1', {host}}}}}\n"
            "queues: {q: {masterId: 1}}")


@pytest.mark.parametrize(("text", "error"), [
    ("cluster: {context: {keyFile: k}, h: {hostId: 1, connectUri: x}}\nqueues: {q: {masterId: 1}}",
     "connectUri 'x' is not host:port"),
    ("cluster: {context: {keyFile: k}, h: {hostId: 1, connectUri: 'a:1'}}\nqueues: {q: {masterId: 2}}",
     "masterId 2 is not a host"),
    ("cluster: {context: {keyFile: k}, h: {hostId: 1, connectUri: 'a:1'}}\nqueues: {q: {masterId: 1, "
     "path: ../x}}", "must be relative and stay inside"),
    ("cluster: {context: {keyFile: k}, h: {hostId: one, connectUri: 'a:1'}}\nqueues: {q: {masterId: 1}}",
     "hostId must be an integer"),
    ("cluster: {context: {keyFile: short}, h: {hostId: 1, connectUri: 'a:1'}}\nqueues: {q: {masterId: 1}}",
     "holds 5 bytes"),
    ("cluster: {context: {keyFile: k}, h: {hostId: 1, connectUri: 'a:1'}}\nqueues: {'a/b': {masterId: 1}}",
     "a queue name is"),
    ("cluster: {context: {keyFile: k, busySpinMicros: -1}, h: {hostId: 1, connectUri: 'a:1'}}\n"
     "queues: {q: {masterId: 1}}", "busySpinMicros must be an integer >= 0"),
    ("cluster: {context: {keyFile: missing}}", "missing: .*No such file"),
    ("cluster: [1, 2]", "cluster: expected a map"),
    # unknown keys at every level, named with the nearest known one
    ("clustr: {}", r"configuration: unknown key 'clustr' \(did you mean 'cluster'\?\)"),
    ("cluster: {context: {keyFile: k, tlsCAFile: ca.pem}, h: {hostId: 1, connectUri: 'a:1'}}\n"
     "queues: {q: {masterId: 1}}", r"cluster.context: unknown key 'tlsCAFile' \(did you mean 'tlsCaFile'"),
    ("cluster: {context: {keyFile: k}, h: {hostId: 1, connectUri: 'a:1', port: 7}}\n"
     "queues: {q: {masterId: 1}}", r"cluster.h: unknown key 'port' \(known: hostId, connectUri"),
    ("cluster: {context: {keyFile: k}, h: {hostId: 1, connectUri: 'a:1'}}\n"
     "queues: {q: {masterId: 1, acknowlege: true}}",
     r"queues.q: unknown key 'acknowlege' \(did you mean 'acknowledge'"),
    # every number bounded
    (_cfg(context=f"maxFrameSize: {2**63 - 1}"),
     f"maxFrameSize must be an integer >= 1024 and <= {1 << 30}, got {2**63 - 1}"),
    (_cfg(context=f"heartbeatTimeoutMs: {10**15}"),
     "heartbeatTimeoutMs must be an integer >= 1 and <= 86400000"),
    (_cfg(host=f"hostId: {2**32}"), "hostId must be an integer >= 1 and <= 2147483647"),
    (_cfg(context="busySpinMicros: 100000000"), "busySpinMicros must be an integer >= 0 and <= 1000000"),
    # neither a key nor TLS: the message says either would do
    ("cluster: {context: {}, h: {hostId: 1, connectUri: 'a:1'}}\nqueues: {q: {masterId: 1}}",
     r"keyFile is missing: replication needs a pre-shared key \(keyFile\) or TLS \(tlsCaFile, tlsCertFile"),
    # hostile YAML: one line, no RecursionError
    ("cluster: " + "[" * 100_000 + "]" * 100_000,
     "not valid YAML: document 1: YAML line 1, column [0-9]+: nesting deep"),
])
def test_config_errors(tmp_path: Path, text: str, error: str) -> None:
    (tmp_path / "k").write_text("sixteen bytes or more\n")
    (tmp_path / "short").write_text("short")
    with pytest.raises(ConfigError, match=error):
        parse_config(text, tmp_path)


def test_config_larger_than_the_bound_is_refused_unread(tmp_path: Path) -> None:
    """An 8 MiB configuration (it took 3.8 s to parse before) is refused with one line, without
    parsing it; so is a 100 MB one, without reading it all."""
    config = write_config(tmp_path, hosts=2)
    text = config.read_text()
    huge = tmp_path / "huge.yaml"
    huge.write_text(text + "#" * (8 << 20) + "\n")
    with pytest.raises(ConfigError, match=f"huge.yaml: the configuration is larger than {MAX_CONFIG_BYTES}"):
        load_config(huge)
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES}"):
        parse_config(text + "#" * (8 << 20), tmp_path)
    with huge.open("r+b") as f:
        f.truncate(100_000_000)  # sparse: read whole, it would take as long as before
    with pytest.raises(ConfigError, match="larger than"):
        load_config(huge)
    assert load_config(config).max_frame > 0


def test_cli_refuses_an_unknown_host(tmp_path: Path) -> None:
    config = write_config(tmp_path, hosts=2)
    p = subprocess.run([sys.executable, "-m", "chronq", "replicate", str(config), "--host-id", "9"],
                       capture_output=True, text=True, timeout=60, env={**os.environ})
    assert p.returncode == 2 and "host id 9 is not in the cluster" in p.stderr and str(config) in p.stderr
    assert p.stderr.count("\n") == 1


@pytest.mark.parametrize(("text", "error"), [
    ("cluster: {context: {keyFile: missing}, hosts: {h1: {hostId: 1, connectUri: 'localhost:1'}}}",
     "missing: .*No such file"),
    ("cluster: [1, 2]", "cluster: expected a map"),
    ("cluster: {", "not valid YAML"),
])
def test_cli_exits_2_on_a_bad_configuration(tmp_path: Path, text: str, error: str) -> None:
    """A configuration that does not fit is bad usage: exit 2 with one line (it was 1, a queue error's)."""
    config = tmp_path / "replication.yaml"
    config.write_text(text)
    p = subprocess.run([sys.executable, "-m", "chronq", "replicate", str(config), "--host-id", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert re.search(error, p.stderr) and str(config) in p.stderr, p.stderr


def test_a_sink_reading_nothing_times_the_send_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A sink that subscribes, then sends heartbeats but reads nothing, fills the socket: the source's send
    gives up after the heartbeat timeout and says so, naming the peer, instead of hanging."""
    import logging

    caplog.set_level(logging.INFO, "chronq.replication")
    config = write_config(tmp_path, hosts=2)
    body = bytes(4096)
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        assert src.address is not None
        appender = q.appender()
        for _ in range(16384):  # 64 MiB: more than the socket buffers of both ends hold
            appender.write(body)
        with socket.create_connection(src.address, timeout=20) as s:
            peer = RawPeer(s)
            peer.subscribe()
            host, port = s.getsockname()[:2]
            here = f"{host}:{port}"
            deadline = time.monotonic() + 30
            while "send timed out" not in caplog.text:  # alive (heartbeats) but reading nothing
                assert time.monotonic() < deadline, caplog.text
                peer.send(p.Heartbeat())
                time.sleep(0.2)
    assert f"{here} took nothing for 3.0 s: send timed out" in caplog.text, caplog.text
