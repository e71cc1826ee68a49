"""Credit over a decomposition: `load_transitions`' step from the decomposer's calls and rewards to each call's
return and advantage (``assign_credit``), with the rollouts in the order credit sees them (``ordered``), the
rewards in the order "the last one" goes by (``_reward_order``) and GiGPO's anchor states."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanrl.algorithms.baseline import RunningBaseline
from spanrl.algorithms.call_facts import ID_COLUMNS, call_facts
from spanrl.algorithms.credit import CreditConfig, CreditResult, MissingValueError, assign_credit
from spanrl.algorithms.gigpo import anchor_states
from spanrl.algorithms.learned_credit import CallCritic
from spanrl.algorithms.step_signals import signal_rewards
from spanrl.errors import ConfigError

__all__ = ["batch_credit", "ordered"]


def ordered(rollouts: pa.Table, order: Sequence[str]) -> pa.Table:
    """``rollouts`` with those named in ``order`` first, in its order; the rest after, as they were."""
    position = {rid: i for i, rid in enumerate(order)}
    ids = rollouts.column("rollout_id").to_pylist()
    rank = sorted(range(len(ids)), key=lambda i: (position.get(ids[i], len(position)), i))
    return rollouts.take(pa.array(rank, pa.int64()))


def batch_credit(store: Any, dec: Any, usable_calls: tuple[pa.Table, list[dict[str, Any]]], credit: CreditConfig,
                 state: tuple[Mapping[tuple[str, int], float] | CallCritic | None, RunningBaseline | None,
                              Sequence[str] | None],
                 report: dict[str, int]) -> tuple[CreditResult, np.ndarray, list[str]]:
    """Credit over every selected rollout for the usable calls (fast ones first, then the slow rows), with the
    critic's ``values``, the ``running`` baseline and the rollouts in ``order`` (``state``): the result, each call's
    rollout index, and the rollout ids in index order."""
    (fast_calls, slow_rows), (values, running, order) = usable_calls, state
    rollouts = dec.rollouts if order is None else ordered(dec.rollouts, order)
    calls = dec.calls
    rollout_ids_all = rollouts.column("rollout_id").to_pylist()
    index = lambda ids: (  # noqa: E731
        pc.index_in(ids, value_set=rollouts.column("rollout_id")).to_numpy().astype(np.int64)
    )

    tasks = rollouts.column("task_id").to_pylist()
    report["no_task_id"] = sum(1 for t in tasks if t is None)
    group_keys = [t if t is not None else f"\x00rollout:{r}" for t, r in zip(tasks, rollout_ids_all)]
    group_index: dict[str, int] = {}
    rollout_group = np.array([group_index.setdefault(k, len(group_index)) for k in group_keys], dtype=np.int64)
    group_tasks = [None if k.startswith("\x00rollout:") else k for k in group_index]  # no task: the global mean

    cols = ["rollout_id", "step", "rollout_calls"] + (["prompt_ids", *ID_COLUMNS] if credit.step_group_weight else [])
    cols += [c for c in ("agent", "prompt_ids") if credit.critic is not None and c not in cols]
    usable = [fast_calls.select(cols)]
    if slow_rows:
        usable.append(pa.Table.from_pylist(
            [{k: r[k] for k in cols} for r in slow_rows],
            schema=usable[0].schema,
        ))
    keys = pa.concat_tables(usable)
    call_rollout = index(keys.column("rollout_id"))  # every call's and reward's rollout is one of them
    call_step = keys.column("step").to_numpy().astype(np.int64)
    rollout_calls = np.zeros(len(rollout_ids_all), dtype=np.int64)
    rewards = dec.rewards
    r_roll = index(rewards.column("rollout_id"))
    if rewards.num_rows:
        rollout_calls[r_roll] = rewards.column("rollout_calls").fill_null(0).to_numpy()
    if calls.num_rows:
        rollout_calls[index(calls.column("rollout_id"))] = calls.column("rollout_calls").to_numpy()
    value_arr = None
    if credit.mode == "gae" or credit.critic is not None:
        if values is None:
            raise ConfigError("values must map (rollout_id, step) to the critic's value when mode is 'gae', or be "
                              "the learned critic when credit.critic is set (load_training_batch makes it)")
        if isinstance(values, Mapping):
            rids = keys.column("rollout_id").to_pylist()
            value_arr = np.array([float(values.get((r, int(s)), np.nan)) for r, s in zip(rids, call_step)])
        else:
            value_arr = np.asarray(values.value_calls(keys), dtype=np.float64)
    try:
        result = assign_credit(
            credit,
            call_rollout=call_rollout,
            call_step=call_step,
            rollout_calls=rollout_calls,
            rollout_group=rollout_group,
            reward_rollout=r_roll,
            reward_step=rewards.column("step").to_numpy() if rewards.num_rows else np.zeros(0, np.int64),
            reward_value=rewards.column("value").to_numpy(zero_copy_only=False) if rewards.num_rows else np.zeros(0),
            reward_time_ns=_reward_order(rewards),
            reward_name=np.array(rewards.column("name").to_pylist(), dtype=object),
            values=value_arr,
            call_state=_anchor_states(store, keys) if credit.step_group_weight else None,
            signals=signal_rewards(store, calls, index, credit.step_signals, report) if credit.step_signals else None,
            running=None if running is None else (running, group_tasks),
        )
    except MissingValueError as exc:  # a call of a kept rollout that the critic did not value
        key = (keys.column("rollout_id")[exc.call].as_py(), int(call_step[exc.call]))
        raise ConfigError(f"values has no critic value for call (rollout_id, step) = {key!r}") from None
    if result.value_targets is not None and not isinstance(values, Mapping):
        values.observe_returns(result.value_targets)
    return result, call_rollout, rollout_ids_all


def _anchor_states(store: Any, keys: pa.Table) -> np.ndarray:
    """GiGPO's anchor state of each call (``algorithms/gigpo.py``): its ``spanrl.state.id``, else the messages
    since the last assistant turn, else the prompt's token ids."""
    facts = call_facts(store, keys)
    return anchor_states(facts.state, facts.messages, keys.column("prompt_ids").to_pylist())


def _reward_order(rewards: pa.Table) -> np.ndarray:
    """Each reward's rank in "which came last": when the collector stored it (``ingested_ns``), the sender's
    own clock only within one commit. A sender's clock can be anything; the ingest time is the collector's."""
    if not rewards.num_rows:
        return np.zeros(0, np.int64)
    ingested = rewards.column("ingested_ns").fill_null(0).to_numpy()
    return np.lexsort((rewards.column("time_ns").to_numpy(), ingested)).argsort().astype(np.int64)
