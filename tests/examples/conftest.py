"""Shared helpers of the example tests: the repository root on sys.path (so tests can
`import examples.<name>.agent`) and a one-step run of an agent through the real pipeline."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
for _path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


@dataclass
class PipelineRun:
    """What one short Trainer run left: its history and the span store's rows."""

    history: list[dict[str, Any]]
    db_path: Path
    model: Path
    """The model the run started from (primed, when ``prime`` was given)."""
    checkpoint: Path
    """The last step's checkpoint."""

    def sql(self, query: str) -> list[dict[str, Any]]:
        from spanrl.store import SpanStore

        with SpanStore.open(self.db_path, read_only=True) as store:
            return store.sql(query).to_pylist()


def run_pipeline(tmp_path: Path, *, agent_file: Path, words: Sequence[str], tasks: list[dict[str, Any]],
                 steps: int = 1, tasks_per_step: int = 2, n_rollouts: int = 2, max_tokens: int = 8,
                 agent_name: str | None = None, workers: int = 2,
                 prime: Sequence[tuple[list[dict[str, Any]], str, str]] | None = None,
                 served_probe: list[dict[str, Any]] | None = None) -> PipelineRun:
    """Build a tiny model over ``words`` and run ``steps`` GRPO steps of the command-line agent
    ``agent_file`` (as jsonl workers under opentelemetry-instrument) through collector, store,
    decomposer, credit assignment, update and reload.

    ``prime``: ``(messages, right, wrong)`` examples for ``training_checks.prime_half_right`` (so rewards
    vary within a group). ``served_probe``: messages for ``assert_served_policy_changed``, asked of the
    Trainer's own server after its reload, before it stops."""
    from spanrl.algorithms import GRPO
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig
    from spanrl.demo.tiny import build_tiny_model
    from training_checks import assert_served_policy_changed, prime_half_right

    model = build_tiny_model(tmp_path / "model", words=sorted(set(words)), hidden_size=32, num_layers=1,
                             num_heads=2, intermediate_size=64)
    if prime:
        prime_half_right(model, prime)
    trainer = Trainer(
        model=model, agent=[sys.executable, str(agent_file)], tasks=tasks, algorithm=GRPO(learning_rate=1e-3),
        config=TrainerConfig(output_dir=str(tmp_path / "run"), n_rollouts=n_rollouts, tasks_per_step=tasks_per_step,
                             max_steps=steps, max_tokens=max_tokens, eval_at_start=False, progress=False,
                             agent_name=agent_name, torch_threads=1,
                             runner=RunnerConfig(workers=workers, max_concurrency=2 * workers, max_attempts=2)),
    )
    trainer.start()  # so train() leaves the server up: the probe asks the reloaded server itself
    try:
        history = trainer.train()
        checkpoint = tmp_path / "run" / f"checkpoint-{steps}"
        if served_probe is not None:
            assert_served_policy_changed(trainer.deploy(), served_probe, initial=model,
                                         checkpoint=checkpoint)
    finally:
        trainer.close()
    return PipelineRun(history, Path(trainer.db_path), model, checkpoint)


@pytest.fixture
def pipeline(tmp_path: Path) -> Any:
    """``pipeline(agent_file=..., words=..., tasks=...)`` -> PipelineRun (see run_pipeline)."""
    return lambda **kwargs: run_pipeline(tmp_path, **kwargs)
