"""The credit audit: how well each credit configuration's per-call advantages agree with ground truth.

An environment may label calls (``spanrl.label.good`` true / false on the LLM call's span: was this a
good decision?). Labels are diagnostics only: credit never reads them. On one fixed batch of stored
rollouts, for each configuration:

- ``auc``: the probability that a good call's advantage exceeds a bad call's (ties count a half), over
  every labelled pair (Mann-Whitney U / (n_good * n_bad)); 0.5 is chance, 1 a perfect ranking.
- ``sign_errors`` / ``bad_in_success``: bad calls inside successful episodes (episode reward above
  ``success_above``) whose advantage is positive, and how many such calls there are: the mistakes that
  copying the episode's reward to every call reinforces.
- ``step_corr``: per step ``t``, the Pearson correlation of the advantage with the label (1 good, 0 bad)
  over the labelled calls at that step, and their count (None when either is constant).

Advantages are per call (aggregation off: a merged sample's would hide the calls'). A config with a learned
critic (``critic.weight=1``: the value head on the policy's hidden states) needs the policy (`AuditPolicy`) and is
cross-fitted: the task groups are split in two halves by task id, a fresh head fits one half's returns and values
the other's calls, and the other way round, so no call's advantage comes from a head fitted on its own return.
``spanrl credit audit`` prints `format_audit`; docs/credit.md explains how to label an environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from spanrl.algorithms.call_facts import ID_COLUMNS, call_facts
from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.transitions import load_transitions
from spanrl.errors import ConfigError
from spanrl.store.decomposer import Selection, decompose

__all__ = ["AuditPolicy", "AuditRow", "audit", "auc", "describe", "format_audit", "parse_config"]


@dataclasses.dataclass
class AuditRow:
    """One configuration's figures (module docstring)."""

    config: str
    calls: int
    """Calls with an advantage (of kept rollouts)."""
    good: int
    bad: int
    auc: float | None
    sign_errors: int
    bad_in_success: int
    step_corr: dict[int, tuple[float | None, int]]
    settings: str = ""
    """What the config compares (`describe`)."""


class AuditPolicy:
    """The policy whose hidden states a learned critic reads (``algorithms/value_head.py``): a model folder loaded
    in fp32 for a no-grad forward, no trainer."""

    def __init__(self, path: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        self.bf16 = False
        self.value_head: Any = None


def describe(config: CreditConfig) -> str:
    """The config's mode and every field that differs from the defaults (the critic's in full): what it compares."""
    default, parts = CreditConfig(), [f"mode={config.mode}"]
    for f in dataclasses.fields(CreditConfig):
        value = getattr(config, f.name)
        if f.name == "mode" or f.name == "trajectory_aggregation" or value == getattr(default, f.name):
            continue
        if f.name == "critic":
            value = "{" + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(value).items()) + "}"
        parts.append(f"{f.name}={value}")
    return " ".join(parts)


def parse_config(text: str) -> CreditConfig:
    """``mode=step,gamma=0.9`` -> a validated `CreditConfig` (values: true/false, none, numbers, else text);
    ``step_signals.retry=-0.1`` sets one entry of ``step_signals``, ``critic.weight=1`` one field of ``critic``."""
    fields: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(CreditConfig)}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip()
        section, dot, sub = key.partition(".")
        if sep and dot and section in ("step_signals", "critic"):
            fields.setdefault(section, {})[sub] = _value(raw.strip())
            continue
        if not sep or key not in names:
            raise ConfigError(f"--config takes FIELD=VALUE pairs of {', '.join(sorted(names))} "
                              f"(step_signals.SIGNAL=VALUE for step_signals, critic.FIELD=VALUE for critic); "
                              f"got {part!r}")
        fields[key] = _value(raw.strip())
    config = CreditConfig(**fields)
    config.validate()
    return config


def _value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def auc(good: Sequence[float], bad: Sequence[float]) -> float | None:
    """P(a good call's advantage > a bad call's), ties a half; None without both kinds."""
    g, b = np.asarray(good, dtype=np.float64), np.asarray(bad, dtype=np.float64)
    if not len(g) or not len(b):
        return None
    greater = (g[:, None] > b[None, :]).sum()
    ties = (g[:, None] == b[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(g) * len(b)))


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def audit(store: Any, configs: Sequence[tuple[str, CreditConfig]], *, success_above: float = 0.0,
          policy: AuditPolicy | None = None, **selection: Any) -> list[AuditRow]:
    """The figures of each ``(name, config)`` on the rollouts ``selection`` picks (``load_transitions``'s
    selection arguments: ``rollout_ids``, ``agents``, ``mode``, ...); ``policy`` for configs with a critic."""
    calls = decompose(store, Selection(**selection), call_columns=("rollout_id", "step", *ID_COLUMNS)).calls
    facts = call_facts(store, calls, tool_states=False)
    labels = {(r, int(s)): lab for r, s, lab in zip(calls.column("rollout_id").to_pylist(),
                                                    calls.column("step").to_pylist(), facts.label)
              if lab is not None}
    rows = []
    for name, config in configs:
        config = dataclasses.replace(config, trajectory_aggregation=False)
        if config.critic is None:
            keys, adv, rewards = _per_call(load_transitions(store, credit=config, **selection))
        elif policy is None:
            raise ConfigError(f"config {name!r} has a critic: the audit needs the policy whose hidden states the "
                              f"head reads (spanrl credit audit --model PATH)")
        else:
            keys, adv, rewards = _cross_fitted(store, config, policy, selection)
        rows.append(_score(name, keys, adv, rewards, labels, success_above, describe(config)))
    return rows


