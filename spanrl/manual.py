"""``spanrl docs [NAME]``: the docs that ship in the package (``spanrl/docs/*.md`` in a wheel, ``docs/`` in a
checkout), so a wheel install can read what every help text points at. No name: each doc, its first line and
where it lies; a name (``train-config``, ``online-config.md``): that doc's text on stdout."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spanrl.errors import UsageError

__all__ = ["docs_folder", "register"]


def docs_folder() -> Path:
    """Where the docs are: the installed ``spanrl/docs`` package, else a checkout's ``docs/``."""
    import importlib.util

    spec = importlib.util.find_spec("spanrl.docs")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[1] / "docs"  # an editable install made before the docs shipped


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("docs", help="the docs that ship with spanrl: list them, or print one",
                              description="Without NAME: every doc, what it is about and its path. With NAME: its "
                                          "text (spanrl docs train-config | less).")
    p.add_argument("name", nargs="?", help="a doc's name, e.g. train-config, online-config, conventions, credit")
    p.set_defaults(func=_docs)


def _docs(args: argparse.Namespace) -> int:
    folder = docs_folder()
    docs = sorted(folder.glob("*.md"))
    if not args.name:
        for doc in docs:
            title = next((line.lstrip("# ").strip() for line in doc.read_text().splitlines() if line.strip()), "")
            print(f"{doc.stem:<14} {title}  ({doc})")
        return 0
    wanted = args.name.removesuffix(".md").removeprefix("docs/")
    found = next((doc for doc in docs if doc.stem == wanted), None)
    if found is None:
        raise UsageError(f"docs: no doc {args.name!r}; the docs are {', '.join(d.stem for d in docs)}")
    print(found.read_text(), end="")
    return 0
