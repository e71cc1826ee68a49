"""``spanrl sweep SWEEP.yaml``: a grid or random search over train-config keys, as Ray Tune trials. The
handler imports Ray and the Trainer lazily."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spanrl.extras import needs_extra

__all__ = ["register"]


def register(subparsers: Any) -> None:
    sweep = subparsers.add_parser(
        "sweep", help="grid or random search over train-config keys, as Ray Tune trials",
        description="Run a grid or random search over train-config keys (spanrl.sweep.search documents the YAML); "
                    "print one line per trial and the best config. Needs spanrl[ray].",
    )
    sweep.add_argument("config", help="the sweep's YAML: train, parameters, search, metric, ...")
    sweep.add_argument("--verbose", "-v", action="store_true", help="Ray's and Tune's messages on the terminal too")
    sweep.set_defaults(func=_sweep)
    needs_extra(sweep, "train")  # and ray: a missing ray names the ray extra (spanrl.extras)


def _sweep(args: argparse.Namespace) -> int:
    from spanrl.sweep.search import run_sweep

    rows = run_sweep(Path(args.config), verbose=args.verbose)
    return 0 if any(row["error"] is None for row in rows) else 1
