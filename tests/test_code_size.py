"""Small modules, short functions (the team's guide): no product module over 500 lines, no function
over 80, in every product package, the C extensions (collector/*.c, *.h; instrumentation/_encode.c) included.
``python tests/test_code_size.py`` lists the biggest everywhere."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
# every product package, as pyproject maps them (a new room is covered the day it is added there)
PRODUCT = tuple(sorted({d.split("/")[0] for d in tomllib.loads((REPO / "pyproject.toml").read_text())
                        ["tool"]["setuptools"]["package-dir"].values()}))
HELD = PRODUCT  # every room keeps the limits
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# A room's Python lines (issue 54): trainer/ is the loop and what it calls; learning from live traffic is online/'s
# job. Reached by splitting by job, never by moving code out to spare it: a room over its cap is split the same way.
MAX_ROOM_LINES = {"trainer": 2500}
# where the C sources are (the optional extensions spanrl.collector._wire and spanrl.instrumentation._encode)
C_ROOTS = ("collector", "instrumentation")
# A C function as the team writes it (clang-format style): a signature starting at column 0 (it may wrap)
# and its body up to the first `}` at column 0. Not a C parser; the test below checks it finds them.
_C_FUNCTION = re.compile(r"^(?:static |inline |PyMODINIT_FUNC )*[A-Za-z_][\w \t*]*?\b(\w+)\([^;{]*?\)\s*\{\s*$.*?^\}",
                         re.M | re.S)


def _files(roots: tuple[str, ...], patterns: tuple[str, ...] = ("*.py",)) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        path = REPO / root
        found += [path] if path.is_file() else sorted(p for pattern in patterns for p in path.rglob(pattern))
    return [p for p in found if "__pycache__" not in p.parts]


def _c_files() -> list[Path]:
    return _files(C_ROOTS, ("*.c", "*.h"))


def module_lines(roots: tuple[str, ...]) -> list[tuple[int, str]]:
    paths = _files(roots) + _c_files()
    return sorted(((len(p.read_text().splitlines()), str(p.relative_to(REPO))) for p in paths), reverse=True)


def c_function_lines() -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for path in _c_files():
        text = path.read_text()
        for m in _C_FUNCTION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((m.group(0).count("\n") + 1, f"{path.relative_to(REPO)}:{line} {m.group(1)}"))
    return found


def function_lines(roots: tuple[str, ...]) -> list[tuple[int, str]]:
    found = c_function_lines()
    for path in _files(roots):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(REPO)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def test_no_module_over_the_limit() -> None:
    assert [m for m in module_lines(HELD) if m[0] > MAX_MODULE_LINES] == []


def test_no_function_over_the_limit() -> None:
    assert [f for f in function_lines(HELD) if f[0] > MAX_FUNCTION_LINES] == []


def test_no_room_over_its_cap() -> None:
    lines = {room: sum(len(p.read_text().splitlines()) for p in _files((room,))) for room in MAX_ROOM_LINES}
    assert {room: n for room, n in lines.items() if n > MAX_ROOM_LINES[room]} == {}


def test_every_product_package_is_held() -> None:
    """The limits see every room: each folder with an ``__init__.py`` next to pyproject is in ``PRODUCT``."""
    rooms = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests", "bench", "examples"}
    assert rooms <= set(PRODUCT) and {"rollouts", "demo", "trainer"} <= set(PRODUCT)


def test_c_functions_are_found() -> None:
    """The C count is a pattern, not a parser: it must see every function definition that is there
    (one per line that opens a function body at column 0), else the limit above checks nothing."""
    names = {name.split()[-1] for _, name in c_function_lines()}
    assert {"PyInit__wire", "decode", "span", "span_row", "kv_entry", "put_double", "rd_varint"} <= names
    assert {"PyInit__encode", "encode_snapshot", "put_span", "put_attribute", "scalar"} <= names
    opened = sum(len(re.findall(r"^[A-Za-z_][^;=]*\)\s*\{\s*$", p.read_text(), re.M)) for p in _c_files())
    assert len(c_function_lines()) == opened


if __name__ == "__main__":  # pragma: no cover
    for title, rows, limit in (("modules", module_lines(PRODUCT), MAX_MODULE_LINES),
                               ("functions", function_lines(PRODUCT), MAX_FUNCTION_LINES)):
        print(f"{title} over {limit} lines:")
        for n, name in rows:
            if n > limit:
                print(f"  {n:5d}  {name}")
    sys.exit(0)
