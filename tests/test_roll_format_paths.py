"""A roll cycle's format becomes cycle file names, and formats come from outside: a replication peer's
`QueueInfo`, a table store (or a Chronicle 4.x cycle header) on disk, an archive manifest. A format whose
literal text holds `/`, `\\`, `..` or NUL would make those names paths, so every entry point refuses it,
through the one check `chronq.rollcycles` makes wherever a format names files."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest

import chronq
from chronq.errors import CorruptQueueError
from chronq.rollcycles import RollCycle, by_format
from chronq.table import TABLE_STORE_FILE, RollMetadata, TableStore

HOSTILE = "'../../somewhere/x'yyyyMMdd"
BAD_FORMATS = [HOSTILE, "yyyyMMdd'/x'", "'..'yyyyMMdd", "yyyy'.''.'MMdd", "yyyy..MMdd", "yyyyMMdd'a\\b'",
               "yyyyMMdd'\0'", "yyyyMMdd\0"]


def _outside(root: Path, inside: Path) -> list[Path]:
    """Every file under `root` that is not under `inside`."""
    return [p for p in root.rglob("*") if p.is_file() and inside not in p.parents]


@pytest.mark.parametrize("fmt", BAD_FORMATS)
def test_a_format_whose_names_would_be_paths_is_refused(fmt: str) -> None:
    with pytest.raises(ValueError, match="file names would be paths"):
        by_format(fmt, 86_400_000)
    with pytest.raises(ValueError, match="file names would be paths"):
        RollCycle.custom(fmt, 86_400_000)


@pytest.mark.parametrize("fmt", ["yyyy.MM.dd", "yyyy-MM-dd'_x.y'", "yyyyMMdd'F'", "YYYY'W'ww"])
def test_dots_and_plain_literals_stay_usable(fmt: str) -> None:
    name = by_format(fmt, 86_400_000).file_name(19_737)
    assert "/" not in name and ".." not in name


def test_a_table_store_naming_a_path_is_refused_naming_it(tmp_path: Path) -> None:
    """A metadata.cq4t whose roll format holds a path (written by anyone with access to the directory):
    opening the queue is a CorruptQueueError naming the table store, and nothing is written anywhere."""
    queue = tmp_path / "a" / "q"
    queue.mkdir(parents=True)
    (tmp_path / "somewhere").mkdir()  # where the format points: it exists, so only the check stops it
    with TableStore.open(queue / TABLE_STORE_FILE, roll=RollMetadata(HOSTILE, 86_400_000)):
        pass
    with pytest.raises(CorruptQueueError, match="file names would be paths") as info, chronq.open(queue) as q:
        q.appender().write(b"lands outside the queue")
    assert info.value.file.endswith(TABLE_STORE_FILE)
    assert _outside(tmp_path, queue) == []


def test_an_archive_manifest_naming_a_path_is_refused_by_open_verify_and_restore(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    from chronq import archive as archives
    from chronq.rollcycles import FixedClock

    clock = FixedClock(0)
    with chronq.open(tmp_path / "q", "FAST_DAILY", clock=clock) as q:
        q.appender().write(b"day 0")
        clock.advance(86_400_000)
        q.appender().write(b"day 1")
    dest = tmp_path / "arch"
    assert len(archives.archive(tmp_path / "q", dest, clock=clock)) == 1
    m = json.loads((dest / archives.MANIFEST).read_text())
    m["roll_cycle"]["format"] = HOSTILE
    m["roll_cycle"]["name"] = "CUSTOM"
    (dest / archives.MANIFEST).write_text(json.dumps(m))
    restored = tmp_path / "r" / "s" / "restored"
    for attempt in (lambda: archives.open(dest), lambda: archives.verify(dest),
                    lambda: archives.restore(dest, restored)):
        with pytest.raises(CorruptQueueError, match="file names would be paths") as info:
            attempt()
        assert info.value.file.endswith(archives.MANIFEST)
    assert not restored.exists() or not any(restored.iterdir())
    assert [p for p in _outside(tmp_path, tmp_path / "q") if dest not in p.parents] == []


def test_a_sink_refuses_a_queue_info_whose_format_is_a_path(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The test plays the source of a real sink host: after a genuine handshake it sends a `QueueInfo`
    whose roll format climbs out of the sink's directory. The sink must not subscribe, must create
    nothing outside its directory, and must log why (then retry, as for any refused source)."""
    from chronq.replication import ReplicatedQueue, load_config
    from chronq.replication import protocol as p
    from chronq.replication.sink import Position
    from chronq.replication.source import SourceReader
    from tests.replication_support import RawPeer, write_config

    cluster = tmp_path / "cluster"
    config = write_config(cluster, hosts=2)
    somewhere = cluster / "somewhere"  # sink2/queue1/../../somewhere: it exists, only the check stops it
    somewhere.mkdir()
    host = load_config(config).hosts[1]
    made = tmp_path / "cluster" / "made"
    with chronq.open(made, roll_cycle="FAST_DAILY") as q:  # the data a hostile source would send
        q.appender().write(b"lands outside the sink")
        reader = SourceReader(q, Position(None, 0))
        buf = bytearray(4096)
        docs, _data, end, first = reader.read_run(buf, p.RUN_HEAD.size, len(buf), 1)
        p.run_head(buf, end, first, docs)
        run = bytes(buf[:end])
        reader.close()
        rc = q.roll_cycle
        info = p.QueueInfo(HOSTILE, rc.length_ms, rc.index_count, rc.index_spacing, q.epoch, 1)
    caplog.set_level(logging.WARNING, logger="chronq.replication")
    got: list[p.Frame] = []
    with socket.create_server((host.host, host.port)) as server, ReplicatedQueue(config, 2):
        server.settimeout(20)
        s, _ = server.accept()
        with s:
            s.settimeout(20)
            peer = RawPeer(s)
            peer.accept_sink()
            peer.send(info)
            # until the sink hangs up; unfixed, it subscribes, is sent data and acknowledges storing it
            while not any(isinstance(f, p.Ack) for f in got) and (frame := peer.next(skip=())) is not None:
                if isinstance(frame, p.Subscribe):
                    peer.send_encoded(run)
                got.append(frame)
    (refused,) = [f for f in got if not isinstance(f, p.Heartbeat)]  # the sink says why, and hangs up
    assert isinstance(refused, p.Error) and "holds '/'" in refused.text, refused
    assert list(somewhere.iterdir()) == []
    stray = [p for p in _outside(cluster, cluster / "sink2") if p.suffix == ".cq4" and made not in p.parents]
    assert stray == []
    refused = [r.getMessage() for r in caplog.records if "file names would be paths" in r.getMessage()]
    assert refused and HOSTILE in refused[0] and "queue1" in refused[0], caplog.text
