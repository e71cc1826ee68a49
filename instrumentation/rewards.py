"""Reward helpers for agents: an LLM-as-judge reward through any OpenAI-compatible model, reward shaping
with intermediate rewards, and a reward-weight grid search.

Agent side: nothing here imports torch; the judge needs only the ``openai`` client.

    judge = LLMJudge(JudgeConfig(model="gpt-4o-mini", base_url="http://judge:8000/v1"))
    result = judge.score("What is 2+2?", "4", reference="4")      # JudgeResult(value=1.0, ...)
    spanrl.emit_reward(result.value)

    total = shaped_reward(outcome=1.0, step_rewards=[0.2, 0.0, 0.5], shaping_weight=0.1)

    best = grid_search_weights({"exec": [1.0], "format": [0.0, 0.1, 0.3]},
                               agreement_evaluator(components, labels))
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spanrl.errors import ConfigError, positive_number

__all__ = [
    "GridSearchResult",
    "JudgeConfig",
    "JudgeResult",
    "LLMJudge",
    "agreement_evaluator",
    "combine_rewards",
    "default_judge_config",
    "grid_search_weights",
    "potential_shaping",
    "shaped_reward",
    "spearman",
]

_logger = logging.getLogger(__name__)

_DEFAULT_RUBRIC = (
    "You are a strict grader. Rate how well the ANSWER answers the QUESTION"
    "{reference_clause} on a scale from 0 (wrong or useless) to {scale_max:g} (fully correct). "
    "Reply with 'Score: N' on the first line, then one sentence of explanation."
)
_REFERENCE_CLAUSE = ", given the REFERENCE answer,"
_SCORE_PATTERN = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_PATTERN = re.compile(r"-?\d+(?:\.\d+)?")
_DEFAULT_JUDGE_TIMEOUT_S = 60.0
_MAX_GRID_POINTS = 10_000


# --- LLM as judge --------------------------------------------------------------------------------------
@dataclass
class JudgeConfig:
    """How to reach the judge model and read its verdict."""

    model: str = "judge"
    """Model name sent to the judge's OpenAI-compatible endpoint."""
    base_url: str | None = None
    """Endpoint (``.../v1``); None: ``OPENAI_BASE_URL``."""
    api_key: str | None = None
    """None: ``OPENAI_API_KEY``, else a placeholder (local servers ignore it)."""
    rubric: str = _DEFAULT_RUBRIC
    """System prompt; may use ``{scale_max}`` and ``{reference_clause}``."""
    scale_max: float = 10.0
    """Top of the judge's score scale; the reward is score / scale_max, clipped to [0, 1]."""
    temperature: float = 0.0
    """Sampling temperature of the judge (0: as deterministic as the server allows)."""
    max_tokens: int = 64
    """Longest verdict read."""
    timeout_s: float = _DEFAULT_JUDGE_TIMEOUT_S
    """Per-request timeout."""
    fallback_value: float = 0.0
    """Reward when the verdict holds no score (logged as a warning, ``JudgeResult.parsed`` False)."""

    def validate(self) -> JudgeConfig:
        if not self.model:
            raise ConfigError(f"JudgeConfig.model must be a non-empty string, got {self.model!r}")
        positive_number("JudgeConfig.scale_max", self.scale_max)
        if not 0.0 <= self.fallback_value <= 1.0:
            raise ConfigError(f"JudgeConfig.fallback_value must be in [0, 1], got {self.fallback_value!r}")
        if self.max_tokens < 1:
            raise ConfigError(f"JudgeConfig.max_tokens must be >= 1, got {self.max_tokens!r}")
        positive_number("JudgeConfig.timeout_s", self.timeout_s)
        positive_number("JudgeConfig.temperature", self.temperature, allow_zero=True)
        return self


def default_judge_config() -> JudgeConfig:
    """A new default config (judge at ``OPENAI_BASE_URL``)."""
    return JudgeConfig()


@dataclass(frozen=True)
class JudgeResult:
    """One verdict: ``value`` in [0, 1] is the reward; ``raw`` the judge's text."""

    value: float
    score: float | None
    raw: str
    parsed: bool


def parse_score(text: str) -> float | None:
    """The score in a verdict: the number after 'Score', else the first number; None if none."""
    match = _SCORE_PATTERN.search(text) or _NUMBER_PATTERN.search(text)
    return float(match.group(1) if match.re is _SCORE_PATTERN else match.group(0)) if match else None


class LLMJudge:
    """Scores answers with any OpenAI-compatible chat model. Thread-safe (one client, no state)."""

    def __init__(self, config: JudgeConfig | None = None, *, client: Any = None) -> None:
        self.config = (config or default_judge_config()).validate()
        if client is None:
            from openai import OpenAI

            client = OpenAI(
                base_url=self.config.base_url or os.environ.get("OPENAI_BASE_URL"),
                api_key=self.config.api_key or os.environ.get("OPENAI_API_KEY") or "spanrl",
                timeout=self.config.timeout_s,
            )
        self._client = client

    def messages(self, question: str, answer: str, reference: str | None = None) -> list[dict[str, str]]:
        """The conversation sent to the judge."""
        cfg = self.config
        system = cfg.rubric.format(scale_max=cfg.scale_max, reference_clause=_REFERENCE_CLAUSE if reference else "")
        user = f"QUESTION:\n{question}\n\nANSWER:\n{answer}"
        if reference is not None:
            user += f"\n\nREFERENCE:\n{reference}"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def score(self, question: str, answer: str, *, reference: str | None = None) -> JudgeResult:
        """Ask the judge; the reward is its score scaled to [0, 1]."""
        cfg = self.config
        reply = self._client.chat.completions.create(
            model=cfg.model,
            messages=self.messages(question, answer, reference),
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
        )
        raw = reply.choices[0].message.content or ""
        score = parse_score(raw)
        if score is None:
            _logger.warning("judge reply holds no score; using fallback_value %.3f: %r", cfg.fallback_value, raw[:200])
            return JudgeResult(cfg.fallback_value, None, raw, False)
        return JudgeResult(min(1.0, max(0.0, score / cfg.scale_max)), score, raw, True)

    def __call__(self, question: str, answer: str, *, reference: str | None = None) -> float:
        return self.score(question, answer, reference=reference).value


