"""What load_transitions gives the online trainer (online/trainer.py): the running baseline's state passed in and
fed the rollouts in the order asked for, and unusable rewards ignored so that a rollout's reward is the one the
online trainer's ready query reads (store/online.py: the latest usable one)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from test_transitions import H  # the decomposer tests' span-tree helpers, loaded once there

from spanrl.algorithms.baseline import RunningBaseline
from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.transitions import load_transitions
from spanrl.collector.encoding import encode_request
from spanrl.store.online import Watermark, now_ns, ready_rollouts


def _rollout(rec: Any, rid: str, task: str | None, rewards: list[float], *, usable_call: bool = True) -> None:
    r = H.Rollout(rec, rid, task_id=task)
    root = r.root(0, 100)
    if usable_call:
        r.call(root, 10, [1, 2], [3])
    else:
        r.call(root, 10, [], [], error=True)  # the policy server failed it: nothing to train on
    for i, value in enumerate(rewards):
        r.reward(root, 80 + i, value)


def _advantages(batch: Any) -> dict[str, float]:
    return {t.rollout_id: t.advantage for t in batch.transitions}


def _state() -> RunningBaseline:
    return RunningBaseline(window=20, prior=2.0, mean=0.25, var=0.04, count=10, tasks={"t1": [4, 1.0]})


def test_the_running_baseline_sees_the_rollouts_in_the_order_given_and_only_those_with_a_call(collector: Any) -> None:
    rec = H.Recorder()
    _rollout(rec, "a", "t1", [1.0])
    _rollout(rec, "b", "t2", [0.0])
    _rollout(rec, "c", None, [0.5])
    _rollout(rec, "d", "t1", [1.0], usable_call=False)
    H.deliver(collector, rec.spans())
    config = CreditConfig(baseline="running", scale_std=False)

    state = _state()
    batch = load_transitions(collector.store, credit=config, order=["c", "a", "d", "b"], running=state)

    by_hand = _state()  # the same state fed the same rewards in the same order: the formulas of baseline.py
    expected = by_hand.advantages([(None, 0.5), ("t1", 1.0), ("t2", 0.0)], scale_std=False)
    assert _advantages(batch) == pytest.approx(dict(zip("cab", expected)))
    assert state == by_hand and state.recent == [0.5, 1.0, 0.0] and state.count == 13  # "d" has no call: unseen
    assert [t.rollout_id for t in batch.transitions] == ["a", "b", "c"]  # the rows keep the store's order
    assert batch.rewards_by_rollout == {"a": 1.0, "b": 0.0, "c": 0.5, "d": 1.0}

    by_id = _state()
    load_transitions(collector.store, credit=config, running=by_id)
    assert by_id.recent == [1.0, 0.0, 0.5]  # no order given: the store's (by rollout id)


def test_ignored_unusable_rewards_leave_the_latest_usable_one_as_the_ready_query_reads_it(collector: Any) -> None:
    """A store written before the collector refused unusable rewards holds them (appended here straight into it):
    the latest usable reward counts, as in the online trainer's ready query; one with none left has no reward."""
    rec = H.Recorder()
    _rollout(rec, "a", "t1", [1.0])
    _rollout(rec, "mixed", "t1", [0.5, float("nan")])  # the NaN is the latest
    _rollout(rec, "only-nan", "t1", [float("nan")])
    collector.store.append(encode_request(encode_spans(rec.spans())).table)

    ignored = load_transitions(collector.store, credit=CreditConfig(baseline="none", scale_std=False,
                                                                     nan_reward="ignore"))
    skipped = load_transitions(collector.store, credit=CreditConfig(baseline="none", scale_std=False))

    assert _advantages(ignored) == {"a": 1.0, "mixed": 0.5}
    assert ignored.report["nan_reward"] == 2 and ignored.report["skipped_no_reward"] == 1
    assert _advantages(skipped) == {"a": 1.0}  # "skip": a NaN anywhere skips the rollout
    ready = ready_rollouts(collector.store, Watermark(), now=now_ns(collector.store), horizon_ns=0, settle_s=0.0,
                           quiet_s=60.0, max_age_s=60.0)
    assert {r.rollout_id: r.reward for r in ready} == {"a": 1.0, "mixed": 0.5, "only-nan": None}
