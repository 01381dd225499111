"""The runner under SIGKILL: the reference pipeline's matching and positions services, each a process of
`chronq services run`, killed at random moments while orders keep coming. The runner restarts each one
(from its newest snapshot and what its output reflects), and in the end every order is answered exactly
once: the `fills` and `positions` queues equal an uninterrupted run's, call for call.

A restart is a fork of the runner's forkserver plus the replay after the newest snapshot; the default run
kills 30 times (13 s on this shared, loaded machine); the `slow` run 300 times."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from rpc.services import load_services
from rpc.services.status import collect_status
from tests.services_support import (
    RunnerProcess,
    alive,
    calls,
    count,
    expected,
    feed,
    services_yaml,
    wait_until,
)

CHUNK = 60  # orders written after each kill


def kill_loop(tmp_path: Path, kills: int, seed: int) -> None:
    rnd = random.Random(seed)
    f = services_yaml(tmp_path)
    feed(tmp_path, CHUNK)
    killed: dict[str, set[int]] = {"matching": set(), "positions": set()}
    written = CHUNK
    with RunnerProcess(f, "--only", "matching", "--only", "positions") as r:
        done = 0
        deadline = time.monotonic() + 60 + kills
        while done < kills:
            assert time.monotonic() < deadline, f"only {done} kills: {r.text()[-3000:]}"
            assert r.proc.poll() is None, r.text()
            # each service whose new process is up, or a random one of them: restarts overlap
            ready = {n: pid for n in killed if (pid := r.service_pid(n)) is not None
                     and pid not in killed[n] and alive(pid)}
            if not ready or (len(ready) == 1 and rnd.random() < 0.5):
                time.sleep(0.01)
                continue
            time.sleep(rnd.random() * 0.05)  # somewhere in its replay, or in the stream
            for name, pid in list(ready.items())[: kills - done]:
                os.kill(pid, signal.SIGKILL)
                killed[name].add(pid)
                done += 1
            feed(tmp_path, written + CHUNK, start=written)
            written += CHUNK
        fills, positions = expected(written)
        wait_until(lambda: count(tmp_path / "data" / "positions") >= len(positions), 120,
                   "the positions of every order", r.proc, r.log)
        wait_until(lambda: count(tmp_path / "data" / "fills") >= len(fills), 120, "the fills", r.proc, r.log)
        st = collect_status(load_services(f).status_dir, ["matching", "positions"])["services"]
        assert st["matching"]["restarts"] + st["positions"]["restarts"] >= kills
        assert r.stop() == 0, r.text()
    assert calls(tmp_path / "data" / "fills") == fills
    assert calls(tmp_path / "data" / "positions") == positions
    assert "left down" not in r.text()


@pytest.mark.exclusive
def test_sigkilled_services_are_restarted_and_answer_every_order_once(tmp_path: Path) -> None:
    kill_loop(tmp_path, 30, seed=1)


@pytest.mark.slow
@pytest.mark.exclusive
def test_three_hundred_kills(tmp_path: Path) -> None:
    kill_loop(tmp_path, 300, seed=2)
