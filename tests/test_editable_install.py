"""The editable install `make` does is one a static checker can see.

setuptools' default editable mode installs an import hook, which mypy and pyright cannot follow: a
user's own code outside the repository then type-checks as if chronq and rpc were missing. The Makefile
asks for a mode that installs a plain path entry instead; this installs the project the way its install
line says (into a fresh virtual environment, from a copy of the sources so the tree's C modules are not
rebuilt under other tests) and runs mypy on a file that imports chronq and rpc from elsewhere.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

USER_CODE = """\
import chronq
import rpc
from typing import Protocol


class Greeter(Protocol):
    def greet(self, name: str) -> None: ...


def send(path: str) -> int:
    with chronq.open(path) as q:
        rpc.writer(q, Greeter).greet("world")
        index: int | None = q.last_index
        return -1 if index is None else index
"""


def _install_settings() -> list[str]:
    """The `--config-settings` the Makefile's editable installs pass (its EDITABLE variable)."""
    text = (REPO / "Makefile").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and " -e " in line]
    assert installs and all("$(EDITABLE)" in line for line in installs), installs
    defined = re.search(r"^EDITABLE\s*:?=(.*)$", text, re.MULTILINE)
    assert defined is not None, "the Makefile defines no EDITABLE"
    words = shlex.split(defined[1])
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--config-settings"]


def test_the_makefiles_editable_mode_is_seen_by_mypy_outside_the_tree(tmp_path: Path) -> None:
    settings = _install_settings()
    assert any(re.fullmatch(r"editable_mode=(compat|strict)", s) for s in settings), settings

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "pyspark_chronq.py"):
        shutil.copy2(REPO / name, src / name)
    for package in ("chronq", "rpc", "wire"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([venv / "bin" / "python", "-c", where], capture_output=True, text=True,
                               check=True).stdout.strip())
    # setuptools, mypy and chronq's dependencies come from the environment running the tests (a plain
    # path entry: its own .pth files, such as an import hook of its chronq, are not processed)
    (site / "tests-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    install = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
               "--no-deps", "--no-build-isolation", "--no-index", "-e", str(src)]
    for s in settings:
        install += ["--config-settings", s]
    r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr

    user = tmp_path / "elsewhere"
    user.mkdir()
    (user / "app.py").write_text(USER_CODE)
    r = subprocess.run([venv / "bin" / "python", "-m", "mypy", "--strict", "--no-incremental", "app.py"],
                       capture_output=True, text=True, cwd=user, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found in 1 source file" in r.stdout
