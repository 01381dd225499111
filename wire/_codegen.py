"""Generated Python code for the typed BINARY codec: per class, a fields encoder, a fields decoder and
(for classes with `init=False` fields) a builder, compiled once from the class's field model.

Each function's source is registered with `linecache` under a file name of its own
(`<wire encode_fields module.Class #n>`), so a traceback through one class's code shows that code.
The value writers and readers come from the caller (`wire.marshal`): this module knows the layout of a
class's fields, not how each type is written.
"""

from __future__ import annotations

import enum
import itertools
import keyword
import linecache
from collections.abc import Callable
from typing import Any

from wire import binary
from wire._fields import MISSING, ClassFields, is_default
from wire.errors import WireError

_serial = itertools.count(1)


def source_name(what: str, cls: Any) -> str:
    """A `linecache` file name no other generated function has (classes may share a qualname)."""
    owner = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}"
    return f"<wire {what} {owner} #{next(_serial)}>"


def compile_function(name: str, source: str, namespace: dict[str, Any], filename: str) -> Any:
    """`source` defining `name`, compiled under `filename`, whose text tracebacks then show."""
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, namespace)
    return namespace[name]


def key_bytes(name: str) -> bytes:
    """A field name as BINARY writes it."""
    b = bytearray()
    binary.put_field(b, name)
    return bytes(b)


def is_keyword_safe(name: str) -> bool:
    """Whether generated code may pass `name` as `name=value` (not for fields such as `try`)."""
    return name.isidentifier() and not keyword.iskeyword(name)


def fields_encoder(info: ClassFields, value_writer: Callable[[Any], Any]) -> Any:
    """`encode_fields(b, v)` appending `v`'s fields (no length prefix), the common scalars inline."""
    ns: dict[str, Any] = {"put_int": binary.put_int, "put_text": binary.put_text}
    ns["put_float"] = binary.put_float
    lines = ["def encode_fields(b, v):"]
    for i, f in enumerate(info.fields):
        ns[f"K{i}"] = key_bytes(f.wire_name)
        lines.append(f"    x = v.{f.name}" if is_keyword_safe(f.name) else f"    x = getattr(v, {f.name!r})")
        indent = "    "
        if info.omit_defaults and (f.default is not MISSING or f.default_factory is not None):
            ns[f"F{i}"] = f
            ns["is_default"] = is_default
            lines.append(f"    if not is_default(F{i}, x):")
            indent = "        "
        body: list[str] = [f"b += K{i}"]
        if f.type is int:  # inline the most common small-int case
            body += ["if x.__class__ is int and 0 <= x <= 255:", "    b.append(0xA1)", "    b.append(x)",
                     "else:", "    put_int(b, x)"]  # fmt: skip
        elif f.type is str:  # short ASCII text inline
            body += ["if x.__class__ is str and len(x) < 32 and x.isascii():", "    b.append(0xE0 + len(x))",
                     "    b += x.encode()", "else:", "    put_text(b, x)"]  # fmt: skip
        elif f.type is float:
            body.append("put_float(b, x if x.__class__ is float else float(x))")
        elif f.type is bool:
            body.append("b.append(0xB1 if x else 0xB0)")
        elif isinstance(f.type, type) and issubclass(f.type, enum.Enum):
            ns[f"T{i}"] = f.type
            ns[f"W{i}"] = value_writer(f.type)
            body += [f"if x.__class__ is T{i} and len(x.name) < 32 and x.name.isascii():",
                     "    b.append(0xE0 + len(x.name))", "    b += x.name.encode()",
                     "else:", f"    W{i}(b, x)"]  # fmt: skip
        else:
            ns[f"W{i}"] = value_writer(f.type)
            body.append(f"W{i}(b, x)")
        lines += [indent + line for line in body]
    if not info.fields:
        lines.append("    pass")
    source = "\n".join(lines) + "\n"
    return compile_function("encode_fields", source, ns, source_name("encode_fields", info.cls))


