"""``spanrl credit audit`` with a learned critic (``critic.*`` fields): the value head on the tiny model's hidden
states, cross-fitted over halves of the task groups, on the planted task of ``test_value_head.py`` with each call
labelled (call 0 good iff it said yes, call 1 always good: it decides nothing)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_transitions import Recorder, Rollout, deliver
from toy_task import build_model, prompt_ids
from transformers import AutoTokenizer

from spanrl import semconv as sc
from spanrl.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

GROUP = 8


def _deliver_planted(collector: Any, tok: Any, tasks: int) -> None:
    yes, no, word = (tok.convert_tokens_to_ids(w) for w in ("yes", "no", "w3"))
    turn = prompt_ids(tok, 20)[1:]
    rec, rng = Recorder(), random.Random(0)
    for task in range(1, tasks + 1):
        choices = [True] * (GROUP // 2) + [False] * (GROUP // 2)
        rng.shuffle(choices)
        for i, ok in enumerate(choices):
            r = Rollout(rec, f"t{task}-{i}", task_id=f"t{task}")
            root = r.root(0, 200)
            first = prompt_ids(tok, task)
            answer = yes if ok else no
            r.call(root, 10, first, [answer], attributes={sc.LABEL_GOOD: ok})
            r.call(root, 40, first + [answer] + turn, [word], attributes={sc.LABEL_GOOD: True})
            r.reward(root, 90, 1.0 if ok else 0.0)
    deliver(collector, rec.spans())


def test_the_learned_critic_arm_is_cross_fitted_and_separates_the_bad_calls(collector: Any, tmp_path: Path,
                                                                             capsys: Any) -> None:
    model = build_model(tmp_path / "model")
    _deliver_planted(collector, AutoTokenizer.from_pretrained(model), tasks=4)
    collector.shutdown()
    db = collector.config.db_path
    critic = "mode=identical,critic.weight=1,critic.epochs=200,critic.depth=1"
    assert main(["credit", "audit", db, "--model", str(model), "--config", "mode=identical", "--config", critic]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "credit audit: 64 calls, 64 labelled (48 good, 16 bad); success: episode reward > 0"
    assert out[2].split()[1:4] == ["compares:", "mode=identical", "critic={weight=1,"]
    rows = {line.split()[0]: line.split() for line in out[4:]}
    # identical: each bad call 0 (-1 scaled) ties with the 16 failed episodes' harmless call 1: AUC 40/48
    assert rows["mode=identical"][1] == "0.833"
    # the head, fitted on the other half's tasks, values the state after "no" below the one after "yes": the
    # GAE term moves the blame from call 1 onto call 0
    assert float(rows[critic][1]) > 0.95


def test_a_critic_arm_needs_the_model(collector: Any, capsys: Any) -> None:
    collector.shutdown()
    assert main(["credit", "audit", collector.config.db_path, "--config", "critic.weight=1"]) == 2
    assert "--model: a config with a critic needs the policy's model folder" in capsys.readouterr().err
