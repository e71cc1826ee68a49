"""What the Trainer hands an algorithm each step (`load_training_batch`), end to end: span trees written
with the OTel SDK, ingested by the real collector into DuckDB, decomposed, credited, then a real update
of the tiny model (PPO with its critic, GRPO)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from test_transitions import Recorder, Rollout, by_rollout, deliver
from toy_task import build_model, prompt_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.tables import fill_missing_logprobs, pad_transitions
from spanrl.algorithms.credit import CreditConfig, LightningRL
from spanrl.algorithms.grpo import GRPO
from spanrl.algorithms.batching import padded_logprobs
from spanrl.algorithms.ppo import PPO
from spanrl.algorithms.transitions import load_training_batch, load_transitions
from spanrl.errors import ConfigError


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _ppo(model_path: Path, tmp_path: Path, **fields: Any) -> PPO:
    algo = PPO(gamma=1.0, lam=0.95, **fields)
    algo.setup(model_path=model_path, output_dir=tmp_path / "run", seed=0)
    return algo


def _two_calls(rec: Recorder, tok: Any, rid: str, rewards: list[tuple[float, str]], **call: Any) -> None:
    """A rollout of two policy calls (exact ids and log-probs), then its rewards (value, name) in order."""
    r = Rollout(rec, rid, task_id="t1")
    root = r.root(0, 200)
    yes = tok.convert_tokens_to_ids("yes")
    r.call(root, 10, prompt_ids(tok, 1), [yes], [-0.3], **call)
    r.call(root, 40, prompt_ids(tok, 2), [yes], [-0.4], **call)
    for i, (value, name) in enumerate(rewards):
        r.reward(root, 90 + 10 * i, value, name=name)


def test_ppo_trains_on_the_rest_when_credit_skips_rollouts(collector: Any, model_path: Path, tmp_path: Path) -> None:
    ppo = _ppo(model_path, tmp_path)
    tok = ppo.tokenizer
    rec = Recorder()
    _two_calls(rec, tok, "good", [(1.0, "score")])
    _two_calls(rec, tok, "bad", [(0.0, "score")])
    _two_calls(rec, tok, "renamed", [(1.0, "style")])  # no reward of the credit's name: skipped
    _two_calls(rec, tok, "nan", [(1.0, "score"), (math.nan, "score")])  # a NaN after a valid one: skipped
    # appended straight into the store: the collector refuses a NaN reward at ingest, a store written before
    # it did holds one (tests/collector/test_reward_check.py)
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from spanrl.collector.encoding import encode_request

    collector.store.append(encode_request(encode_spans(rec.spans())).table)
    credit = LightningRL(reward_name="score")

    batch = load_training_batch(collector.store, ppo, credit=credit)

    # the critic starts at V = 0: GAE gives A_1 = r, A_0 = 0 + gamma * V_1 - V_0 + gamma * lam * A_1
    assert by_rollout(batch, "step", "advantage") == {
        "bad": [(0, 0.0), (1, 0.0)], "good": [(0, pytest.approx(0.95)), (1, 1.0)]}
    report = batch.report
    assert (report["skipped_no_reward"], report["skipped_nan_reward"], report["skipped_rollout_calls"]) == (1, 1, 4)
    metrics = ppo.update(batch)
    assert metrics["charts/transitions"] == 4 and math.isfinite(metrics["losses/value_loss"])
    # the same two passes by hand: values only for the kept rollouts' calls are enough
    states = load_transitions(collector.store, credit=CreditConfig(reward_name="score", baseline="none"))
    gae = load_transitions(collector.store, credit=CreditConfig(reward_name="score", mode="gae", baseline="none"),
                           values=ppo.value_map(states))
    assert sorted(batch.rewards_by_rollout) == sorted(gae.rewards_by_rollout) == ["bad", "good"]


def test_one_retokenized_call_keeps_the_servers_logprobs_of_the_others(collector: Any, model_path: Path,
                                                                       tmp_path: Path) -> None:
    ppo = _ppo(model_path, tmp_path)
    tok = ppo.tokenizer
    rec = Recorder()
    r = Rollout(rec, "mixed", task_id="t1")
    root = r.root(0, 200)
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    r.call(root, 10, prompt_ids(tok, 1), [yes, no], [-0.25, -2.5])  # exact ids and the server's log-probs
    r.call(root, 40, [], [], server=False, messages=(  # an external call: retokenized, no log-probs
        [{"role": "user", "parts": [{"type": "text", "content": "w3"}]}],
        [{"role": "assistant", "parts": [{"type": "text", "content": "maybe"}]}]))
    r.reward(root, 90, 1.0)
    deliver(collector, rec.spans())

    batch = load_training_batch(collector.store, ppo, credit=CreditConfig(baseline="none", scale_std=False))

    assert [t.retokenized for t in batch.transitions] == [False, True]
    data = pad_transitions(batch.transitions, pad_token_id=tok.pad_token_id)
    assert data.old_logprobs is not None
    assert data.old_logprobs[0, :2].tolist() == [-0.25, -2.5]  # the server's, not recomputed
    assert torch.isnan(data.old_logprobs[1, :2]).all()  # unknown: recompute this row
    computed_rows: list[int] = []

    def current(part: Any) -> torch.Tensor:
        computed_rows.append(len(part.completion_ids))
        return padded_logprobs(ppo.model, part, temperature=1.0, fp32_head=True, entropy=True)[0]

    with torch.no_grad():
        filled = fill_missing_logprobs(data, current)
        whole = padded_logprobs(ppo.model, data, temperature=1.0, fp32_head=True, entropy=True)[0]
    assert computed_rows == [1]  # only the retokenized row went through the model
    assert filled[0, :2].tolist() == [-0.25, -2.5]
    assert filled[1, :2].tolist() == pytest.approx(whole[1, :2].tolist(), abs=1e-5)
    # PPO's first ratio compares the policy with the server's log-probs (-0.25, -2.5): not 1, so approx_kl
    # is not 0 (with every row recomputed it would be exactly 0 before the first optimizer step)
    metrics = ppo.update(batch)
    assert metrics["losses/approx_kl"] > 1e-3


def test_calls_sampled_at_another_temperature_are_skipped_and_counted(collector: Any, model_path: Path,
                                                                      tmp_path: Path) -> None:
    grpo = GRPO(learning_rate=1e-3, temperature=0.7)
    grpo.setup(model_path=model_path, output_dir=tmp_path / "grpo", seed=0)
    tok = grpo.tokenizer
    rec = Recorder()
    _two_calls(rec, tok, "cold", [(1.0, "reward")], temperature=0.7)
    _two_calls(rec, tok, "hot", [(0.0, "reward")], temperature=1.3)  # the agent asked for another temperature
    _two_calls(rec, tok, "unknown", [(0.5, "reward")])  # an older server that recorded none
    deliver(collector, rec.spans())

    batch = load_training_batch(collector.store, grpo, credit=CreditConfig(baseline="none", scale_std=False))

    assert sorted({(t.rollout_id, t.temperature) for t in batch.transitions}) == [("cold", 0.7), ("unknown", None)]
    assert batch.report["skipped_temperature_mismatch"] == 2
    assert json.loads(json.dumps(batch.to_arrow().column("temperature").to_pylist())) == [0.7, 0.7, None, None]
    assert math.isfinite(grpo.update(batch)["losses/policy_loss"])
    # with no temperature to compare (load_transitions alone), every call stays, each with its own
    every = load_transitions(collector.store, credit=CreditConfig(baseline="none", scale_std=False))
    assert [t.temperature for t in every.transitions] == [0.7, 0.7, 1.3, 1.3, None, None]


def test_trajectory_aggregation_with_ppo_is_refused(collector: Any, model_path: Path,
                                                               tmp_path: Path) -> None:
    ppo = _ppo(model_path, tmp_path)
    tok = ppo.tokenizer
    yes = tok.convert_tokens_to_ids("yes")
    rec = Recorder()
    r = Rollout(rec, "conv", task_id="t1")
    root = r.root(0, 200)
    first = prompt_ids(tok, 1)
    r.call(root, 10, first, [yes], [-0.3])
    r.call(root, 40, first + [yes] + prompt_ids(tok, 2)[1:], [yes], [-0.4])  # the prompt extends the history
    r.reward(root, 90, 1.0)
    deliver(collector, rec.spans())

    # GAE gives each call its own advantage and value target; a merged sample has one value target, so the
    # combination is refused (it took the first call's advantage for both calls' tokens before)
    with pytest.raises(ConfigError, match=r"^trajectory_aggregation .* but mode='gae' \(PPO's critic\) gives each"):
        load_training_batch(collector.store, ppo, credit=LightningRL(trajectory_aggregation=True, baseline="none"))
    apart = load_training_batch(collector.store, ppo, credit=LightningRL(baseline="none"))
    assert len(apart) == 2 and len({t.advantage for t in apart.transitions}) == 2
    assert math.isfinite(ppo.update(apart)["losses/policy_loss"])
