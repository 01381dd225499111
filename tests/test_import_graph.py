"""The import rules of wire, chronq and rpc, read from each module's AST.

- No import cycle among the imports a module runs when it is imported: statements at module level (also
  inside a module-level ``try``/``if``), not those inside functions or ``if TYPE_CHECKING:`` blocks. A
  cycle there means some module sees another half-initialised depending on which one is imported first.
- On every import statement anywhere in a module (inside functions and ``TYPE_CHECKING`` blocks too):
  imports point one way, rpc -> chronq -> wire; nothing outside `chronq.spark` imports it (the Spark
  source is a leaf: it needs pyspark); and no package imports another package's private module (a
  module named with a leading underscore, or one inside such a package) -- what another package
  needs gets a public name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import chronq

# the folder the packages are imported from: this tree, or site-packages when the suite runs against an
# installed wheel (`make test-pythons`)
ROOT = Path(chronq.__file__).resolve().parents[1]
PACKAGES = ("wire", "chronq", "rpc")
LAYER = {"wire": 0, "chronq": 1, "rpc": 2}  # a module may import only its own layer and those below


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for pkg in packages:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_at_import(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements executed when the module body runs (TYPE_CHECKING blocks are not)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                out += _run_at_import(node.body)
            out += _run_at_import(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                out += _run_at_import(block)
        elif isinstance(node, ast.With):
            out += _run_at_import(node.body)
    return out


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_pkg: bool, files: set[str] | dict[str, Path]
             ) -> list[str]:
    """The modules (of `files`, or outside them by name) one import statement of module `name` names.

    ``from pkg import name`` is ``pkg.name`` when that is a module (or private: a private module, or
    a private name of it, either way not another package's to take), else ``pkg`` itself."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        anchor = name.split(".") if is_pkg else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append(sub if sub in files or alias.name.startswith("_") else base)
    return out


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of `packages` its body imports.

    ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg`` itself.
    A submodule's implicit import of its parent packages is no edge: Python starts those first.
    """
    files = module_files(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in _run_at_import(ast.parse(path.read_text(), str(path)).body):
            for t in _targets(node, name, is_pkg, files):
                if t in files and t != name and not name.startswith(t + "."):
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _private_owner(module: str) -> str | None:
    """The package a private module belongs to (`chronq` for `chronq._directory`), None if public."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def rule_violations(name: str, source: str, is_pkg: bool = False, modules: set[str] | None = None
                    ) -> list[str]:
    """The import rules module `name` (with this `source`) breaks, one line each, on every import
    statement anywhere in it. `modules`: the known module names (to tell ``from pkg import mod``)."""
    known = modules or set()
    found = []
    own_top = name.split(".")[0]
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for t in _targets(node, name, is_pkg, known):
            top = t.split(".")[0]
            if top not in LAYER:
                continue
            where = f"{name}:{node.lineno} imports {t}"
            if LAYER[top] > LAYER[own_top]:
                found.append(f"{where}: upward (imports point rpc -> chronq -> wire)")
            if (t == "chronq.spark" or t.startswith("chronq.spark.")) and not (
                    name == "chronq.spark" or name.startswith("chronq.spark.")):
                found.append(f"{where}: nothing outside chronq.spark imports it")
            owner = _private_owner(t)
            if owner is not None and top != own_top:
                found.append(f"{where}: a private module of another package ({owner})")
    return found


def test_import_rules_hold_on_every_import() -> None:
    files = module_files(ROOT, PACKAGES)
    broken = [v for name, path in sorted(files.items())
              for v in rule_violations(name, path.read_text(), path.name == "__init__.py", set(files))]
    assert broken == []


@pytest.mark.parametrize(("name", "source", "rule"), [
    # the two violations fixed, reintroduced: rpc inside a function of the Spark source ...
    ("chronq.spark._typed", "def interface_columns(spec):\n    import rpc\n    return rpc.describe\n",
     "upward"),
    # ... and chronq's private progress module from rpc's command line
    ("rpc.cli", "def _write(args):\n    from chronq._progress import Progress\n", "private module"),
    ("rpc.cli", "from chronq import _directory\n", "private module"),
    ("chronq.queue", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rpc import Service\n",
     "upward"),
    ("wire.binary", "def f():\n    from chronq.errors import ChronqError\n", "upward"),
    ("chronq.cli", "def f():\n    from chronq.spark import source\n", "outside chronq.spark"),
    ("rpc.service", "import chronq.spark._typed\n", "outside chronq.spark"),
    ("chronq.codecs", "from wire import _accel\n", "private module"),
])
def test_the_checker_sees_each_broken_rule(name: str, source: str, rule: str) -> None:
    found = rule_violations(name, source, modules={"chronq._directory", "chronq.spark.source"})
    assert any(rule in v for v in found), found


def test_the_checker_passes_allowed_imports() -> None:
    # downward, within a package's own private modules (a subpackage included), the Spark source itself
    ok = "from chronq import _directory\nfrom chronq.spark import _typed\nimport wire.binary\n"
    modules = {"chronq._directory", "chronq.spark._typed"}
    assert rule_violations("chronq.spark.source", ok, modules=modules) == []
    assert rule_violations("rpc.cli", "import chronq.progress\nfrom wire import binary\n") == []