def builder(info: ClassFields) -> Callable[..., Any]:
    """`build(*values)` in field order -> an instance: the constructor takes the `init` fields, and the
    `init=False` ones are set afterwards (with `object.__setattr__`, which frozen classes allow).
    A value MISSING is not set: the object keeps what its constructor gave it."""
    ns: dict[str, Any] = {"cls": info.cls, "MISSING": MISSING, "setattr": object.__setattr__}
    params = ", ".join(f"f{i}" for i in range(len(info.fields)))
    lines = [f"def build({params}):", f"    o = cls({_arguments(info)})"]
    for i, f in enumerate(info.fields):
        if not f.init:
            lines.append(f"    if f{i} is not MISSING:")
            lines.append(f"        setattr(o, {f.name!r}, f{i})")
    lines.append("    return o")
    source = "\n".join(lines) + "\n"
    return compile_function("build", source, ns, source_name("build", info.cls))  # type: ignore[no-any-return]


def _arguments(info: ClassFields) -> str:
    """The constructor call's arguments for the init fields, held in `f0`, `f1`, ... (field order)."""
    plain, other = [], []
    for i, f in enumerate(info.fields):
        if f.init_name is None:
            continue
        if is_keyword_safe(f.init_name):
            plain.append(f"{f.init_name}=f{i}")
        else:
            other.append(f"{f.init_name!r}: f{i}")
    return ", ".join(plain + ([f"**{{{', '.join(other)}}}"] if other else []))


def fields_decoder(info: ClassFields, value_reader: Callable[[Any], Any], scan: Any = None) -> Any:
    """`decode_fields(r)` reading the remaining fields of a Reader into an instance, matched by wire
    name (unknown ones skipped, missing ones defaulted). `scan` is a C plan's `decode_fields`: it reads
    a block of known scalar fields at once; anything unusual falls through to the Python loop."""
    fields = info.fields
    ns: dict[str, Any] = {"cls": info.cls, "MISSING": MISSING, "WireError": WireError}
    lines = ["def decode_fields(r):"]
    body = "    "
    if scan is not None and fields:
        ns["SCAN"] = scan
        lines.append("    vals = SCAN(r.buf, r.pos, r.end, MISSING)")
        lines.append("    if vals is not None:")
        lines.append("        r.pos = r.end")
        lines.append(f"        {', '.join(f'f{i}' for i in range(len(fields)))}, = vals")
        lines.append("    else:")
        body = "        "
    for i in range(len(fields)):
        lines.append(f"{body}f{i} = MISSING")
    lines.append(f"{body}has_more = r.has_more")
    lines.append(f"{body}read_field = r.read_field")
    lines.append(f"{body}while has_more():")
    lines.append(f"{body}    k = read_field()")
    for i, f in enumerate(fields):
        ns[f"R{i}"] = value_reader(f.type)
        lines.append(f"{body}    {'if' if i == 0 else 'elif'} k == {f.wire_name!r}:")
        lines.append(f"{body}        f{i} = R{i}(r)")
    if fields:
        lines.append(f"{body}    else:")
        lines.append(f"{body}        r.skip_value()")
    else:
        lines.append(f"{body}    r.skip_value()")
    for i, f in enumerate(fields):
        if not f.init:
            continue  # left MISSING: the builder does not set it
        lines.append(f"    if f{i} is MISSING:")
        if f.default_factory is not None:
            ns[f"F{i}"] = f.default_factory
            lines.append(f"        f{i} = F{i}()")
        elif f.default is not MISSING:
            ns[f"D{i}"] = f.default
            lines.append(f"        f{i} = D{i}")
        else:
            message = f"{info.cls.__qualname__}: required field {f.wire_name!r} is missing"
            lines.append(f"        raise WireError({message!r}, r.pos)")
    if info.has_post_init_fields:
        ns["build"] = builder(info)
        lines.append(f"    return build({', '.join(f'f{i}' for i in range(len(fields)))})")
    else:
        lines.append(f"    return cls({_arguments(info)})")
    source = "\n".join(lines) + "\n"
    return compile_function("decode_fields", source, ns, source_name("decode_fields", info.cls))
