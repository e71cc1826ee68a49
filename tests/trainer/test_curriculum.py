"""Curriculum: pools by difficulty, sampling with review, promotion by success rate."""

from __future__ import annotations

import pytest

from spanrl.trainer.curriculum import Curriculum, CurriculumConfig
from spanrl.errors import ConfigError

TASKS = [{"id": f"{d}-{i}", "difficulty": d} for d in (1, 2, 3) for i in range(5)]


def test_samples_only_the_easiest_level_at_first():
    cur = Curriculum(TASKS, config=CurriculumConfig(review_fraction=0.25))
    batch = cur.sample(12)
    assert cur.level == 1 and {t["difficulty"] for t in batch} == {1}
    assert len({t["id"] for t in batch[:5]}) == 5  # without replacement until the pool runs out


def test_promotes_when_success_rate_reaches_threshold():
    cur = Curriculum(TASKS, config=CurriculumConfig(promote_at=0.75, window=4, min_results=4))
    task = cur.pool()[0]
    results = [cur.record(task, r) for r in (1.0, 0.0, 1.0, 1.0)]
    assert results == [False, False, False, True]
    assert cur.level == 2 and cur.success_rate() is None
    assert cur.promotions == [{"from": 1, "to": 2, "success_rate": 0.75, "after_results": 4}]


def test_does_not_promote_below_threshold_or_before_min_results():
    cur = Curriculum(TASKS, config=CurriculumConfig(promote_at=0.8, window=5, min_results=3))
    task = cur.pool()[0]
    assert not cur.record(task, 1.0) and not cur.record(task, 1.0)  # only 2 results
    assert not cur.record(task, 0.0)  # 2/3 < 0.8
    assert cur.level == 1 and cur.success_rate() == pytest.approx(2 / 3)


def test_review_tasks_do_not_count_and_are_mixed_in_after_promotion():
    cur = Curriculum(TASKS, config=CurriculumConfig(promote_at=0.5, window=2, min_results=2, review_fraction=0.25))
    for _ in range(2):
        cur.record({"difficulty": 1}, 1.0)
    assert cur.level == 2
    assert not cur.record({"difficulty": 1}, 1.0) and cur.success_rate() is None
    batch = cur.sample(8)
    assert [t["difficulty"] for t in batch].count(1) == 2 and [t["difficulty"] for t in batch].count(2) == 6


def test_review_draws_only_from_the_levels_passed():
    cur = Curriculum(TASKS, config=CurriculumConfig(promote_at=0.5, window=2, min_results=2))
    assert cur.review(4) == []
    for _ in range(2):
        cur.record({"difficulty": 1}, 1.0)
    assert [t["difficulty"] for t in cur.review(5)] == [1] * 5


def test_stays_on_the_last_level():
    cur = Curriculum({"easy": [{"q": 1}], "hard": [{"q": 2}]}, config=CurriculumConfig(window=1, min_results=1))
    assert cur.levels == ["easy", "hard"]
    assert cur.record({"q": 1}, 1.0) and cur.finished
    assert not cur.record({"q": 2}, 1.0) and cur.level == "hard"
    assert cur.state()["promotions"][0]["to"] == "hard"


def test_same_seed_gives_same_batches():
    a, b = Curriculum(TASKS), Curriculum(TASKS)
    assert a.sample(7) == b.sample(7)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"promote_at": 0.0}, "promote_at must be in"),
        ({"window": 0}, "window must be >= 1"),
        ({"window": 4, "min_results": 5}, r"min_results must be in \[1, window=4\], got 5"),
        ({"review_fraction": 1.0}, "review_fraction must be in"),
    ],
)
def test_bad_config_fails_with_its_message(kwargs, message):
    CurriculumConfig().validate()
    with pytest.raises(ConfigError, match=message):
        CurriculumConfig(**kwargs).validate()


def test_tasks_without_difficulty_are_named():
    with pytest.raises(ConfigError, match=r"tasks\[1\] has no 'difficulty' field"):
        Curriculum([{"difficulty": 1}, {"id": "x"}])
    with pytest.raises(ConfigError, match="at least one task"):
        Curriculum([])


def test_train_with_curriculum_promotes_from_the_rounds_rollouts(tmp_path):
    """Two rounds of real training (tiny model, quick-start arithmetic env): the first round's rollouts,
    read back from the span store, promote the curriculum; the second round resumes on the next level."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.quickstart.arith import VOCAB, ArithEnv, ArithReward, make_tasks
    from spanrl.algorithms import GRPO
    from spanrl.trainer import Trainer, TrainerConfig
    from spanrl.trainer.curriculum import train_with_curriculum
    from spanrl.quickstart import env_agent
    from spanrl.demo.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", words=VOCAB, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    tasks = [dict(t, difficulty=1 if t["question"].startswith("add") else 2) for t in make_tasks(40)]
    # success_threshold 0: every finished rollout is a success, so round 1 must promote.
    cur = Curriculum(tasks, config=CurriculumConfig(window=4, min_results=4, success_threshold=0.0))
    seen_levels = []

    def make_trainer(pool, max_steps, resume):
        seen_levels.append({t["difficulty"] for t in pool})
        return Trainer(model=model, agent=env_agent(ArithEnv, ArithReward), tasks=pool,
                       algorithm=GRPO(learning_rate=1e-3),
                       config=TrainerConfig(output_dir=str(tmp_path / "run"), n_rollouts=2, tasks_per_step=2,
                                            max_steps=max_steps, resume=resume, max_tokens=2, progress=False,
                                            torch_threads=1))

    rounds = train_with_curriculum(cur, make_trainer, steps_per_round=1, max_steps=2)
    assert [r["step"] for r in rounds] == [1, 2]
    assert rounds[0]["level"] == 1 and rounds[0]["promoted"] and rounds[0]["rollouts"] == 4
    assert rounds[0]["round_success_rate"] == 1.0
    assert rounds[1]["level"] == 2 and seen_levels == [{1}, {2}]
    assert cur.promotions[0]["from"] == 1 and cur.promotions[0]["to"] == 2
