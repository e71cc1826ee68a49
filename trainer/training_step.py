"""One training step: the step's rollout ids in, its history row out.

Two sources feed it. The Trainer's (``RolloutRunner``, through the prefetch: run now, or ahead while the last
update computed) calls ``run``. The online trainer's (``trainer/online.py``: the store's ready window, its
watermark and ledger the exactly-once commit point) calls ``load`` with its ready order and the running
baseline's state, then ``update`` with its one-off learning rate, and pushes the checkpoint it committed through
its server's reload route. The step loads their transitions once with the credit config
(``load_training_batch``; per-agent policies each with their own credit), runs the algorithm's update(s)
(``updates_per_step``, each on a seeded minibatch or on every row; under many processes rank 0 broadcasts the
rows and every rank updates on its shard), pushes the weights through the policy pool, and returns the row the
Trainer records (its reporting callbacks; ``NonFiniteGuard``, the one non-finite policy, is the last of them).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from spanrl.algorithms import distributed as _distributed
from spanrl.algorithms.baseline import RunningBaseline
from spanrl.algorithms.hf_trainer import one_off_learning_rate
from spanrl.algorithms.transitions import load_training_batch
from spanrl.rollouts.prefetch import StepRollouts, policy_lag
from spanrl.trainer.config import TrainerConfig
from spanrl.trainer.preflight import no_rollout_succeeded
from spanrl.trainer.reporting import StageClock

__all__ = ["TrainingStep"]

_logger = logging.getLogger("spanrl.trainer.trainer")


class TrainingStep:
    """Transitions, update(s) and weight push for one step (see the module docstring)."""

    def __init__(self, *, algorithm: Any, credit: Any, config: TrainerConfig | None, store: Any, server: Any,
                 world: int = 1) -> None:
        """``config``: the Trainer's (None for the online trainer: every agent, one update per step)."""
        self.algorithm, self.credit, self.config = algorithm, credit, config
        self.store, self.server, self.world = store, server, world

    def run(self, step: int, got: StepRollouts, *, sampler: random.Random, waited: float,
            clock: StageClock) -> dict[str, Any]:
        """Step ``step`` on the rollouts ``got`` (``waited``: seconds the loop waited for them; ``clock``: the
        step's, started before that wait); ``sampler`` picks the minibatches. Returns the step's history row
        (not recorded)."""
        cfg = self.config
        results = got.results
        ok_ids = [r.rollout_id for r in results if r.ok]
        row: dict[str, Any] = {"step": step, "rollouts_ok": len(ok_ids), "rollouts_failed": len(results) - len(ok_ids),
                               "policy_version": got.policy_version}
        metrics: dict[str, float] = {}
        with clock("decompose"):
            batch = self.load(ok_ids) if ok_ids else None
        n_transitions = len(batch) if batch is not None else 0
        if batch is not None:
            rewards = [float(v) for v in batch.rewards_by_rollout.values() if v is not None]
            row["reward_mean"] = sum(rewards) / len(rewards) if rewards else None
            row["transitions"] = n_transitions
            row["transitions_report"] = dict(batch.report)
            row.update(getattr(batch, "metrics", {}))  # the learned critic's figures (algorithms/value_head.py)
        if n_transitions:  # columnar all the way: no dataclass per row on the training path
            row["advantage_mean"] = float(np.mean(batch.to_arrow().column("advantage").to_numpy()))
            row.update(policy_lag(batch, self.policy_version()))
            with clock("update"):
                for _ in range(cfg.updates_per_step):
                    use_minibatch = cfg.minibatch_size and cfg.minibatch_size < n_transitions
                    # the same rows from the same RNG as sampling the list of transitions would pick
                    metrics = self.update(batch.take(sampler.sample(range(n_transitions), cfg.minibatch_size))
                                          if use_minibatch else batch)
            with clock("reload"):
                row.update(self.push_weights())
        elif ok_ids:
            _logger.warning("step %d: %d rollouts gave no transitions; no update", step, len(ok_ids))
        else:
            raise no_rollout_succeeded(f"step {step}", results)
        row.update({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        row.update({"time/rollouts_s": got.seconds, "time/rollout_wait_s": waited, **clock.row()})
        return row

    def load(self, rollout_ids: Sequence[str], *, running: RunningBaseline | None = None) -> Any:
        """The rollouts' transitions, credit assigned once (``load_training_batch``); with ``running`` (baseline
        ``running``'s state, updated) credit sees the rollouts in the order of ``rollout_ids``."""
        load = getattr(self.algorithm, "load_batch", None)  # per-agent policies: each agent's own credit
        if load is not None:
            return load(self.store, self.credit, list(rollout_ids))
        agent = getattr(self.config, "agent_name", None)
        online = {} if running is None else {"running": running, "order": list(rollout_ids)}
        return load_training_batch(self.store, self.algorithm, credit=self.credit, rollout_ids=list(rollout_ids),
                                   agents=[agent] if agent else None, **online)

    def update(self, transitions: Any, *, learning_rate: float | None = None) -> dict[str, float]:
        """One algorithm update (at ``learning_rate`` for this one, when given); under many processes rank 0
        broadcasts the transitions and every rank updates on its shard (the metrics are rank 0's shard's)."""
        sleep = getattr(self.server, "sleep", None)  # serving.enable_sleep_mode: vLLM frees the GPU; reload wakes it
        if sleep is not None:
            sleep()
        if self.world == 1:
            with one_off_learning_rate(self.algorithm, learning_rate):
                return self.algorithm.update(transitions)
        from spanrl.algorithms.tables import transitions_of

        items = _distributed.broadcast(transitions_of(transitions))
        return self.algorithm.update(_distributed.shard_transitions(items))

    def push_weights(self) -> dict[str, Any]:
        """Reload the servers of the pool: plain-keyed weights (a LoRA adapter merged), else the model itself;
        per-agent adapters each on their own. Returns the history row's policy version(s)."""
        push = getattr(self.algorithm, "push_weights", None)
        if push is not None:
            return push(self.server)
        weights = getattr(self.algorithm, "policy_weights", None)
        lora = getattr(self.server, "reload_lora", None)  # algorithm.lora: servers in serving.urls get the adapter
        if lora is not None and self.world == 1 and callable(weights) and hasattr(self.algorithm.model, "peft_config"):
            return {"policy_version": lora(self.algorithm.model, weights)}
        return {"policy_version": self.server.reload(weights() if callable(weights) else self.algorithm.model)}

    def policy_version(self) -> int | None:
        return getattr(self.server, "version", None)
