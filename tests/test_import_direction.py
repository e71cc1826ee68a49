"""Imports go down, never up: the rooms' order is docs/architecture.md's ("Imports go one way"), read from
there, so the rule is stated once. A module may import its own room and any lower one, lazy imports (inside
functions) included; ``python tests/test_import_direction.py`` prints every upward import."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_import_cycles import REPO, import_graph  # noqa: E402

_ROOMS = {"instrumentation", "collector", "store", "algorithms", "serving", "rollouts", "trainer", "online", "sweep",
          "demo", "ui"}
# `spanrl` itself (its __init__) imports only _lazy and errors: its public names load on first use, so an agent's
# `import spanrl` stays at the bottom; the modules that build a Trainer or run the CLI sit above every room.
_FRONT_DOORS = {"spanrl.__main__", "spanrl.cli", "spanrl.quickstart", "spanrl.doctor"}


def _doc() -> str:
    return (REPO / "docs" / "architecture.md").read_text()


def layers() -> list[set[str]]:
    """The rooms bottom first, from the architecture doc's ``layers:`` line (``a, b < c < ...``)."""
    line = re.search(r"^layers: `(.+)`$", _doc(), re.MULTILINE)
    assert line, "docs/architecture.md has no line 'layers: `...`'"
    return [{room.strip() for room in layer.split(",")} for layer in line.group(1).split("<")]


def exceptions() -> set[str]:
    """The upward imports the doc's ``upward, still:`` line names (``a -> b``), each with its reason there."""
    line = re.search(r"^upward, still: (.+?)\n\n", _doc(), re.MULTILINE | re.DOTALL)
    return set(re.findall(r"`([\w.]+ -> [\w.]+)`", line.group(1))) if line else set()


def room_of(module: str) -> str:
    """``spanrl.online.trainer`` -> ``trainer``; the public API's front doors -> ``front doors``; every other
    module of ``spanrl/`` (errors, env, semconv, ...) -> ``spanrl``, the shared vocabulary."""
    if module in _FRONT_DOORS:
        return "front doors"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in _ROOMS else "spanrl"


def upward_imports(graph: dict[str, set[str]], order: list[set[str]], allowed: set[str] = frozenset()) -> list[str]:
    rank = {room: i for i, rooms in enumerate(order) for room in rooms}
    found = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            a, b = room_of(module), room_of(other)
            if a != b and rank[b] >= rank[a] and f"{module} -> {other}" not in allowed:
                found.append(f"{module} ({a}) -> {other} ({b})")
    return found


def test_imports_go_down() -> None:
    assert upward_imports(import_graph(), layers(), exceptions()) == []


def test_each_exception_is_still_an_import() -> None:
    """A named exception that no longer happens is struck from the doc, so the list only shrinks."""
    graph = import_graph()
    assert {e for e in exceptions() if e.split(" -> ")[1] not in graph.get(e.split(" -> ")[0], set())} == set()


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(module) for module in import_graph()}
    assert rooms <= {room for layer in layers() for room in layer}, rooms


def test_the_check_finds_an_upward_import() -> None:
    order = [{"spanrl"}, {"store"}, {"trainer"}, {"front doors"}]
    graph = {"spanrl.store.x": {"spanrl.trainer.y", "spanrl.errors"}, "spanrl.trainer.y": {"spanrl.store.x"}}
    assert upward_imports(graph, order) == ["spanrl.store.x (store) -> spanrl.trainer.y (trainer)"]


def private_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of another room's private module (``spanrl.trainer._cli`` from ``online/``): a room's underscore
    modules are its own; the front doors may register the rooms' commands (``spanrl.cli``), and every room's
    ``__init__`` loads its public names on first use through ``spanrl._lazy``, the package's own helper."""
    found = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            private = other.rsplit(".", 1)[-1].startswith("_") and not other.endswith(("__init__", "__main__"))
            if private and other != "spanrl._lazy" and room_of(module) not in (room_of(other), "front doors"):
                found.append(f"{module} -> {other}")
    return found


def test_no_room_imports_another_rooms_private_module() -> None:
    assert private_imports(import_graph()) == []


def test_the_check_finds_a_private_import() -> None:
    graph = {"spanrl.online.x": {"spanrl.trainer._cli", "spanrl.online._y"}, "spanrl.cli": {"spanrl.trainer._cli"}}
    assert private_imports(graph) == ["spanrl.online.x -> spanrl.trainer._cli"]


if __name__ == "__main__":  # pragma: no cover
    print("\n".join(upward_imports(import_graph(), layers(), exceptions())))
