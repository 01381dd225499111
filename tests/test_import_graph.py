"""No import cycle among the modules of wire, chronq and rpc; imports point one way: rpc -> chronq -> wire.

Read from the AST of the imports a module runs when it is imported: statements at module level (also
inside a module-level ``try``/``if``), not those inside functions or ``if TYPE_CHECKING:`` blocks. A
cycle there means some module sees another half-initialised depending on which one is imported first.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in files else base)
            for t in targets:
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
