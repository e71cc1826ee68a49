"""Which ``pip install 'spanrl[EXTRA]'`` a command needs, checked before it runs.

``pip install spanrl`` is the agent side only (the emit API, the distro, the exporter). A command whose
extra is missing stops with one line naming the extra, instead of an ImportError traceback::

    spanrl: error: spanrl collector needs the collector extra: pip install 'spanrl[collector]'
"""

from __future__ import annotations

import argparse
import importlib.util

from spanrl.errors import MissingExtraError

__all__ = ["EXTRA_MODULES", "extra_of_module", "missing_modules", "needs_extra", "require_extra"]

# extra -> the top-level modules it installs that spanrl imports (pyproject's optional-dependencies)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "collector": ("duckdb", "pyarrow", "numpy", "orjson", "uvicorn"),
    "serve": ("torch", "transformers", "fastapi", "numpy", "uvicorn", "httpx", "gguf"),
    "train": ("duckdb", "pyarrow", "orjson", "torch", "transformers", "trl", "accelerate", "peft", "datasets",
              "fastapi", "yaml", "rich", "httpx"),
    "ray": ("ray",),
}


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them)."""
    return [name for name in EXTRA_MODULES[extra] if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install, or a module whose __spec__ is unset
        return False


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` when ``what`` (e.g. ``"spanrl collector"``) cannot run."""
    absent = missing_modules(extra)
    if absent:
        raise MissingExtraError(f"{what} needs the {extra} extra: pip install 'spanrl[{extra}]' "
                                f"(missing: {', '.join(absent)})", extra=extra)


def extra_of_module(name: str | None) -> str | None:
    """The extra that installs the top-level module ``name`` (the first that lists it), or None."""
    top = (name or "").split(".")[0]
    return next((extra for extra, modules in EXTRA_MODULES.items() if top in modules), None)


def needs_extra(parser: argparse.ArgumentParser, extra: str) -> None:
    """Mark a (sub)command as needing ``extra``: its ``--help`` says so, and ``spanrl.cli.main`` checks it
    before the handler runs (``args.extra``, ``args.extra_for``)."""
    parser.set_defaults(extra=extra, extra_for=parser.prog)
    state = " (not installed here)" if missing_modules(extra) else ""
    note = f"needs the {extra} extra{state}: pip install 'spanrl[{extra}]'."
    parser.epilog = f"{parser.epilog} {note}" if parser.epilog else note  # keeps the command's own pointer
