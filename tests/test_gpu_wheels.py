"""bench/gpu_wheels.py's list stays whole: every package spanrl's base, collector, serve and train extras need is
carried to the offline GPU machine or already in its image, each carried once (two versions stop the install)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import gpu_wheels  # noqa: E402


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _needs(extras: list[str]) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names, todo = set(), [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]
    while todo:
        req = Requirement(todo.pop())
        if req.name == "spanrl":  # spanrl[collector,serve]: those extras' own needs
            todo += [r for e in req.extras for r in project["optional-dependencies"][e]]
        else:
            names.add(_name(req.name))
    return names


def test_every_package_spanrl_needs_is_carried_or_in_the_image() -> None:
    carried = [_name(Requirement(line).name) for line in gpu_wheels.CARRY]
    missing = _needs(["collector", "serve", "train"]) - set(carried) - gpu_wheels.IMAGE
    assert not missing, f"add to bench/gpu_wheels.py CARRY (or IMAGE if the image has it): {sorted(missing)}"
    assert len(carried) == len(set(carried)), sorted(n for n in carried if carried.count(n) > 1)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", line) for line in gpu_wheels.CARRY)  # pinned
