"""docs/rpc.md, docs/testing.md and docs/records.md: their Python blocks run in order in one namespace, as a
reader would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("doc", ["docs/rpc.md", "docs/testing.md", "docs/records.md"])
def test_doc_examples_run(doc, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    blocks = BLOCK.findall((ROOT / doc).read_text())
    assert blocks
    namespace: dict[str, object] = {"__name__": "__doc_example__"}
    for block in blocks:
        exec(compile(block, doc, "exec"), namespace)
