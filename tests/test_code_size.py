"""Small modules, short functions (the team's guide): no product module over 500 lines, no function
over 80, in every product package. ``python tests/test_code_size.py`` lists the biggest everywhere."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("spanrl", "instrumentation", "collector", "store", "algorithms", "trainer", "serving", "ui")
HELD = PRODUCT  # every room keeps the limits
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _files(roots: tuple[str, ...]) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        path = REPO / root
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [p for p in found if "__pycache__" not in p.parts]


def module_lines(roots: tuple[str, ...]) -> list[tuple[int, str]]:
    return sorted(((len(p.read_text().splitlines()), str(p.relative_to(REPO))) for p in _files(roots)), reverse=True)


def function_lines(roots: tuple[str, ...]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for path in _files(roots):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(REPO)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def test_no_module_over_the_limit() -> None:
    assert [m for m in module_lines(HELD) if m[0] > MAX_MODULE_LINES] == []


def test_no_function_over_the_limit() -> None:
    assert [f for f in function_lines(HELD) if f[0] > MAX_FUNCTION_LINES] == []


if __name__ == "__main__":  # pragma: no cover
    for title, rows, limit in (("modules", module_lines(PRODUCT), MAX_MODULE_LINES),
                               ("functions", function_lines(PRODUCT), MAX_FUNCTION_LINES)):
        print(f"{title} over {limit} lines:")
        for n, name in rows:
            if n > limit:
                print(f"  {n:5d}  {name}")
    sys.exit(0)
