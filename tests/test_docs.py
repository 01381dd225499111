"""Every page of the documentation (README.md and docs/*.md) runs as printed: its ```python blocks are
executed, in order, the way a reader would try them, in a fresh working directory.

Most pages build one example across their blocks, so the blocks share a namespace. Where a page's
blocks are independent, each runs alone; where they declare dataclasses, each runs as a registered
module (dataclasses look their module up in sys.modules). A page with a Python block and no entry in
PAGES runs with the defaults, so a new page is covered as soon as it has code.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _readme_writes_a_queue(cwd: Path, out: str) -> None:
    assert out == "Trade(symbol='EURUSD', price=1.0875, quantity=1000000)\n"
    assert list((cwd / "trades").glob("*.cq4")) and (cwd / "trades" / "metadata.cq4t").exists()


def _spark_writes_the_latency_plot(cwd: Path, out: str) -> None:
    assert (cwd / "spark-demo" / "latency-report" / "latency.png").stat().st_size > 0


@dataclass(frozen=True)
class Page:
    min_blocks: int = 1
    max_blocks: int | None = None
    each_block_alone: bool = False
    as_modules: bool = False
    spark: bool = False  # needs the shared SparkSession (the page's local_session() then returns it)
    check: Callable[[Path, str], None] | None = None  # (working directory, stdout) after the last block


PAGES: dict[str, Page] = {
    "README.md": Page(1, 1, check=_readme_writes_a_queue),
    "docs/format.md": Page(4, 4),
    "docs/queue.md": Page(each_block_alone=True),
    "docs/rpc.md": Page(),
    "docs/spark.md": Page(8, spark=True, check=_spark_writes_the_latency_plot),
    "docs/testing.md": Page(),
    "docs/wire.md": Page(9, as_modules=True),
}


def _pages() -> list[str]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p.relative_to(ROOT).as_posix() for p in found if BLOCK.search(p.read_text())]


def _param(name: str) -> object:
    marks = [pytest.mark.spark] if PAGES.get(name, Page()).spark else []
    return pytest.param(name, marks=marks, id=name)


def test_every_configured_page_exists_and_has_code() -> None:
    """A renamed page, or one whose examples were removed, would otherwise lose its checks silently."""
    assert set(PAGES) <= set(_pages()), set(PAGES) - set(_pages())


@pytest.mark.parametrize("doc", [_param(name) for name in _pages()])
def test_doc_examples_run(doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    page = PAGES.get(doc, Page())
    if page.spark:
        from tests.spark_support import spark_session

        spark_session()
    blocks = BLOCK.findall((ROOT / doc).read_text())
    assert len(blocks) >= page.min_blocks, len(blocks)
    assert page.max_blocks is None or len(blocks) <= page.max_blocks, len(blocks)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))  # pages import the examples package, as from a checkout
    shared: dict[str, object] = {"__name__": "__doc_example__"}
    for n, block in enumerate(blocks):
        code = compile(block, doc, "exec")
        if page.as_modules:
            module = types.ModuleType(f"doc_example_{n}")
            sys.modules[module.__name__] = module
            try:
                exec(code, module.__dict__)
            finally:
                del sys.modules[module.__name__]
        else:
            exec(code, {"__name__": "__doc_example__"} if page.each_block_alone else shared)
    if page.check is not None:
        page.check(tmp_path, capsys.readouterr().out)
