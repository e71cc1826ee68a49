"""The viewer's credit table shows each call's step signals (what its tool spans say went wrong, and their
reward under the run's ``credit.step_signals``): in a real headless Chromium, over a DuckDB file a real
collector filled with tool spans shaped as the GenAI conventions write them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "algorithms"))
from test_step_signals import SIGNALS, _deliver  # noqa: E402

_NOBODY = "http://127.0.0.1:9"  # no collector: read the file


def _run_folder(path: Path) -> Path:
    """A GRPO run's folder as the Trainer leaves it, trained with step credit and step signals."""
    path.mkdir()
    credit = {"mode": "step", "scale_std": False, "step_signals": SIGNALS}
    (path / "config.json").write_text(json.dumps({"algorithm": {"name": "grpo"}, "credit": credit}))
    (path / "history.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 1.0}) + "\n")
    return path


def _table(browser: Any) -> dict[int, dict[str, str]]:
    rows = browser.eval("""[...document.querySelectorAll('#transitions tbody tr')].map(tr => [+tr.dataset.step,
        tr.querySelector('.signals').textContent, tr.querySelector('.advantage').textContent])""")
    return {step: {"signals": text, "advantage": adv} for step, text, adv in rows}


def test_the_credit_table_shows_each_calls_signals_and_their_reward(collector: Any, tmp_path: Path, ui_factory: Any,
                                                                     browser: Any, shots: Path) -> None:
    _deliver(collector)
    collector.shutdown()  # the file is free: the viewer opens it read-only
    run = _run_folder(tmp_path / "grpo")
    ui = ui_factory("--db", collector.config.db_path, "--url", _NOBODY, "--run", str(run))

    heads = None
    for rid, expected in {  # tests/algorithms/test_step_signals.py works these advantages out by hand
        "a": {0: {"signals": "nonzero_exit (-0.200)", "advantage": "-0.050"}, 1: {"signals": "", "advantage": "0.075"}},
        "b": {0: {"signals": "denied (-0.100)", "advantage": "0.050"}, 1: {"signals": "", "advantage": "0.075"}},
        "c": {0: {"signals": "", "advantage": "-0.150"},
              1: {"signals": "tool_error, retry (-0.300)", "advantage": "-0.225"}},
    }.items():
        browser.goto(ui.url + "#/rollout/" + rid)  # a hash change: wait for this rollout's table, not the last one's
        browser.wait(f"document.querySelector('h1 code')?.textContent === '{rid}' && "
                     "document.querySelector('#transitions')")
        heads = browser.eval("[...document.querySelectorAll('#transitions th')].map(t => t.textContent)")
        assert _table(browser) == expected, rid
    assert heads is not None and heads[3:6] == ["advantage", "label", "signals"]
    summary = browser.eval("document.querySelector('#credit p').textContent")
    assert "Credit step" in summary and "step signals (tool_error -0.2, nonzero_exit -0.2, denied -0.1, retry -0.1)" \
        in summary
    browser.screenshot(shots / "step-signals.png")
    assert not browser.console_errors


def test_without_step_signals_the_facts_are_shown_with_no_reward(collector: Any, ui_factory: Any,
                                                                 browser: Any) -> None:
    _deliver(collector)
    collector.shutdown()
    ui = ui_factory("--db", collector.config.db_path, "--url", _NOBODY)  # no run: the LightningRL defaults
    browser.goto(ui.url + "#/rollout/c")
    browser.wait("document.querySelector('#transitions')")
    assert {s: row["signals"] for s, row in _table(browser).items()} == {0: "", 1: "tool_error, retry"}
    assert not browser.console_errors


def test_a_runs_step_signals_reach_the_viewers_credit(tmp_path: Path) -> None:
    from spanrl.ui.runs import Run
    from spanrl.ui.server import credit_of_runs

    run = _run_folder(tmp_path / "step")
    assert credit_of_runs([Run(run, "step")]).step_signals == SIGNALS
    gae = tmp_path / "ppo"
    gae.mkdir()  # PPO's gae is shown as discounted (no critic here), which reads no per-step rewards
    credit = {"mode": "gae", "baseline": "none", "step_signals": SIGNALS}
    (gae / "config.json").write_text(json.dumps({"algorithm": {"name": "ppo"}, "credit": credit}))
    shown = credit_of_runs([Run(gae, "ppo")])
    assert (shown.mode, shown.step_signals) == ("discounted", None)
