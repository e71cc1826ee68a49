"""load_transitions end to end: span trees written with the OTel SDK, ingested by the real collector,
turned into transitions whose ids and advantages are worked out by hand in each test."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.transitions import TRANSITIONS_SCHEMA, load_transitions


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
Recorder, Rollout, deliver = H.Recorder, H.Rollout, H.deliver
NO_BASELINE = CreditConfig(baseline="none", scale_std=False)


def by_rollout(batch: Any, *columns: str) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    for t in batch.transitions:
        out.setdefault(t.rollout_id, []).append(tuple(getattr(t, c) for c in columns))
    return out


def advantages(batch: Any) -> dict[str, list[float]]:
    return {k: [v[0] for v in vs] for k, vs in by_rollout(batch, "advantage").items()}


def one_call_rollout(rec: Any, rid: str, task: str | None, reward: float | None, *, calls: int = 1) -> None:
    r = Rollout(rec, rid, task_id=task)
    root = r.root(0, 100)
    for i in range(calls):
        r.call(root, 10 + 20 * i, [1, i + 2], [i + 3])
    if reward is not None:
        r.reward(root, 90, reward)


# --- credit modes and baselines --------------------------------------------------------------------


def test_identical_grpo_one_advantage_per_rollout_vs_per_call(collector: Any) -> None:
    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0, calls=2)
    one_call_rollout(rec, "b", "t1", 0.0)
    one_call_rollout(rec, "c", "t2", 0.5)
    one_call_rollout(rec, "d", "t2", 0.5)
    deliver(collector, rec.spans())

    per_rollout = load_transitions(collector.store, credit=CreditConfig())
    per_call = load_transitions(collector.store, credit=CreditConfig(per_rollout=False))

    # t1 scores [1, 0]: mean 0.5, std (ddof 1) sqrt(0.5); t2 has std 0: not scaled, advantage 0
    s = math.sqrt(0.5)
    assert advantages(per_rollout) == {
        "a": [pytest.approx(0.5 / s, rel=1e-5)] * 2, "b": [pytest.approx(-0.5 / s, rel=1e-5)],
        "c": [0.0], "d": [0.0]}
    # Agent Lightning's grouping: one value per call [1, 1, 0]: mean 2/3, std sqrt(1/3); longer rollouts weigh more
    s = math.sqrt(1 / 3)
    assert advantages(per_call) == {
        "a": [pytest.approx((1 / 3) / s, rel=1e-5)] * 2, "b": [pytest.approx((-2 / 3) / s, rel=1e-5)],
        "c": [0.0], "d": [0.0]}
    assert [t.reward for t in per_rollout.transitions] == [1.0, 1.0, 0.0, 0.5, 0.5]
    assert per_rollout.rewards_by_rollout == {"a": 1.0, "b": 0.0, "c": 0.5, "d": 0.5}
    assert per_rollout.report["unscaled_groups"] == 1 and per_rollout.report["calls"] == 5


def test_discounted_mode_discounts_the_episode_reward_per_step(collector: Any) -> None:
    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0, calls=3)
    deliver(collector, rec.spans())

    batch = load_transitions(collector.store, credit=CreditConfig(mode="discounted", gamma=0.5, baseline="none",
                                                                  scale_std=False))

    assert by_rollout(batch, "step", "reward", "advantage") == {"a": [(0, 0.25, 0.25), (1, 0.5, 0.5), (2, 1.0, 1.0)]}


def test_step_mode_returns_to_go_over_intermediate_rewards(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "a")
    root = r.root(0, 200)
    r.reward(root, 5, 0.3)  # before any call: credits no call, counted
    r.call(root, 10, [1], [2])
    r.reward(root, 25, 0.2)  # after call 0
    r.call(root, 30, [1, 2], [3])
    r.call(root, 50, [1, 2, 3], [4])
    r.reward(root, 90, 1.0)  # after call 2
    one_call_rollout(rec, "b", "t1", 0.4)
    deliver(collector, rec.spans())

    step = dict(mode="step", episode_reward="sum")  # every reward counts ("last": only the 1.0)
    flat = load_transitions(collector.store, credit=CreditConfig(gamma=1.0, baseline="none", scale_std=False, **step))
    discounted = load_transitions(collector.store, credit=CreditConfig(gamma=0.5, baseline="none", scale_std=False,
                                                                       **step))
    grpo = load_transitions(collector.store, credit=CreditConfig(**step))

    # r = [0.2, 0, 1.0]: G = [1.2, 1.0, 1.0]; gamma 0.5: G2 = 1, G1 = 0.5, G0 = 0.2 + 0.25 = 0.45
    assert advantages(flat) == {"a": [pytest.approx(1.2), 1.0, 1.0], "b": [0.4]}
    assert advantages(discounted) == {"a": [pytest.approx(0.45), 0.5, 1.0], "b": [0.4]}
    assert flat.report["rewards_before_first_call"] == 1
    # GRPO per step over the returns-to-go of the rollouts that reached the step: step 0 [1.2, 0.4], mean 0.8,
    # std sqrt(0.32); steps 1 and 2: a alone (b made one call), compared with no one: 0
    s0 = math.sqrt(0.32)
    assert advantages(grpo) == {"a": [pytest.approx(0.4 / s0, rel=1e-5), 0.0, 0.0],
                                "b": [pytest.approx(-0.4 / s0, rel=1e-5)]}


def test_rloo_leave_one_out_per_rollout_and_per_call_and_singleton_group(collector: Any) -> None:
    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0, calls=2)
    one_call_rollout(rec, "b", "t1", 0.0)
    one_call_rollout(rec, "c", "t1", 0.5)
    one_call_rollout(rec, "alone", "t9", 0.7)
    deliver(collector, rec.spans())

    per_rollout = load_transitions(collector.store, credit=CreditConfig(baseline="rloo", scale_std=False))
    per_call = load_transitions(collector.store, credit=CreditConfig(baseline="rloo", scale_std=False,
                                                                     per_rollout=False))
    scaled = load_transitions(collector.store, credit=CreditConfig(baseline="rloo", scale_std=True))

    # baselines: a (0 + 0.5) / 2, b (1 + 0.5) / 2, c (1 + 0) / 2
    assert advantages(per_rollout) == {"a": [0.75, 0.75], "b": [-0.75], "c": [0.0], "alone": [0.0]}
    # per call: values a [1, 1], b [0], c [0.5]: a's baseline 0.5 / 2, b's 2.5 / 3, c's 2 / 3
    assert advantages(per_call) == {"a": [0.75, 0.75], "b": [pytest.approx(-2.5 / 3)],
                                    "c": [pytest.approx(0.5 - 2 / 3)], "alone": [0.0]}
    s = 0.5  # std of [1, 0, 0.5], ddof 1
    assert advantages(scaled)["b"] == [pytest.approx(-0.75 / s, rel=1e-5)]
    assert per_rollout.report["singleton_groups"] == 1


def shaped_rollout(rec: Any, rid: str, task: str, rewards_after: list[float | None]) -> None:
    """One call per entry (call i at 10 + 20 i ms, 10 ms long), then its reward (if not None) 5 ms later."""
    r = Rollout(rec, rid, task_id=task)
    root = r.root(0, 20 * len(rewards_after) + 50)
    for i, reward in enumerate(rewards_after):
        r.call(root, 10 + 20 * i, [1] + list(range(2, i + 3)), [i + 3])
        if reward is not None:
            r.reward(root, 10 + 20 * i + 15, reward)


def deliver_identical_pair_and_a_varied_group(collector: Any) -> None:
    rec = Recorder()
    shaped_rollout(rec, "a", "t1", [0.2, None, 1.0])  # a and b: identical rewards in one task group
    shaped_rollout(rec, "b", "t1", [0.2, None, 1.0])
    shaped_rollout(rec, "c", "t2", [0.0, None, 1.0])  # c and d differ
    shaped_rollout(rec, "d", "t2", [0.5, 0.0])
    deliver(collector, rec.spans())


@pytest.mark.parametrize("baseline", ["grpo", "rloo"])
@pytest.mark.parametrize("mode", ["identical", "discounted", "step"])
def test_identical_rewards_in_a_group_get_zero_advantage_at_every_step(collector: Any, mode: str,
                                                                      baseline: str) -> None:
    deliver_identical_pair_and_a_varied_group(collector)

    for per_rollout in (True, False):
        for scale_std in (True, False):
            cfg = CreditConfig(mode=mode, baseline=baseline, gamma=0.9, per_rollout=per_rollout, scale_std=scale_std)
            adv = advantages(load_transitions(collector.store, credit=cfg))
            assert adv["a"] == [0.0, 0.0, 0.0] and adv["b"] == [0.0, 0.0, 0.0], (cfg, adv)
            assert any(abs(x) > 0.01 for x in adv["c"] + adv["d"]), (cfg, adv)  # the varied group learns


def test_baselines_per_mode_as_docs_credit_md_writes_them(collector: Any) -> None:
    deliver_identical_pair_and_a_varied_group(collector)

    def run(**fields: Any) -> dict[str, list[float]]:
        adv = advantages(load_transitions(collector.store, credit=CreditConfig(scale_std=False, **fields)))
        return {k: v for k, v in adv.items() if k in ("c", "d")}

    # episode rewards R_c = 1, R_d = 0 (the last by time): grpo baseline 0.5, times gamma ** (T - 1 - t)
    assert run(mode="discounted", gamma=0.5) == {"c": [0.125, 0.25, 0.5], "d": [-0.25, -0.5]}
    # every reward (episode_reward sum): returns-to-go G_c = [1, 1, 1], G_d = [0.5, 0] (d made 2 calls):
    # step means [0.75, 0.5]; step 2: c alone, compared with no one
    assert run(mode="step", episode_reward="sum") == {"c": [0.25, 0.5, 0.0], "d": [-0.25, -0.5]}
    assert run(mode="step", baseline="rloo", episode_reward="sum") == {"c": [0.5, 1.0, 0.0], "d": [-0.5, -1.0]}
    # scaled by the std of each step: [0.5, 0] at step 1 -> std sqrt(0.5)
    scaled = advantages(load_transitions(collector.store, credit=CreditConfig(mode="step", episode_reward="sum")))
    s = math.sqrt(0.125)  # step 0: [1, 0.5], ddof 1
    assert scaled["c"][0] == pytest.approx(0.25 / s, rel=1e-5)
    assert scaled["d"][1] == pytest.approx(-0.5 / math.sqrt(0.5), rel=1e-5)
    # no baseline: the return itself, no group comparison
    assert run(mode="discounted", gamma=0.5, baseline="none") == {"c": [0.25, 0.5, 1.0], "d": [0.0, 0.0]}


def test_gae_with_critic_values(collector: Any) -> None:
    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0, calls=2)
    deliver(collector, rec.spans())

    batch = load_transitions(
        collector.store,
        credit=CreditConfig(mode="gae", gamma=0.9, lam=0.8, baseline="none", scale_std=False),
        values={("a", 0): 0.5, ("a", 1): 0.6},
    )

    # delta1 = 1 - 0.6 = 0.4 = A1; delta0 = 0 + 0.9 * 0.6 - 0.5 = 0.04; A0 = 0.04 + 0.9 * 0.8 * 0.4 = 0.328
    assert by_rollout(batch, "advantage", "reward") == {
        "a": [(pytest.approx(0.328), pytest.approx(0.828)), (pytest.approx(0.4), pytest.approx(1.0))]}
    with pytest.raises(ValueError, match=r"values has no critic value for call \(rollout_id, step\) = \('a', 1\)"):
        load_transitions(collector.store, credit=CreditConfig(mode="gae", baseline="none"), values={("a", 0): 0.5})


def test_multi_agent_selection_keeps_global_steps_for_credit(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "m")
    root = r.root(0, 300)
    planner = r.invoke_agent("planner", root, 1, 299)
    r.call(planner, 10, [1], [2])
    coder = r.invoke_agent("coder", planner, 30, 100)
    r.call(coder, 40, [3], [4])
    r.reward(coder, 60, 0.5)  # after the coder's call (step 1)
    r.call(planner, 150, [5], [6])
    r.reward(planner, 200, 1.0)  # after step 2
    deliver(collector, rec.spans())

    batch = load_transitions(collector.store, agents=["coder"],
                             credit=CreditConfig(mode="step", gamma=0.5, baseline="none", scale_std=False,
                                                 episode_reward="sum"))

    # returns-to-go at step 1: 0.5 + 0.5 * 1.0 (the planner's later step 2 still counts)
    assert by_rollout(batch, "agent", "step", "prompt_ids", "advantage") == {"m": [("coder", 1, [3], 1.0)]}


# --- aggregation -----------------------------------------------------------------------------------


def test_aggregation_merges_calls_whose_prompt_extends_the_previous_sample(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "a")
    root = r.root(0, 200)
    r.call(root, 10, [1, 2], [3, 4], [-0.1, -0.2])
    r.call(root, 30, [1, 2, 3, 4, 9, 9], [5], [-0.3])  # tool output [9, 9] in between
    r.call(root, 50, [1, 2, 3, 4, 9, 9, 5, 7], [8], [-0.4])
    r.reward(root, 90, 1.0)
    deliver(collector, rec.spans())

    batch = load_transitions(collector.store, credit=NO_BASELINE, aggregate=True)

    [t] = batch.transitions
    assert (t.step, t.prompt_ids, t.completion_ids, t.completion_mask) == (
        0, [1, 2], [3, 4, 9, 9, 5, 7, 8], [1, 1, 0, 0, 1, 0, 1])
    assert t.old_logprobs == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3, 0.0, -0.4])
    assert (t.reward, t.advantage) == (1.0, 1.0)
    assert batch.report["merged"] == 2 and batch.report["transitions"] == 1


def test_aggregation_counts_why_prefixes_do_not_match(collector: Any) -> None:
    from spanrl.demo.tiny import build_tiny_tokenizer

    rec = Recorder()
    r = Rollout(rec, "a")
    root = r.root(0, 300)
    r.call(root, 10, [1, 2], [3])
    r.call(root, 30, [1, 2, 30, 9], [4])  # keeps the prompt, but the completion was re-rendered
    r.call(root, 50, [50], [51])  # a new conversation
    r.call(root, 70, [], [], server=False, messages=(
        [{"role": "user", "parts": [{"type": "text", "content": "3 add 4"}]}],
        [{"role": "assistant", "parts": [{"type": "text", "content": "7"}]}]))
    r.reward(root, 90, 1.0)
    b = Rollout(rec, "b")
    root_b = b.root(0, 100)
    b.call(root_b, 10, [1, 2], [3])
    b.call(root_b, 30, [1, 2], [4])  # a second sample of the same prompt
    b.reward(root_b, 90, 0.0)
    deliver(collector, rec.spans())

    batch = load_transitions(collector.store, credit=NO_BASELINE, aggregate=True,
                             tokenizer=build_tiny_tokenizer(["3", "add", "4", "7"]))

    assert [(t.rollout_id, t.step) for t in batch.transitions] == [("a", 0), ("a", 1), ("a", 2), ("a", 3),
                                                                   ("b", 0), ("b", 1)]
    assert {k: v for k, v in batch.report.items() if k.startswith("prefix_mismatch_")} == {
        "prefix_mismatch_template_drift": 1, "prefix_mismatch_history_changed": 1, "prefix_mismatch_retokenized": 1,
        "prefix_mismatch_same_prompt": 1}
    assert batch.report["merged"] == 0


# --- retokenization and bad data -------------------------------------------------------------------


def test_external_call_is_retokenized_with_the_policy_tokenizer(collector: Any) -> None:
    from spanrl.demo.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer(["3", "add", "4", "7"])
    rec = Recorder()
    r = Rollout(rec, "a")
    root = r.root(0, 100)
    r.call(root, 10, [], [], server=False, messages=(
        [{"role": "user", "parts": [{"type": "text", "content": "3 add 4"}]}],
        [{"role": "assistant", "parts": [{"type": "text", "content": "7"}], "finish_reason": "stop"}]))
    r.reward(root, 90, 1.0)
    deliver(collector, rec.spans())

    with_tok = load_transitions(collector.store, credit=NO_BASELINE, tokenizer=tok)
    without = load_transitions(collector.store, credit=NO_BASELINE)

    [t] = with_tok.transitions
    assert t.prompt_ids == tok.convert_tokens_to_ids("<bos> <user> 3 add 4 <eos> <assistant>".split())
    assert t.completion_ids == tok.convert_tokens_to_ids(["7", "<eos>"])
    assert (t.retokenized, t.completion_mask, t.old_logprobs, t.policy_version) == (True, [1, 1], [], None)
    assert with_tok.report["retokenized"] == 1
    assert len(without) == 0 and without.report["skipped_no_ids"] == 1


def test_rollout_without_reward_is_skipped_or_scored_zero(collector: Any) -> None:
    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0)
    one_call_rollout(rec, "none", "t1", None)
    deliver(collector, rec.spans())

    skipped = load_transitions(collector.store, credit=CreditConfig(baseline="none", scale_std=False))
    zero = load_transitions(collector.store, credit=CreditConfig(missing_reward="zero", scale_std=False))

    assert advantages(skipped) == {"a": [1.0]}
    assert skipped.report["skipped_no_reward"] == 1 and skipped.report["skipped_rollout_calls"] == 1
    assert advantages(zero) == {"a": [0.5], "none": [-0.5]}  # GRPO over [1, 0]
    assert zero.report["defaulted_no_reward"] == 1


def test_nan_reward_skips_its_rollout_or_counts_as_zero(collector: Any) -> None:
    """The collector refuses a NaN reward at ingest (tests/collector/test_reward_check.py); a store written
    before it did holds one: appended here straight into the store."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from spanrl.collector.encoding import encode_request

    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0)
    one_call_rollout(rec, "nan", "t1", float("nan"))
    collector.store.append(encode_request(encode_spans(rec.spans())).table)

    skipped = load_transitions(collector.store, credit=NO_BASELINE)
    zero = load_transitions(collector.store, credit=CreditConfig(baseline="none", scale_std=False, nan_reward="zero"))

    assert advantages(skipped) == {"a": [1.0]}
    assert skipped.report["nan_reward"] == 1 and skipped.report["skipped_nan_reward"] == 1
    assert advantages(zero) == {"a": [1.0], "nan": [0.0]}


