"""The ``spanrl`` command line. Each part registers its own subcommands; handlers import lazily,
so ``spanrl sql`` never loads torch.

    spanrl collector --db PATH        OTLP/gRPC + OTLP/HTTP collector writing DuckDB
    spanrl sql "SELECT ..."           SQL over the span store (through a running collector, or the file)
    spanrl store export|prune|import  Parquet export, retention, OTLP JSON lines or ATIF trajectories in
    spanrl export transitions         training rows for offline work (also: trajectories as ATIF, model as GGUF)
    spanrl credit audit STORE         credit configs scored against the calls' ground-truth labels
    spanrl serve --model PATH         OpenAI-compatible policy server
    spanrl train CONFIG.yaml          the training loop (--plan: its memory, part by part)
    spanrl sweep SWEEP.yaml           a grid or random search over train-config keys, on Ray Tune
    spanrl demo                       everything, locally, on a tiny model
    spanrl ui                         the viewer in the browser (rollouts, credit, runs, SQL)
    spanrl doctor [CONFIG]            what a first run needs: Python, torch, extras, ports, the config's agent
    spanrl docs [NAME]                the docs, which ship with spanrl: list them, or print one
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from spanrl.errors import MissingExtraError, SpanRLError, cli_error
from spanrl.extras import extra_of_module, require_extra

# Modules with a `register(subparsers)` function, in the order their commands are listed.
_COMMAND_MODULES = (
    "spanrl.collector._cli",
    "spanrl.store._cli",
    "spanrl.serving._cli",
    "spanrl.trainer._cli",
    "spanrl.online._cli",  # after trainer's: it adds --online to `spanrl train`
    "spanrl.sweep._cli",
    "spanrl.demo._cli",
    "spanrl.algorithms._cli",
    "spanrl.ui._cli",
    "spanrl.doctor",
    "spanrl.manual",
)


# Where a newcomer starts; every command's help ends with it (the docs ship with spanrl: `spanrl docs NAME`).
START_HERE = ("Start here: the README's 'Train your own agent' (an agent, a train.yaml, your own collector and "
              "server, online training). Every config key: docs/train-config.md (spanrl train), "
              "docs/online-config.md (spanrl train --online); span conventions: docs/conventions.md. Each ships "
              "with spanrl: `spanrl docs train-config` prints it, `spanrl docs` lists them.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spanrl", description="Train agents with RL from their OpenTelemetry traces.",
                                     epilog=START_HERE)
    parser.add_argument("--log-level", default="INFO",
                        help="logging level (default INFO; train and demo log to a file)")

    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    for command in subparsers.choices.values():
        command.epilog = f"{command.epilog} {START_HERE}" if command.epilog else START_HERE
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "extra", None):
            require_extra(args.extra, args.extra_for)
        return _run(args)
    except SpanRLError as exc:  # bad input or a failed run: one clear line, no traceback
        return cli_error(exc)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:  # a module of an extra the command's declaration did not list
        extra = extra_of_module(exc.name)
        if extra is None:
            raise
        raise MissingExtraError(f"spanrl {args.command} needs the {extra} extra: pip install 'spanrl[{extra}]' "
                                f"(missing: {exc.name})", extra=extra) from exc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
