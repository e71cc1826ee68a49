"""Async steps through the real Trainer path: tiny model, policy server, calculator agent as jsonl
workers, collector, DuckDB, GRPO. The next step's rollouts run while the current update computes; they
lag the policy they update by at most ``max_staleness``; resuming after a crash never retrains them."""

from __future__ import annotations

import json
import math
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from spanrl.algorithms import GRPO, LightningRL
from spanrl.errors import ConfigError
from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = REPO / "examples" / "calculator"
sys.path.insert(0, str(CALCULATOR))

import calculator  # noqa: E402

_WORKER = textwrap.dedent(
    f"""
    import json, sys
    sys.path.insert(0, {str(CALCULATOR)!r})
    import openai
    from spanrl.instrumentation import configure, rollout
    from agent import run_rollout
    provider = configure()
    for line in sys.stdin:
        job = json.loads(line)
        client = openai.OpenAI(base_url=job["base_url"], api_key=job["api_key"], max_retries=0)
        with rollout(job["rollout_id"], task_id=job["task_id"], attempt=job["attempt"], mode=job["mode"]):
            run_rollout(client, job["task"], model=job["model"], sampling=job["sampling"])
        provider.force_flush()
        print(json.dumps({{"spanrl_done": job["rollout_id"]}}), flush=True)
    """
)


def _trainer(model: Path, tmp_path: Path, out: Path, **fields: Any) -> Trainer:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    runner = RunnerConfig(workers=2, max_concurrency=4, instrument=False, rollout_timeout_s=30.0, span_timeout_s=10.0)
    config = TrainerConfig(
        output_dir=str(out), n_rollouts=4, tasks_per_step=2, temperature=1.0, max_tokens=8, eval_at_start=False,
        progress=False, torch_threads=1, runner=runner, async_steps=True, max_staleness=1, **fields,
    )
    return Trainer(model=model, agent=[sys.executable, str(script)], tasks=calculator.make_tasks(40, seed=3),
                   algorithm=GRPO(learning_rate=5e-4), credit=LightningRL(baseline="grpo"), config=config)


def _trained_ok(out: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r["mode"] == "train" and r["status"] == "ok"]


@pytest.mark.slow
def test_async_steps_overlap_bounded_staleness_and_exact_resume(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    history = _trainer(tiny_model, tmp_path, out, max_steps=3, save_every=2).train()
    assert [row["step"] for row in history] == [1, 2, 3]
    # step 1 had nothing ahead of it; steps 2 and 3 started during the previous update: one version behind
    assert history[0]["policy_lag"] == 0
    assert all(row["policy_lag"] <= 1 for row in history) and max(row["policy_lag"] for row in history[1:]) == 1
    for row in history[1:]:  # the overlap: the loop waited less than the rollouts took
        assert row["time/rollout_wait_s"] < row["time/rollouts_s"]
    for row in history:  # each stage's seconds, and the loop's own stages add up to no more than the step
        stages = [row[f"time/{k}_s"] for k in ("rollout_wait", "decompose", "update", "reload")]
        assert all(s >= 0 for s in stages) and row["time/update_s"] > 0 and sum(stages) <= row["time/step_s"]
    assert history[-1]["policy_version"] == 3  # every step updated and pushed its weights
    for row in history:  # learning still works on stale rollouts: rewards and a finite, bounded update
        assert row["rollouts_ok"] == 8 and row["transitions"] >= 8 and row["reward_mean"] is not None
        assert math.isfinite(row["losses/approx_kl"]) and row["losses/approx_kl"] < 1.0
    ok = _trained_ok(out)
    ids = [r["rollout_id"] for r in ok]
    assert len(ids) == len(set(ids)) == 3 * 8  # nothing ran past the last step, nothing twice
    assert {i.split("-")[1] for i in ids} == {"s1", "s2", "s3"}

    # a crash after checkpoint-2, while step 3's rollouts ran ahead: the resumed run reruns step 3 under
    # new ids (those run ahead were never trained by it) and counts steps from the checkpoint
    shutil.rmtree(out / "checkpoint-3")
    resumed = _trainer(tiny_model, tmp_path, out, max_steps=4, resume=True)
    history = resumed.train()
    assert resumed.step == 4 and [row["step"] for row in history] == [1, 2, 3, 4]
    assert history[:2] == json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["history"]
    assert history[2]["policy_lag"] == 0 and history[3]["policy_lag"] <= 1
    new = [r["rollout_id"] for r in _trained_ok(out) if r["rollout_id"] not in set(ids)]
    assert len(new) == len(set(new)) == 2 * 8 and {i.split("-")[1] for i in new} == {"s3", "s4"}


def test_async_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="max_staleness must be a positive integer, got 0"):
        TrainerConfig(async_steps=True, max_staleness=0).validate()
    with pytest.raises(ConfigError, match="async_steps must be true or false, got 'yes'"):
        TrainerConfig(async_steps="yes").validate()  # type: ignore[arg-type]
    assert TrainerConfig().async_steps is False  # the default loop is synchronous
