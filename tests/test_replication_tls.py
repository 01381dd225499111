"""Replication over TLS with certificates checked on both sides (a CA made by the `openssl` command)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

import chronq
from chronq.replication import ConfigError, ReplicatedQueue, load_config
from tests.conftest import skip_unless_strict
from tests.replication_support import Host, last_index, wait_until, write_config


@pytest.fixture(autouse=True)
def _openssl_command() -> None:
    """The CA and certificates are made by the `openssl` command: skip without it, fail under
    CHRONQ_STRICT=1."""
    if shutil.which("openssl") is None:
        skip_unless_strict("the TLS tests need the openssl command (it makes their CA and certificates)")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> None:
    """`name`.pem / `name`.key: a self-signed CA."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             cwd=folder)


def make_cert(folder: Path, ca: str, name: str, ip: str = "127.0.0.1") -> None:
    """`name`.pem / `name`.key signed by `ca`, with an IP subjectAltName."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)
    (folder / f"{name}.ext").write_text(f"subjectAltName=IP:{ip}\n"
                                        "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)


def tls_config(tmp_path: Path, psk: bool, hosts: int = 2) -> Path:
    """The test cluster with TLS: host N uses hostN.pem; with `psk` the pre-shared key as well."""
    config = write_config(tmp_path, hosts=hosts)
    make_ca(tmp_path, "ca")
    for h in range(1, hosts + 1):
        make_cert(tmp_path, "ca", f"host{h}")
    text = config.read_text()
    tls = "      tlsCaFile: ca.pem,\n"
    if not psk:
        text = text.replace("      keyFile: cluster.yaml.key,\n", "")
    text = text.replace("      baseSourcePath: source,\n", "      baseSourcePath: source,\n" + tls)
    for h in range(1, hosts + 1):
        text = text.replace(f"baseSinkPath: sink{h} }}",
                            f"baseSinkPath: sink{h}, tlsCertFile: host{h}.pem, tlsKeyFile: host{h}.key }}")
    config.write_text(text)
    return config


@pytest.mark.parametrize("psk", [False, True])
def test_tls_replicates_between_processes(tmp_path: Path, psk: bool) -> None:
    config = tls_config(tmp_path, psk)
    assert (load_config(config).key is not None) == psk
    source, sink = Host(config, 1), Host(config, 2)
    try:
        with chronq.open(tmp_path / "source/queue1") as q:
            appender = q.appender()
            last = [appender.write(f"m{i}".encode()) for i in range(1000)][-1]
        wait_until(lambda: last_index(tmp_path / "sink2/queue1") == last, 30, "the sink over TLS")
    finally:
        assert sink.stop() == 0 and source.stop() == 0
    assert "TLS handshake failed" not in source.text() + sink.text()


def test_untrusted_certificates_are_refused_both_ways(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A sink whose certificate another CA signed is refused by the source (logged with its address),
    and a sink refuses a source it does not trust; no data moves either way."""
    config = tls_config(tmp_path, psk=False)
    rogue = tmp_path / "rogue"
    make_ca(rogue, "rogue-ca")
    make_cert(rogue, "rogue-ca", "rogue")
    text = config.read_text()
    # host 2 presents a certificate of another CA (but trusts the cluster's CA)
    genuine, fake = ("tlsCertFile: host2.pem, tlsKeyFile: host2.key",
                     "tlsCertFile: rogue/rogue.pem, tlsKeyFile: rogue/rogue.key")
    (tmp_path / "intruder.yaml").write_text(text.replace(genuine, fake))
    # host 2 trusts only the rogue CA: the genuine source is not trusted
    (tmp_path / "wary.yaml").write_text(text.replace("tlsCaFile: ca.pem", "tlsCaFile: rogue/rogue-ca.pem")
                                        .replace(genuine, fake))
    (tmp_path / "cluster.yaml.key").unlink()
    with ReplicatedQueue(config, 1) as src, chronq.open(src.source_path("queue1")) as q:
        q.appender().write(b"secret")
        intruder = Host(tmp_path / "intruder.yaml", 2)
        try:
            wait_until(lambda: "TLS handshake failed" in caplog.text, 20, "the intruder to be refused")
            assert "refused 127.0.0.1:" in caplog.text and "certificate verify failed" in caplog.text
            # TLS 1.3: the client learns of the refusal at its first read, as an alert
            wait_until(lambda: "SSL" in intruder.text(), 20, "the intruder to see the refusal")
        finally:
            assert intruder.stop() == 0
        wary = Host(tmp_path / "wary.yaml", 2)
        try:
            wait_until(lambda: "certificate verify failed" in wary.text(), 20,
                       "the sink to refuse the source")
        finally:
            assert wary.stop() == 0
        assert src.last_acknowledged("queue1") == -1
    assert last_index(tmp_path / "sink2/queue1") is None


def test_tls_refusal_is_logged_with_the_address(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A plain TCP peer (no TLS) is refused by a TLS source, which logs its address."""
    config = tls_config(tmp_path, psk=True)
    with ReplicatedQueue(config, 1) as src:
        assert src.address is not None
        with socket.create_connection(src.address, timeout=10) as s:
            s.sendall(b"\x00\x00\x00\x05hello, no TLS here")
            s.settimeout(10)
            with contextlib.suppress(OSError):
                while s.recv(4096):
                    pass
        wait_until(lambda: "refused 127.0.0.1:" in caplog.text, 10, "the refusal in the log")
    assert "TLS handshake failed" in caplog.text


def test_tls_config_errors(tmp_path: Path) -> None:
    config = tls_config(tmp_path, psk=False)
    text = config.read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("tlsCertFile: host2.pem, tlsKeyFile: host2.key", "tlsCertFile: host2.pem"))
    with pytest.raises(ConfigError, match="every host needs tlsCertFile and tlsKeyFile"):
        load_config(bad)
    bad.write_text(text.replace("      tlsCaFile: ca.pem,\n", ""))
    with pytest.raises(ConfigError, match="keyFile is missing"):
        load_config(bad)
    bad.write_text(text.replace("host1.key", "missing.key"))
    with pytest.raises(ConfigError, match=r"missing\.key"):
        ReplicatedQueue(bad, 1)
