"""Transitions: the one way algorithms/ reads the span store.

`load_transitions` decomposes the selected rollouts (``spanrl.store.decomposer``, SQL), retokenizes
calls that have only messages (external APIs), assigns credit (``spanrl.algorithms.credit``), and
optionally merges the calls of a multi-turn conversation into one sample. Everything odd in the data is
counted in ``TransitionBatch.report``, which the trainer logs; nothing is dropped silently.

Report keys: ``rollouts``, ``calls``, ``transitions``, ``retokenized``, ``skipped_no_ids`` (a call
without token ids, and no tokenizer or no messages to retokenize), ``skipped_failed_calls`` (status
ERROR, no ids), ``skipped_retokenize_error``, ``skipped_bad_logprobs`` (logprobs not aligned with
completion ids), ``missing_logprobs`` (left empty), ``skipped_temperature_mismatch`` (log-probs
recorded at another temperature than the algorithm's), ``skipped_no_reward`` / ``defaulted_no_reward``,
``nan_reward`` / ``skipped_nan_reward``, ``skipped_rollout_calls`` (calls of skipped rollouts),
``rewards_before_first_call``, ``step_signal_<fact>`` / ``step_signals_before_first_call`` (credit's
``step_signals``), ``singleton_groups``, ``unscaled_groups``, ``no_task_id``, ``merged``,
``prefix_mismatch_<reason>`` (``retokenized``, ``same_prompt``, ``template_drift``, ``history_changed``),
and the decomposer's ``rewards``, ``duplicate_spans`` (extra copies of call and reward spans, ignored),
``orphan_calls`` (calls whose ancestor chain breaks at a missing parent before any agent: agent None),
``late_arrivals`` (calls and rewards stored after their rollout's ``spanrl.rollout`` span; used),
``failed_rollouts``, ``open_rollouts``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spanrl.algorithms.baseline import RunningBaseline
from spanrl.algorithms.batch_credit import batch_credit
from spanrl.algorithms.call_facts import ID_COLUMNS
from spanrl.algorithms.credit import CreditConfig, aggregation_conflict
from spanrl.algorithms.learned_credit import CallCritic
from spanrl.algorithms.presets import check_credit
from spanrl.algorithms.retokenize import retokenize
from spanrl.algorithms.step_signals import CALL_COLUMNS as SIGNAL_COLUMNS
from spanrl.algorithms.tables import TRANSITIONS_SCHEMA, pad_transitions
from spanrl.errors import ConfigError
from spanrl.store.decomposer import Selection, decompose

__all__ = ["TRANSITIONS_SCHEMA", "Transition", "TransitionBatch", "load_training_batch", "load_transitions"]

_TEMPERATURE_TOLERANCE = 1e-6  # recorded as a double by the server; float32 round trips stay within it
# The decomposer's call columns read here: the rest (rewards_after, span ids, clocks) are not computed
_CALL_COLUMNS_READ = ("rollout_id", "task_id", "attempt", "agent", "step", "rollout_calls", "policy_version",
                      "status_code", "prompt_ids", "completion_ids", "logprobs", "temperature",
                      "input_messages", "output_messages")


@dataclass
class Transition:
    """One training sample: an LLM call, or consecutive calls of one conversation merged (``aggregate``).

    ``completion_mask`` is 1 on tokens the policy generated and 0 on tokens it did not (tool output,
    template glue between merged calls); ``old_logprobs`` is aligned with ``completion_ids``, 0.0 where
    the mask is 0, and EMPTY when the logprobs are unknown (retokenized calls, a server that sent none,
    a merged sample with such a call): the trainer recomputes them with the current policy. ``reward``
    is the call's return before the baseline (``identical``: the episode reward); ``advantage`` is what
    the policy gradient uses. A merged sample takes the
    step, reward, advantage and policy version of its first call; when its calls' advantages differ
    (``discounted``, ``step``, GiGPO's term), ``token_advantages`` gives each completion token its own
    call's advantage (0 on glue), which GRPO feeds to TRL's loss as (B, C); empty otherwise.
    ``temperature`` is the one the policy
    server's log-probs were computed at (``spanrl.llm.logprobs_temperature``; None: not recorded).
    """

    rollout_id: str
    task_id: str | None
    attempt: int | None
    agent: str | None
    step: int
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    old_logprobs: list[float]
    reward: float
    advantage: float
    policy_version: int | None
    retokenized: bool
    temperature: float | None = None
    token_advantages: list[float] = field(default_factory=list)


class TransitionBatch:
    """The transitions of a selection, as an Arrow table, with the data-quality ``report``."""

    def __init__(self, table: pa.Table, report: dict[str, int], rewards_by_rollout: dict[str, float]) -> None:
        self._table = table
        self.report = report
        """Counts of what was seen, skipped, defaulted and merged (see the module docstring)."""
        self.rewards_by_rollout = rewards_by_rollout
        """Episode reward (``episode_reward``: the last stored reward, or the sum) of each rollout that made it
        into the batch."""
        self.metrics: dict[str, float] = {}
        """Figures of the loading the Trainer adds to its history row (the learned critic's losses)."""

    def __len__(self) -> int:
        return self._table.num_rows

    def to_arrow(self) -> pa.Table:
        """The transitions as an Arrow table with `TRANSITIONS_SCHEMA`."""
        return self._table

    def to_padded(self, *, pad_token_id: int) -> Any:
        """The transitions as a ``spanrl.algorithms.tables.PaddedBatch`` of (B, T) tensors, straight from
        the Arrow columns (no dataclass per row; what GRPO and PPO train on)."""
        return pad_transitions(self, pad_token_id=pad_token_id)

    def take(self, indices: Sequence[int]) -> TransitionBatch:
        """The rows ``indices`` (e.g. a sampled mini-batch) as a batch, columnar; same report and rewards."""
        return TransitionBatch(self.to_arrow().take(pa.array(indices, pa.int64())), self.report,
                               self.rewards_by_rollout)

    @cached_property
    def transitions(self) -> list[Transition]:
        """The transitions as dataclasses (built on first access; ~40 us per row, the Arrow table and
        `to_padded` are the fast path). Once built, they are what the algorithms read: edits count."""
        columns = {}
        for name in self._table.column_names:
            column = self._table.column(name)
            is_list = pa.types.is_list(column.type)
            columns[name] = _pylists(column) if is_list else column.to_pylist()
        return [Transition(**dict(zip(columns, values))) for values in zip(*columns.values())]


def _pylists(column: pa.ChunkedArray) -> list[list[Any]]:
    """A list column as Python lists, converting the flat values once (much faster than to_pylist)."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if array.null_count:
        return [v if v is not None else [] for v in array.to_pylist()]
    flat = array.flatten().to_numpy(zero_copy_only=False).tolist()
    offsets = (array.offsets.to_numpy() - array.offsets[0].as_py()).tolist()
    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


# --- aggregation ----------------------------------------------------------------------------------
def _mismatch_reason(prev: dict[str, Any], nxt: dict[str, Any]) -> str | None:
    """None when ``nxt``'s prompt extends ``prev``'s prompt + completion; else why not."""
    history = prev["prompt_ids"] + prev["completion_ids"]
    prompt = nxt["prompt_ids"]
    if len(prompt) >= len(history) and prompt[: len(history)] == history:
        return None
    if prev["retokenized"] or nxt["retokenized"]:
        return "retokenized"
    head = prev["prompt_ids"]
    if prompt == head:
        return "same_prompt"  # parallel samples of one request (n > 1), or a retry
    if len(prompt) >= len(head) and prompt[: len(head)] == head:
        return "template_drift"  # the history is kept but the completion was re-rendered differently
    return "history_changed"  # the conversation was rewritten, truncated, or is another conversation


def _aggregate(rows: list[dict[str, Any]], report: dict[str, int]) -> list[dict[str, Any]]:
    """Merge consecutive calls of one rollout and agent whose prompt extends the previous sample."""
    out: list[dict[str, Any]] = []
    last_by_key: dict[tuple[str, str | None], dict[str, Any]] = {}
    for row in rows:  # sorted by rollout, step
        key = (row["rollout_id"], row["agent"])
        prev = last_by_key.get(key)
        if prev is not None:
            reason = _mismatch_reason(prev, row)
            if reason is None:
                history = len(prev["prompt_ids"]) + len(prev["completion_ids"])
                glue = row["prompt_ids"][history:]
                if prev["token_advantages"] or row["advantage"] != prev["advantage"]:  # each call's own
                    # masked tokens (the glue of calls merged before with one advantage) get 0, as glue does
                    before = prev["token_advantages"] or [
                        prev["advantage"] if m else 0.0 for m in prev["completion_mask"]]
                    prev["token_advantages"] = (before + [0.0] * len(glue)
                                                + [row["advantage"]] * len(row["completion_ids"]))
                prev["completion_ids"] = prev["completion_ids"] + glue + row["completion_ids"]
                prev["completion_mask"] = prev["completion_mask"] + [0] * len(glue) + row["completion_mask"]
                known = bool(prev["old_logprobs"]) and bool(row["old_logprobs"])
                prev["old_logprobs"] = prev["old_logprobs"] + [0.0] * len(glue) + row["old_logprobs"] if known else []
                prev["retokenized"] = prev["retokenized"] or row["retokenized"]
                report["merged"] = report.get("merged", 0) + 1
                continue
            name = f"prefix_mismatch_{reason}"
            report[name] = report.get(name, 0) + 1
        row = dict(row)
        last_by_key[key] = row
        out.append(row)
    return out


# --- loading --------------------------------------------------------------------------------------
def load_transitions(
    store: Any,
    *,
    credit: CreditConfig | None = None,
    rollout_ids: Sequence[str] | None = None,
    agents: Sequence[str] | None = None,
    mode: str | None = None,
    since_ns: int | None = None,
    until_ns: int | None = None,
    min_policy_version: int | None = None,
    tokenizer: Any = None,
    aggregate: bool = False,
    values: Mapping[tuple[str, int], float] | CallCritic | None = None,
    temperature: float | None = None,
    order: Sequence[str] | None = None,
    running: RunningBaseline | None = None,
) -> TransitionBatch:
    """The transitions of the selected rollouts, with advantages.

    ``store`` is a ``spanrl.store.SpanStore``, a DuckDB connection or cursor (the collector's works),
    or anything with ``sql(query, params) -> pyarrow.Table``. Selection: ``rollout_ids``, ``agents``
    (train one agent of a multi-agent system: the nearest ``invoke_agent`` ancestor's name), ``mode``
    (``train`` / ``val``), ``since_ns`` / ``until_ns`` (rollout start), ``min_policy_version``.
    ``tokenizer`` (the policy's, with a chat template) retokenizes calls that have only messages.
    ``aggregate`` merges multi-turn calls into one sample (see `Transition`). ``values`` maps
    ``(rollout_id, step)`` to the critic's value, for ``CreditConfig(mode="gae")`` (calls of rollouts the credit
    skips need none); with ``credit.critic``, a `CallCritic` (``learned_credit``) that values the calls and is handed
    their returns-to-go. ``temperature``: the one the algorithm divides its logits by; calls whose log-probs the
    server computed at another are skipped and counted (``skipped_temperature_mismatch``). ``running``: baseline
    ``running``'s state, updated (it observes the kept rollouts with a usable call one at a time, in ``order``: rollout
    ids, the rest after by id; the online trainer's ready order).
    ``credit.trajectory_aggregation`` also turns on ``aggregate``; with ``gae`` it is refused (`ConfigError`,
    ``credit.aggregation_conflict``)."""
    credit = credit or CreditConfig()
    credit.validate()
    if aggregate and (conflict := aggregation_conflict(credit)):  # one advantage for a merged sample's calls
        raise ConfigError(conflict)
    dec = decompose(
        store,
        Selection(rollout_ids=rollout_ids, agents=agents, mode=mode, since_ns=since_ns, until_ns=until_ns,
                  min_policy_version=min_policy_version),
        call_columns=_CALL_COLUMNS_READ + (ID_COLUMNS if credit.step_group_weight else ()) + (
            SIGNAL_COLUMNS if credit.step_signals else ()),
    )
    report: dict[str, int] = dict(dec.report)
    for key in ("retokenized", "skipped_no_ids", "skipped_failed_calls", "skipped_retokenize_error",
                "skipped_bad_logprobs", "missing_logprobs", "skipped_rollout_calls", "merged", "no_task_id",
                "skipped_temperature_mismatch"):
        report.setdefault(key, 0)
    fast_calls, slow_rows = _usable_calls(_same_temperature(dec.calls, temperature, report), tokenizer, report)
    result, call_rollout, rollout_ids_all = batch_credit(store, dec, (fast_calls, slow_rows), credit,
                                                         (values, running, order), report)
    for key, value in result.report.items():
        report[key] = report.get(key, 0) + value
    keep_call = result.keep[call_rollout]
    report["skipped_rollout_calls"] = int((~keep_call).sum())

    table = _assemble(fast_calls, slow_rows, keep_call, result)
    if aggregate or credit.trajectory_aggregation:
        table = pa.Table.from_pylist(_aggregate(table.to_pylist(), report), schema=TRANSITIONS_SCHEMA)
    report["transitions"] = table.num_rows
    rewards_by_rollout = {
        rid: float(result.episode_reward[i]) for i, rid in enumerate(rollout_ids_all) if result.keep[i]
    }
    return TransitionBatch(table, report, rewards_by_rollout)


def _assemble(fast_calls: pa.Table, slow_rows: list[dict[str, Any]], keep_call: np.ndarray, result: Any) -> pa.Table:
    """The kept calls' transition rows with their returns and advantages: the columnar ones (``fast_calls``), then
    the row-by-row ones (``slow_rows``: retokenized), all sorted by rollout and step when there are both."""
    n_fast = fast_calls.num_rows
    fast_keep = keep_call[:n_fast]
    table = _fast_table(fast_calls, result.returns[:n_fast], result.advantages[:n_fast])
    if not fast_keep.all():
        table = table.filter(pa.array(fast_keep))
    slow_out = [_row_out(row, float(result.returns[n_fast + i]), float(result.advantages[n_fast + i]))
                for i, row in enumerate(slow_rows) if keep_call[n_fast + i]]
    if slow_out:
        table = pa.concat_tables([table, pa.Table.from_pylist(slow_out, schema=TRANSITIONS_SCHEMA)])
        table = table.sort_by([("rollout_id", "ascending"), ("step", "ascending")])
    return table


def _same_temperature(calls: pa.Table, temperature: float | None, report: dict[str, int]) -> pa.Table:
    """The calls whose log-probs were computed at ``temperature`` or at an unrecorded one; the rest are
    counted: their importance ratio would compare distributions of different temperatures."""
    if temperature is None or not calls.num_rows:
        return calls
    recorded = np.asarray(calls.column("temperature").to_numpy(zero_copy_only=False), dtype=np.float64)  # null: NaN
    other = np.isfinite(recorded) & (np.abs(recorded - float(temperature)) > _TEMPERATURE_TOLERANCE)
    report["skipped_temperature_mismatch"] = int(other.sum())
    return calls.filter(pa.array(~other)) if other.any() else calls


def _usable_calls(calls: pa.Table, tokenizer: Any, report: dict[str, int]) -> tuple[pa.Table, list[dict[str, Any]]]:
    """Split the calls: exact ids with aligned logprobs (an Arrow table, the vectorised path) and rows
    built in Python (missing logprobs, retokenized); count the rest as skipped."""
    has_ids = pc.is_valid(calls.column("prompt_ids")) if calls.num_rows else pa.array([], pa.bool_())
    has_ids = pc.and_(has_ids, pc.is_valid(calls.column("completion_ids"))) if calls.num_rows else has_ids
    n_completion = pc.fill_null(pc.list_value_length(calls.column("completion_ids")), -1)
    n_logprobs = pc.fill_null(pc.list_value_length(calls.column("logprobs")), -1)
    has_ids_np = np.asarray(has_ids.to_numpy(zero_copy_only=False), dtype=bool)
    nc = np.asarray(n_completion.to_numpy(zero_copy_only=False))
    nl = np.asarray(n_logprobs.to_numpy(zero_copy_only=False))
    missing_lp = has_ids_np & ((nl < 0) | ((nl == 0) & (nc > 0)))  # none recorded (null or empty)
    fast = has_ids_np & (nl == nc) & ~missing_lp  # exact ids and aligned logprobs: vectorised path
    bad_lp = has_ids_np & ~missing_lp & (nl != nc)
    report["skipped_bad_logprobs"] = int(bad_lp.sum())
    report["missing_logprobs"] = int(missing_lp.sum())

    slow_rows: list[dict[str, Any]] = []  # built in Python: missing logprobs, retokenized
    if missing_lp.any():
        for row in calls.filter(pa.array(missing_lp)).to_pylist():
            row["old_logprobs"] = []
            row["retokenized"] = False
            slow_rows.append(row)
    no_ids = ~has_ids_np
    if no_ids.any():
        for row in calls.filter(pa.array(no_ids)).to_pylist():
            if row["status_code"] == "ERROR":  # the call failed: nothing was generated
                report["skipped_failed_calls"] += 1
                continue
            if tokenizer is None or not row["input_messages"]:
                report["skipped_no_ids"] += 1
                continue
            try:
                row["prompt_ids"], row["completion_ids"] = retokenize(
                    tokenizer, row["input_messages"], row["output_messages"]
                )
            except Exception:  # noqa: BLE001 - bad messages JSON or a template error: counted
                report["skipped_retokenize_error"] += 1
                continue
            row["old_logprobs"] = []
            row["retokenized"] = True
            report["retokenized"] += 1
            slow_rows.append(row)

    fast_calls = calls if fast.all() else calls.filter(pa.array(fast))
    return fast_calls, slow_rows


def _fast_table(calls: pa.Table, returns: np.ndarray, advantages: np.ndarray) -> pa.Table:
    completion = calls.column("completion_ids").combine_chunks()
    ones = pa.array(np.ones(len(completion.values), dtype=np.int8))
    mask = pa.ListArray.from_arrays(completion.offsets, ones)
    return pa.table(
        {
            "rollout_id": calls.column("rollout_id"),
            "task_id": calls.column("task_id"),
            "attempt": calls.column("attempt"),
            "agent": calls.column("agent"),
            "step": calls.column("step"),
            "prompt_ids": calls.column("prompt_ids"),
            "completion_ids": completion,
            "completion_mask": mask,
            "old_logprobs": calls.column("logprobs"),
            "reward": pa.array(returns, pa.float64()),
            "advantage": pa.array(advantages, pa.float64()),
            "policy_version": calls.column("policy_version"),
            "retokenized": pa.array(np.zeros(calls.num_rows, dtype=bool)),
            "temperature": calls.column("temperature"),
            "token_advantages": pa.ListArray.from_arrays(pa.array(np.zeros(calls.num_rows + 1, np.int32)),
                                                         pa.array([], pa.float32())),
        },
        schema=TRANSITIONS_SCHEMA,
    )


def _row_out(row: dict[str, Any], ret: float, adv: float) -> dict[str, Any]:
    out = {f.name: row.get(f.name) for f in fields(Transition)}
    out["completion_mask"] = [1] * len(row["completion_ids"])
    out["token_advantages"] = []
    out["reward"], out["advantage"] = ret, adv
    return out


def load_training_batch(store: Any, algorithm: Any, *, credit: CreditConfig | None = None,
                        **selection: Any) -> TransitionBatch:
    """The transitions ``algorithm`` trains on, as the Trainer loads them each step.

    `load_transitions` with the algorithm's tokenizer (retokenization) and temperature (calls sampled at
    another are skipped and counted); ``selection`` passes through (``rollout_ids``, ``agents``, ...).
    An algorithm with a critic (``needs_values``, e.g. PPO) gets two passes: the critic values the
    states of every call the credit keeps, then GAE with the algorithm's ``gamma``/``lam`` gives raw
    advantages (unwhitened: the value target is advantage + V, and PPO whitens per mini-batch itself).
    Both passes apply the credit's selection rules (``reward_name``, ``missing_reward``, ``nan_reward``),
    so a skipped rollout is skipped and counted in both, and the step trains on the rest. With
    ``credit.critic`` (not with a critic of the algorithm's own) one pass: the learned value head values each
    call, credit adds its GAE term, then the head fits the returns (its figures: ``batch.metrics``).
    """
    import dataclasses

    credit = credit or CreditConfig()
    algo_cfg = getattr(algorithm, "config", None)
    check_credit(algo_cfg, credit)
    temperature = getattr(algo_cfg, "temperature", None)
    common: dict[str, Any] = dict(selection, tokenizer=getattr(algorithm, "tokenizer", None),
                                  temperature=temperature if isinstance(temperature, (int, float)) else None)
    if credit.critic is not None:
        return _learned_critic_batch(store, algorithm, credit, common)
    if not getattr(algorithm, "needs_values", False):
        return load_transitions(store, credit=credit, **common)
    states = load_transitions(  # one state per call, never merged: the critic values each call's prompt
        store, credit=dataclasses.replace(credit, mode="identical", baseline="none", scale_std=False,
                                          trajectory_aggregation=False, step_signals=None), **common)
    values = algorithm.value_map(states) if len(states) else {}
    gae = dataclasses.replace(credit, mode="gae", gamma=algo_cfg.gamma, lam=algo_cfg.lam, baseline="none",
                              scale_std=False)
    return load_transitions(store, credit=gae, values=values, **common)


def _learned_critic_batch(store: Any, algorithm: Any, credit: CreditConfig, common: dict[str, Any]) -> TransitionBatch:
    """One pass with the learned value head (``algorithms/value_head.py``): it values the calls, credit adds its
    GAE term, then it fits the calls' returns (its figures in ``batch.metrics``)."""
    if getattr(algorithm, "needs_values", False):
        raise ConfigError(f"credit.critic must be None with {type(algorithm).__name__}: its own critic gives "
                          f"the advantages (mode 'gae'); the learned head is for the group-baseline algorithms")
    from spanrl.algorithms.value_head import head_critic

    critic = head_critic(algorithm, credit.critic)
    batch = load_transitions(store, credit=critic.credit(credit), values=critic, **common)
    batch.metrics.update(critic.fit())
    return batch
