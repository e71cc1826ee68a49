"""Reward helpers: the LLM judge through an OpenAI-compatible server, shaping, and the weight grid search."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from spanrl.instrumentation.rewards import (
    JudgeConfig,
    LLMJudge,
    agreement_evaluator,
    combine_rewards,
    grid_search_weights,
    potential_shaping,
    shaped_reward,
    spearman,
)
from spanrl.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import FakeOpenAI  # noqa: E402


def _grader(body):
    """A scripted judge: full marks when the answer matches the reference, else 2/10."""
    user = body["messages"][-1]["content"]
    answer = user.split("ANSWER:\n", 1)[1].split("\n\n", 1)[0]
    reference = user.split("REFERENCE:\n", 1)[1] if "REFERENCE:" in user else None
    return "Score: 10\nExact." if answer == reference else "Score: 2\nWrong."


def test_judge_scores_through_an_openai_compatible_server():
    with FakeOpenAI(reply=_grader) as server:
        judge = LLMJudge(JudgeConfig(model="grader", base_url=server.base_url, api_key="k"))
        good = judge.score("What is 2+2?", "4", reference="4")
        bad = judge.score("What is 2+2?", "5", reference="4")
        sent = server.requests[0].body
    assert (good.value, good.score, good.parsed) == (1.0, 10.0, True)
    assert bad.value == pytest.approx(0.2)
    assert sent["model"] == "grader" and sent["temperature"] == 0.0
    assert "REFERENCE answer" in sent["messages"][0]["content"]


def test_judge_uses_fallback_when_the_verdict_has_no_score():
    with FakeOpenAI(reply="I refuse to grade this.") as server:
        judge = LLMJudge(JudgeConfig(base_url=server.base_url, fallback_value=0.5))
        result = judge.score("q", "a")
    assert (result.value, result.score, result.parsed) == (0.5, None, False)


def test_judge_clips_scores_to_the_unit_interval():
    with FakeOpenAI(reply="Score: 14/10, generous") as server:
        assert LLMJudge(JudgeConfig(base_url=server.base_url))("q", "a") == 1.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("scale_max", 0, "JudgeConfig.scale_max must be > 0, got 0"),
        ("fallback_value", 2.0, "JudgeConfig.fallback_value must be in [0, 1], got 2.0"),
        ("model", "", "JudgeConfig.model must be a non-empty string, got ''"),
        ("max_tokens", 0, "JudgeConfig.max_tokens must be >= 1, got 0"),
    ],
)
def test_judge_config_rejects_bad_fields(field, value, message):
    JudgeConfig().validate()
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        JudgeConfig(**{field: value}).validate()


def test_combine_rewards_weights_components_and_names_missing_ones():
    assert combine_rewards({"exec": 1.0, "format": 0.5}, {"exec": 1.0, "format": 0.2}) == pytest.approx(1.1)
    with pytest.raises(ConfigError, match=r"\['judge'\] have weights but no value"):
        combine_rewards({"exec": 1.0}, {"exec": 1.0, "judge": 0.5})
    with pytest.raises(ConfigError, match="'exec' must be finite"):
        combine_rewards({"exec": math.nan}, {"exec": 1.0})


def test_potential_shaping_telescopes_to_final_minus_initial_potential():
    potentials = [0.0, 0.5, 0.25, 1.0]
    shaping = potential_shaping(potentials)
    assert shaping == [0.5, -0.25, 0.75]
    assert sum(shaping) == pytest.approx(potentials[-1] - potentials[0])
    assert potential_shaping([0.0, 1.0], gamma=0.5) == [0.5]
    with pytest.raises(ConfigError, match="gamma must be in"):
        potential_shaping([0.0, 1.0], gamma=0.0)


def test_shaped_reward_adds_weighted_intermediate_rewards_and_clips():
    assert shaped_reward(1.0, [0.2, 0.0, 0.5], shaping_weight=0.1) == pytest.approx(1.07)
    assert shaped_reward(0.0, [1.0, 1.0], shaping_weight=0.5, clip=(0.0, 0.8)) == 0.8
    with pytest.raises(ConfigError, match="shaping_weight must be >= 0"):
        shaped_reward(1.0, [1.0], shaping_weight=-1)


def test_spearman_matches_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)  # scipy.stats.spearmanr
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_grid_search_finds_the_weighting_that_agrees_with_outcomes():
    # "format" is noise; the label follows "exec" plus a little of "steps".
    components = [{"exec": e, "steps": s, "format": f}
                  for e, s, f in [(0, 0.1, 1), (0, 0.9, 0), (1, 0.2, 1), (1, 0.8, 0), (0, 0.5, 1), (1, 0.4, 0)]]
    labels = [c["exec"] + 0.3 * c["steps"] for c in components]
    grid = {"exec": [1.0], "steps": [0.0, 0.3, 3.0], "format": [0.0, 1.0]}
    result = grid_search_weights(grid, agreement_evaluator(components, labels))
    assert result.best_weights == {"exec": 1.0, "steps": 0.3, "format": 0.0}
    assert result.best_score == pytest.approx(1.0)
    assert len(result.table) == 6 and result.table[-1][1] <= result.table[0][1]
    assert "score" in result.format(top=2)


def test_grid_search_rejects_empty_and_huge_grids():
    with pytest.raises(ConfigError, match="grid must name at least one"):
        grid_search_weights({}, lambda w: 0.0)
    with pytest.raises(ConfigError, match=r"grid\['a'\] must list at least one weight"):
        grid_search_weights({"a": []}, lambda w: 0.0)
    with pytest.raises(ConfigError, match="more than 10000"):
        grid_search_weights({k: list(range(11)) for k in "abcd"}, lambda w: 0.0)
