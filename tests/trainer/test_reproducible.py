"""One seed, one run (issue 55): the same seeded, deterministic config trained twice on the tiny model, once
beside two busy processes, gives the same per-step rewards in history.jsonl and bit-identical final weights;
another seed gives other weights. Real parts: collector, DuckDB, policy server (its rollouts' calls arrive
concurrently, in whatever order the load makes), a callable calculator agent, GRPO."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
import torch
from safetensors.torch import load_file

from spanrl.algorithms import GRPO, LightningRL
from spanrl.rollouts.rollouts import jobs_of
from spanrl.rollouts.runner import LLMEndpoint, RolloutRunner
from spanrl.seeding import derive_seed, step_jobs
from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402

_BURN = "while True: pass"


@pytest.fixture
def two_busy_processes() -> Iterator[None]:
    """Two processes burning a core each, stopped when the test ends (the machine under load)."""
    procs = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
    """A calculator question through the policy server at the run's temperature (no seed of its own); the
    reward, the answer's length, varies between samples of the untrained model: a gradient to follow."""
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}],
        max_tokens=llm.sampling["max_tokens"], temperature=llm.sampling["temperature"],
    )
    return len(reply.choices[0].message.content or "") / 10


def _train(model: Path, out: Path, seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A seeded, deterministic 2-step run; its per-step rewards (from history.jsonl) and final weights."""
    config = TrainerConfig(
        output_dir=str(out), seed=seed, deterministic=True, n_rollouts=4, tasks_per_step=2, max_steps=2,
        temperature=1.0, max_tokens=8, eval_at_start=False, progress=False, torch_threads=1,
        runner=RunnerConfig(max_concurrency=8),  # every rollout at once: calls arrive in the load's order
    )
    Trainer(model=model, agent=_agent, tasks=calculator.make_tasks(20, seed=3), algorithm=GRPO(learning_rate=5e-3),
            credit=LightningRL(baseline="grpo"), config=config).train()
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines() if line.strip()]
    assert [row["step"] for row in rows] == [1, 2] and all(row["rollouts_ok"] == 8 for row in rows)
    return [row["reward_mean"] for row in rows], load_file(out / "checkpoint-2" / "model.safetensors")


def _batch_sizes(out: Path) -> set[int]:
    """The batch sizes the policy server generated the run's calls in (its chat spans in the store)."""
    with duckdb.connect(str(out / "spans.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT DISTINCT CAST(attributes->>'$.\"spanrl.llm.batch_size\"' AS INTEGER) FROM spans "
                           "WHERE kind = 'SERVER' AND operation_name = 'chat'").fetchall()
    return {size for (size,) in rows}


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.slow
def test_a_seed_pins_the_run_whatever_the_load(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    with caplog.at_level(logging.INFO, logger="spanrl.seeding"):
        rewards, weights = _train(tiny_model, tmp_path / "quiet", seed=7)
    assert "spanrl: seed 7 (deterministic)" in caplog.text
    assert not _same_weights(weights, load_file(tiny_model / "model.safetensors"))  # the run learned something
    saved = json.loads((tmp_path / "quiet" / "config.json").read_text())["trainer"]
    assert saved["seed"] == 7 and saved["deterministic"] is True
    assert _batch_sizes(tmp_path / "quiet") == {1}  # deterministic: the server generated one call at a time
    request.getfixturevalue("two_busy_processes")
    busy_rewards, busy_weights = _train(tiny_model, tmp_path / "busy", seed=7)
    from training_checks import report_figures, weights_digest

    report_figures("reproducible", rewards=rewards, busy_rewards=busy_rewards,
                   weights=weights_digest(tmp_path / "quiet" / "checkpoint-2"),
                   busy_weights=weights_digest(tmp_path / "busy" / "checkpoint-2"))
    assert busy_rewards == rewards
    assert _same_weights(busy_weights, weights)
    # the seed is what pins it: another one samples other completions and learns other weights
    _, other_weights = _train(tiny_model, tmp_path / "other", seed=8)
    assert not _same_weights(other_weights, weights)


def test_derived_seeds_are_stable_and_reach_each_attempt_through_its_url() -> None:
    # BLAKE2b of the parts: the same in every process and Python version (Python's hash() is salted)
    assert derive_seed("rollout", 7, 1, "add-1-2", 0) == 5196576495274273037
    tasks = jobs_of([{"id": "ok"}, {"id": "flaky"}, {"id": "other"}])
    config = TrainerConfig(seed=7, n_rollouts=2, tasks_per_step=3)
    _, jobs = step_jobs(tasks, config, 1)
    assert jobs == step_jobs(tasks, config, 1)[1] and jobs != step_jobs(tasks, config, 2)[1]  # seeds, order
    assert [j.seed for j in jobs] == [derive_seed("rollout", 7, 1, j.task_id, g % 2) for g, j in enumerate(jobs)]
    assert len({job.seed for job in jobs}) == 6
    seen: dict[str, list[tuple[str, int | None]]] = {}

    def agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
        seen.setdefault(task["id"], []).append((llm.base_url, llm.seed))
        if task["id"] == "flaky" and len(seen["flaky"]) == 1:
            raise RuntimeError("the first attempt fails")
        return 1.0

    runner = RolloutRunner(agent, config=RunnerConfig(max_concurrency=4, max_attempts=2, span_timeout_s=30.0),
                           ready=lambda ids, since_ns: set(ids))  # every finished rollout's spans are there
    try:
        results = runner.run([job for job in jobs if job.task_id == "flaky"][:1], id_prefix="seeded-",
                             llm_url="http://x", model="m", sampling={})
    finally:
        runner.close()
    job = next(job for job in jobs if job.task_id == "flaky")
    assert [(r.attempt, r.status) for r in results] == [(1, "crashed"), (2, "ok")]
    assert seen["flaky"] == [(f"http://x/rollouts/seeded-0-a{a}/seeds/{derive_seed(job.seed, a)}/v1",
                              derive_seed(job.seed, a)) for a in (1, 2)]  # a retry samples anew, seeded too
