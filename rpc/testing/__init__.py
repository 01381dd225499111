"""Replay-testing kit for method-reader components (YamlTester, hypothesis strategies, pytest plugin).

Names are loaded on first use: pytest imports this package for the `chronq_replay` plugin in every run,
and that must stay cheap and independent of the codec.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpc.testing.yaml_tester import Recorder, ReplayResult, YamlTester, read_calls, render_calls

__all__ = ["Recorder", "ReplayResult", "YamlTester", "read_calls", "render_calls"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("rpc.testing.yaml_tester"), name)
    raise AttributeError(f"module 'rpc.testing' has no attribute {name!r}")
