"""Lazy public names for a package's ``__init__`` (PEP 562), so ``import spanrl.x`` stays light.

    _LAZY = {"Trainer": "spanrl.trainer.trainer"}          # public name -> module that defines it
    __getattr__ = lazy_getattr(__name__, _LAZY, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, table: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that imports ``table[name]`` on first use and caches it in ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
