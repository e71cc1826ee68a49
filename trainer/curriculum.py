"""Curriculum: task pools by difficulty, promoted to the next pool when the recent success rate on the
current one is high enough.

    cur = Curriculum(tasks, config=CurriculumConfig(promote_at=0.8, window=32))   # tasks carry "difficulty"
    batch = cur.sample(16)                     # mostly the current level, some review of easier ones
    easier = cur.review(4)                     # tasks of the levels passed (none at the first)
    for task, reward in results:
        cur.record(task, reward)               # may promote
    cur.level, cur.success_rate(), cur.state()

Only results on tasks of the current level count toward promotion (review tasks do not), and the
window restarts after each promotion, so a level is judged on its own tasks only.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spanrl.errors import ConfigError

__all__ = ["Curriculum", "CurriculumConfig", "default_curriculum_config", "train_with_curriculum"]


@dataclass
class CurriculumConfig:
    """When to promote, and how to mix levels when sampling."""

    promote_at: float = 0.8
    """Success rate over the window that moves the curriculum to the next level."""
    window: int = 32
    """How many recent results on the current level the success rate is computed over."""
    min_results: int = 16
    """Results on the current level needed before a promotion can happen."""
    success_threshold: float = 1.0
    """A result counts as a success when its reward is >= this."""
    review_fraction: float = 0.2
    """Share of each sampled batch drawn from easier levels already passed (0: none)."""
    seed: int = 0
    """Seed of the sampler (same seed, same calls: same batches)."""

    def validate(self) -> CurriculumConfig:
        if not 0.0 < self.promote_at <= 1.0:
            raise ConfigError(f"promote_at must be in (0, 1], got {self.promote_at!r}")
        if self.window < 1:
            raise ConfigError(f"window must be >= 1, got {self.window!r}")
        if not 1 <= self.min_results <= self.window:
            raise ConfigError(f"min_results must be in [1, window={self.window}], got {self.min_results!r}")
        if not 0.0 <= self.review_fraction < 1.0:
            raise ConfigError(f"review_fraction must be in [0, 1), got {self.review_fraction!r}")
        return self


def default_curriculum_config() -> CurriculumConfig:
    """A new default config."""
    return CurriculumConfig()


class Curriculum:
    """Task pools ordered by difficulty, with promotion by success rate."""

    def __init__(self, tasks: Sequence[Mapping[str, Any]] | Mapping[Hashable, Sequence[Mapping[str, Any]]], *,
                 difficulty_key: str = "difficulty", config: CurriculumConfig | None = None) -> None:
        self.config = (config or default_curriculum_config()).validate()
        if isinstance(tasks, Mapping):
            pools = {level: list(pool) for level, pool in tasks.items()}
        else:
            pools = {}
            for i, task in enumerate(tasks):
                if difficulty_key not in task:
                    raise ConfigError(f"tasks[{i}] has no {difficulty_key!r} field: {dict(task)!r}")
                pools.setdefault(task[difficulty_key], []).append(task)
        if not pools:
            raise ConfigError("tasks must hold at least one task")
        empty = [level for level, pool in pools.items() if not pool]
        if empty:
            raise ConfigError(f"difficulty levels {empty} have no tasks")
        try:
            self.levels: list[Hashable] = sorted(pools)
        except TypeError as exc:
            raise ConfigError(f"difficulty values must be comparable, got {list(pools)!r}") from exc
        self._pools = pools
        self._index = 0
        self._results: deque[bool] = deque(maxlen=self.config.window)
        self._rng = random.Random(self.config.seed)
        self.promotions: list[dict[str, Any]] = []  # {"from", "to", "success_rate", "after_results"}
        self._n_recorded = 0

    @property
    def level(self) -> Hashable:
        """The current difficulty level."""
        return self.levels[self._index]

    @property
    def finished(self) -> bool:
        """True once the last level is reached (it is never left)."""
        return self._index == len(self.levels) - 1

    def pool(self, level: Hashable | None = None) -> list[Mapping[str, Any]]:
        """The tasks of ``level`` (default: the current one)."""
        return list(self._pools[self.level if level is None else level])

    def sample(self, n: int) -> list[Mapping[str, Any]]:
        """``n`` tasks: ``review_fraction`` of them (rounded down) from passed levels, the rest from the
        current level. Each pool is drawn without replacement until it runs out, then reshuffled."""
        if n < 1:
            raise ConfigError(f"n must be >= 1, got {n!r}")
        n_review = int(n * self.config.review_fraction) if self._index > 0 else 0
        return self._draw(self._pools[self.level], n - n_review) + self.review(n_review)

    def review(self, n: int) -> list[Mapping[str, Any]]:
        """``n`` tasks of the levels already passed, drawn as ``sample`` draws them (none at the first level)."""
        if n < 1 or self._index == 0:
            return []
        return self._draw([t for level in self.levels[: self._index] for t in self._pools[level]], n)

    def _draw(self, pool: list[Mapping[str, Any]], n: int) -> list[Mapping[str, Any]]:
        out: list[Mapping[str, Any]] = []
        while len(out) < n:
            order = list(pool)
            self._rng.shuffle(order)
            out += order[: n - len(out)]
        return out

    def success_rate(self) -> float | None:
        """Success rate over the window of the current level; None before any result."""
        return sum(self._results) / len(self._results) if self._results else None

    def record(self, task: Mapping[str, Any], reward: float, *, difficulty_key: str = "difficulty") -> bool:
        """Record one finished rollout. Returns True when this result promoted the curriculum.

        A task whose difficulty is not the current level (a review task) is ignored for promotion.
        """
        level = task.get(difficulty_key, self.level) if isinstance(task, Mapping) else self.level
        if level != self.level:
            return False
        self._n_recorded += 1
        self._results.append(float(reward) >= self.config.success_threshold)
        rate = self.success_rate()
        if self.finished or len(self._results) < self.config.min_results or rate < self.config.promote_at:
            return False
        self.promotions.append({"from": self.level, "to": self.levels[self._index + 1], "success_rate": rate,
                                "after_results": self._n_recorded})
        self._index += 1
        self._results.clear()
        return True

    def state(self) -> dict[str, Any]:
        """Everything needed to report (or save beside a checkpoint) where the curriculum stands."""
        return {"level": self.level, "levels": list(self.levels), "success_rate": self.success_rate(),
                "results_in_window": len(self._results), "promotions": list(self.promotions),
                "config": asdict(self.config)}


def train_with_curriculum(curriculum: Curriculum, make_trainer: Callable[[list[Mapping[str, Any]], int, bool], Any], *,
                          steps_per_round: int, max_steps: int, review_tasks: int = 0) -> list[dict[str, Any]]:
    """Train in rounds on the curriculum's current level, promoting by the success rate of the rounds'
    own training rollouts (read back from the span store).

    ``make_trainer(tasks, max_steps, resume)`` returns a ``spanrl.Trainer`` writing to the same
    ``output_dir`` every time; each round trains up to ``max_steps`` (resuming from the previous round's
    checkpoint), then every train rollout the round ran is recorded: ``curriculum.record(task, reward)``.
    Tasks need an ``id`` field (how rollouts are matched back to tasks). ``review_tasks`` easier tasks
    (sampled by the curriculum) join each round's pool. Returns one row per round.
    """
    from spanrl.store import SpanStore
    from spanrl.store.rollouts import finished_rewards

    if steps_per_round < 1 or max_steps < 1:
        raise ConfigError(f"steps_per_round and max_steps must be >= 1, got {steps_per_round!r} and {max_steps!r}")
    rounds: list[dict[str, Any]] = []
    step = 0
    while step < max_steps:
        level = curriculum.level
        tasks = list(curriculum.pool())
        tasks += curriculum.review(review_tasks)
        by_id: dict[str, Mapping[str, Any]] = {}
        for i, task in enumerate(tasks):
            if "id" not in task:
                raise ConfigError(
                    f"train_with_curriculum needs an 'id' in every task; task {i} has none: {dict(task)!r}"
                )

            by_id.setdefault(str(task["id"]), task)
        started_ns = time.time_ns()
        trainer = make_trainer(list(by_id.values()), min(max_steps, step + steps_per_round), step > 0)
        trainer.train()
        if trainer.step <= step:
            raise ConfigError(f"make_trainer's Trainer did not advance past step {step}: give it max_steps and resume")
        step = trainer.step
        with SpanStore.open(trainer.db_path, read_only=True) as store:
            rows = finished_rewards(store, mode="train", since_ns=started_ns)
        promoted, successes, counted = False, 0, 0
        for row in rows:
            task = by_id.get(str(row["task_id"]))
            if task is not None and task.get("difficulty", level) == level:
                counted += 1
                successes += row["final_reward"] >= curriculum.config.success_threshold
            if task is not None:
                promoted = curriculum.record(task, row["final_reward"]) or promoted
        rounds.append({"step": step, "level": level, "rollouts": len(rows), "promoted": promoted,
                       "round_success_rate": successes / counted if counted else None, "next_level": curriculum.level})
    return rounds