def test_misaligned_or_missing_logprobs_are_counted(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "a")
    root = r.root(0, 100)
    r.call(root, 10, [1], [2], [-0.1, -0.2])  # two logprobs for one token: unusable
    r.call(root, 30, [1, 2], [3], [])  # no logprobs recorded
    r.reward(root, 90, 1.0)
    deliver(collector, rec.spans())

    batch = load_transitions(collector.store, credit=NO_BASELINE)

    assert by_rollout(batch, "step", "old_logprobs") == {"a": [(1, [])]}
    assert batch.report["skipped_bad_logprobs"] == 1 and batch.report["missing_logprobs"] == 1


def test_failed_call_without_ids_is_skipped_and_counted(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "a")
    root = r.root(0, 100)
    r.call(root, 10, [1], [2])
    r.call(root, 30, [], [], error=True)  # the policy server failed the request
    r.reward(root, 90, 1.0)
    deliver(collector, rec.spans())

    batch = load_transitions(collector.store, credit=NO_BASELINE)

    assert by_rollout(batch, "step") == {"a": [(0,)]}
    assert batch.report["skipped_failed_calls"] == 1 and batch.report["calls"] == 2


def test_to_arrow_has_the_transitions_schema(collector: Any) -> None:
    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0, calls=2)
    deliver(collector, rec.spans())

    table = load_transitions(collector.store, credit=NO_BASELINE).to_arrow()

    assert table.schema == TRANSITIONS_SCHEMA
    assert table.column("completion_mask").to_pylist() == [[1], [1]]
    assert json.loads(json.dumps(table.column("prompt_ids").to_pylist())) == [[1, 2], [1, 3]]


