"""Shared fixtures: the Java-written test vectors live beside the repository in ../shared."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example time limit (hypothesis' default is 200 ms): on a loaded 2-core machine, beside the
# other xdist worker, or under ASan an example can take longer without anything being wrong, and a
# deadline would turn that into a failure. Loaded here, before any test module builds its settings.
settings.register_profile("chronq", deadline=None)
settings.load_profile("chronq")

# Every Spark driver JVM the tests start (the shared session, and those of the demo and other driver
# subprocesses, which inherit the environment; Spark's launcher puts SPARK_SUBMIT_OPTS on the driver's
# command line): the client JIT only and the single-threaded collector. The test jobs are many short
# queries, so on 2 busy cores the optimizing JIT's and the parallel collector's threads cost more than
# they give back (the Spark tests took about a third less wall time). Results are the same; set
# SPARK_SUBMIT_OPTS to run them otherwise.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

VECTORS = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "chronicle"
GENERATED = VECTORS / "generated-cq5.26"


def skip_unless_strict(reason: str) -> None:
    """Skip the calling test, or fail it under ``CHRONQ_STRICT=1`` (CI), where nothing may be skipped for
    a missing prerequisite: a green CI run must have run the Spark and Java-vector tests."""
    if os.environ.get("CHRONQ_STRICT") == "1":
        pytest.fail(f"CHRONQ_STRICT=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def require_vectors() -> Path:
    """Return the vectors folder, or skip the calling test with the reason."""
    if not GENERATED.is_dir():
        skip_unless_strict(f"Java-written test vectors not found at {VECTORS} (../shared is absent)")
    return VECTORS


@pytest.fixture
def vectors() -> Path:
    return require_vectors()


@pytest.fixture(scope="module")
def dictionary_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A zstd queue whose dictionary was trained on its own messages (the codec tests')."""
    from chronq.codecs import Codec, train_dictionary
    from tests.codec_support import open_q, trade

    path = tmp_path_factory.mktemp("dict")
    with open_q(path, codec=Codec("zstd")) as q:
        q.appender().write_many([trade(i) for i in range(2000)])
        return path, train_dictionary(q, size=4096)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Groups for pytest-xdist's `--dist loadgroup` (`make test` runs the suite in parallel): every Spark
    test in one worker, so that one JVM serves them all instead of one per worker (a test that starts its
    own Spark in a subprocess, as test_demo.py's does, names another group); the `exclusive` tests
    (latency-sensitive, pinned CPUs, kill loops) one after another in one worker, never beside each
    other. Set as each test is collected: xdist reads the groups in its collection_modifyitems hook."""
    if item.get_closest_marker("xdist_group") is not None or not item.config.pluginmanager.hasplugin("xdist"):
        return
    for group in ("spark", "exclusive"):
        if item.get_closest_marker(group) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            return


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Make xdist's groups take effect on pytest 9.2+. An xdist worker names each grouped test's group in
    its node id (`path::test@group`), which the scheduler reads; xdist 3.8 still writes the id to the
    attribute older pytest read it from, so on pytest 9.2 every group was silently ignored (tests of one
    group ran on every worker). Carry its id over to the one pytest now reads."""
    yield
    if not config.pluginmanager.hasplugin("xdist") or config.getvalue("dist") != "no":
        return  # only the workers (whose dist is "no") name the groups
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest before 9.2: xdist's own id is the one read
        return
    for item in items:
        grouped = item.__dict__.get("_nodeid")
        if isinstance(grouped, str) and grouped != item.nodeid:
            item._id = coerce_node_id(grouped)  # type: ignore[attr-defined]
