"""Step signals: per-step rewards from what the trace says went wrong at each LLM call (opt-in).

``CreditConfig.step_signals`` maps trace facts to a reward each (YAML
``credit: {mode: step, step_signals: {tool_error: -0.2, nonzero_exit: -0.2, denied: -0.1, retry: -0.1}}``).
The facts are counted per call from its tool spans (``spanrl/store/step_facts.py``: which call issued a tool
span, and what counts as an error, a non-zero exit, a denial, a retry). Call ``t`` of a rollout then gets
the intermediate reward

    s_t = sum_f w_f * n_{t,f}

(``w_f`` the configured reward of fact ``f``, ``n_{t,f}`` how many of its tool spans show ``f``), added to
``r_t``, the rewards that followed it: ``step`` mode's returns-to-go ``G_t = sum_{k >= t} gamma^(k - t)
(r_k + s_k)`` and ``gae``'s ``delta_t`` read them like any reward. The episode reward ``R`` (what
``identical`` and ``discounted`` compare, what ``episode_reward`` picks, what a rollout is kept by) is left
as it was: a signal never keeps a rollout that has no reward. ``identical`` and ``discounted`` read only
``R``, so ``step_signals`` is refused with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from spanrl.errors import ConfigError
from spanrl.store.step_facts import CALL_COLUMNS, FACTS

__all__ = ["CALL_COLUMNS", "SIGNALS", "SIGNAL_MODES", "call_signal_reward", "check_step_signals", "signal_rewards"]

SIGNALS = FACTS
"""The facts a reward can be given to (``spanrl.store.step_facts``)."""
SIGNAL_MODES = ("step", "gae")
"""Credit modes that read per-step rewards."""


def check_step_signals(signals: Any, mode: str) -> None:
    """Raise `ConfigError` naming the field, what is allowed and the bad value (None or ``{}``: off)."""
    if signals is None:
        return
    if not isinstance(signals, Mapping):
        raise ConfigError(f"step_signals must be a mapping of {', '.join(SIGNALS)} to a reward, got {signals!r}")
    for name, value in signals.items():
        if name not in SIGNALS:
            raise ConfigError(f"step_signals: no signal {name!r}; the signals are {', '.join(SIGNALS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"step_signals.{name} must be a finite number (a reward), got {value!r}")
    if signals and mode not in SIGNAL_MODES:
        raise ConfigError(f"step_signals needs mode {' or '.join(repr(m) for m in SIGNAL_MODES)} (per-step rewards); "
                          f"mode {mode!r} reads only the episode reward: got step_signals={dict(signals)!r}")


def call_signal_reward(counts: Mapping[str, int], signals: Mapping[str, float] | None) -> float:
    """``s_t``: the reward one call's fact ``counts`` give under ``signals``."""
    return float(sum(float(w) * counts.get(name, 0) for name, w in (signals or {}).items()))


def signal_rewards(store: Any, calls: Any, rollout_index: Callable[[Any], Any], signals: Mapping[str, float],
                   report: dict[str, int]) -> tuple[Any, Any, Any]:
    """The per-step rewards of ``calls`` (the decomposer's calls of the selected rollouts, with `CALL_COLUMNS`
    and ``rollout_calls``) as
    ``(rollout index, step, value)`` arrays for ``assign_credit(signals=...)``; the report counts each
    fact (``step_signal_<fact>``) and the tool spans before every call (``step_signals_before_first_call``)."""
    import numpy as np
    import pyarrow as pa

    from spanrl.store.step_facts import step_facts

    calls = _every_call(store, calls)
    facts = step_facts(store, calls) if calls.num_rows else None
    rows = facts.to_pylist() if facts is not None else []
    report["step_signals_before_first_call"] = sum(r["tools"] for r in rows if r["step"] < 0)
    rows = [r for r in rows if r["step"] >= 0]
    for name in SIGNALS:
        report[f"step_signal_{name}"] = sum(r[name] for r in rows)
    value = np.array([call_signal_reward(r, signals) for r in rows], dtype=np.float64)
    ids = pa.array([r["rollout_id"] for r in rows], pa.string())
    return rollout_index(ids), np.array([r["step"] for r in rows], dtype=np.int64), value


def _every_call(store: Any, calls: Any) -> Any:
    """``calls``, or every call of their rollouts when a selection (``agents``, ``min_policy_version``) left some
    out: a tool span another agent's call issued is that call's, never the selected agent's call before it."""
    rollout_calls = dict(zip(calls.column("rollout_id").to_pylist(), calls.column("rollout_calls").to_pylist()))
    if calls.num_rows == sum(rollout_calls.values()):
        return calls
    from spanrl.store.decomposer import Selection, decompose

    return decompose(store, Selection(rollout_ids=sorted(rollout_calls)), call_columns=CALL_COLUMNS).calls
