"""``spanrl export transitions``: training rows (ids, masks, logprobs, rewards, advantages) for offline work
(``spanrl export model`` is serving/_cli.py's, ``spanrl export trajectories`` store/_cli.py's).

Reads through a running collector (``--url``) when it serves the same ``--db``, else opens the file
read-only, like ``spanrl sql``. Writes Parquet, JSON lines, or a Hugging Face ``datasets`` folder, and
prints the data-quality report (what was skipped, defaulted, merged) as JSON on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from spanrl.extras import needs_extra

_FORMATS = ("parquet", "jsonl", "hf")


def register(subparsers: argparse._SubParsersAction) -> None:
    from spanrl.cli_groups import command_group
    from spanrl.store.access import add_store_options

    t = command_group(subparsers, "export").add_parser(
        "transitions", help="transitions with advantages, as Parquet, JSON lines or a HF dataset")
    t.add_argument("--output", "-o", required=True, help="output file (parquet, jsonl) or folder (hf)")
    t.add_argument("--format", "-f", default="parquet", choices=_FORMATS, help="output format (default parquet)")
    add_store_options(t)
    sel = t.add_argument_group("selection")
    sel.add_argument("--rollout-id", action="append", default=None, help="only this rollout (repeatable)")
    sel.add_argument("--agent", action="append", default=None, help="only calls of this agent (repeatable)")
    sel.add_argument("--mode", default=None, help="only rollouts of this mode (train, val)")
    sel.add_argument("--since-ns", type=int, default=None, help="only rollouts starting at or after (unix ns)")
    sel.add_argument("--until-ns", type=int, default=None, help="only rollouts starting before (unix ns)")
    sel.add_argument("--min-policy-version", type=int, default=None, help="only calls of this version or newer")
    cr = t.add_argument_group("credit assignment (see spanrl.algorithms.credit)")
    cr.add_argument("--credit-mode", default="identical", help="identical | discounted | step (default identical)")
    cr.add_argument("--baseline", default="grpo", help="grpo | rloo | none (default grpo)")
    cr.add_argument("--gamma", type=float, default=1.0, help="discount per call (default 1.0)")
    cr.add_argument("--no-scale-std", action="store_true", help="do not divide by the group std")
    cr.add_argument("--per-call", action="store_true", help="group statistics per call (Agent Lightning)")
    cr.add_argument("--reward-name", default=None, help="only rewards of this name")
    cr.add_argument("--missing-reward", default="skip", help="skip | zero (default skip)")
    cr.add_argument("--nan-reward", default="skip", help="skip | zero | ignore (default skip)")
    t.add_argument("--aggregate", action="store_true", help="merge multi-turn calls into one masked sample")
    t.add_argument("--tokenizer", default=None, help="tokenizer folder to retokenize calls without ids")
    t.set_defaults(func=_export_transitions)
    needs_extra(t, "collector")
    from spanrl.algorithms._credit_cli import register as register_credit

    register_credit(subparsers)  # spanrl credit audit


def _export_transitions(args: argparse.Namespace) -> int:
    from spanrl.algorithms.credit import CreditConfig
    from spanrl.algorithms.transitions import load_transitions
    from spanrl.errors import SpanRLError, cli_error
    from spanrl.store import SpanStore
    from spanrl.store.access import db_path, remote_store

    try:
        credit = CreditConfig(
            mode=args.credit_mode,
            baseline=args.baseline,
            gamma=args.gamma,
            scale_std=not args.no_scale_std,
            per_rollout=not args.per_call,
            reward_name=args.reward_name,
            missing_reward=args.missing_reward,
            nan_reward=args.nan_reward,
        )
        credit.validate()
        tokenizer = None
        if args.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        kwargs: dict[str, Any] = dict(
            credit=credit,
            rollout_ids=args.rollout_id,
            agents=args.agent,
            mode=args.mode,
            since_ns=args.since_ns,
            until_ns=args.until_ns,
            min_policy_version=args.min_policy_version,
            tokenizer=tokenizer,
            aggregate=args.aggregate,
        )
        remote = remote_store(args)
        if remote is not None:
            batch = load_transitions(remote, **kwargs)
        else:
            with SpanStore.open(db_path(args), read_only=True) as store:
                batch = load_transitions(store, **kwargs)
        _write(batch.to_arrow(), args.format, args.output)
    except SpanRLError as exc:
        return cli_error(exc)
    print(json.dumps(batch.report, sort_keys=True), file=sys.stderr)
    print(args.output)
    return 0


def _write(table: Any, fmt: str, output: str) -> None:
    from spanrl.errors import ConfigError

    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, output)
    elif fmt == "jsonl":
        import orjson

        with open(output, "wb") as out:
            for row in table.to_pylist():
                out.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        try:
            import datasets
        except ModuleNotFoundError:
            raise ConfigError("format 'hf' needs the datasets package: pip install 'spanrl[train]'") from None
        datasets.Dataset(table).save_to_disk(output)
