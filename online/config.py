"""The online trainer's settings, `OnlineConfig` (``spanrl train --online CONFIG`` takes the same fields; every
key in docs/online-config.md), beside the loop that reads them (``online/trainer.py``) as ``TrainerConfig`` is
beside the Trainer (``trainer/config.py``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from spanrl import env
from spanrl.errors import ConfigError, positive_int
from spanrl.online.guard import validate_guard

__all__ = ["OnlineConfig"]

_POLICY_URL = f"http://{env.DEFAULT_HOST}:{env.DEFAULT_POLICY_PORT}"
_STORE_URL = f"http://{env.DEFAULT_HOST}:{env.DEFAULT_HTTP_PORT}"


@dataclass
class OnlineConfig:
    """The online trainer's settings (``spanrl train --online CONFIG`` takes the same fields)."""

    model: str = ""
    """The starting policy: an HF folder (the one ``spanrl serve`` was started with)."""
    server_url: str = dataclasses.field(default_factory=lambda: env.get_str(env.SPANRL_POLICY_URL) or _POLICY_URL)
    """The running policy server, reloaded after every update (default ``SPANRL_POLICY_URL``, else port 8000)."""
    store_url: str = dataclasses.field(default_factory=lambda: env.get_str(env.SPANRL_SQL_URL) or _STORE_URL)
    """The collector's HTTP endpoint, whose SQL route reads the span store (default ``SPANRL_SQL_URL``, as
    ``spanrl sql``, else port 4318)."""
    collector_token: str | None = None
    """Bearer token of the collector, if it has one: its read token is enough (None: ``collector_token_file``,
    else ``SPANRL_COLLECTOR_READ_TOKEN``, else ``SPANRL_COLLECTOR_TOKEN``). Never written to ``config.json``."""
    collector_token_file: str | None = None
    """A file holding the collector token (private to its owner, as a config or a command line may not be)."""
    admin_token_file: str | None = None
    """A file holding the policy server's admin token, for reloads (None: ``SPANRL_POLICY_ADMIN_TOKEN``)."""
    output_dir: str = "spanrl-online"
    """Checkpoints, ``online_state.json``, ``ledger.jsonl``, ``history.jsonl``."""
    poll_interval_s: float = 2.0
    """Seconds between polls of the store when there is nothing to train."""
    settle_s: float = 2.0
    """A rollout is taken only this long after it became ready, so near-simultaneous feedback combines."""
    quiet_s: float | None = None
    """An agent that opens no ``spanrl.rollout`` span: its rollout is complete after this long without spans.
    None: the store's one quiet time (``store/views.sql``'s ``rollout_quiet_ns()``, 60 s), as every reader of it."""
    max_age_s: float = 600.0
    """Feedback window: a rollout without a reward this long after it completed ages out, never trained."""
    min_rollouts: int = 8
    """Rollouts (after skipping stale ones) needed for an update."""
    max_rollouts: int = 64
    """Most rollouts in one update."""
    max_policy_lag: int = 2
    """K: rollouts sampled more than K policy versions before the server's current one are skipped."""
    baseline_window: int = 20
    """Running means of the baseline average over about this many recent rewards."""
    baseline_prior: float = 2.0
    """Weight of the global mean in a task's baseline (pseudo-observations)."""
    scale_std: bool = True
    """Divide advantages by the running reward std."""
    baseline_clip_std: float = 4.0
    """Rewards are winsorized to the running mean +- this many stds (at least 1) before they enter the
    baseline or an advantage, so one outlier cannot poison it (``online/state.py``)."""
    max_bad_updates: int = 3
    """Stop with a `TrainingError` after this many updates in a row whose loss, gradients or weights were
    not finite (each is undone, its rollouts are quarantined as ``bad_update``, nothing is checkpointed)."""
    reward_name: str | None = None
    """Only rewards (and feedback) of this name; None: any."""
    max_updates: int | None = None
    """Stop after this many updates (all runs of this output dir together, rolled-back ones too); None: run
    until stopped."""
    max_seconds: float | None = None
    """Stop after this many seconds of this run; None: run until stopped."""
    keep_checkpoints: int = 2
    """Checkpoints kept in the output dir (the newest ones; those a guard trial needs are kept too)."""
    guard: bool = False
    """Guarded updates (``online/guard.py``): after each reload, make no further update until the new
    version's live reward is judged against the previous weights'; roll it back when it is worse."""
    guard_min_judged: int = 16
    """Judged rollouts each side needs (those the new version served alone, and the previous weights')."""
    guard_margin: float = 0.0
    """Reward units: reject only a new version whose mean live reward is more than this below the previous."""
    guard_alpha: float = 0.05
    """Significance level of the one-sided Welch t-test that the new version is worse by more than the margin."""
    learning_rate_overrides: dict[int, float] = dataclasses.field(default_factory=dict)
    """Update step -> learning rate for that update alone, then the algorithm's own again. To rehearse the
    guard, one huge rate makes one harmful update: ``{3: 300.0}``."""
    seed: int = 0
    torch_threads: int | None = 1
    """``torch.set_num_threads`` for this process; None leaves torch's default."""

    def validate(self) -> "OnlineConfig":
        """Raise `ConfigError` naming the first bad field; returns self."""
        if not self.model:
            raise ConfigError("model must be the HF folder the policy server started from, got ''")
        for name in ("server_url", "store_url"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.startswith(("http://", "https://")):
                raise ConfigError(f"{name} must be an http(s) URL, got {value!r}")
        for name in ("poll_interval_s", "settle_s", "quiet_s", "max_age_s", "baseline_prior"):
            value = getattr(self, name)
            if name == "quiet_s" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(self.baseline_clip_std, bool) or not isinstance(self.baseline_clip_std, (int, float)) \
                or not self.baseline_clip_std > 0 or not math.isfinite(self.baseline_clip_std):
            raise ConfigError(f"baseline_clip_std must be a finite number > 0, got {self.baseline_clip_std!r}")
        for name in ("min_rollouts", "max_rollouts", "baseline_window", "keep_checkpoints", "max_bad_updates"):
            positive_int(name, getattr(self, name))
        if self.max_rollouts < self.min_rollouts:
            raise ConfigError(f"max_rollouts must be >= min_rollouts ({self.min_rollouts}), got {self.max_rollouts}")
        if isinstance(self.max_policy_lag, bool) or not isinstance(self.max_policy_lag, int) or self.max_policy_lag < 0:
            raise ConfigError(f"max_policy_lag must be an integer >= 0, got {self.max_policy_lag!r}")
        positive_int("max_updates", self.max_updates, optional=True)
        validate_guard(self)
        return self
