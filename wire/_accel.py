"""The optional C accelerator (wire/_speedups.c), loaded once for every module that uses it.

The only place that imports `wire._speedups` (its API: wire/_speedups.pyi). Other packages never see
the module: what they need of it is a public wire name (`wire.methods` for rpc's dispatch).

Its own module so that `wire.binary` (which the accelerator's generic reader serves) and the typed
codec built on it both reach it without importing each other. WIRE_NO_SPEEDUPS=1 forces the
pure-Python reference.
"""

from __future__ import annotations

import os
from typing import Any


def _load_speedups() -> Any:
    if os.environ.get("WIRE_NO_SPEEDUPS"):
        return None
    try:
        from wire import _speedups
    except ImportError:
        return None
    return _speedups


#: The C accelerator module, or None when running the pure-Python reference.
speedups: Any = _load_speedups()

# plan kinds shared with wire/_speedups.c
K_INT, K_FLOAT, K_STR, K_BOOL, K_ENUM, K_OTHER, K_FLOAT32 = range(7)
