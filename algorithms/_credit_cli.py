"""``spanrl credit audit``: score credit configurations against labelled calls on stored rollouts
(``spanrl.algorithms.credit_audit``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from spanrl.extras import needs_extra

_DB_FILE = "spans.duckdb"  # a run folder's store (spanrl.trainer.config.DB_FILE, not imported at startup)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("credit", help="credit assignment tools: spanrl credit audit ...")
    sub = p.add_subparsers(dest="credit_command", metavar="WHAT", required=True)
    a = sub.add_parser("audit", help="each credit config's advantages against calls labelled spanrl.label.good")
    a.add_argument("store", help="a span store (DuckDB file) or a run folder holding spans.duckdb; opened read-only")
    a.add_argument("--config", action="append", default=None, metavar="FIELD=VALUE,...",
                   help="a credit config to score, e.g. mode=step,gamma=0.9 (repeatable; default: mode=identical)")
    a.add_argument("--success-above", type=float, default=0.0,
                   help="an episode is successful when its reward is above this (default 0)")
    a.add_argument("--rollout-id", action="append", default=None, help="only this rollout (repeatable)")
    a.add_argument("--agent", action="append", default=None, help="only calls of this agent (repeatable)")
    a.add_argument("--mode", default=None, help="only rollouts of this mode (train, val)")
    a.add_argument("--model", default=None,
                   help="the policy's model folder: needed by a config with a learned critic (critic.weight=1), "
                        "whose head reads its hidden states (cross-fitted over two halves of the task groups)")
    a.set_defaults(func=_audit)
    needs_extra(a, "collector")


def _audit(args: argparse.Namespace) -> int:
    from spanrl.algorithms.credit_audit import AuditPolicy, audit, format_audit, parse_config
    from spanrl.errors import ConfigError, SpanRLError, cli_error
    from spanrl.store import SpanStore

    path = Path(args.store)
    if path.is_dir():
        path = path / _DB_FILE
    try:
        if not path.is_file():
            raise ConfigError(f"store: no span store at {str(path)!r} (a DuckDB file, or a run folder with {_DB_FILE})")
        texts = args.config or ["mode=identical"]
        configs = [(text, parse_config(text)) for text in texts]
        policy = None
        if any(config.critic is not None for _, config in configs):
            if args.model is None:
                raise ConfigError("--model: a config with a critic needs the policy's model folder (its hidden "
                                  "states are the head's input); got none")
            if not Path(args.model).is_dir():
                raise ConfigError(f"--model: no model folder at {args.model!r}")
            policy = AuditPolicy(args.model)
        with SpanStore.open(str(path), read_only=True) as store:
            rows = audit(store, configs, success_above=args.success_above, policy=policy,
                         rollout_ids=args.rollout_id, agents=args.agent, mode=args.mode)
    except SpanRLError as exc:
        return cli_error(exc)
    print(format_audit(rows, success_above=args.success_above))
    return 0
