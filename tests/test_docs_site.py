"""The documentation site builds with `mkdocs build --strict` (no broken link, no docstring griffe cannot
read), its home page is the README with working links, and every public name has an API entry."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_unless_strict

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["chronq", "chronq.replication", "chronq.spark", "wire", "rpc", "rpc.testing"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import mkdocstrings  # noqa: F401
    except ImportError:
        skip_unless_strict("mkdocs is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    return out


def test_home_page_is_the_readme_with_links_into_the_site(site: Path) -> None:
    home = (site / "index.html").read_text()
    assert "Chronicle Queue v5" in home
    links = set(re.findall(r'href="([a-z][\w.-]*/)"', home))
    assert {"queue/", "wire/", "rpc/", "benchmarks/"} <= links, links
    for link in links:
        assert (site / link / "index.html").is_file(), link


@pytest.mark.parametrize("package", PACKAGES)
def test_api_page_lists_every_public_name(site: Path, package: str) -> None:
    page = (site / "api" / package / "index.html").read_text()
    names = importlib.import_module(package).__all__
    missing = [name for name in names if f'id="{package}.{name}"' not in page]
    assert not missing, missing