def _per_call(batch: Any) -> tuple[list[tuple[str, int]], dict[tuple[str, int], float], dict[str, Any]]:
    table = batch.to_arrow()
    keys = list(zip(table.column("rollout_id").to_pylist(), table.column("step").to_pylist()))
    return keys, dict(zip(keys, table.column("advantage").to_pylist())), dict(batch.rewards_by_rollout)


def _cross_fitted(store: Any, config: CreditConfig, policy: AuditPolicy, selection: dict[str, Any]) -> tuple:
    """Each half of the task groups scored by a fresh head fitted (``warmup_steps`` passes, at least one) on the
    other half's returns (module docstring)."""
    from spanrl.algorithms.transitions import load_training_batch

    table = load_transitions(store, credit=dataclasses.replace(config, critic=None), **selection).to_arrow()
    groups: dict[str, set[str]] = {}
    for rid, task in zip(table.column("rollout_id").to_pylist(), table.column("task_id").to_pylist()):
        groups.setdefault(task or rid, set()).add(rid)
    tasks = sorted(groups)
    halves = [sorted(r for t in tasks[k::2] for r in groups[t]) for k in (0, 1)]
    keys: list[tuple[str, int]] = []
    adv: dict[tuple[str, int], float] = {}
    rewards: dict[str, Any] = {}
    if len(tasks) < 2:
        raise ConfigError(f"a config with a critic is audited by cross-fitting over task groups: it needs two or "
                          f"more, got {len(tasks)}")
    for k in (0, 1):
        policy.value_head = None
        fit, score = {**selection, "rollout_ids": halves[1 - k]}, {**selection, "rollout_ids": halves[k]}
        for _ in range(max(1, config.critic.warmup_steps)):
            load_training_batch(store, policy, credit=config, **fit)
        part = _per_call(load_training_batch(store, policy, credit=config, **score))
        keys += part[0]
        adv.update(part[1])
        rewards.update(part[2])
    return keys, adv, rewards


def _score(name: str, keys: list[tuple[str, int]], adv: dict[tuple[str, int], float], rewards: dict[str, Any],
           labels: dict[tuple[str, int], bool], success_above: float, settings: str) -> AuditRow:
    labelled = [(k, labels[k], adv[k]) for k in keys if k in labels]
    good = [a for _, lab, a in labelled if lab]
    bad = [a for _, lab, a in labelled if not lab]
    success = {r for r, v in rewards.items() if v is not None and v > success_above}
    bad_ok = [a for (r, _), lab, a in labelled if not lab and r in success]
    steps: dict[int, tuple[float | None, int]] = {}
    for step in sorted({s for (_, s), _, _ in labelled}):
        at = [(float(lab), a) for (_, s), lab, a in labelled if s == step]
        x, y = np.array([a for _, a in at]), np.array([lab for lab, _ in at])
        steps[step] = (_corr(x, y), len(at))
    return AuditRow(name, len(keys), len(good), len(bad), auc(good, bad), sum(a > 0 for a in bad_ok), len(bad_ok),
                    steps, settings)


def format_audit(rows: Sequence[AuditRow], *, success_above: float = 0.0) -> str:
    """The table ``spanrl credit audit`` prints: one line per configuration."""
    if not rows:
        return "no credit configuration to audit"
    first = rows[0]
    steps = sorted({s for row in rows for s in row.step_corr})
    lines = [f"credit audit: {first.calls} calls, {first.good + first.bad} labelled ({first.good} good, "
             f"{first.bad} bad); success: episode reward > {success_above:g}"]
    width = max(len("config"), *(len(r.config) for r in rows))
    lines += [f"  {row.config:<{width}}  compares: {row.settings}" for row in rows if row.settings]
    by_step = "".join(f"  {'r step ' + str(s):>9}" for s in steps)
    lines.append(f"{'config':<{width}}  {'AUC':>6}  {'sign errors':>18}{by_step}")
    for row in rows:
        auc_text = "-" if row.auc is None else f"{row.auc:.3f}"
        rate = "-" if not row.bad_in_success else f"{row.sign_errors / row.bad_in_success:.3f}"
        errors = f"{row.sign_errors}/{row.bad_in_success} = {rate}"
        corr = "".join(f"  {_fmt(row.step_corr.get(s, (None, 0))[0]):>9}" for s in steps)
        lines.append(f"{row.config:<{width}}  {auc_text:>6}  {errors:>18}{corr}")
    if not first.good + first.bad:
        lines.append("no call is labelled: set spanrl.label.good on the LLM call's span (docs/credit.md)")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    text = "-" if value is None else f"{value:.3f}"
    return "0.000" if text == "-0.000" else text  # a correlation of 0 up to rounding (-1e-17) reads 0
