"""Shared fixtures: the Java-written test vectors live beside the repository in ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
