"""LightningRL credit assignment: rewards of a rollout -> a return and an advantage for each LLM call.

Returns ``G`` per call (``mode``), then a baseline over the rollouts of the same task (``baseline``):

The rewards a rollout's credit reads follow one rule in every mode (``episode_reward``): ``last``, the
reward of the rollout the collector stored last (the default; docs/credit.md), or ``sum``, every reward of
the rollout. Under ``last`` the other rewards are dropped before any mode reads them, so the arms of an
ablation optimise one objective.

- ``identical``: ``G_t = R``, the episode reward (the last reward, or the sum) on every call, as
  in the LightningRL paper (Agent Lightning, arXiv 2508.03680, section 3.2).
- ``discounted``: ``G_t = gamma ** (T - 1 - t) * R``: the episode reward discounted by the number of
  calls that still followed (``T`` calls in the rollout, ``t`` the call's step).
- ``step``: returns-to-go over intermediate rewards, ``G_t = sum_{k >= t} gamma ** (k - t) * r_k``,
  where ``r_k`` sums the rewards that followed call ``k`` and came before call ``k + 1``
  (rewards before the first call are counted in the report and credit no call).
- ``gae``: generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438) from critic values
  ``V`` per call, over the chain of calls in the batch: ``delta_j = r_j + gamma * V_{j+1} - V_j``,
  ``A_j = delta_j + gamma * lam * A_{j+1}``, ``G_j = A_j + V_j``. The critic is the baseline.

Baselines (groups: rollouts of the same ``task_id``), chosen so that rollouts with identical rewards
in one group get zero advantage at every step, in every mode, whatever their lengths (``step`` with
``gamma < 1``: see below; formulas: docs/credit.md):

- ``grpo``: subtract the group mean (Shao et al. 2024, arXiv 2402.03300), divide by the group's standard
  deviation (ddof 1, as TRL) when ``scale_std``. A group whose std is below ``eps`` is not scaled.
- ``rloo``: subtract the mean of the group's other rollouts (leave-one-out, Ahmadian et al. 2024,
  arXiv 2402.14740), divide by the group std when ``scale_std``. A rollout alone in its group gets 0.
- ``none``: ``A = G`` (the right choice with ``gae``); with ``scale_std`` the batch is whitened,
  ``(A - mean) / std`` over all calls, as PPO implementations do. No group comparison.
- ``running``: against earlier batches, a per-task running mean (rewards one at a time, online): ``baseline.py``.

What the baseline compares, per mode: ``identical`` and ``discounted`` compare episode rewards ``R``
(``discounted`` then scales each call's advantage by ``gamma ** (T - 1 - t)``); ``step`` compares the
returns-to-go of the group's rollouts that reached step ``t`` (made more than ``t`` calls): a call at a
step no other kept rollout of its group reached is compared with no one and gets 0, never a comparison
with the zero padding of rollouts that had ended. With ``gamma < 1`` rollouts that earn the same reward in different
numbers of calls are not alike: the shorter one's calls have the higher returns-to-go (what discounting is for).
``per_rollout`` (default): group statistics take one value per rollout, so a rollout with more calls
does not weigh more. ``per_rollout=False`` takes one value per call, as Agent Lightning 0.3 does (longer
rollouts weigh more; RLOO then leaves out all calls of the same rollout); in ``step`` mode each step's
statistics already take one value per rollout, so it changes nothing there.

``step_group_weight`` (``omega``, GiGPO's state-grouped advantage, Feng et al. 2025, arXiv 2505.10978):
``algorithms/gigpo.py``. Within a task group, the kept calls that observed the same environment state (an
"anchor state") form a step group; each call adds ``omega * (G^s_t - mean_sg G^s) / std_sg G^s`` to its
advantage, ``G^s_t = sum_{k >= t} step_gamma ** (k - t) * r_k`` its discounted step return (a step group of
one adds 0). The episode term is the mode's. Identical rollouts still get zero at every step.

``step_signals`` (``algorithms/step_signals.py``): per-step rewards from trace facts (a tool error, a non-zero
exit code, a denied or repeated tool call) at the call that issued the tool call, added to ``r_t`` in
``step`` and ``gae`` (``signals``); the episode reward and which rollouts are kept do not change.

``critic`` (a learned value head on the policy's hidden state, ``algorithms/learned_credit.py``): each call
adds ``weight * A^V_t``, GAE over the head's values ``V`` (``values``, one per call), to the advantage above;
``CreditResult.value_targets`` holds the returns-to-go ``G_t`` the head regresses on.

``trajectory_aggregation`` (read by ``load_transitions``): merge the calls of a multi-turn
conversation into one sample (the seed design's ``LightningRL(trajectory_aggregation=True)``). A merged
sample keeps each call's advantage on that call's tokens (``Transition.token_advantages``); with ``gae``
(PPO's per-call value targets) it is refused (`aggregation_conflict`).

Bad data is handled by the config and counted, never dropped silently: a rollout without a reward is
skipped or scored 0 (``missing_reward``); a NaN reward skips its rollout, counts as 0 or is ignored (``nan_reward``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


import numpy as np

from spanrl.algorithms.baseline import RunningBaseline, running_advantages
from spanrl.algorithms.credit_config import CreditConfig, LightningRL, aggregation_conflict, default_config
from spanrl.algorithms.gigpo import group_stats as _group_stats
from spanrl.algorithms.gigpo import state_ids, step_group_advantage
from spanrl.algorithms.learned_credit import critic_terms
from spanrl.errors import ConfigError

__all__ = ["CreditConfig", "CreditResult", "LightningRL", "MissingValueError", "aggregation_conflict",
           "assign_credit", "default_config", "state_ids"]

class MissingValueError(ConfigError):
    """``gae`` got no finite critic value for a call of a rollout it keeps (``call``: the call's index)."""

    def __init__(self, call: int, value: float) -> None:
        super().__init__(f"values must be finite for every call of a kept rollout; call {call} has {value!r}")
        self.call = call


@dataclass
class CreditResult:
    """Per call: ``returns`` and ``advantages`` (NaN for calls of skipped rollouts). Per rollout:
    ``keep`` (False: skipped, see ``report``) and ``episode_reward`` (NaN when it has none)."""

    returns: np.ndarray
    advantages: np.ndarray
    keep: np.ndarray
    episode_reward: np.ndarray
    report: dict[str, int] = field(default_factory=dict)
    value_targets: np.ndarray | None = None
    """Per call, with a ``critic``: the return-to-go ``G_t`` its value head regresses on (NaN: skipped)."""


def assign_credit(
    config: CreditConfig,
    *,
    call_rollout: np.ndarray,
    call_step: np.ndarray,
    rollout_calls: np.ndarray,
    rollout_group: np.ndarray,
    reward_rollout: np.ndarray,
    reward_step: np.ndarray,
    reward_value: np.ndarray,
    reward_time_ns: np.ndarray,
    reward_name: np.ndarray | None = None,
    values: np.ndarray | None = None,
    call_state: np.ndarray | None = None,
    running: tuple[RunningBaseline, list[str | None]] | None = None,
    signals: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> CreditResult:
    """Returns and advantages for the calls of a batch of rollouts. Rollouts are ``0..R-1``: ``rollout_calls[i]``
    calls (all agents, before any selection), task group ``rollout_group[i]``. Calls: rollout and ``step`` (0-based).
    Rewards: rollout, step of the last call before them (-1: none), value, time, name; the episode reward is the
    last by ``reward_time_ns`` (any sort key: load_transitions passes the ingest order) or the sum
    (``episode_reward``). ``values`` (gae, critic): one per
    call. ``call_state`` (``step_group_weight``): per call, the id of the state it observed
    (``gigpo.anchor_states``). ``running``
    (baseline ``running``): the running baseline and each group's task id. ``signals``: ``step_signals``' rewards."""
    config.validate()
    report: dict[str, int] = {}
    rollout_calls = np.asarray(rollout_calls, dtype=np.int64)
    keep, episode, r_roll, r_step, r_val = _rewards(
        config, len(rollout_calls), reward_rollout, reward_step, reward_value, reward_time_ns, reward_name, report,
        signals,
    )
    b = _Calls(np.asarray(call_rollout, dtype=np.int64), np.asarray(call_step, dtype=np.int64), rollout_calls,
               np.asarray(rollout_group, dtype=np.int64), keep, episode, r_roll, r_step, r_val)
    if config.mode in ("step", "gae"):
        report["rewards_before_first_call"] = int((r_step < 0).sum())
    returns, gae_advantages, to_go = _returns(config, b, values)
    advantages = _advantages(config, b, returns, gae_advantages, to_go, running, report)
    if config.step_group_weight:
        if call_state is None or len(call_state) != len(b.call_rollout):
            raise ConfigError("call_state must give one state per call when step_group_weight > 0")
        step_returns = _returns_to_go(r_roll, r_step, r_val, b.offsets, config.step_gamma)[b.call_pos]
        step_adv = step_group_advantage(config, step_returns, b.call_keep, rollout_group[b.call_rollout],
                                        call_state, report)
        advantages = advantages + config.step_group_weight * step_adv
    critic_term, value_targets = _critic(config, values, b.call_rollout, b.call_step, b.call_keep, r_roll, r_step,
                                         r_val)
    advantages = np.where(b.call_keep, advantages + critic_term, np.nan)
    return CreditResult(returns, advantages, keep, episode, report, value_targets)


@dataclass
class _Calls:
    """One batch's calls and rollouts as `assign_credit` reads them (rewards already chosen by `_rewards`)."""

    call_rollout: np.ndarray
    call_step: np.ndarray
    rollout_calls: np.ndarray
    rollout_group: np.ndarray
    keep: np.ndarray
    episode: np.ndarray
    r_roll: np.ndarray
    r_step: np.ndarray
    r_val: np.ndarray

    def __post_init__(self) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(self.rollout_calls)])
        self.call_pos = self.offsets[self.call_rollout] + self.call_step  # the call's row in a rollout-major layout
        self.call_keep = self.keep[self.call_rollout]