# --- spanrl export transitions ---------------------------------------------------------------------


def test_export_transitions_cli_through_the_collector_and_from_the_file(collector: Any, tmp_path: Path,
                                                                         capsys: Any) -> None:
    import pyarrow.parquet as pq

    from spanrl.cli import main

    rec = Recorder()
    one_call_rollout(rec, "a", "t1", 1.0, calls=2)
    one_call_rollout(rec, "b", "t1", 0.0)
    one_call_rollout(rec, "none", "t1", None)
    deliver(collector, rec.spans())
    db = collector.config.db_path

    # while the collector runs, the CLI reads through its SQL endpoint
    rc = main(["export", "transitions", "--db", db, "--url", collector.http_endpoint, "--format", "jsonl",
               "-o", str(tmp_path / "t.jsonl"), "--baseline", "none", "--no-scale-std"])
    assert rc == 0
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(r["rollout_id"], r["step"], r["prompt_ids"], r["advantage"]) for r in lines] == [
        ("a", 0, [1, 2], 1.0), ("a", 1, [1, 3], 1.0), ("b", 0, [1, 2], 0.0)]
    assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["skipped_no_reward"] == 1

    collector.shutdown()  # now the file is free: the CLI opens it read-only
    rc = main(["export", "transitions", "--db", db, "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "t.parquet"),
               "--agent", "nobody"])
    assert rc == 0 and pq.read_table(tmp_path / "t.parquet").num_rows == 0
    rc = main(["export", "transitions", "--db", db, "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "hf"),
               "--format", "hf"])
    assert rc == 0
    import datasets

    ds = datasets.load_from_disk(str(tmp_path / "hf"))
    assert ds["advantage"] == pytest.approx([math.sqrt(0.5), math.sqrt(0.5), -math.sqrt(0.5)], rel=1e-5)
    assert main(["export", "transitions", "--db", db, "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "x"),
                 "--credit-mode", "final"]) == 2
    assert "mode must be one of identical, discounted, step, gae; got 'final'" in capsys.readouterr().err


def test_the_episode_reward_is_the_last_one_the_collector_stored_not_the_senders_latest_clock(collector: Any) -> None:
    """A verdict that arrives later wins even when its sender's clock is behind (issue 28: ordered by the
    collector's ingest time). By the senders' clocks the first reward (at 95 ms) would be the last."""
    rec = Recorder()
    first = Rollout(rec, "a", task_id="t1")
    root = first.root(0, 100)
    first.call(root, 10, [1, 2], [3])
    first.reward(root, 95, 1.0)
    deliver(collector, rec.spans())
    later = Recorder()
    Rollout(later, "a", task_id="t1").reward(None, 50, 0.25)  # a grader whose clock is 45 ms behind
    deliver(collector, later.spans())

    batch = load_transitions(collector.store, credit=NO_BASELINE)
    assert advantages(batch) == {"a": [pytest.approx(0.25)]}
