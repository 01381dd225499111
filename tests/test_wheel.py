"""The sdist and the wheel `python -m build` makes from this tree carry what an installed chronq needs:
every module, the C modules, the `.pyi` stubs and `py.typed` markers, the `pyspark_chronq` shim, the
entry points and the licence; the sdist builds with OpenSSL's headers (chronq._codecs links libcrypto)
and without them (it builds without AES-GCM, says so, and codec queues seal through `cryptography`).

Marked `wheel` (two builds, about a minute): `make test-pythons` runs it, then the whole suite against
the installed wheel on each Python (noxfile.py)."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chronq", "wire", "rpc")
EXT = sysconfig.get_config_var("EXT_SUFFIX")
C_MODULES = ("chronq/_native", "chronq/_codecs", "wire/_speedups")
# What the package needs whatever else the tree holds: deleting one from the tree or from the package
# data of pyproject.toml fails this test.
NEEDED = (
    *(f"{m}{EXT}" for m in C_MODULES),
    *(f"{m}.pyi" for m in C_MODULES),
    *(f"{p}/py.typed" for p in PACKAGES),
    "pyspark_chronq.py",
    "chronq/__init__.py", "chronq/__main__.py", "chronq/cli.py", "chronq/spark/__init__.py",
    "rpc/__init__.py", "rpc/cli.py", "rpc/testing/plugin.py", "wire/__init__.py",
)
# what pyproject.toml declares: the command and every entry point group (rpc's CLI commands and decoders,
# the Spark source's interface reader, the pytest plugin) must reach the wheel
_PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
ENTRY_POINTS = {"console_scripts": _PROJECT["scripts"], **_PROJECT["entry-points"]}
# Run from an unpacked wheel: the C modules load, a plain queue and an AES-GCM codec queue round-trip.
ROUND_TRIP = textwrap.dedent("""
    import sys
    import chronq, chronq._codecs
    from chronq.codecs import Codec, Keys
    assert chronq.__file__.startswith(sys.argv[1]), chronq.__file__
    with chronq.open(sys.argv[2]) as q:
        q.appender().write_many([b"plain %d" % i for i in range(100)])
        assert q.tailer().read_many() == [b"plain %d" % i for i in range(100)]
    keys = Keys({1: bytes(range(32))})
    with chronq.open(sys.argv[3], codec=Codec(None, "aes-gcm"), keys=keys) as q:
        q.appender().write_many([b"sealed %d" % i for i in range(100)])
        assert q.tailer().read_many() == [b"sealed %d" % i for i in range(100)]
    print("HAVE_AES", chronq._codecs.HAVE_AES)
""")


def build(src: Path, out: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """`python -m build` (in this environment: no download) of `src` into `out`; its output."""
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), *args, str(src)]
    env = {**os.environ, **(env or {})}
    r = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(the sdist, the wheel built from it, the build's output)."""
    out = tmp_path_factory.mktemp("dist")
    log = build(ROOT, out)
    (sdist,) = out.glob("chronq-*.tar.gz")
    (wheel,) = out.glob("chronq-*.whl")
    return sdist, wheel, log


def links_libcrypto(wheel: Path, module: str) -> bool:
    """Whether the wheel's C module names libcrypto among the libraries it needs (ELF DT_NEEDED names
    are strings in the module's dynamic string table)."""
    with zipfile.ZipFile(wheel) as z:
        return b"libcrypto" in z.read(f"{module}{EXT}")


def round_trip(wheel: Path, tmp: Path) -> str:
    """Unpack the wheel and run ROUND_TRIP against it alone (no tree on the path): its output."""
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", ROUND_TRIP, str(site), str(tmp / "plain"), str(tmp / "sealed")],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_wheel_carries_every_module_stub_marker_and_c_module(dist: tuple[Path, Path, str]) -> None:
    _, wheel, _ = dist
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in NEEDED if n not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    tracked = sorted(
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*")
        if p.suffix in (".py", ".pyi") or p.name == "py.typed"
    )
    assert [t for t in tracked if t not in names] == []
    top = {n.split("/", 1)[0] for n in names}
    assert top == {*PACKAGES, "pyspark_chronq.py", wheel.name.split("-")[0] + "-0.1.0.dist-info"}


def test_wheel_declares_entry_points_licence_and_pythons(dist: tuple[Path, Path, str]) -> None:
    _, wheel, _ = dist
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        entry_points = configparser.ConfigParser()
        entry_points.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
        entry_points.read_string(z.read(f"{info}/entry_points.txt").decode())
        metadata = z.read(f"{info}/METADATA").decode()
        licence = z.read(f"{info}/licenses/LICENSE").decode()
    assert {s: dict(entry_points[s]) for s in entry_points.sections()} == ENTRY_POINTS
    assert "Apache License" in licence and "Version 2.0" in licence
    lines = metadata.splitlines()
    assert "License-Expression: Apache-2.0" in lines and "License-File: LICENSE" in lines
    assert "Requires-Python: >=3.11" in lines
    python = "Classifier: Programming Language :: Python :: 3."
    tested = [x.rsplit(":: ", 1)[1] for x in lines if x.startswith(python)]
    assert tested == ["3.11", "3.12", "3.13"]


def test_sdist_carries_what_the_wheel_is_built_from(dist: tuple[Path, Path, str]) -> None:
    sdist, _, _ = dist
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    needed = {"setup.py", "pyproject.toml", "README.md", "LICENSE", "pyspark_chronq.py",
              "wire/_document_source.h", "chronq/csrc/doorbell.c", "chronq/csrc/doorbell.h",
              *(f"{m}.c" for m in C_MODULES), *(f"{m}.pyi" for m in C_MODULES),
              *(f"{p}/py.typed" for p in PACKAGES)}
    assert sorted(needed - names) == []


def test_wheel_built_with_openssl_headers_links_libcrypto_only_in_codecs(
        dist: tuple[Path, Path, str], tmp_path: Path) -> None:
    """The wheel `python -m build` made from the sdist (which builds the wheel from the unpacked sdist)."""
    _, wheel, log = dist
    if "building without OpenSSL" in log:
        pytest.skip("OpenSSL's headers are not on this machine: the build without them is the next test")
    assert links_libcrypto(wheel, "chronq/_codecs")
    assert not links_libcrypto(wheel, "chronq/_native") and not links_libcrypto(wheel, "wire/_speedups")
    assert round_trip(wheel, tmp_path) == "HAVE_AES True"


def test_sdist_builds_without_openssl_headers(dist: tuple[Path, Path, str], tmp_path: Path) -> None:
    """OPENSSL_DIR naming a prefix without `include/openssl/evp.h`, as a machine without OpenSSL's
    headers: the build says it goes without, chronq._codecs links no libcrypto and AES-GCM codec queues
    still round-trip (through `cryptography`)."""
    sdist, _, _ = dist
    (tmp_path / "no-openssl" / "include").mkdir(parents=True)
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path / "src", filter="data")
    (src,) = (tmp_path / "src").iterdir()
    out = tmp_path / "dist"
    log = build(src, out, "--wheel", env={"OPENSSL_DIR": str(tmp_path / "no-openssl")})
    assert "chronq._codecs: building without OpenSSL" in log
    (wheel,) = out.glob("chronq-*.whl")
    assert not links_libcrypto(wheel, "chronq/_codecs")
    assert round_trip(wheel, tmp_path) == "HAVE_AES False"
