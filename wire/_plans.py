"""The C plans (wire/_speedups.c `Plan`) of the typed BINARY codec, built from the same field model as
the generated Python code (`wire._codegen`), so both write and read the same fields under the same names.

A plan holds per field its key as written, attribute, kind, declared type, the Python writer for values
the C fast paths skip, and enum constants; and how to build an instance from the values in field order.
"""

from __future__ import annotations

import enum
import inspect
import sys
from collections.abc import Callable
from typing import Any

from wire import _codegen, binary
from wire._accel import K_BOOL, K_ENUM, K_FLOAT, K_FLOAT32, K_INT, K_OTHER, K_STR, speedups
from wire._fields import ClassFields
from wire.types import Float32


def kind(tp: Any) -> int:
    """The C plan's kind of a declared type."""
    if tp is int:
        return K_INT
    if tp is float:
        return K_FLOAT
    if tp is Float32:
        return K_FLOAT32
    if tp is str:
        return K_STR
    if tp is bool:
        return K_BOOL
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return K_ENUM
    return K_OTHER


def _entry(key: bytes, attr: str, tp: Any, writer: Any) -> tuple[Any, ...]:
    k = kind(tp)
    members = tuple((binary.utf8(m.name), m) for m in tp) if k == K_ENUM else None
    return (key, sys.intern(attr), k, tp, writer, members)


def positional(cls: Any, names: tuple[str, ...]) -> bool:
    """Whether `cls(*values)` in field order means `cls(**fields)` (no keyword-only or reordered
    parameters): the C decoder then builds objects without keyword names, about twice as fast."""
    try:
        params = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == len(names) and all(
        p.kind is p.POSITIONAL_OR_KEYWORD and p.name == name for p, name in zip(params, names, strict=True)
    )


def class_plan(info: ClassFields, value_writer: Callable[[Any], Any]) -> Any:
    """The C plan of a structured class (the accelerator must be there).

    A class with `init=False` fields is built by its generated builder (positional, every field), which
    sets those after construction; the plan then reads attributes generically (no slot offsets, which
    belong to the class itself), a cost only such classes pay."""
    entries = tuple(
        _entry(_codegen.key_bytes(f.wire_name), f.name, f.type, value_writer(f.type)) for f in info.fields
    )
    if info.has_post_init_fields:
        names = tuple(f.name for f in info.fields)
        return speedups.Plan(entries, _codegen.builder(info), names, True)
    init_names = tuple(f.init_name for f in info.fields if f.init_name is not None)
    return speedups.Plan(entries, info.cls, init_names, positional(info.cls, init_names))


def arguments_plan(types: tuple[Any, ...], value_writer: Callable[[Any], Any]) -> Any:
    """The C plan reading a method's arguments of these scalar types (int, float, str, bool, enums) as
    Java writes them: one bare value, or a sequence of one value per parameter; None otherwise."""
    if speedups is None or not types or any(kind(t) == K_OTHER for t in types):
        return None
    entries = tuple(_entry(b"\xc0", "_", t, value_writer(t)) for t in types)
    return speedups.Plan(entries, None, ("_",) * len(types), False, 1 if len(types) == 1 else 2)
