"""What every training command (``spanrl train``, ``train --online``, ``spanrl demo``) prints and logs, one way:
``--no-progress`` / ``--verbose`` (`output_options`) and the run's ``spanrl.log`` (`log_file`). Public so the
other rooms' commands import it rather than ``spanrl.trainer._cli``."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["log_file", "output_options"]


def output_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-progress`` and ``--verbose`` to a training command's parser."""
    parser.add_argument("--no-progress", action="store_true", help="no progress bar and step lines")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="log lines and third-party output on the terminal too")


def log_file(output_dir: Path, args: argparse.Namespace) -> Path:
    """Send every log line to ``OUTPUT_DIR/spanrl.log`` (the terminal too with ``--verbose``); print its path."""
    from spanrl.logs import log_to_file
    from spanrl.trainer.config import LOG_FILE

    path = log_to_file(output_dir / LOG_FILE, verbose=args.verbose, level=getattr(args, "log_level", "INFO"))
    print(f"full logs: {path}")
    return path
