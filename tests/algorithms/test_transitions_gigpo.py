"""GiGPO's step groups from real span trees: load_transitions keys each call's state by its recorded
prompt token ids (through the real collector), as tests/algorithms/test_credit_gigpo.py does on arrays."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.transitions import load_transitions


def _helpers() -> Any:
    name = "spanrl_tests_decomposer_helpers"  # the span-tree helpers of the decomposer tests, loaded by path
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parents[1] / "store" / "test_decomposer.py"
        )
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


H = _helpers()


def test_calls_after_the_same_tool_result_form_one_step_group(collector: Any) -> None:
    rec = H.Recorder()
    # four rollouts of one task: the first prompt is shared; a and b then saw one tool result, c and d another
    for rid, seen, reward in (("a", 9, 1.0), ("b", 9, 1.0), ("c", 8, 0.0), ("d", 8, 1.0)):
        r = H.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        r.call(root, 10, [1, 2], [5])
        r.call(root, 30, [1, 2, 5, seen], [seen])
        r.reward(root, 90, reward)
    H.deliver(collector, rec.spans())

    batch = load_transitions(collector.store, credit=CreditConfig(scale_std=False, step_group_weight=1.0))
    got = {}
    for t in batch.transitions:
        got.setdefault(t.rollout_id, []).append(t.advantage)
    # episode term R - 0.75; step 0 (one state): the same again; step 1: {a, b} R = [1, 1] -> 0, {c, d} [0, 1] -> -/+0.5
    assert got == {"a": [pytest.approx(0.5), pytest.approx(0.25)], "b": [pytest.approx(0.5), pytest.approx(0.25)],
                   "c": [pytest.approx(-1.5), pytest.approx(-1.25)], "d": [pytest.approx(0.5), pytest.approx(0.75)]}
    assert batch.report["step_groups"] == 3
    plain = load_transitions(collector.store, credit=CreditConfig(scale_std=False))
    assert sorted(t.advantage for t in plain.transitions if t.rollout_id == "d") == [pytest.approx(0.25)] * 2
