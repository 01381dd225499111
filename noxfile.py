"""The matrix of Pythons (`make test-pythons`): for each of 3.11, 3.12 and 3.13, a wheel built from this
tree's sdist with that Python, installed (not editable) into a clean virtualenv, then the test suite run
against the installed package, so a module, stub or entry point missing from the wheel fails a test.

The Pythons are pyenv's (``$(pyenv root)/versions/X.Y.Z/bin/python3``, the newest X.Y.Z of each); nox
never downloads one. One that is not installed is said in the session's output: its session is skipped,
except 3.11 (the oldest supported, and CI's), whose absence fails. Run one with ``nox -s tests-3.12``;
arguments after ``--`` go to pytest (``nox -s tests-3.13 -- tests/test_tailer.py``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PYTHONS = ("3.11", "3.12", "3.13")
REQUIRED = "3.11"  # a machine without it fails `make test-pythons`; the others are skipped, saying so
EXTRAS = "dev,spark,docs,archive,archive-test,codecs,cli"
# What the suite needs beside the package, copied next to it: the tests' tree without chronq, wire, rpc
# and pyspark_chronq, which must come from the installed wheel.
TREE = ("tests", "docs", "examples", "benchmarks", "README.md", "pyproject.toml", "mkdocs.yml",
        "mkdocs_hooks.py", "Makefile")
# The only tests left out, as they cannot run from an installed wheel: test_wheel.py builds the sdist and
# wheel from this repository's sources (`make test-pythons` runs it first, on the dev interpreter);
# test_docs_site.py builds the documentation site, whose mkdocs.yml watches and reads the source packages
# (`make docs` builds it in CI); test_editable_install.py installs the source tree in editable mode, as
# the Makefile does (`make test` runs it). Tests that read the packages' files find them where the packages
# are imported from: site-packages here.
NOT_FROM_A_WHEEL = ("tests/test_wheel.py", "tests/test_docs_site.py", "tests/test_editable_install.py")

nox.options.download_python = "never"
nox.options.default_venv_backend = "venv"
nox.options.sessions = [f"tests-{v}" for v in PYTHONS]


def pyenv_python(version: str) -> tuple[str | None, str]:
    """(the interpreter of pyenv's newest `version`.Z, or None; what was found, to say when it is None)."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
        bare = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True,
                              check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"pyenv is not usable here ({e})"
    found = [v for v in bare if re.fullmatch(re.escape(version) + r"\.\d+", v)]
    if not found:
        return None, f"pyenv has no Python {version} (it has: {', '.join(bare) or 'none'})"
    newest = max(found, key=lambda v: int(v.rsplit(".", 1)[1]))
    path = Path(root) / "versions" / newest / "bin" / "python3"
    if not path.exists():
        return None, f"pyenv lists Python {newest} but {path} does not exist"
    return str(path), newest


def run_suite(session: nox.Session, version: str) -> None:
    """Build the wheel with this session's Python, install it with the test extras, run the suite."""
    work = ROOT / "build" / "pythons" / version
    shutil.rmtree(work, ignore_errors=True)
    dist, tree = work / "dist", work / "tree"
    session.install("build")
    # sdist first, then the wheel built from the unpacked sdist: what `pip install chronq` from an sdist does
    session.run("python", "-m", "build", "--outdir", str(dist), str(ROOT), silent=True)  # printed if it fails
    (wheel,) = dist.glob("chronq-*.whl")
    session.install(f"{wheel}[{EXTRAS}]", "pytest-xdist")
    for part in TREE:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        elif src.exists():
            shutil.copy2(src, tree / part)
    shared = ROOT.parent / "shared"  # the Java-written vectors and run.sh, at ../shared from the tree
    if shared.exists():
        (work / "shared").symlink_to(shared.resolve())
    session.chdir(tree)
    # `python -m pytest` puts the tree (which has no chronq) first on sys.path for the tests' own `tests.`
    # imports; chronq, wire and rpc come from site-packages.
    here = session.run("python", "-c", "import chronq, wire, rpc; print(chronq.__file__)", silent=True)
    assert isinstance(here, str) and Path(here.strip()).is_relative_to(session.virtualenv.location), here
    ignore = [f"--deselect={t}" for t in NOT_FROM_A_WHEEL]  # also when named on the command line
    # in parallel as `make test` runs it: --dist loadgroup keeps the Spark tests in one worker (one JVM)
    # and the `exclusive` ones one after another, never beside each other (tests/conftest.py)
    xdist = ["-n", "auto", "--dist", "loadgroup", "--durations=10"]
    session.run("python", "-m", "pytest", "-q", *xdist, *ignore, *(session.posargs or ["tests"]))


def define(version: str) -> None:
    """The session `tests-<version>`, on pyenv's interpreter when there is one."""
    python, found = pyenv_python(version)

    if python is not None:
        @nox.session(name=f"tests-{version}", python=python)
        def tests(session: nox.Session) -> None:
            session.log(f"Python {found} from pyenv: {python}")
            run_suite(session, version)
    else:
        @nox.session(name=f"tests-{version}", python=False)
        def missing(session: nox.Session) -> None:
            message = f"Python {version} is not tested on this machine: {found}"
            if version == REQUIRED:
                session.error(message)
            session.skip(message)


for v in PYTHONS:
    define(v)
