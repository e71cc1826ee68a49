"""Guarded updates (``OnlineConfig.guard``): a new policy version that makes the live reward worse is rolled back.

After each reload the new version is *on trial*: the online trainer makes no further update until it is
judged. Its live reward is that of the rollouts whose every token call it served (``store/online.py``'s
``version_rewards``); the previous weights' is that of every version that served them (a rollback
serves them again under a new version number, and those versions count too). Rewards may be
continuous or 0/1.

**The rule** (`verdict`): once both sides have at least ``min_judged`` judged rollouts, one look at their
rewards winsorized together (`winsorized`: the ``ceil(5%)`` highest of both sides' rewards pooled are pulled
down to the next one, and the lowest up; at least one each way), so that one extreme but legal reward cannot
flip a verdict (issue 53: one +1e6 feedback on a collapsed update's rollouts turned its verdict from rejected
to accepted):
reject the new version when ``previous_mean - new_mean > margin`` and Welch's one-sided t-test
(``online/welch.py``) of H0 ``new_mean >= previous_mean - margin`` against H1
``new_mean < previous_mean - margin`` gives ``p < alpha``; otherwise accept it. When only the previous
side lacks ``min_judged`` (it served too few), the new version is accepted untested (counted
``guard_untested``). One look per trial keeps the false-rejection rate of a harmless update at most ``alpha``.

**A rejection** reloads the previous checkpoint into the server (a new version number, the old weights),
restores the trainer's weights, optimizer, scheduler and RNG from that same checkpoint (GRPO's
checkpoints hold them all), writes a ``rejected_update`` line to the ledger and a ``rejected`` row to the
history, and training goes on from there. The rollouts the rejected update trained stay ``trained``
(never trained again); those the rejected version served are judged, counted in the test, and never
trained (ledger status ``rejected_version``): they were sampled from weights the trainer no longer has.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Protocol

from spanrl.online.welch import worse_p_value
from spanrl.errors import ConfigError
from spanrl.store.online import ReadyRollout, RewardStats, now_ns, version_rewards

__all__ = ["Gated", "Guard", "validate_guard", "verdict", "winsorized"]

_logger = logging.getLogger("spanrl.online")
_NS_PER_S = 1_000_000_000


_WINSOR_SHARE = 0.05


def winsorized(previous: RewardStats, new: RewardStats) -> tuple[RewardStats, RewardStats]:
    """Both sides with the ``k = ceil(5%)`` lowest and highest of their pooled rewards pulled in to the next one
    (as given when a side carries no values). 0/1 rewards with more than ``k`` of each value are unchanged; a
    side that differs from the other only in its ``k`` most extreme rewards is judged equal."""
    if not previous.values or not new.values:
        return previous, new
    pooled = sorted((*previous.values, *new.values))
    k = min(math.ceil(_WINSOR_SHARE * len(pooled)), (len(pooled) - 1) // 2)
    low, high = pooled[k], pooled[len(pooled) - 1 - k]

    def side(values: tuple[float, ...]) -> RewardStats:
        clipped = [min(max(v, low), high) for v in values]
        mean = sum(clipped) / len(clipped)
        var = sum((v - mean) ** 2 for v in clipped) / (len(clipped) - 1) if len(clipped) > 1 else 0.0
        return RewardStats(len(clipped), mean, var, tuple(clipped))

    return side(previous.values), side(new.values)


def verdict(previous: RewardStats, new: RewardStats, *, margin: float, alpha: float, min_judged: int) -> str | None:
    """``"rejected"`` | ``"accepted"`` | ``"untested"`` (the previous side has too few judged rollouts), or
    None while the new version has fewer than ``min_judged`` (the module docstring's rule). Pass the sides
    through `winsorized` first."""
    if new.n < min_judged:
        return None
    if previous.n < min_judged:
        return "untested"
    worse = previous.mean - new.mean > margin and worse_p_value(previous, new, margin) < alpha
    return "rejected" if worse else "accepted"


def validate_guard(config: Any) -> None:
    """Raise `ConfigError` naming the first bad guard field of an `OnlineConfig` (and read the overrides' steps)."""
    judged, margin, alpha = config.guard_min_judged, config.guard_margin, config.guard_alpha
    if isinstance(judged, bool) or not isinstance(judged, int) or judged < 2:
        raise ConfigError(f"guard_min_judged must be an integer >= 2, got {judged!r}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
        raise ConfigError(f"guard_margin must be a finite number >= 0, got {margin!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ConfigError(f"guard_alpha must be a number in (0, 1), got {alpha!r}")
    overrides = config.learning_rate_overrides
    try:  # a JSON config gives the steps as strings
        config.learning_rate_overrides = {int(k): float(v) for k, v in dict(overrides).items()}
    except (TypeError, ValueError):
        raise ConfigError(f"learning_rate_overrides must map update steps to learning rates, got {overrides!r}") \
            from None
    if not all(lr > 0 and math.isfinite(lr) for lr in config.learning_rate_overrides.values()):
        raise ConfigError(f"learning_rate_overrides must be finite and > 0, got {overrides!r}")


class Gated(Protocol):
    """What the guard needs of the source it gates (`OnlineTrainer`): its committed state and ledger (the guard
    commits its trials there, with the step's commit point's ``state.save``), its checkpoints and its weights."""

    def committed(self) -> tuple[Any, Any]:
        """The committed `OnlineState` and `Ledger`."""

    def save_checkpoint(self, step: int) -> str:
        """Write ``checkpoint-<step>`` under the output folder; its name."""

    def load_weights(self, checkpoint: str) -> None:
        """Restore the update's weights, optimizer, scheduler and RNG from ``checkpoint`` (a name)."""


class Guard:
    """The trials (``state.trial``) and rollbacks of the online source ``gated`` (`Gated`), read from ``store``
    (its ``sql``) and served by ``server`` (a `PolicyClient`) from checkpoints under ``output_dir``."""

    def __init__(self, config: Any, gated: Gated, *, store: Any, server: Any, output_dir: Path) -> None:
        self.config, self.gated, self.store, self.server, self.output_dir = config, gated, store, server, output_dir

    @property
    def _state(self) -> Any:
        return self.gated.committed()[0]

    def base(self) -> str | None:
        """With the guard on: the checkpoint a rejection of the coming update restores (``checkpoint-0``, the
        starting weights and a fresh optimizer, saved before the first update). None with the guard off."""
        if not self.config.guard:
            return None
        return self._state.checkpoint or self.gated.save_checkpoint(0)

    def rejected(self, rollout: ReadyRollout) -> bool:
        """Whether a policy version the guard rolled back served one of its calls."""
        low = rollout.min_policy_version
        high = rollout.max_policy_version if rollout.max_policy_version is not None else low
        return low is not None and any(low <= v <= high for v in self._state.rejected_versions)

    def serving(self, version: int) -> None:
        """The server now serves the committed checkpoint as ``version`` (after an update's or a restart's reload)."""
        state = self._state
        (state.trial["new_versions"] if state.trial is not None else state.served_versions).append(version)
        state.save(self.output_dir)

    def reloaded(self, version: int | None) -> None:
        """After an update's reload (``version`` None: it failed): the version on trial, or, with no trial
        (the guard off), the only version that serves the new checkpoint from now on."""
        state = self._state
        if state.trial is not None:
            state.trial["new_versions"].extend([] if version is None else [version])
        else:
            state.served_versions = [] if version is None else [version]
            state.served_since_ns = now_ns(self.store)
        state.save(self.output_dir)

    def open(self, *, step: int, checkpoint: str, previous: str, version: int, oldest_ns: int) -> dict[str, Any]:
        """The trial of ``checkpoint`` (update ``step``) against ``previous``, which ``version`` serves now;
        ``oldest_ns``: the update's oldest rollout (``ready_ns``), where the first trial's store reads begin."""
        state = self._state
        versions = sorted({*state.served_versions, version})
        return {"step": step, "checkpoint": checkpoint, "previous": previous, "new_versions": [],
                "previous_versions": versions, "since_ns": state.served_since_ns or oldest_ns,
                "opened_ns": now_ns(self.store)}

    def judge(self) -> dict[str, Any] | None:
        """Look at the open trial once: a history row when it was decided, None while it waits."""
        cfg, state = self.config, self._state
        trial = state.trial
        if not trial["new_versions"]:  # the reload after the update failed: the new version is not served yet
            trial["new_versions"].append(self.server.reload(self.output_dir / trial["checkpoint"]))
            state.save(self.output_dir)
        now = now_ns(self.store)
        new, previous = version_rewards(
            self.store, new_versions=trial["new_versions"], previous_versions=trial["previous_versions"], now=now,
            horizon_ns=max(0, trial["since_ns"] - 2 * int(cfg.max_age_s * _NS_PER_S)), settle_s=cfg.settle_s,
            max_age_s=cfg.max_age_s, quiet_s=cfg.quiet_s, reward_name=cfg.reward_name)
        previous, new = winsorized(previous, new)  # the row, the log line and the test: all on the clipped rewards
        decided = verdict(previous, new, margin=cfg.guard_margin, alpha=cfg.guard_alpha,
                          min_judged=cfg.guard_min_judged)
        if decided is None:
            return None
        p_value = worse_p_value(previous, new, cfg.guard_margin) if decided != "untested" else None
        row = {"step": state.step, "time": time.time(), "event": decided, "trial_step": trial["step"],
               "trial_versions": trial["new_versions"], "reward_new": new.mean, "reward_previous": previous.mean,
               "judged_new": new.n, "judged_previous": previous.n, "p_value": p_value}
        if decided == "rejected":
            row.update(self._roll_back(trial, row))
        else:
            state.served_versions, state.served_since_ns = list(trial["new_versions"]), trial["opened_ns"]
            state.trial = None
            state.count(f"guard_{decided}")
            state.save(self.output_dir)
        _logger.info("spanrl online: update %d (v%s) %s: live reward %.3f over %d vs %.3f over %d (p %s)",
                     trial["step"], trial["new_versions"], decided, new.mean, new.n, previous.mean, previous.n,
                     "-" if p_value is None else f"{p_value:.3g}")
        return row

    def _roll_back(self, trial: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """Serve and restore the previous checkpoint; commit the rejection (ledger line, state)."""
        (state, ledger), previous = self.gated.committed(), trial["previous"]
        version = self.server.reload(self.output_dir / previous)  # a ServingError: retried at the next poll
        self.gated.load_weights(previous)
        restored = {"restored": previous, "policy_version": version}
        ledger.append([{"event": "rejected_update", "step": trial["step"], "checkpoint": trial["checkpoint"],
                        "rejected_versions": trial["new_versions"], **restored,
                        **{k: row[k] for k in ("reward_new", "reward_previous", "judged_new", "judged_previous",
                                               "p_value")}}])
        state.rejected_versions = sorted({*state.rejected_versions, *trial["new_versions"]})
        state.served_versions = [*trial["previous_versions"], version]
        state.checkpoint, state.trial, state.ledger_lines = previous, None, ledger.lines
        state.count("guard_rejected")
        state.save(self.output_dir)
        _logger.warning("spanrl online: update %d rolled back: serving %s again as v%d", trial["step"], previous,
                        version)
        return restored
