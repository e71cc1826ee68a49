"""APO: automatic prompt optimisation by textual gradients and beam search
(Pryzant et al. 2023, "Automatic Prompt Optimization with 'Gradient Descent' and Beam Search",
arXiv 2305.03495; the APO algorithm of Agent Lightning).

No weights change: the thing trained is the agent's prompt *template*. Each round, for every template
in the beam, a critic LLM (any OpenAI-compatible endpoint) writes ``branch_factor`` critiques of it
from its score and sample outcomes (the "textual gradient"), then applies each critique as an edit
(the "step"). Every new template is scored by the caller's ``score(template)`` (the Trainer scores by
rollouts), and the best ``beam_width`` of old and new survive::

    apo = APO(critic_base_url="http://127.0.0.1:8000/v1", critic_model="gpt-4o-mini", rounds=3)
    result = apo.optimize("Answer the question: {question}", score)
    result.best_template, result.best_score

``score`` returns a float, or an :class:`Evaluation` with example outcomes (failures the critic should
see). An edit that drops or adds a ``{placeholder}`` of the template is rejected, not scored.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import string
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from spanrl.errors import ConfigError, TrainingError, non_negative_int, positive_int, positive_number

__all__ = ["APO", "APOConfig", "APOResult", "Evaluation"]

_logger = logging.getLogger(__name__)
_TEMPLATE_RE = re.compile(r"<template>(.*?)</template>", re.DOTALL)
_CRITIQUE_RE = re.compile(r"<critique>(.*?)</critique>", re.DOTALL)

GRADIENT_PROMPT = """I am optimising a prompt template for an AI agent.
The current template is:
<template>
{template}
</template>
Scored on tasks, it reached {score:.4f} (higher is better).
{examples}
Give one specific reason why this template falls short, and how it should change.
Wrap your answer in <critique></critique>."""

EDIT_PROMPT = """I am optimising a prompt template for an AI agent.
The current template is:
<template>
{template}
</template>
A critique of it:
<critique>
{critique}
</critique>
Write an improved template that follows the critique. Keep these placeholders exactly: {placeholders}.
Answer with the new template only, between <template> and </template>."""


@dataclasses.dataclass
class APOConfig:
    """APO hyperparameters and the critic endpoint."""

    critic_base_url: str | None = None
    """OpenAI-compatible base URL (ending in ``/v1``) of the critic; None = ``OPENAI_BASE_URL``."""
    critic_model: str = "gpt-4o-mini"
    """Model name sent to the critic."""
    critic_api_key: str | None = None
    """API key of the critic; None = ``OPENAI_API_KEY`` (or a placeholder for local servers)."""
    beam_width: int = 2
    """Templates kept after each round."""
    branch_factor: int = 2
    """Critique-and-edit children per template per round."""
    rounds: int = 3
    """Rounds of expansion."""
    critic_temperature: float = 1.0
    """Sampling temperature of the critic (children of one parent differ)."""
    max_examples: int = 4
    """Example outcomes shown to the critic per template."""
    timeout_s: float = 120.0
    """Timeout of one critic request in seconds."""

    def validate(self) -> APOConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        for name in ("beam_width", "branch_factor", "rounds"):
            positive_int(name, getattr(self, name))
        non_negative_int("max_examples", self.max_examples)
        positive_number("critic_temperature", self.critic_temperature, allow_zero=True)
        positive_number("timeout_s", self.timeout_s)
        if not self.critic_model:
            raise ConfigError("critic_model must name the critic's model")
        if self.critic_base_url is not None and not self.critic_base_url.startswith(("http://", "https://")):
            raise ConfigError(f"critic_base_url must be an http(s) URL, got {self.critic_base_url!r}")
        return self


@dataclasses.dataclass
class Evaluation:
    """What ``score(template)`` may return instead of a float: the score and outcomes to show the critic."""

    score: float
    """Mean reward of the template (higher is better)."""
    examples: Sequence[str] = ()
    """Short textual outcomes, e.g. ``"task: 3 add 4 -> answered 8 (reward 0)"``; failures help most."""


@dataclasses.dataclass
class APOResult:
    """The outcome of :meth:`APO.optimize`."""

    best_template: str
    best_score: float
    initial_score: float
    history: list[dict[str, Any]]
    """One entry per scored or rejected template: round, template, score, parent, critique, status."""

    def save(self, path: Path) -> None:
        """Write the result as JSON."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2))


ScoreFn = Callable[[str], "float | Evaluation"]


