"""Command groups that several parts fill: ``spanrl export`` holds ``transitions`` (algorithms/), ``model``
(serving/) and ``trajectories`` (store/). Each part registers its command where its code lives, so no part
imports another to hand it a parser; the group's parser is made by whichever part registers first."""

from __future__ import annotations

import argparse
import weakref

__all__ = ["command_group"]

_HELP = {"export": "export training data, a model or trajectories: spanrl export transitions|model|trajectories ..."}
_GROUPS: weakref.WeakKeyDictionary[argparse._SubParsersAction, dict[str, argparse._SubParsersAction]] = (
    weakref.WeakKeyDictionary())


def command_group(subparsers: argparse._SubParsersAction, name: str) -> argparse._SubParsersAction:
    """The subcommands of ``spanrl NAME`` (``export``), made the first time a part asks."""
    groups = _GROUPS.setdefault(subparsers, {})
    if name not in groups:
        parser = subparsers.add_parser(name, help=_HELP[name])
        groups[name] = parser.add_subparsers(dest=f"{name}_command", metavar="WHAT", required=True)
    return groups[name]
