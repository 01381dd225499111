"""The rpc examples run as users run them: risk monitor, account-service scenarios, SIGKILL + restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chronq
from rpc.testing import YamlTester
from rpc.testing.yaml_tester import decode_call
from tests.test_rpc_service import commands, feed, full_replay
from wire.history import read_history

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "examples" / "account_service" / "scenarios"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_risk_monitor_example_runs():
    proc = subprocess.run([sys.executable, "examples/risk_monitor.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert "alice over limit after BUY 2000000 EURUSD" in proc.stdout
    assert "bob: " in proc.stdout


def test_account_scenarios_pass_through_the_pytest_plugin():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SCENARIOS)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = len([d for d in SCENARIOS.iterdir() if (d / "in.yaml").exists()])
    assert f"{n} passed" in proc.stdout


def test_scenario_mismatch_shows_a_diff_and_regenerate_fixes_it(tmp_path):
    from examples.account_service.service import make_handler

    (tmp_path / "in.yaml").write_text(
        "open: { account: A, owner: ann }\n---\ndeposit: { account: A, amount: 5 }\n"
    )
    (tmp_path / "out.yaml").write_text(
        "opened: { account: A, owner: ann }\n---\nbalance_changed: { account: A, balance: 6 }\n"
    )
    tester = YamlTester(make_handler)
    with pytest.raises(AssertionError, match=r"(?s)-  balance: 6.*\+  balance: 5"):
        tester.check(tmp_path)
    tester.check(tmp_path, regenerate=True)
    tester.check(tmp_path)
    assert "# input 2: deposit" in (tmp_path / "out.yaml").read_text()


def _start(inq: Path, outq: Path, state: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    args = [sys.executable, "-m", "examples.account_service.service", str(inq), str(outq)]
    p = subprocess.Popen([*args, *([str(state)] if state else [])], cwd=ROOT, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, p.stdout.readline().strip()


def _wait_for(outq: chronq.Queue, n: int, timeout: float, poll: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        first = outq.first_index
        if first is not None and outq.count_excerpts(first, outq.last_index + 1) >= n:
            return
        time.sleep(poll)
    raise AssertionError(f"output did not reach {n} documents in {timeout}s")


def test_service_killed_mid_stream_resumes_with_only_the_missed_messages(tmp_path):
    inq_path, outq_path, state = tmp_path / "in", tmp_path / "out", tmp_path / "state.json"
    cmds = commands(6000)
    backlog = 5000
    with chronq.open(inq_path, source_id=1) as inq, chronq.open(outq_path, source_id=2) as outq:
        feed(inq, cmds[:backlog])  # far more than it can answer between two polls below
        p, ready = _start(inq_path, outq_path)
        assert ready == "ready replay_until=None", p.stderr.read() if p.stderr else ""
        _wait_for(outq, 20, 60, poll=0.002)
        p.send_signal(signal.SIGKILL)  # mid-stream: no cleanup, maybe mid-document
        p.wait(10)
        p.communicate()  # closes its pipes
        killed_at = outq.count_excerpts(outq.first_index, outq.last_index + 1)
        assert 20 <= killed_at < backlog
        feed(inq, cmds[backlog:])

        p, ready = _start(inq_path, outq_path, state)
        assert ready.startswith("ready replay_until="), ready
        _wait_for(outq, len(cmds), 120)
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, p.stderr.read() if p.stderr else ""
        assert p.stdout is not None
        # state rebuilt from the answered commands with their outputs suppressed; the rest answered live
        out, _ = p.communicate()  # reads and closes its pipes
        assert out.split() == ["stopped", f"processed={len(cmds)}", f"suppressed={killed_at}"]

        balances, calls = full_replay(cmds)
        t = outq.tailer()
        got, sources = [], []
        while (ex := t.read()) is not None:
            body = bytes(ex.payload)
            h, _ = read_history(body)
            sources.append(h.sources[-1] if h else None)
            got.append(decode_call(body))
        assert got == calls  # nothing lost, nothing repeated, same order
        in_t = inq.tailer()
        in_indexes = []
        while (ex := in_t.read()) is not None:
            in_indexes.append(ex.index)
        assert sources == [(1, i) for i in in_indexes]
        assert ready == f"ready replay_until={in_indexes[killed_at - 1]}"
        assert json.loads(state.read_text()) == balances


@pytest.mark.slow  # two more pytest subprocesses; the plugin's collection is covered by the test above
def test_plugin_reports_a_diff_and_regenerates(tmp_path):
    scenario = tmp_path / "scenarios" / "deposit"
    scenario.mkdir(parents=True)
    (tmp_path / "scenarios" / "replay.toml").write_text(
        f'handler = "examples.account_service.service:make_handler"\npythonpath = "{ROOT}"\n'
    )
    (scenario / "setup.yaml").write_text("open: { account: A, owner: ann }\n")
    (scenario / "in.yaml").write_text("deposit: { account: A, amount: 5 }\n")
    (scenario / "out.yaml").write_text("balance_changed: { account: A, balance: 6 }\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "scenarios")]
    failed = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "+  balance: 5" in failed.stdout and "1 failed" in failed.stdout
    fixed = subprocess.run([*cmd, "--rpc-regenerate"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env=ENV)
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, fixed.stdout + fixed.stderr
    assert "balance: 5" in (scenario / "out.yaml").read_text()
