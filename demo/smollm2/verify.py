"""The calc-verify task: the calculator tool agent (:mod:`~spanrl.demo.smollm2.tools`) with recoverable
mistakes, where per-call credit has something to assign.

The model gets the tool task's question, tools and solved examples. A final answer is checked: a wrong
one is rejected with one fixed message (``REJECTION``) and the rejected attempt is dropped from the
history (its answer and any tool calls before it), so the conversation after a rejection is the shots,
the question and ``REJECTION``: every rejected rollout of a task observes one state, the state GiGPO
groups by. At most ``MAX_CALLS`` LLM calls and ``MAX_ANSWERS`` answers; the reward is
``1[right] * DECAY ** max(0, calls - 2)`` (``episode_reward``): right first time with one tool call
scores 1, a recovery after a rejection 0.6 or less.

What the environment knows goes on the spans (docs/conventions.md):

- ``spanrl.state.id`` (``state_id``): the state each call observed, a hash of the conversation after the
  shots (tool-call ids left out). It sits on the span of what the environment did before the next call:
  each ``execute_tool`` span of a tool the model called, and the ``execute_tool check_answer`` span of a
  rejection (the check is the environment's step; it is not a tool the model can call).
- ``spanrl.label.good`` (credit audit ground truth, never a reward): a tool call is good iff one of its
  tools returns the answer; an answer iff it is right. On a ``label`` span naming the call's response id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from spanrl.demo.smollm2.tools import (SHOT_TRIPLES, SHOTS, TOOLS, make_tasks, reward, run_tool, shot_keys,
                                      solved_episode)

__all__ = ["CHECK_TOOL", "DECAY", "Episode", "MAX_ANSWERS", "MAX_CALLS", "Outcome", "RECOVERIES_SENT",
           "RECOVERY_SHOTS", "RECOVERY_TRIPLES", "REJECTION", "REQUEST_TIMEOUT_S", "agent", "episode_reward", "shots",
           "split", "state_id"]

REJECTION = "That answer is wrong. Use one of the tools."
MAX_CALLS = 4
MAX_ANSWERS = 2
DECAY = 0.6
"""Reward factor per LLM call beyond two (one tool call and the answer)."""
REQUEST_TIMEOUT_S = 3600.0
"""The agent's timeout per LLM request (the server batches up to 64 rollouts' calls: minutes each on busy cores)."""
CHECK_TOOL = "check_answer"
"""Name of the ``execute_tool`` span recording a rejection (the environment's check, carrying its state)."""
RECOVERY_TRIPLES = (("subtract", 62, 27), ("multiply", 19, 36), ("add", 45, 38))
"""The (operation, a, b) of each solved recovery in ``RECOVERY_SHOTS``: never a task."""
RECOVERY_QUESTIONS = (None, None, "How much is {a} plus {b}?")
"""Each recovery's question: None for the shots' plain symbols, else a task's phrasing (``tools.PHRASINGS``)."""
RECOVERIES_SENT = 3
"""How many of ``RECOVERY_SHOTS`` the agent sends after the tool task's shots. Without one SmolLM2 answered
again in its head after a rejection (P(tool call | rejection) 0.011 of 88, temperature 1, 100 tasks; with one
0.279 of 86, rejected-then-right 0.10; with two 0.234 and 0.10 on 200 tasks; with three 0.425 and 0.22 on 100:
examples/smollm2/README.md, ``verify_probe.py``)."""


def _recovery_shot(k: int) -> list[dict[str, Any]]:
    op, a, b = RECOVERY_TRIPLES[k]
    solved = solved_episode(op, a, b, len(SHOT_TRIPLES) + k)
    question = solved[0] if RECOVERY_QUESTIONS[k] is None else {
        "role": "user", "content": RECOVERY_QUESTIONS[k].format(a=a, b=b)}
    return [question, {"role": "user", "content": REJECTION}, *solved[1:]]


RECOVERY_SHOTS: list[list[dict[str, Any]]] = [_recovery_shot(k) for k in range(len(RECOVERY_TRIPLES))]
"""Solved recoveries: the question, ``REJECTION`` (the wrong answer dropped, as the environment drops it), a
tool call, its result, the answer."""


def shots(recovery: int = 0) -> list[dict[str, Any]]:
    """The solved examples sent before the question: the tool task's three, then the first ``recovery`` of
    ``RECOVERY_SHOTS``."""
    if not 0 <= recovery <= len(RECOVERY_SHOTS):
        raise ValueError(f"recovery must be 0 to {len(RECOVERY_SHOTS)} (solved recoveries), got {recovery!r}")
    return [*SHOTS, *(m for shot in RECOVERY_SHOTS[:recovery] for m in shot)]


def episode_reward(right: bool, calls: int) -> float:
    """``1[right] * DECAY ** max(0, calls - 2)``."""
    return DECAY ** max(0, calls - 2) if right else 0.0


def state_id(visible: list[dict[str, Any]]) -> str:
    """The state a call observes: a hash of the conversation after the shots, tool-call ids left out (they
    differ between rollouts that made the same calls)."""
    def plain(m: dict[str, Any]) -> dict[str, Any]:
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for c in m.get("tool_calls") or ()]
        return {"role": m["role"], "content": m.get("content"), "calls": calls}

    text = json.dumps([plain(m) for m in visible], sort_keys=True)
    return "calc-verify:" + hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Outcome:
    """What the environment did with one LLM call."""

    good: bool
    """The call's label: a tool call that returns the answer, or a right answer."""
    results: list[tuple[dict[str, Any], str]]
    """Each tool call of the reply and its result (empty for an answer)."""
    rejected: bool = False
    state: str | None = None
    """The state the next call observes; None when the episode is over."""


