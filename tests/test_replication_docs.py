"""docs/replication.md: its configuration parses and its two-process example runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replication_support import free_port

DOC = Path(__file__).resolve().parents[1] / "docs" / "replication.md"


def _block(lang: str) -> str:
    found = re.search(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)
    assert found is not None
    return found.group(1)


def _udp_config() -> str:
    """The configuration of the example's UDP variant (the yaml block with `transport: udp`)."""
    (found,) = [b for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S) if "transport: udp" in b]
    return str(found)


@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_two_process_example_runs(tmp_path: Path, transport: str) -> None:
    config = _block("yaml") if transport == "tcp" else _udp_config()
    config = config.replace("PORT1", str(free_port())).replace("PORT2", str(free_port()))
    (tmp_path / "cluster.yaml").write_text(config)
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    wait = 'until [ "$(chronq tail replica/sink/queue1 2>/dev/null | wc -l)" = 2 ]; do sleep 0.1; done; '
    tail = "chronq tail replica/sink/queue1"
    script = _block("sh").replace(tail, wait + tail, 1)
    script += "wait $source; echo source=$?; wait $sink; echo sink=$?\n"
    p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = [line for line in p.stdout.splitlines() if not line.startswith("chronq replicate:")]
    appended = lines[:2]
    assert [line.split("\t") for line in lines[2:4]] == [[appended[0], "hello"], [appended[1], "replica"]]
    assert lines[4:] == ["source=0", "sink=0"]
