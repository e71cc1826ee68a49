"""APO: critique-and-edit beam search against a scripted critic served locally over HTTP."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from spanrl.algorithms.apo import APO, APOConfig, Evaluation
from spanrl.errors import ConfigError, TrainingError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import FakeOpenAI  # noqa: E402

HINTS = ["Think step by step.", "Answer with a number only.", "Check your arithmetic."]


def scripted_critic(body: dict) -> str:
    """Critiques name the first hint the template lacks; edits append it (a deterministic 'LLM')."""
    prompt = body["messages"][-1]["content"]
    template = re.search(r"<template>\n(.*?)\n</template>", prompt, re.DOTALL).group(1)
    missing = [h for h in HINTS if h not in template]
    if "Wrap your answer in <critique>" in prompt:
        return f"<critique>Add the instruction: {missing[0] if missing else 'nothing'}</critique>"
    critique = re.search(r"<critique>\n(.*?)\n</critique>", prompt, re.DOTALL).group(1)
    hint = critique.removeprefix("Add the instruction: ")
    return (f"Here it is:\n<template>{template} {hint}</template>" if hint in HINTS
            else f"<template>{template}</template>")


def score(template: str) -> Evaluation:
    """Stands in for scoring by rollouts: each hint present solves a third of the tasks."""
    solved = sum(h in template for h in HINTS)
    return Evaluation(score=solved / len(HINTS),
                      examples=[f"task {i}: wrong answer (reward 0)" for i in range(3 - solved)])


def test_apo_improves_the_template_score() -> None:
    with FakeOpenAI(reply=scripted_critic) as critic:
        apo = APO(critic_base_url=critic.base_url, critic_model="scripted", beam_width=2, branch_factor=2, rounds=3)
        result = apo.optimize("Solve: {question}", score)
    assert result.initial_score == 0.0
    assert result.best_score == 1.0
    assert result.best_template.startswith("Solve: {question}") and all(h in result.best_template for h in HINTS)
    assert [e["status"] for e in result.history][0] == "initial"
    # the critic saw the score and the failing examples (the textual gradient's input)
    first = critic.requests[0].body["messages"][0]["content"]
    assert "0.0000" in first and "task 0: wrong answer" in first
    assert critic.requests[0].body["model"] == "scripted"


def test_edit_that_drops_a_placeholder_is_rejected(tmp_path: Path) -> None:
    with FakeOpenAI(reply=lambda body: "<critique>x</critique>" if "critique>." in body["messages"][0]["content"]
                    else "<template>no fields</template>") as critic:
        result = APO(critic_base_url=critic.base_url, rounds=1, branch_factor=2, beam_width=1).optimize("Q: {question}",
                                                                                                        lambda t: 0.5)
    assert result.best_template == "Q: {question}" and result.best_score == 0.5
    assert [e["status"] for e in result.history[1:]] == ["rejected: placeholders changed"] * 2
    result.save(tmp_path / "apo.json")
    assert json.loads((tmp_path / "apo.json").read_text())["best_template"] == "Q: {question}"


def test_unreachable_critic_names_the_url() -> None:
    apo = APO(critic_base_url="http://127.0.0.1:9/v1", rounds=1, timeout_s=2.0)
    with pytest.raises(TrainingError, match=r"critic request to http://127.0.0.1:9/v1/? failed"):
        apo.optimize("Q: {question}", lambda t: 0.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"beam_width": 0}, "beam_width must be a positive integer, got 0"),
        ({"critic_base_url": "localhost:8000"}, "critic_base_url must be an http\\(s\\) URL, got 'localhost:8000'"),
        ({"critic_temperature": -1.0}, "critic_temperature must be >= 0, got -1.0"),
        ({"max_examples": True}, "max_examples must be a non-negative integer, got True"),
    ],
)
def test_bad_config_names_the_field(fields: dict, message: str) -> None:
    assert APOConfig().validate().rounds == 3
    with pytest.raises(ConfigError, match=message):
        APO(**fields)
