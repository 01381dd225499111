"""The one field model: what a msgspec Struct, attrs class or dataclass puts on the wire.

Every codec (BINARY, FIELDLESS_BINARY, MSGSPEC), the text forms (YAML, JSON), Spark's typed columns and
the hypothesis strategies list a class's fields through `fields_of`, so a rename rule, an `init=False`
field, a default or `omit_defaults` means the same thing in all of them.

The rules (see docs/wire.md, "Fields"):

* Wire name: a Struct's `rename` applies (`encode_name`); attrs classes and dataclasses use the attribute
  name (an attrs `alias` only renames the constructor keyword).
* `init=False` fields are written like any other field, as msgspec, `dataclasses.asdict` and
  `attrs.asdict` do. Reading sets one present in the data on the object after construction (msgspec does
  the same for attrs classes); absent, the object keeps what its constructor gave it (default or
  `__post_init__`). Such a field is never required.
* `omit_defaults` (a Struct option): fields equal to their default are left out when writing.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from wire.types import Float32

#: The `default` of a field without one.
MISSING: Any = type("MissingType", (), {"__repr__": lambda self: "MISSING", "__slots__": ()})()


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field of a structured class."""

    name: str  #: the Python attribute
    wire_name: str  #: its name on the wire and in text (after a Struct's `rename`)
    init_name: str | None  #: the constructor keyword; None for an `init=False` field
    annotation: Any  #: the declared annotation, resolved where it can be
    type: Any  #: the annotation that decides the encoding (`Annotated` and NewTypes unwrapped)
    default: Any  #: MISSING when there is none
    default_factory: Callable[[], Any] | None

    @property
    def init(self) -> bool:
        """Whether the constructor takes this field."""
        return self.init_name is not None

    @property
    def required(self) -> bool:
        """Whether reading must find it: an `init=False` field never is (the constructor sets it)."""
        return self.init and self.default is MISSING and self.default_factory is None

    def default_value(self) -> Any:
        """The default (a new one from the factory), MISSING when there is none."""
        return self.default_factory() if self.default_factory is not None else self.default


@dataclasses.dataclass(frozen=True, slots=True)
class ClassFields:
    """A structured class's fields in declaration order, and the class options that change its form."""

    cls: type[Any]
    kind: str  #: "struct", "attrs" or "dataclass"
    fields: tuple[Field, ...]
    omit_defaults: bool = False
    array_like: bool = False
    tag_field: str | None = None
    tag: str | int | None = None

    @property
    def init_fields(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.init)

    @property
    def has_post_init_fields(self) -> bool:
        """Whether some field is set after construction (`init=False`)."""
        return any(not f.init for f in self.fields)

    def items(self, value: Any) -> list[tuple[Field, Any]]:
        """(field, value) pairs as they are written: all fields, less those equal to their default
        under `omit_defaults`."""
        out = [(f, getattr(value, f.name)) for f in self.fields]
        if self.omit_defaults:
            out = [(f, x) for f, x in out if not is_default(f, x)]
        return out


def is_default(f: Field, x: Any) -> bool:
    """Whether `x` equals `f`'s default (what `omit_defaults` leaves out; msgspec compares the same way:
    `==` to the default, or to an empty container for the usual factories)."""
    if f.default_factory is not None:
        if f.default_factory in (list, dict, set, tuple, frozenset, bytearray):
            return type(x) is f.default_factory and not x
        return False
    if f.default is MISSING:
        return False
    try:
        return bool(x is f.default or (type(x) is type(f.default) and x == f.default))
    except Exception:  # an __eq__ that refuses: not the default
        return False


def unwrap(tp: Any) -> Any:
    """The type that decides the encoding: `Annotated[T, ...]` and NewTypes (but Float32) are their T."""
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif isinstance(tp, typing.NewType) and tp is not Float32:
            tp = tp.__supertype__
        else:
            return tp


def _hints(cls: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # unresolvable forward references: those fields take generic values
        return {}


_cache: dict[Any, ClassFields | None] = {}


def fields_of(cls: Any) -> ClassFields | None:
    """The fields of a msgspec Struct, attrs class or dataclass; None for anything else (cached:
    introspection is slow, and a class's fields do not change)."""
    try:
        return _cache[cls]
    except KeyError:
        pass
    except TypeError:  # unhashable annotations such as some typing constructs
        return None
    found = _introspect(cls) if isinstance(cls, type) else None
    _cache[cls] = found
    return found


def _introspect(cls: type[Any]) -> ClassFields | None:
    import msgspec

    if issubclass(cls, msgspec.Struct):
        config = cls.__struct_config__
        out = []
        for f in msgspec.structs.fields(cls):
            factory = None if f.default_factory is msgspec.NODEFAULT else f.default_factory
            default = MISSING if f.default is msgspec.NODEFAULT else f.default
            out.append(Field(f.name, f.encode_name, f.name, f.type, unwrap(f.type), default, factory))
        return ClassFields(
            cls, "struct", tuple(out), bool(config.omit_defaults), bool(config.array_like),
            config.tag_field, config.tag,
        )  # fmt: skip
    attrs_fields = getattr(cls, "__attrs_attrs__", None)
    if attrs_fields is not None:
        import attrs

        hints = _hints(cls)
        out = []
        for a in attrs_fields:
            factory = a.default.factory if isinstance(a.default, attrs.Factory) else None  # type: ignore[arg-type]
            if factory is not None and a.default.takes_self:
                raise TypeError(f"{cls.__qualname__}.{a.name}: self-referencing factories are not supported")
            default = MISSING if a.default is attrs.NOTHING or factory is not None else a.default
            init_name = (getattr(a, "alias", None) or a.name.lstrip("_")) if a.init else None
            annotation = hints.get(a.name, a.type or Any)
            out.append(Field(a.name, a.name, init_name, annotation, unwrap(annotation), default, factory))
        return ClassFields(cls, "attrs", tuple(out))
    if dataclasses.is_dataclass(cls):
        hints = _hints(cls)
        out = []
        for d in dataclasses.fields(cls):
            factory = None if d.default_factory is dataclasses.MISSING else d.default_factory
            default = MISSING if d.default is dataclasses.MISSING else d.default
            annotation = hints.get(d.name, Any)
            init_name = d.name if d.init else None
            out.append(Field(d.name, d.name, init_name, annotation, unwrap(annotation), default, factory))
        return ClassFields(cls, "dataclass", tuple(out))
    return None


__all__ = ["MISSING", "ClassFields", "Field", "fields_of", "is_default", "unwrap"]
