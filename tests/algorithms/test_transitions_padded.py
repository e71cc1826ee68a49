"""The fast path (store -> Arrow -> padded tensors, no Python per row) against the per-row reference
(a dataclass per transition, a tensor per row and field), on a real store with the odd cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.transitions import load_transitions


def _load_span_helpers() -> Any:
    # The span-tree helpers live with the decomposer tests; load them by path (tests are not a package).
    name = "spanrl_tests_decomposer_helpers"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "store" / "test_decomposer.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


H = _load_span_helpers()
PAD = 7  # not 0: a pad written where a token belongs (or the reverse) shows


def _per_row_reference(transitions: list[Any]) -> dict[str, torch.Tensor]:
    """The tensors, one row at a time: prompts left-padded, completions right-padded, log-probs NaN on
    the tokens of a row that has none, 0 on padding."""
    bsz = len(transitions)
    max_p = max(len(t.prompt_ids) for t in transitions)
    max_c = max(len(t.completion_ids) for t in transitions)
    out = {"prompt_ids": torch.full((bsz, max_p), PAD, dtype=torch.long),
           "prompt_mask": torch.zeros((bsz, max_p), dtype=torch.bool),
           "completion_ids": torch.full((bsz, max_c), PAD, dtype=torch.long),
           "completion_mask": torch.zeros((bsz, max_c), dtype=torch.bool),
           "loss_mask": torch.zeros((bsz, max_c), dtype=torch.bool),
           "old_logprobs": torch.zeros((bsz, max_c), dtype=torch.float32)}
    for i, t in enumerate(transitions):
        p, c = len(t.prompt_ids), len(t.completion_ids)
        out["prompt_ids"][i, max_p - p:] = torch.tensor(t.prompt_ids, dtype=torch.long)
        out["prompt_mask"][i, max_p - p:] = True
        out["completion_ids"][i, :c] = torch.tensor(t.completion_ids, dtype=torch.long)
        out["completion_mask"][i, :c] = True
        out["loss_mask"][i, :c] = torch.tensor(t.completion_mask, dtype=torch.bool)
        out["old_logprobs"][i, :c] = torch.tensor(t.old_logprobs) if t.old_logprobs else float("nan")
    out["advantages"] = torch.tensor([t.advantage for t in transitions], dtype=torch.float32)
    out["rewards"] = torch.tensor([t.reward for t in transitions], dtype=torch.float32)
    return out


def _assert_same(padded: Any, reference: dict[str, torch.Tensor]) -> None:
    for name, expected in reference.items():
        got = getattr(padded, name)
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert torch.equal(torch.isnan(got), torch.isnan(expected)), f"{name}: NaN where the reference has none"
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected)), f"{name} differs from the per-row path"


def _odd_store(collector: Any) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from spanrl.collector.encoding import encode_request

    """Rollouts of two tasks: multi-call ones with uneven lengths, a call without log-probs, compact
    arrays, an agent subtree, a failed call, misaligned log-probs, and rollouts the credit skips (no
    reward, a NaN reward)."""
    rec = H.Recorder()
    multi = H.Rollout(rec, "multi", task_id="t1")
    root = multi.root(0, 200)
    agent = multi.invoke_agent("solver", root, 1, 199)
    multi.call(agent, 10, [1, 2, 3], [4, 5], [-0.1, -0.2])
    multi.call(agent, 30, [1, 2, 3, 4, 5, 6], [7], [])  # extends the first: merged by aggregate; no log-probs
    multi.call(agent, 50, [9], [10, 11, 12, 13], [-1.0, -2.0, -3.0, -4.0], compact=True)
    multi.call(agent, 70, [1], [2], [-0.5, -0.6])  # misaligned log-probs: skipped
    multi.call(agent, 90, [], [], error=True)  # the server failed: skipped
    multi.reward(root, 95, 1.0)
    other = H.Rollout(rec, "other", task_id="t1")
    root = other.root(0, 100)
    other.call(root, 10, [20, 21], [22, 23, 24], [-0.3, -0.3, -0.3])
    other.reward(root, 90, 0.0)
    for rid, reward in (("no_reward", None), ("nan", float("nan")), ("single", 0.5)):
        r = H.Rollout(rec, rid, task_id="t2")
        root = r.root(0, 100)
        r.call(root, 10, [30, 31, 32, 33, 34], [35], [-0.7])
        r.call(root, 40, [36], [37, 38], [-0.8, -0.9])
        if reward is not None:
            r.reward(root, 90, reward)
    # appended straight into the store: the collector refuses a NaN reward at ingest, a store written before
    # it did holds one (tests/collector/test_reward_check.py)
    collector.store.append(encode_request(encode_spans(rec.spans())).table)


@pytest.mark.parametrize("aggregate", [False, True])
def test_fast_path_tensors_equal_the_per_row_reference(collector: Any, aggregate: bool) -> None:
    _odd_store(collector)

    batch = load_transitions(collector.store, credit=CreditConfig(), aggregate=aggregate)
    padded = batch.to_padded(pad_token_id=PAD)

    assert "transitions" not in vars(batch)  # no dataclass on the fast path
    report = batch.report
    assert report["missing_logprobs"] == 1 and report["skipped_bad_logprobs"] == 1
    assert report["skipped_failed_calls"] == 1
    assert report["skipped_no_reward"] == 1 and report["skipped_nan_reward"] == 1
    assert report["skipped_rollout_calls"] == 4 and report["merged"] == (1 if aggregate else 0)
    assert sorted(batch.rewards_by_rollout) == ["multi", "other", "single"]
    assert len(batch) == (5 if aggregate else 6)
    _assert_same(padded, _per_row_reference(batch.transitions))
    assert torch.isnan(padded.old_logprobs).any()  # the row without log-probs is marked for recomputing

    picked = [len(batch) - 1, 0, 2]  # a sampled mini-batch, columnar
    _assert_same(batch.take(picked).to_padded(pad_token_id=PAD),
                 _per_row_reference([batch.transitions[i] for i in picked]))
