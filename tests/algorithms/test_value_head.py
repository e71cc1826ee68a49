"""The learned critic on the tiny model (``algorithms/value_head.py``): span trees through the real collector,
``load_training_batch`` with ``CreditConfig.critic``, real GRPO updates, a checkpoint round trip.

The planted task: call 0 answers ``yes`` (good) or ``no`` (bad) to ``wN``; call 1 (after a fixed user turn,
its prompt extends call 0's conversation) does not matter; the reward after call 1 is 1 when call 0 said yes.
Copying the reward to every call (``identical``) ties each bad call with the harmless call 1 of a failed
episode; the head learns that the state after ``no`` is worth 0, so the GAE term puts the blame on call 0."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from test_transitions import Recorder, Rollout, deliver
from toy_task import build_model, prompt_ids

from spanrl.algorithms.checkpoints import VALUE_HEAD_FILE
from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.credit_audit import auc
from spanrl.algorithms.grpo import GRPO
from spanrl.algorithms.learned_credit import CriticConfig
from spanrl.algorithms.ppo import PPO
from spanrl.algorithms.transitions import load_training_batch
from spanrl.algorithms.value_head import prompt_hidden
from spanrl.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

STEPS = 6
GROUP = 8  # rollouts per task, half of them good


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _grpo(model_path: Path, out: Path) -> GRPO:
    algo = GRPO(learning_rate=1e-4, bf16=False)
    algo.setup(model_path=model_path, output_dir=out, seed=0)
    return algo


def _step_rollouts(collector: Any, tok: Any, step: int, rng: random.Random) -> dict[str, bool]:
    """Two tasks x GROUP rollouts of the planted task; returns each rollout's call-0 decision (True: good)."""
    yes, no, word = (tok.convert_tokens_to_ids(w) for w in ("yes", "no", "w3"))
    turn = prompt_ids(tok, 20)[1:]  # a fixed user turn after the first answer (its bos dropped)
    rec, good = Recorder(), {}
    for task in (1, 2):
        choices = [True] * (GROUP // 2) + [False] * (GROUP // 2)
        rng.shuffle(choices)
        for i, ok in enumerate(choices):
            rid = f"s{step}-t{task}-{i}"
            r = Rollout(rec, rid, task_id=f"s{step}-t{task}")
            root = r.root(0, 200)
            first = prompt_ids(tok, task)
            answer = yes if ok else no
            r.call(root, 10, first, [answer])
            r.call(root, 40, first + [answer] + turn, [word])
            r.reward(root, 90, 1.0 if ok else 0.0)
            good[rid] = ok
    deliver(collector, rec.spans())
    return good


def _auc(batch: Any, good: dict[str, bool]) -> float | None:
    """AUC of the advantages: call 0 labelled by its decision, call 1 always good (it decides nothing)."""
    table = batch.to_arrow()
    rows = zip(table.column("rollout_id").to_pylist(), table.column("step").to_pylist(),
               table.column("advantage").to_pylist())
    labelled = [(good[r] if s == 0 else True, a) for r, s, a in rows]
    return auc([a for lab, a in labelled if lab], [a for lab, a in labelled if not lab])


def test_head_loss_falls_and_its_advantages_separate_the_planted_bad_call(collector: Any, model_path: Path,
                                                                         tmp_path: Path) -> None:
    grpo = _grpo(model_path, tmp_path / "run")
    credit = CreditConfig(critic=CriticConfig(weight=1.0))
    rng, losses = random.Random(0), []
    for step in range(1, STEPS + 1):
        good = _step_rollouts(collector, grpo.tokenizer, step, rng)
        ids = sorted(good)
        plain = load_training_batch(collector.store, grpo, credit=CreditConfig(), rollout_ids=ids)
        batch = load_training_batch(collector.store, grpo, credit=credit, rollout_ids=ids)
        losses.append(batch.metrics["losses/value_head_loss"])
        if step == 1:  # the head has not trained yet (warmup_steps 1): identical's advantages, V = 0
            assert batch.to_arrow().column("advantage").to_pylist() == plain.to_arrow().column("advantage").to_pylist()
            assert losses[0] == pytest.approx(0.5)  # mean of G^2: half the calls return 1
            assert _auc(batch, good) == pytest.approx(40 / 48)  # bad calls tie with failed episodes' call 1
        grpo.update(batch)
    assert batch.metrics["time/value_head_s"] > 0
    # call 0's state is one per task, so its best value (0.5) leaves 0.25 on half the calls: the floor is 0.125;
    # the best constant V scores 0.25, which every step after the first beats, on calls it has not seen
    assert max(losses[1:]) < 0.25 < losses[0], losses
    assert batch.metrics["charts/value_head_explained_variance"] > 0.2  # at most 0.5 (call 0 is noise)
    assert _auc(plain, good) == pytest.approx(40 / 48) and _auc(batch, good) == 1.0

    # the head is saved with the checkpoint and restored on resume, so the next step's values are the same
    grpo.save(tmp_path / "checkpoint-6")
    assert (tmp_path / "checkpoint-6" / VALUE_HEAD_FILE).is_file()
    resumed = _grpo(model_path, tmp_path / "resumed")
    resumed.load_state(tmp_path / "checkpoint-6")
    assert resumed.value_head.steps == grpo.value_head.steps == STEPS
    hidden = torch.randn(3, grpo.model.config.hidden_size)
    assert torch.equal(resumed.value_head(hidden), grpo.value_head(hidden))


def test_prompt_hidden_equals_each_prompt_run_alone(model_path: Path, tmp_path: Path) -> None:
    grpo = _grpo(model_path, tmp_path / "run")
    tok = grpo.tokenizer
    first = prompt_ids(tok, 1) + [7 + i % 20 for i in range(40)]  # long enough for a micro-batch to share it
    later = [first + [5, 6, 7], first + [5, 6], first + [9] * 30, first + [5, 6, 7, 8]]  # a conversation's calls
    prompts = [first, *later, first]  # a group's repeated first prompt
    hidden = prompt_hidden(grpo.model, prompts, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        alone = [grpo.model(input_ids=torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0, -1]
                 for p in prompts]
    assert torch.allclose(hidden, torch.stack(alone), atol=1e-5)
    # depth 0.5 of 4 layers: the second layer's output, through the final norm
    half = prompt_hidden(grpo.model, prompts, pad_token_id=tok.pad_token_id, depth=0.5)
    with torch.no_grad():
        second = [grpo.model.base_model.norm(grpo.model(input_ids=torch.tensor([p]),
                                                        output_hidden_states=True).hidden_states[2][0, -1])
                  for p in prompts]
    assert torch.allclose(half, torch.stack(second), atol=1e-5) and not torch.allclose(half, hidden, atol=1e-2)
    assert len(grpo.model.base_model.layers) == 4  # the layers are all back


def test_ppo_refuses_the_learned_critic(collector: Any, model_path: Path, tmp_path: Path) -> None:
    ppo = PPO()
    ppo.setup(model_path=model_path, output_dir=tmp_path / "ppo", seed=0)
    with pytest.raises(ConfigError, match=r"credit.critic must be None with PPO: its own critic gives the advantages"):
        load_training_batch(collector.store, ppo, credit=CreditConfig(critic={}))
