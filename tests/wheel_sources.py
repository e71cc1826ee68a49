"""What a wheel of the checkout is built from, copied to a folder of its own (the wheel tests and the doc
commands' test build from it)."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path


# What a wheel of the checkout is built from: pyproject's package-dir folders plus the files setuptools reads.
_PACKAGE_DIRS = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["tool"][
    "setuptools"]["package-dir"]
WHEEL_SOURCES = ("pyproject.toml", "README.md", "LICENSE", *sorted({d.split("/")[0] for d in _PACKAGE_DIRS.values()}))


def copy_wheel_sources(dest: Path) -> Path:
    """Copy what a wheel of the checkout is built from into a new folder ``dest`` (no caches, no egg-info)."""
    repo = Path(__file__).resolve().parents[1]
    dest.mkdir()
    for name in WHEEL_SOURCES:
        src = repo / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / name)
    return dest