def placeholders(template: str) -> set[str]:
    """The ``{name}`` fields of a ``str.format`` template."""
    try:
        return {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError as exc:
        raise ConfigError(f"template is not a valid str.format template: {exc}") from None


class APO:
    """Prompt-template optimisation by critique and beam search; see the module docstring.

    ``APO(APOConfig(...))`` or ``APO(critic_base_url=..., rounds=...)`` with :class:`APOConfig` fields.
    """

    config_class: ClassVar[type] = APOConfig

    def __init__(self, config: APOConfig | None = None, **fields: Any) -> None:
        config = config or APOConfig()
        try:
            config = dataclasses.replace(config, **fields)
        except TypeError as exc:
            raise ConfigError(f"APO got an unknown config field: {exc}") from None
        self.config = config.validate()
        self._client: Any = None

    # --- the critic -------------------------------------------------------------------------------
    def _chat(self, prompt: str) -> str:
        if self._client is None:
            from openai import OpenAI

            base_url = self.config.critic_base_url or os.environ.get("OPENAI_BASE_URL")
            if not base_url:
                raise ConfigError("critic_base_url is not set and OPENAI_BASE_URL is empty: APO needs a critic LLM")
            api_key = self.config.critic_api_key or os.environ.get("OPENAI_API_KEY") or "spanrl-apo"
            self._client = OpenAI(base_url=base_url, api_key=api_key, timeout=self.config.timeout_s, max_retries=2)
        try:
            response = self._client.chat.completions.create(
                model=self.config.critic_model,
                messages=[{"role": "user", "content": prompt}],
                temperature=self.config.critic_temperature,
            )
        except Exception as exc:  # the openai client's errors: connection, status, timeout
            raise TrainingError(f"APO critic request to {self._client.base_url} failed: {exc}") from exc
        return response.choices[0].message.content or ""

    def critique(self, template: str, evaluation: Evaluation) -> str:
        """The textual gradient: why ``template`` scored as it did and what to change."""
        shown = list(evaluation.examples)[: self.config.max_examples]
        examples = "Sample outcomes:\n" + "\n".join(f"- {e}" for e in shown) if shown else ""
        reply = self._chat(GRADIENT_PROMPT.format(template=template, score=evaluation.score, examples=examples))
        match = _CRITIQUE_RE.search(reply)
        return (match.group(1) if match else reply).strip()

    def edit(self, template: str, critique: str) -> str:
        """Apply a critique: the critic's rewritten template."""
        names = ", ".join(f"{{{n}}}" for n in sorted(placeholders(template))) or "(none)"
        reply = self._chat(EDIT_PROMPT.format(template=template, critique=critique, placeholders=names))
        match = _TEMPLATE_RE.search(reply)
        return (match.group(1) if match else reply).strip()

    # --- beam search ------------------------------------------------------------------------------
    def optimize(self, template: str, score: ScoreFn) -> APOResult:
        """Beam search from ``template``; returns the best template found and the full history."""
        cfg = self.config
        required = placeholders(template)
        cache: dict[str, Evaluation] = {}

        def evaluate(candidate: str) -> Evaluation:
            if candidate not in cache:
                value = score(candidate)
                result = value if isinstance(value, Evaluation) else Evaluation(score=float(value))
                if result.score != result.score:  # NaN
                    raise TrainingError(f"score(template) returned NaN for {candidate!r}")
                cache[candidate] = result
            return cache[candidate]

        started = time.perf_counter()
        initial = evaluate(template)
        history: list[dict[str, Any]] = [
            {"round": 0, "template": template, "score": initial.score, "parent": None, "critique": None,
             "status": "initial"}
        ]
        beam = [template]
        for round_ in range(1, cfg.rounds + 1):
            children: list[str] = []
            for parent in beam:
                for _ in range(cfg.branch_factor):
                    critique = self.critique(parent, cache[parent])
                    child = self.edit(parent, critique)
                    entry = {"round": round_, "template": child, "parent": parent, "critique": critique}
                    if not child or placeholders_safe(child) != required:
                        history.append({**entry, "score": None, "status": "rejected: placeholders changed"})
                        continue
                    if child in cache or child in children:
                        known = cache[child].score if child in cache else None
                        history.append({**entry, "score": known, "status": "duplicate"})
                        continue
                    children.append(child)
                    history.append({**entry, "score": evaluate(child).score, "status": "scored"})
            pool = list(dict.fromkeys(beam + children))
            beam = sorted(pool, key=lambda t: cache[t].score, reverse=True)[: cfg.beam_width]
            _logger.info("APO round %d: best %.4f (%d new templates)", round_, cache[beam[0]].score, len(children))
        best = beam[0]
        _logger.info("APO: %.4f -> %.4f in %.1f s", initial.score, cache[best].score, time.perf_counter() - started)
        return APOResult(best_template=best, best_score=cache[best].score, initial_score=initial.score, history=history)


def placeholders_safe(template: str) -> set[str] | None:
    """:func:`placeholders`, or None when the critic's text is not a valid template."""
    try:
        return placeholders(template)
    except ConfigError:
        return None
