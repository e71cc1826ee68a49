"""No module cycles in product code, lazy imports (inside functions) included: a cycle means two modules
that can only be read, tested and changed together. Imports under ``if TYPE_CHECKING:`` are for the type
checker and never run, so they are left out. ``python tests/test_import_cycles.py`` prints the graph's cycles."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_DIRS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def product_modules() -> dict[str, Path]:
    """Dotted name -> file of every product module (packages by their ``__init__``)."""
    found: dict[str, Path] = {}
    for package, folder in _DIRS.items():
        for path in (REPO / folder).glob("*.py"):
            found[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under an ``if TYPE_CHECKING:`` body."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return [node for node in ast.walk(tree) if id(node) not in skip]


def _imported(tree: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> set[str]:
    names: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:  # `from pkg import submodule` is an edge to the submodule
                sub = f"{base}.{alias.name}"
                if base in _DIRS and (REPO / _DIRS[base] / f"{alias.name}.c").exists():
                    continue  # a C extension (collector/_wire.c): it imports no Python module
                names.add(sub if sub in known else base)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the product modules it imports anywhere (module level or inside functions)."""
    known = product_modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = _imported(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        graph[name] = {m for m in edges if m in known and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_cycles() -> None:
    graph = import_graph()
    assert [[f"{m} -> {sorted(graph[m] & set(c))}" for m in c] for c in cycles(graph)] == []


def test_the_check_sees_lazy_imports_and_cycles() -> None:
    """The graph holds imports made inside functions, and `cycles` finds a two-module loop."""
    graph = import_graph()
    assert "spanrl.store.kept_rollouts" in graph["spanrl.store._spanstore"]  # imported inside SpanStore.open
    assert cycles({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]


if __name__ == "__main__":  # pragma: no cover
    g = import_graph()
    for component in cycles(g):
        print(" <-> ".join(component))
    sys.exit(0)
