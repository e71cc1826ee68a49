"""The calc-verify credit study's table (``examples/smollm2/study.py``): records on disk in, each arm's means and
its paired differences against ``identical`` with 95% t intervals out, worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.smollm2.study import ARMS, BUDGET, load_records, paired, plot, same_samples, table, verdict


def _record(folder: Path, arm: str, seed: int, first_try: float, calls: float, final: float = 0.5) -> None:
    after = {"first_try": first_try, "final_success": final, "calls_per_episode": calls, "recovery_rate": None}
    (folder / f"{arm}-s{seed}.json").write_text(json.dumps({"arm": arm, "seed": seed, "after": after,
                                                            "train_reward_by_step": [0.2, 0.3 + seed / 10]}))


def test_paired_differences_get_a_t_interval_from_two_pairs_on(tmp_path: Path) -> None:
    for seed, (ident, aa, gigpo) in enumerate([(0.40, 0.42, 0.50), (0.30, 0.29, 0.44), (0.35, 0.35, 0.45)]):
        _record(tmp_path, "identical", seed, ident, 2.0)
        _record(tmp_path, "aa", seed, aa, 2.0)
        _record(tmp_path, "gigpo", seed, gigpo, 2.5)
    _record(tmp_path, "critic", 0, 0.45, 2.2)  # one pair: a difference, no interval
    lines = table(load_records(tmp_path)).splitlines()
    assert lines[2].split("|")[1:4] == [" identical ", " 0,1,2 ", " 0.350 "]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[7:]}
    # gigpo - identical: 0.10, 0.14, 0.10: mean 0.1133, sd 0.02309, t(2) 4.303: half-width 0.0574
    assert rows["gigpo"][:2] == ["3", "+0.113 [+0.056, +0.171]"]
    assert rows["gigpo"][3] == "+0.500 [+0.500, +0.500]" and rows["gigpo"][4] == "-"  # no recovery rate: no cell
    assert rows["aa"][1] == "+0.003 [-0.035, +0.041]"  # 0.02, -0.01, 0: sd 0.01528, half-width 0.0380
    assert rows["critic"][:2] == ["1", "+0.050"]
    assert paired([0.1, 0.14, 0.1]) == (pytest.approx(0.11333, abs=1e-4), pytest.approx(0.05737, abs=1e-4))


def test_every_arm_shares_one_budget_and_aa_differs_only_in_its_sampling_seed() -> None:
    assert {spec["credit"] for spec in ARMS.values()} == {"identical", "gigpo", "critic"}
    assert ARMS["aa"] == {"credit": "identical", "aa": True} and BUDGET["max_minutes"] is None


def test_the_verdict_names_each_condition_an_arm_misses(tmp_path: Path) -> None:
    for seed, (ident, aa, gigpo, critic) in enumerate([(0.40, 0.42, 0.50, 0.52), (0.30, 0.29, 0.44, 0.41),
                                                       (0.35, 0.35, 0.45, 0.46)]):
        _record(tmp_path, "identical", seed, ident, 2.0)
        _record(tmp_path, "aa", seed, aa, 2.0)
        _record(tmp_path, "gigpo", seed, gigpo, 2.5)  # more calls per episode than identical
        _record(tmp_path, "critic", seed, critic, 1.8, final=0.55)
    lines = verdict(load_records(tmp_path))
    # gigpo: +0.113 [+0.056, +0.171], A/A gap mean(|0.02|, |-0.01|, 0) = 0.01 < 0.057, but calls +0.5
    assert lines == ["gigpo: does not earn its keep: calls per episode not lower (3 pairs)",
                     # critic: 0.12, 0.11, 0.11: +0.113, sd 0.00577, half 0.0143; calls -0.2, final +0.05
                     "critic: earns its keep (3 pairs)"]
    _record(tmp_path, "aa", 0, 0.60, 2.0)  # A/A gaps 0.20, -0.01, 0: mean absolute 0.07 > 0.113 / 2
    _record(tmp_path, "critic", 0, 0.44, 1.8, final=0.30)  # gains 0.04, 0.11, 0.11: +0.087 [-0.014, +0.187]
    assert verdict(load_records(tmp_path))[1] == (
        "critic: does not earn its keep: its 95% interval reaches 0; A/A gap 0.070 not below half the gain; "
        "final success lower (3 pairs)")


def test_a_gain_of_exactly_the_bar_counts_and_one_pair_has_no_interval(tmp_path: Path) -> None:
    _record(tmp_path, "identical", 0, 0.40, 2.0)
    _record(tmp_path, "critic", 0, 0.48, 1.9, final=0.5)  # 0.48 - 0.40 = 0.07999999999999996 in floats
    assert verdict(load_records(tmp_path)) == ["critic: does not earn its keep: one pair: no interval; no A/A pair "
                                               "(1 pair)"]
    _record(tmp_path, "critic", 0, 0.45, 1.9)
    assert verdict(load_records(tmp_path)) == ["critic: does not earn its keep: first-try gain +0.050 < +0.08; "
                                               "one pair: no interval; no A/A pair (1 pair)"]


def test_the_plot_is_a_png_of_every_run(tmp_path: Path) -> None:
    for seed in range(2):
        _record(tmp_path, "identical", seed, 0.3, 2.0)
        _record(tmp_path, "critic", seed, 0.4, 1.9)
    out = plot(load_records(tmp_path), tmp_path / "study.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_same_samples_counts_rollouts_whose_every_call_sampled_the_same_tokens(tmp_path: Path) -> None:
    """Two runs' stores written by real collectors: rollouts matched by step and index, whatever the run's id."""
    import importlib.util
    import sys

    from spanrl.collector import Collector, CollectorConfig

    name = "spanrl_tests_decomposer_helpers"  # the decomposer tests' span-tree helpers, loaded by path
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "store" / "test_decomposer.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    h = sys.modules[name]
    # run a and run b: step 1 alike; at step 2 rollout 1's second call differs; b has one more rollout
    second = {"a": {(1, 0): [7], (1, 1): [7], (2, 0): [7], (2, 1): [7]},
              "b": {(1, 0): [7], (1, 1): [7], (2, 0): [7], (2, 1): [8], (2, 2): [7]}}
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        collector = Collector(CollectorConfig(db_path=str(tmp_path / run / "spans.duckdb"), grpc_port=0,
                                              http_port=0)).start()
        try:
            rec = h.Recorder()
            for (step, index), tokens in second[run].items():
                r = h.Rollout(rec, f"run{run}-s{step}-{index}-a1")
                root = r.root(0, 100)
                r.call(root, 10, [1, 2], [5])
                r.call(root, 30, [1, 2, 5], tokens)
            h.Rollout(rec, f"run{run}-v0-0-a1", mode="val").call(None, 10, [1], [9 if run == "a" else 6])  # not train
            h.deliver(collector, rec.spans())
        finally:
            collector.shutdown()
    assert same_samples(tmp_path / "a", tmp_path / "b") == {1: (2, 2), 2: (1, 2)}