def _returns(config: CreditConfig, b: _Calls,
             values: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Each call's return (NaN on skipped rollouts); ``gae`` also gives its advantages, ``step`` its returns-to-go."""
    to_go = gae_advantages = None
    if config.mode == "identical":
        returns = b.episode[b.call_rollout]
    elif config.mode == "discounted":
        returns = b.episode[b.call_rollout] * _discount(config, b.rollout_calls, b.call_rollout, b.call_step)
    elif config.mode == "step":
        to_go = _returns_to_go(b.r_roll, b.r_step, b.r_val, b.offsets, config.gamma)
        returns = to_go[b.call_pos]
    else:
        returns, gae_advantages = _gae(config, b.call_rollout, b.call_step, b.call_keep, b.r_roll, b.r_step,
                                       b.r_val, values)
    return np.where(b.call_keep, returns, np.nan), gae_advantages, to_go


def _advantages(config: CreditConfig, b: _Calls, returns: np.ndarray, gae_advantages: np.ndarray | None,
                to_go: np.ndarray | None, running: tuple[RunningBaseline, list[str | None]] | None,
                report: dict[str, int]) -> np.ndarray:
    """Returns minus the configured baseline (the mode's episode term, before GiGPO's step term and the critic)."""
    if config.mode == "gae" or config.baseline == "none":
        advantages = gae_advantages if gae_advantages is not None else np.nan_to_num(returns)
        return _whiten(advantages, b.call_keep, config.eps) if config.scale_std else advantages
    if config.baseline == "running":  # (state, task id per group): algorithms/baseline.py
        trained = b.keep & (np.bincount(b.call_rollout, minlength=len(b.keep)) > 0)  # a rollout with no call: unseen
        return running_advantages(config, running, b.episode, trained, b.rollout_group)[b.call_rollout]
    if config.mode == "step":
        assert to_go is not None
        return _step_baseline(config, to_go, b.offsets, b.rollout_calls, b.call_rollout, b.call_step, b.keep,
                              b.rollout_group, report)
    # identical, discounted: episode rewards compared; discounted scales by gamma ** (T - 1 - t)
    advantages = _baseline(config, b.episode[b.call_rollout], b.call_rollout, b.call_keep, b.episode, b.keep,
                           b.rollout_group, report)
    if config.mode == "discounted":
        advantages = advantages * _discount(config, b.rollout_calls, b.call_rollout, b.call_step)
    return advantages


def _rewards(
    config: CreditConfig,
    n_rollouts: int,
    reward_rollout: np.ndarray,
    reward_step: np.ndarray,
    reward_value: np.ndarray,
    reward_time_ns: np.ndarray,
    reward_name: np.ndarray | None,
    report: dict[str, int],
    signals: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rewards of the chosen name under the NaN and missing-reward policies: which rollouts are kept,
    each one's episode reward, and the kept rewards' rollout, step and value (``episode_reward`` ``last``:
    only each rollout's last stored reward; ``sum``: all of them), then ``signals``: the per-step rewards
    ``(rollout, step, value)`` of ``step_signals`` (when configured), which move neither ``keep`` nor ``episode``."""
    r_roll = np.asarray(reward_rollout, dtype=np.int64)
    r_step = np.asarray(reward_step, dtype=np.int64)
    r_val = np.asarray(reward_value, dtype=np.float64).copy()
    r_time = np.asarray(reward_time_ns, dtype=np.int64)
    if config.reward_name is not None and reward_name is not None:
        chosen = np.asarray(reward_name, dtype=object) == config.reward_name
        r_roll, r_step, r_val, r_time = r_roll[chosen], r_step[chosen], r_val[chosen], r_time[chosen]
    keep = np.ones(n_rollouts, dtype=bool)
    nan = np.isnan(r_val)
    report["nan_reward"] = int(nan.sum())
    if nan.any():
        if config.nan_reward == "ignore":  # as if never sent: the rollout's other rewards decide
            r_roll, r_step, r_val, r_time = r_roll[~nan], r_step[~nan], r_val[~nan], r_time[~nan]
        elif config.nan_reward == "zero":
            r_val[nan] = 0.0
        else:
            bad = np.unique(r_roll[nan])
            keep[bad] = False
            report["skipped_nan_reward"] = int(len(bad))
    has_reward = np.bincount(r_roll, minlength=n_rollouts) > 0 if len(r_roll) else np.zeros(n_rollouts, bool)
    episode = np.full(n_rollouts, np.nan)
    if len(r_roll):
        order = np.lexsort((r_time, r_roll))
        last = order[np.r_[r_roll[order][1:] != r_roll[order][:-1], True]]
        if config.episode_reward == "last":
            r_roll, r_step, r_val = r_roll[last], r_step[last], r_val[last]
            episode[r_roll] = r_val
        else:
            episode[r_roll[last]] = 0.0
            np.add.at(episode, r_roll, r_val)
    no_reward = ~has_reward & keep
    if config.missing_reward == "zero":
        episode[no_reward] = 0.0
        report["defaulted_no_reward"] = int(no_reward.sum())
    else:
        keep &= has_reward
        report["skipped_no_reward"] = int(no_reward.sum())
    kept_reward = keep[r_roll] if len(r_roll) else np.zeros(0, bool)
    r_roll, r_step, r_val = r_roll[kept_reward], r_step[kept_reward], r_val[kept_reward]
    if signals is not None and config.step_signals:  # step, gae: added to r_t, never to the episode reward
        r_roll, r_step, r_val = _with_signals(keep, (r_roll, r_step, r_val), signals)
    return keep, episode, r_roll, r_step, r_val


def _with_signals(keep: np.ndarray, rewards: tuple[np.ndarray, np.ndarray, np.ndarray],
                  signals: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kept rewards followed by the signals' per-step rewards of kept rollouts (at a call: step >= 0)."""
    s_roll, s_step = np.asarray(signals[0], np.int64), np.asarray(signals[1], np.int64)
    s_val = np.asarray(signals[2], np.float64)
    ok = (s_step >= 0) & keep[s_roll] if len(s_roll) else np.zeros(0, bool)
    r_roll, r_step, r_val = rewards
    return (np.concatenate([r_roll, s_roll[ok]]), np.concatenate([r_step, s_step[ok]]),
            np.concatenate([r_val, s_val[ok]]))


def _discount(config: CreditConfig, rollout_calls: np.ndarray, call_rollout: np.ndarray,
              call_step: np.ndarray) -> np.ndarray:
    """``gamma ** (T - 1 - t)`` per call: the number of calls of its rollout that still followed."""
    return config.gamma ** (rollout_calls[call_rollout] - 1 - call_step).astype(np.float64)


def _returns_to_go(r_roll: np.ndarray, r_step: np.ndarray, r_val: np.ndarray, offsets: np.ndarray,
                    gamma: float) -> np.ndarray:
    """Per call position: ``sum_{k >= t} gamma ** (k - t) * r_k`` within its rollout (rewards before the first
    call credit none)."""
    dense = np.zeros(offsets[-1])
    ok = r_step >= 0
    np.add.at(dense, offsets[r_roll[ok]] + r_step[ok], r_val[ok])
    return _discounted_cumsum(dense, offsets, gamma)


def _discounted_cumsum(dense: np.ndarray, offsets: np.ndarray, gamma: float) -> np.ndarray:
    """Per segment [offsets[i], offsets[i+1]): out[t] = dense[t] + gamma * out[t+1] within the segment."""
    out = np.zeros_like(dense)
    ends = set(int(o) - 1 for o in offsets[1:])
    running = 0.0
    for t in range(len(dense) - 1, -1, -1):
        if t in ends:
            running = 0.0
        running = dense[t] + gamma * running
        out[t] = running
    return out


def _gae(
    config: CreditConfig,
    call_rollout: np.ndarray,
    call_step: np.ndarray,
    call_keep: np.ndarray,
    r_roll: np.ndarray,
    r_step: np.ndarray,
    r_val: np.ndarray,
    values: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and advantages by GAE; ``values`` may be NaN only on calls of skipped rollouts."""
    values = _checked_values(values, call_rollout, call_keep, "mode is 'gae'")
    # the critic's GAE over each kept rollout's calls (learned_credit.py): one recursion for both critics
    adv, _ = critic_terms(config, values, call_rollout=call_rollout, call_step=call_step, call_keep=call_keep,
                          r_roll=r_roll, r_step=r_step, r_val=r_val)
    return adv + values, adv


def _critic(config: CreditConfig, values: np.ndarray | None, call_rollout: np.ndarray, call_step: np.ndarray,
            call_keep: np.ndarray, r_roll: np.ndarray, r_step: np.ndarray,
            r_val: np.ndarray) -> tuple[np.ndarray | float, np.ndarray | None]:
    """The learned head's ``weight * A^V`` per call and its targets ``G_t`` (``algorithms/learned_credit.py``);
    ``(0, None)`` without a ``critic``."""
    if config.critic is None:
        return 0.0, None
    gae, to_go = critic_terms(config.critic, _checked_values(values, call_rollout, call_keep, "critic is set"),
                              call_rollout=call_rollout, call_step=call_step, call_keep=call_keep, r_roll=r_roll,
                              r_step=r_step, r_val=r_val)
    return config.critic.weight * np.nan_to_num(gae), to_go


def _checked_values(values: np.ndarray | None, call_rollout: np.ndarray, call_keep: np.ndarray,
                    when: str) -> np.ndarray:
    """``values`` as floats, one per call, finite on every kept call (`MissingValueError` names the first not)."""
    if values is None:
        raise ConfigError(f"values must be given (one critic value per call) when {when}")
    values = np.asarray(values, dtype=np.float64)
    if values.shape != call_rollout.shape:
        raise ConfigError(f"values must have one entry per call ({len(call_rollout)}), got shape {values.shape}")
    missing = call_keep & ~np.isfinite(values)
    if missing.any():
        raise MissingValueError(int(np.argmax(missing)), float(values[np.argmax(missing)]))
    return values


def _baseline(
    config: CreditConfig,
    returns: np.ndarray,
    call_rollout: np.ndarray,
    call_keep: np.ndarray,
    score: np.ndarray,
    keep: np.ndarray,
    rollout_group: np.ndarray,
    report: dict[str, int],
) -> np.ndarray:
    """``(G - b) / std`` per call, ``b`` the group mean (grpo) or the others' mean (rloo) of ``score``
    per rollout (``per_rollout``) or of ``returns`` per call."""
    n_groups = int(rollout_group.max()) + 1 if len(rollout_group) else 0
    call_group = rollout_group[call_rollout]
    if config.per_rollout:  # one value per kept rollout
        vals, grp = score[keep], rollout_group[keep]
        count, total, std = _group_stats(vals, grp, n_groups)
        mean = np.divide(total, count, out=np.zeros(n_groups), where=count > 0)
        if config.baseline == "grpo":
            base = mean[call_group]
        else:  # rloo: the mean of the other rollouts of the group
            others = count[call_group] - 1
            base = np.divide(total[call_group] - score[call_rollout], others, out=returns.copy(), where=others > 0)
        report["singleton_groups"] = int(((count == 1)).sum())
    else:  # one value per kept call
        vals, grp = returns[call_keep], call_group[call_keep]
        count, total, std = _group_stats(vals, grp, n_groups)
        mean = np.divide(total, count, out=np.zeros(n_groups), where=count > 0)
        if config.baseline == "grpo":
            base = mean[call_group]
        else:  # rloo: the mean over calls of the group's other rollouts
            own_n = np.bincount(call_rollout[call_keep], minlength=len(keep)).astype(np.float64)
            own_sum = np.bincount(call_rollout[call_keep], weights=vals, minlength=len(keep))
            others = count[call_group] - own_n[call_rollout]
            base = np.divide(
                total[call_group] - own_sum[call_rollout], others, out=returns.copy(), where=others > 0
            )
        rollouts_per_group = np.bincount(rollout_group[keep], minlength=n_groups)
        report["singleton_groups"] = int((rollouts_per_group == 1).sum())
    adv = returns - base
    if config.scale_std:
        s = std[call_group]
        scalable = np.isfinite(s) & (s >= config.eps)
        adv = np.where(scalable, adv / (np.where(scalable, s, 1.0) + config.eps), adv)
        report["unscaled_groups"] = int((~(np.isfinite(std) & (std >= config.eps)) & (count > 0)).sum())
    return adv


def _step_baseline(
    config: CreditConfig,
    to_go: np.ndarray,
    offsets: np.ndarray,
    rollout_calls: np.ndarray,
    call_rollout: np.ndarray,
    call_step: np.ndarray,
    keep: np.ndarray,
    rollout_group: np.ndarray,
    report: dict[str, int],
) -> np.ndarray:
    """``step`` mode: at each step ``t``, ``G_t`` against the returns-to-go of the group's kept rollouts
    that reached step ``t``, scaled by their std; a call no other kept rollout of its group reached gets 0."""
    n_rollouts = len(rollout_calls)
    n_groups = int(rollout_group.max()) + 1 if n_rollouts else 0
    width = int(rollout_calls.max()) if n_rollouts else 0
    grid = np.zeros((n_rollouts, width))  # (R, T_max) returns-to-go, 0 past the rollout's end
    rows = np.repeat(np.arange(n_rollouts), rollout_calls)
    cols = np.arange(offsets[-1]) - np.repeat(offsets[:-1], rollout_calls)
    grid[rows, cols] = to_go
    kept = np.flatnonzero(keep)
    reached = np.arange(width)[None, :] < rollout_calls[:, None]  # (R, T_max): the rollout made call t
    kept_group = rollout_group[kept]
    count = np.zeros((n_groups, width))  # (G, T_max) kept rollouts of the group that reached step t
    np.add.at(count, kept_group, reached[kept].astype(np.float64))
    total = np.zeros((n_groups, width))
    np.add.at(total, kept_group, grid[kept])
    mean = total / np.maximum(count, 1)  # (G, T_max)
    sq = np.zeros((n_groups, width))
    np.add.at(sq, kept_group, np.where(reached[kept], grid[kept] - mean[kept_group], 0.0) ** 2)
    std = np.sqrt(np.divide(sq, count - 1, out=np.full_like(sq, np.nan), where=count > 1))
    g = rollout_group[call_rollout]
    own = grid[call_rollout, call_step]
    if config.baseline == "grpo":
        base = mean[g, call_step]
    else:  # rloo: the others that reached the step (no other: the call itself, so A = 0)
        others = count[g, call_step] - 1
        base = np.divide(total[g, call_step] - own, others, out=own.copy(), where=others > 0)
    rollouts = np.bincount(kept_group, minlength=n_groups)
    report["singleton_groups"] = int((rollouts == 1).sum())
    adv = own - base
    if config.scale_std:
        s = std[g, call_step]
        scalable = np.isfinite(s) & (s >= config.eps)
        adv = np.where(scalable, adv / (np.where(scalable, s, 1.0) + config.eps), adv)
        # a group alone, or with a step two of its rollouts reached at a std below eps (a step one rollout
        # reached alone compares it with no one: nothing to scale)
        unscaled = (~(np.isfinite(std) & (std >= config.eps)) & (count > 1)).any(axis=1) | (rollouts == 1)
        report["unscaled_groups"] = int(unscaled.sum())
    return adv


def _whiten(adv: np.ndarray, keep: np.ndarray, eps: float) -> np.ndarray:
    kept = adv[keep]
    if len(kept) < 2:
        return adv
    std = kept.std(ddof=1)
    return (adv - kept.mean()) / (std + eps) if std >= eps else adv - kept.mean()
