"""What `CHRONQ_STRICT=1` (CI) adds: a green run must have run on the C accelerators, and the fuzzing
harnesses must have had their seeds. Each of these quietly has a fallback elsewhere (pure Python, a
harness that returns at once), so without these checks a CI run could pass having tested the fallback."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
STRICT = os.environ.get("CHRONQ_STRICT") == "1"


@pytest.mark.skipif(not STRICT, reason="the pure-Python fallbacks are allowed outside CHRONQ_STRICT=1")
def test_the_c_accelerators_are_loaded() -> None:
    import chronq
    import wire
    from chronq import _codecs, _native
    from wire import methods

    assert _codecs.HAVE_AES, "chronq._codecs was built without OpenSSL (AES-GCM falls back to cryptography)"
    modules = [(_native, chronq), (_codecs, chronq)]
    if os.environ.get("WIRE_NO_SPEEDUPS"):  # make test-pure: wire's pure-Python codec on purpose
        assert not methods.accelerated
    else:
        assert methods.accelerated, "wire._speedups did not load: wire runs on its pure-Python codec"
        modules.append((importlib.import_module("wire._speedups"), wire))
    for module, package in modules:
        # built for this interpreter, beside the package under test (an editable install elsewhere on the
        # path would otherwise lend its own build to a tree that has none)
        path = Path(str(module.__file__))
        assert path.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), f"not a C module: {path}"
        assert path.parent == Path(str(package.__file__)).parent, f"{module.__name__} loaded from {path}"


def _fuzz_common() -> ModuleType:
    """tests/fuzz/common.py (the harnesses import it as a top-level module, beside them)."""
    spec = importlib.util.spec_from_file_location("fuzz_common", ROOT / "tests" / "fuzz" / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_fuzz_harness_without_its_vectors_fails_under_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make fuzz` must not pass having fuzzed nothing: a missing vector ends the harness under strict."""
    common = _fuzz_common()
    monkeypatch.setattr(common, "VECTORS", tmp_path)
    (tmp_path / "present").mkdir()
    (tmp_path / "present" / "20240115.cq4").write_bytes(b"x")
    monkeypatch.setenv("CHRONQ_STRICT", "1")
    with pytest.raises(SystemExit, match=r"CHRONQ_STRICT=1 but .*vectors missing .*: absent$"):
        common.load_queues(["present", "absent"])
    monkeypatch.delenv("CHRONQ_STRICT")
    loaded = common.load_queues(["present", "absent"])
    assert loaded == [("present", {"20240115.cq4": b"x"})]
    assert "vectors missing" in capsys.readouterr().err
