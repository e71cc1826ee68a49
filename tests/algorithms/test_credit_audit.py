"""``spanrl credit audit`` on a real store with labelled calls, its figures worked out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_transitions_gigpo import H

from spanrl import semconv as sc
from spanrl.algorithms.credit_audit import auc, parse_config
from spanrl.cli import main
from spanrl.errors import ConfigError

# task t1, two calls each: (first call good?, second call good?, reward)
EPISODES = {"a": (True, True, 1.0), "b": (False, True, 1.0), "c": (True, False, 0.0), "d": (False, False, 0.0)}


def _deliver_labelled(collector: Any) -> None:
    rec = H.Recorder()
    for rid, (first, second, reward) in EPISODES.items():
        r = H.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        r.call(root, 10, [1, 2], [5], attributes={sc.LABEL_GOOD: first})
        if rid != "d":
            r.call(root, 30, [1, 2, 5, 9], [7], attributes={sc.LABEL_GOOD: second})
        else:  # labelled afterwards, by a span of the rollout that names the call's response id
            r.call(root, 30, [1, 2, 5, 9], [7])
            H.Recorder.span(r.agent, "label", start_ns=H._ns(50), parent=root,
                            attributes={sc.GEN_AI_RESPONSE_ID: "chatcmpl-d-2", sc.LABEL_GOOD: second})
        r.reward(root, 90, reward)
    e = H.Rollout(rec, "e", task_id="t2")  # unlabelled, alone in its task: advantage 0, not scored
    e.call(e.root(0, 100), 10, [1, 2], [5])
    e.reward(None, 90, 1.0)
    H.deliver(collector, rec.spans())


def test_audit_prints_auc_sign_errors_and_step_correlations(collector: Any, capsys: Any) -> None:
    _deliver_labelled(collector)
    collector.shutdown()  # the file is free: the audit opens it read-only
    db = collector.config.db_path
    rc = main(["credit", "audit", db, "--config", "mode=identical,scale_std=false",
               "--config", "mode=discounted,gamma=0.5,scale_std=false"])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    # identical: R - 0.5 on both calls: a, b +0.5, c, d -0.5. good [a0, a1, b1, c0] = [.5, .5, .5, -.5],
    # bad [b0, c1, d0, d1] = [.5, -.5, -.5, -.5]: each good .5 beats 3 and ties 1 (3.5), c0 ties 3 (1.5):
    # AUC 12 / 16. The one bad call of a successful episode (b0, +0.5) is a sign error. Step 0: labels
    # [1, 0, 1, 0] against [.5, .5, -.5, -.5]: r = 0; step 1: [1, 1, 0, 0] against the same: r = 1.
    # discounted 0.5: step 0 halved: good [.25, .5, .5, -.25], bad [.25, -.5, -.25, -.5]: 3.5 + 4 + 4 + 2.5 = 14
    assert out[0] == "credit audit: 9 calls, 8 labelled (4 good, 4 bad); success: episode reward > 0"
    # each arm's settings first: what it compares, so two arms that are the same math show it
    assert out[1].split()[1:] == ["compares:", "mode=identical", "scale_std=False"]
    assert out[2].split()[1:] == ["compares:", "mode=discounted", "gamma=0.5", "scale_std=False"]
    assert out[3].split() == ["config", "AUC", "sign", "errors", "r", "step", "0", "r", "step", "1"]
    assert [line.split() for line in out[4:]] == [
        ["mode=identical,scale_std=false", "0.750", "1/1", "=", "1.000", "0.000", "1.000"],
        ["mode=discounted,gamma=0.5,scale_std=false", "0.875", "1/1", "=", "1.000", "0.000", "1.000"],
    ]


def test_audit_reads_a_run_folder_and_names_a_bad_config(collector: Any, tmp_path: Path, capsys: Any) -> None:
    _deliver_labelled(collector)
    collector.shutdown()
    run = Path(collector.config.db_path).parent  # the fixture's store is tmp_path / spans.duckdb: a run folder
    assert main(["credit", "audit", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[3].split()[:2] == ["mode=identical", "0.750"]  # std-scaled: same order
    assert main(["credit", "audit", str(run), "--config", "mode=step,gama=0.9"]) == 2  # bad input: exit status 2
    assert capsys.readouterr().err.startswith("spanrl: error: --config takes FIELD=VALUE pairs of ")
    assert main(["credit", "audit", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("spanrl: error: store: no span store at")


def test_auc_counts_ties_as_half_and_needs_both_kinds() -> None:
    assert auc([1.0, 0.0], [0.0]) == 0.75 and auc([1.0], []) is None


def test_parse_config_validates_the_values() -> None:
    assert parse_config("mode=step,gamma=0.9,scale_std=false").gamma == 0.9
    with pytest.raises(ConfigError, match=r"^gamma must be a number in \[0, 1\], got 2$"):
        parse_config("gamma=2")


def test_the_audit_shows_step_signals_separating_the_bad_calls(collector: Any, capsys: Any) -> None:
    """docs/credit.md's step-signals example: four successful rollouts, the three calls whose tool spans went
    wrong labelled bad (tests/algorithms/test_step_signals.py builds them and works out the advantages)."""
    from test_step_signals import _deliver

    _deliver(collector)
    collector.shutdown()
    signals = "step_signals.tool_error=-0.2,step_signals.nonzero_exit=-0.2,step_signals.denied=-0.1," \
              "step_signals.retry=-0.1"
    assert main(["credit", "audit", collector.config.db_path, "--config", "mode=step,scale_std=false",
                 "--config", f"mode=step,scale_std=false,{signals}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "credit audit: 8 calls, 8 labelled (5 good, 3 bad); success: episode reward > 0"
    # without signals every rollout earned 1: every advantage 0, AUC 0.5 (all ties), no bad call pushed up.
    # With them: good [a1, b1, c0, d0, d1] = [.075, .075, -.15, .15, .075], bad [a0, b0, c1] = [-.05, .05, -.225]:
    # each good .075 / .15 beats all 3 bad, -.15 beats 1: 13 / 15; b0 (+.05, in a success) is the one sign error.
    # Step 0: labels [0, 0, 1, 1] against [-.05, .05, -.15, .15]: r = 0; step 1: [1, 1, 0, 1] against
    # [.075, .075, -.225, .075]: r = 1.
    assert [line.split() for line in out[4:]] == [
        ["mode=step,scale_std=false", "0.500", "0/3", "=", "0.000", "-", "-"],
        [f"mode=step,scale_std=false,{signals}", "0.867", "1/3", "=", "0.333", "0.000", "1.000"],
    ]
