"""Shared fixtures: the Java-written test vectors live beside the repository in ../shared."""

from __future__ import annotations

from pathlib import Path

import pytest

VECTORS = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "chronicle"
GENERATED = VECTORS / "generated-cq5.26"


def require_vectors() -> Path:
    """Return the vectors folder, or skip the calling test with the reason."""
    if not GENERATED.is_dir():
        pytest.skip(f"Java-written test vectors not found at {VECTORS} (../shared is absent)")
    return VECTORS


@pytest.fixture
def vectors() -> Path:
    return require_vectors()