# --- Shaping --------------------------------------------------------------------------------------------
def combine_rewards(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Weighted sum of named reward components. Every weighted name must be present."""
    missing = sorted(set(weights) - set(components))
    if missing:
        raise ConfigError(f"reward components {missing} have weights but no value (got {sorted(components)})")
    total = 0.0
    for name, weight in weights.items():
        value = float(components[name])
        if not math.isfinite(value):
            raise ConfigError(f"reward component {name!r} must be finite, got {value!r}")
        total += weight * value
    return total


def potential_shaping(potentials: Sequence[float], *, gamma: float = 1.0) -> list[float]:
    """Potential-based shaping rewards ``F_t = gamma * phi(s_{t+1}) - phi(s_t)`` for a trajectory whose
    states have potentials ``phi(s_0) .. phi(s_T)`` (T+1 values give T rewards).

    With gamma 1 they sum to ``phi(s_T) - phi(s_0)``: shaping of this form leaves the optimal policy
    unchanged (Ng, Harada, Russell 1999, "Policy invariance under reward transformations").
    """
    if not 0.0 < gamma <= 1.0:
        raise ConfigError(f"gamma must be in (0, 1], got {gamma!r}")
    if len(potentials) < 1:
        raise ConfigError("potentials must hold at least one value (the initial state's)")
    return [gamma * potentials[t + 1] - potentials[t] for t in range(len(potentials) - 1)]


def shaped_reward(outcome: float, step_rewards: Sequence[float] = (), *, shaping_weight: float = 0.1,
                  clip: tuple[float, float] | None = None) -> float:
    """Episode reward = outcome + shaping_weight * sum(intermediate step rewards), optionally clipped.

    Intermediate rewards (a tool call that ran, a sub-goal reached) give a weak policy a gradient before
    it ever solves the task; keep ``shaping_weight`` small so they never outweigh the outcome.
    """
    positive_number("shaping_weight", shaping_weight, allow_zero=True)
    total = float(outcome) + shaping_weight * float(sum(step_rewards))
    if clip is not None:
        low, high = clip
        if low > high:
            raise ConfigError(f"clip must be (low, high) with low <= high, got {clip!r}")
        total = min(high, max(low, total))
    return total


# --- Reward-weight grid search ------------------------------------------------------------------------
@dataclass
class GridSearchResult:
    """Every weight setting tried with its score, best first."""

    best_weights: dict[str, float]
    best_score: float
    table: list[tuple[dict[str, float], float]] = field(default_factory=list)

    def format(self, top: int = 10) -> str:
        """A small text table of the best ``top`` settings."""
        lines = [f"{'score':>8}  weights"]
        lines += [f"{score:8.4f}  {weights}" for weights, score in self.table[:top]]
        return "\n".join(lines)


def grid_search_weights(grid: Mapping[str, Sequence[float]],
                        evaluate: Callable[[dict[str, float]], float]) -> GridSearchResult:
    """Try every combination of the weights in ``grid`` and keep the one ``evaluate`` scores highest.

    ``evaluate(weights)`` can be cheap (agreement of the weighted reward with labelled outcomes, see
    ``agreement_evaluator``) or expensive (a short training run returning validation accuracy). Ties keep
    the first setting in grid order. A NaN score ranks last.
    """
    if not grid:
        raise ConfigError("grid must name at least one reward component")
    for name, values in grid.items():
        if len(values) == 0:
            raise ConfigError(f"grid[{name!r}] must list at least one weight")
    n_points = math.prod(len(v) for v in grid.values())
    if n_points > _MAX_GRID_POINTS:
        raise ConfigError(f"grid has {n_points} points, more than {_MAX_GRID_POINTS}; narrow it")
    names = list(grid)
    table: list[tuple[dict[str, float], float]] = []
    for combo in itertools.product(*(grid[n] for n in names)):
        weights = {n: float(w) for n, w in zip(names, combo)}
        score = float(evaluate(weights))
        table.append((weights, score))
    ranked = sorted(table, key=lambda item: -math.inf if math.isnan(item[1]) else item[1], reverse=True)
    # sorted(reverse=True) is still stable: ties keep grid order
    return GridSearchResult(ranked[0][0], ranked[0][1], ranked)


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (ties get average ranks); NaN when either side is constant."""
    if len(x) != len(y) or len(x) < 2:
        raise ConfigError(f"spearman needs two sequences of the same length >= 2, got {len(x)} and {len(y)}")
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else math.nan


def agreement_evaluator(components: Sequence[Mapping[str, float]],
                        labels: Sequence[float]) -> Callable[[dict[str, float]], float]:
    """An ``evaluate`` for ``grid_search_weights``: Spearman correlation between the weighted reward of
    each logged sample and its label (a human grade, or whether the episode finally succeeded)."""
    if len(components) != len(labels):
        raise ConfigError(f"components ({len(components)}) and labels ({len(labels)}) must have the same length")

    def evaluate(weights: dict[str, float]) -> float:
        return spearman([combine_rewards(c, weights) for c in components], [float(v) for v in labels])

    return evaluate
