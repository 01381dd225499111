"""docs/spark.md: its Python blocks run in order in one namespace, as a reader would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.spark_support import spark_session

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_spark_doc_examples_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spark_session()  # the doc's local_session() then returns the shared session
    monkeypatch.chdir(tmp_path)
    blocks = BLOCK.findall((ROOT / "docs" / "spark.md").read_text())
    assert len(blocks) >= 8
    namespace: dict[str, Any] = {"__name__": "__doc_example__"}
    for block in blocks:
        exec(compile(block, "docs/spark.md", "exec"), namespace)
    assert (tmp_path / "spark-demo" / "latency-report" / "latency.png").stat().st_size > 0
