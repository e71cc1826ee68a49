"""The credit a rollout's calls got: ``load_transitions`` over the rollout's group, as the trainer ran it.

A GRPO-style baseline compares a rollout with the other rollouts of its task, so the advantages are computed over
the rollout's group: the rollouts of the same task and mode served by the same policy version (the trainer samples
one step's group on one version). Each call is a row of its own, also where the run merged a conversation's calls
into one sample (``trajectory_aggregation``: the same advantages, each on its call's tokens). Every call of the
rollout that did not become a transition is listed with the reason, from the same rules ``load_transitions``
applies. Each transition shows its call's ``spanrl.label.good`` and its step facts (``store/step_facts.py``: what
its tool spans say went wrong), with their reward when the credit has ``step_signals``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from spanrl.algorithms.call_facts import ID_COLUMNS, call_facts
from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.step_signals import call_signal_reward
from spanrl.algorithms.transitions import TransitionBatch, load_transitions
from spanrl.store.step_facts import FACTS, step_facts
from spanrl.ui.source import Source
from spanrl.ui.subset import Scratch, fetch_spans, version_of

__all__ = ["MAX_GROUP", "rollout_credit"]

MAX_GROUP = 256
"""Rollouts of a group used at most (the newest ones besides the rollout itself)."""


def rollout_credit(
    source: Source, scratch: Scratch, rollouts: pa.Table, rollout_id: str, credit: CreditConfig
) -> dict[str, Any]:
    """Transitions of ``rollout_id`` with return and advantage, the group they were computed over, and
    why each remaining call was skipped. ``rollouts`` is the cached rollouts table."""
    group = _group(rollouts, rollout_id)
    spans = fetch_spans(source, group["rollout_ids"])
    decomposed = scratch.decompose_rollout(spans, rollout_id).calls
    calls = decomposed.to_pylist()

    # one row per call, also for a run that merged each conversation into one sample: credit is assigned per
    # call before merging, and a merged sample carries each call's advantage on that call's tokens
    per_call = dataclasses.replace(credit, trajectory_aggregation=False)

    def transitions() -> TransitionBatch:
        with scratch.holding(spans) as cur:
            return load_transitions(cur, credit=per_call, rollout_ids=group["rollout_ids"])

    key = ("credit", tuple(group["rollout_ids"]), repr(per_call), *version_of(spans))
    batch = scratch.remember(key, transitions)
    table = batch.to_arrow()
    mine = table.filter(pc.equal(table.column("rollout_id"), rollout_id))
    rows = [
        {k: r[k] for k in ("step", "agent", "reward", "advantage", "policy_version", "retokenized", "completion_mask")}
        for r in mine.to_pylist()
    ]
    labels = _labels(scratch, spans, decomposed)
    signals = _signals(scratch, spans, decomposed)
    for r in rows:
        r["label"] = labels.get(r["step"])  # spanrl.label.good: ground truth beside the advantage
        r["signals"] = signals.get(r["step"], {})  # what its tool spans say went wrong, and its reward when on
        r["signal_reward"] = call_signal_reward(r["signals"], credit.step_signals) if credit.step_signals else None
    trained = {r["step"] for r in rows}
    kept = rollout_id in batch.rewards_by_rollout
    skipped = [
        {"step": c["step"], "reason": _skip_reason(c, kept)} for c in calls if c["step"] not in trained
    ]
    group_rewards = [v for v in batch.rewards_by_rollout.values() if v is not None and not math.isnan(v)]
    return {
        "credit": {k: getattr(credit, k)
                   for k in ("mode", "gamma", "lam", "baseline", "scale_std", "per_rollout", "step_group_weight",
                             "step_signals", "trajectory_aggregation")},
        "group": {
            "task_id": group["task_id"],
            "mode": group["mode"],
            "policy_version": group["policy_version"],
            "rollouts": len(group["rollout_ids"]),
            "reward_mean": sum(group_rewards) / len(group_rewards) if group_rewards else None,
            "episode_reward": batch.rewards_by_rollout.get(rollout_id),
        },
        "transitions": rows,
        "skipped": skipped,
        "report": {k: v for k, v in batch.report.items() if v},
    }


def _labels(scratch: Scratch, spans: pa.Table, calls: pa.Table) -> dict[int, bool]:
    """Each labelled call's ``spanrl.label.good`` by step (diagnostics: credit never reads it)."""
    if not calls.num_rows:
        return {}
    with scratch.holding(spans) as cur:
        facts = call_facts(cur, calls.select(["rollout_id", "step", *ID_COLUMNS]), tool_states=False)
    return {s: lab for s, lab in zip(calls.column("step").to_pylist(), facts.label) if lab is not None}


def _signals(scratch: Scratch, spans: pa.Table, calls: pa.Table) -> dict[int, dict[str, int]]:
    """Each call's step facts (``store/step_facts.py``) by step, the facts it has only, shown whether or not
    the credit gives them a reward (``step_signals``)."""
    if not calls.num_rows:
        return {}
    with scratch.holding(spans) as cur:
        rows = step_facts(cur, calls).to_pylist()
    return {r["step"]: {f: r[f] for f in FACTS if r[f]} for r in rows if r["step"] >= 0}


def _group(rollouts: pa.Table, rollout_id: str) -> dict[str, Any]:
    ids = rollouts.column("rollout_id")
    me = rollouts.filter(pc.equal(ids, rollout_id)).to_pylist()
    if not me:
        return {"rollout_ids": [rollout_id], "task_id": None, "mode": None, "policy_version": None}
    task, mode, version = me[0]["task_id"], me[0]["mode"], me[0]["policy_version"]
    if task is None:  # no task: a group of one, as load_transitions treats it
        return {"rollout_ids": [rollout_id], "task_id": None, "mode": mode, "policy_version": version}
    mask = pc.and_(pc.equal(rollouts.column("task_id"), task), _equal_or_both_null(rollouts.column("mode"), mode))
    mask = pc.and_(mask, _equal_or_both_null(rollouts.column("policy_version"), version))
    peers = rollouts.filter(mask).sort_by([("start_ns", "descending")]).column("rollout_id").to_pylist()
    peers = [rollout_id] + [p for p in peers if p != rollout_id][: MAX_GROUP - 1]
    return {"rollout_ids": peers, "task_id": task, "mode": mode, "policy_version": version}


def _equal_or_both_null(column: pa.ChunkedArray, value: Any) -> pa.ChunkedArray:
    if value is None:
        return pc.is_null(column)
    return pc.fill_null(pc.equal(column, value), False)


def _skip_reason(call: Mapping[str, Any], rollout_kept: bool) -> str:
    """Why ``load_transitions`` made no transition of this call (its rules, in its order)."""
    if call["completion_ids"] is None:  # a decomposed call: prompt_ids / completion_ids / logprobs
        if call["status_code"] == "ERROR":
            return "the call failed (status ERROR): nothing was generated"
        if not call["input_messages"]:
            return "no token ids and no messages to retokenize"
        return "no token ids: only the trainer, with the policy's tokenizer, retokenizes it from its messages"
    logprobs = call["logprobs"]
    if logprobs and len(logprobs) != len(call["completion_ids"]):
        return f"{len(logprobs)} log-probs for {len(call['completion_ids'])} completion tokens"
    if not rollout_kept:
        return "its rollout was skipped: no reward, or a NaN reward (credit missing_reward / nan_reward = skip)"
    return "not selected"
