"""Files written whole or not at all, durably: chronq.durable and the writers that use it (the codec
dictionary, the archive manifest and extracted cycles, a replication host's status file)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from chronq import durable
from chronq.codecs import store_dictionary
from chronq.replication.status import HostStatus, write_status_file
from chronq.store import remove_abandoned_files


def _fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What os.fsync is called on from here on (file or directory), by path: a spy, the call goes on."""
    seen: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


def test_a_codec_dictionary_is_fsynced_with_its_directory(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # a queue needs its dictionary for ever: once stored it must outlive a crash of the machine
    seen = _fsynced(monkeypatch)
    path = store_dictionary(tmp_path, 7, b"dictionary bytes")
    assert path.read_bytes() == b"dictionary bytes"
    assert len(seen) == 2 and seen[1] == str(tmp_path)  # the temporary file, then the directory
    temporary = rf"{re.escape(str(tmp_path))}/\.{re.escape(path.name)}\.\d+\.[0-9a-f]{{8}}\.tmp"
    assert re.fullmatch(temporary, seen[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    durable.write_file(target, b"old")
    with pytest.raises(RuntimeError), durable.replacing(target) as f:
        f.write(b"new, half")
        raise RuntimeError("the writer fails half-way")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_the_temporary_of_a_killed_writer_is_cleared_as_a_creators(tmp_path: Path) -> None:
    # the temporary name is the one remove_abandoned_files knows (a dead pid's leftovers go)
    with pytest.raises(RuntimeError), durable.replacing(tmp_path / "x"):
        [name] = [p.name for p in tmp_path.iterdir()]
        raise RuntimeError
    dead = name.replace(f".{os.getpid()}.", ".999999999.")
    (tmp_path / dead).write_bytes(b"left by a killed writer")
    assert remove_abandoned_files(tmp_path) == [tmp_path / dead]


def test_a_status_file_is_the_hosts_own(tmp_path: Path) -> None:
    path = tmp_path / ".replication.yaml.host1.status.json"
    write_status_file(path, HostStatus(1, os.getpid(), 0.0, []))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert HostStatus.from_json(path.read_text()).host_id == 1
