"""``spanrl demo``: everything, locally, on a tiny model. The handler imports torch lazily."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spanrl.trainer._cli import log_file, output_options
from spanrl.extras import needs_extra


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser("demo", help="everything, locally, on a tiny model (about 5 minutes)")
    demo.add_argument("--output-dir", default="spanrl-demo", help="where everything goes (default spanrl-demo)")
    demo.add_argument("--grpo-steps", type=int, help="GRPO updates (default from DemoConfig)")
    demo.add_argument("--quick", action="store_true",
                      help="the shortest setting (about a minute): a smoke test, not a result")

    demo.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    output_options(demo)
    demo.set_defaults(func=_demo)
    needs_extra(demo, "train")




def _demo(args: argparse.Namespace) -> int:
    from spanrl.demo.demo import DemoConfig, run_demo

    fields: dict[str, Any] = {"output_dir": args.output_dir, "seed": args.seed, "progress": not args.no_progress}
    config = DemoConfig.quick(**fields) if args.quick else DemoConfig(**fields)
    if args.grpo_steps is not None:
        config.grpo_steps = args.grpo_steps
    log_file(Path(config.output_dir), args)
    run_demo(config)
    return 0