def test_no_import_cycles() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert "chronq.queue" in graph and graph["chronq.queue"] >= {"chronq.appender", "chronq.tailer"}
    assert cycles(graph) == []


def test_imports_point_one_way() -> None:
    graph = import_graph(ROOT, PACKAGES)
    upward = sorted(
        f"{a} -> {b}" for a, deps in graph.items() for b in deps
        if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]]
    )
    assert upward == []


def test_the_checker_sees_a_cycle(tmp_path: Path) -> None:
    # the graph walk itself: module-level and `try` imports count, function-local and TYPE_CHECKING ones not
    pkg = tmp_path / "pk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pk.a import A\n")
    (pkg / "a.py").write_text("try:\n    from pk import b\nexcept ImportError:\n    b = None\nA = 1\n")
    (pkg / "b.py").write_text("from . import c\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pk import d\n"
        "def f():\n    from pk import d\n    return d\nimport pk.a\n"
    )
    (pkg / "d.py").write_text("from pk.c import f\n")
    graph = import_graph(tmp_path, ("pk",))
    assert graph == {"pk": {"pk.a"}, "pk.a": {"pk.b"}, "pk.b": {"pk.c"}, "pk.c": {"pk.a"}, "pk.d": {"pk.c"}}
    assert cycles(graph) == [["pk.a", "pk.b", "pk.c"]]


def test_the_table_store_is_below_the_directory() -> None:
    # Chronicle's directory listing builds on the table store, never the reverse (not even lazily)
    files = module_files(ROOT, PACKAGES)
    tree = ast.parse(files["chronq.table"].read_text())
    imported = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for t in _targets(node, "chronq.table", False, files)}
    assert "chronq._directory" not in imported


def test_options_are_defined_once() -> None:
    # chronq.open takes Queue's parameters (one definition), rpc.reader is MethodReader's constructor
    import inspect

    import chronq
    import rpc

    init = list(inspect.signature(chronq.Queue.__init__).parameters.values())[1:]
    assert list(inspect.signature(chronq.open).parameters.values()) == init
    assert rpc.reader is rpc.MethodReader


def _underscored_definitions(tree: ast.AST) -> set[str]:
    """The underscored names a module defines: functions, classes, methods, globals, attributes it
    assigns (``self._x = ...``)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return {name for name in out if name.startswith("_") and not name.startswith("__")}


def private_reaches(sources: dict[str, str], native: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Where a module (of `sources`: name -> text) takes another module's underscored name: imports it
    (``from m import _x``), or reads ``obj._x`` of an object (not ``self``/``cls``) when `_x` is defined
    by another of the modules and not by this one. What one module needs of another has a public
    (possibly internal, documented) name. `native`: the underscored members of chronq's C cores
    (chronq/_native.pyi), the documented protocol between chronq's modules and their C hot path."""
    trees = {name: ast.parse(src) for name, src in sources.items()}
    defined = {name: _underscored_definitions(tree) for name, tree in trees.items()}
    packages = {name.rsplit(".", 1)[0] for name in sources if "." in name}
    found = []
    for name, tree in trees.items():
        elsewhere = set().union(*(d for m, d in defined.items() if m != name)) - defined[name] - native
        for n in ast.walk(tree):
            if (isinstance(n, ast.ImportFrom) and n.module in sources and n.module != name
                    and n.module not in packages):  # (`from pkg import _mod`: the import rules' business)
                found += [f"{name}:{n.lineno} imports {n.module}.{a.name}" for a in n.names
                          if a.name.startswith("_") and f"{n.module}.{a.name}" not in sources]
            elif (isinstance(n, ast.Attribute) and n.attr in elsewhere
                  and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))):
                found.append(f"{name}:{n.lineno} reads {ast.unparse(n.value)}.{n.attr}")
    return found


def test_no_module_reaches_another_modules_underscored_names() -> None:
    files = module_files(ROOT, PACKAGES)
    native = _underscored_definitions(ast.parse((ROOT / "chronq" / "_native.pyi").read_text()))
    assert private_reaches({name: path.read_text() for name, path in files.items()}, native) == []


def test_the_checker_sees_a_reach_into_another_module() -> None:
    queue = "class Queue:\n    def _fresh_cycles(self):\n        return self._cycles\n"
    tailer = "def f(q):\n    return q._fresh_cycles()\n"
    found = private_reaches({"chronq.queue": queue, "chronq.tailer": tailer,
                             "chronq.codecs": "from chronq.queue import _helper\n"})
    assert found == ["chronq.tailer:2 reads q._fresh_cycles", "chronq.codecs:1 imports chronq.queue._helper"]
    # its own underscored names, through self or not, are a module's own business
    assert private_reaches({"chronq.queue": queue + "def g(q):\n    return q._fresh_cycles()\n"}) == []
