"""The calc-verify credit study's table (``examples/smollm2/study.py``): records on disk in, each arm's means and
its paired differences against ``identical`` with 95% t intervals out, worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.smollm2.study import ARMS, BUDGET, load_records, paired, table


def _record(folder: Path, arm: str, seed: int, first_try: float, calls: float) -> None:
    after = {"first_try": first_try, "final_success": 0.5, "calls_per_episode": calls, "recovery_rate": None}
    (folder / f"{arm}-s{seed}.json").write_text(json.dumps({"arm": arm, "seed": seed, "after": after}))


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