class Episode:
    """One calc-verify episode as a state machine: ``messages`` to send, ``step`` with each reply."""

    def __init__(self, task: dict[str, Any], *, recovery: int = RECOVERIES_SENT) -> None:
        self.task, self.shots = task, shots(recovery)
        self.start = [*self.shots, {"role": "user", "content": task["question"]}]
        self.messages = list(self.start)
        self.calls = self.answers = self.rejections = 0
        self.right = self.done = False

    @property
    def reward(self) -> float:
        return episode_reward(self.right, self.calls)

    def state(self) -> str:
        return state_id(self.messages[len(self.shots):])

    def step(self, content: str | None, tool_calls: list[dict[str, Any]]) -> Outcome:
        """Take the reply (text, OpenAI ``tool_calls`` dicts): run its tools, or check its answer."""
        if self.done:
            raise RuntimeError("step() after the episode ended")
        self.calls += 1
        if tool_calls:
            results = [(c, run_tool(c["function"]["name"], c["function"]["arguments"])) for c in tool_calls]
            self.messages.append({"role": "assistant", "content": content, "tool_calls": tool_calls})
            self.messages += [{"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in results]
            self.done = self.calls >= MAX_CALLS
            good = any(r == self.task["answer"] for _, r in results)
            return Outcome(good, results, state=None if self.done else self.state())
        self.answers += 1
        self.right = reward(content or "", self.task["answer"]) == 1.0
        if self.right or self.answers >= MAX_ANSWERS or self.calls >= MAX_CALLS:
            self.done = True
            return Outcome(self.right, [])
        self.rejections += 1
        self.messages = [*self.start, {"role": "user", "content": REJECTION}]
        return Outcome(False, [], rejected=True, state=self.state())


def split(n_train: int, n_val: int, *, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out tasks of ``seed``, split by content as the tool task's (``tools.held_out``: no seed
    trains on another seed's held-out triple), none a shot's (the recovery shots' included)."""
    exclude = shot_keys([*SHOT_TRIPLES, *RECOVERY_TRIPLES])
    train = make_tasks(n_train, seed=seed, exclude=exclude, part="train")
    val = make_tasks(n_val, seed=seed, exclude=exclude, part="val")
    for part, tasks in (("train", train), ("val", val)):
        for i, task in enumerate(tasks):
            task["id"] = f"calc-verify-{part}-{seed}-{i}"
    return train, val


def _tool_calls(message: Any) -> list[dict[str, Any]]:
    return [call.model_dump(exclude_none=True) for call in message.tool_calls or ()]


async def agent(task: dict[str, Any], llm: Any) -> float:
    """One calc-verify episode against ``llm`` (an ``LLMEndpoint``); the reward (``episode_reward``)."""
    import spanrl
    from opentelemetry import trace

    from spanrl import semconv

    tracer = trace.get_tracer("spanrl.demo.calc_verify")
    # a request waits behind the server's whole batch: on loaded CPUs that outlasts the client's 600 s default
    client, episode = llm.async_client().with_options(timeout=REQUEST_TIMEOUT_S), Episode(task)
    while not episode.done:
        reply = await client.chat.completions.create(model=llm.model, messages=episode.messages, tools=TOOLS,
                                                     **llm.sampling)
        message = reply.choices[0].message
        text = message.content
        outcome = episode.step(text, _tool_calls(message))
        tracer.start_span("label", attributes={semconv.GEN_AI_RESPONSE_ID: reply.id,
                                               semconv.LABEL_GOOD: outcome.good}).end()
        after = {semconv.STATE_ID: outcome.state} if outcome.state else None
        for call, result in outcome.results:
            fn = call["function"]
            spanrl.emit_tool_call(fn["name"], fn["arguments"], result, call_id=call["id"], attributes=after,
                                  error=result if result.startswith("error:") else None)
        if outcome.rejected:
            spanrl.emit_tool_call(CHECK_TOOL, {"answer": text}, REJECTION, attributes=after)
    return episode.reward

