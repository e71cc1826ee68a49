"""GiGPO's step groups (Feng et al. 2025, arXiv 2505.10978): which calls saw the same state, and their step term.

The paper's anchor state is the environment state the agent observed. A call's state, first found wins:

1. ``spanrl.state.id`` on the LLM call's span (the agent's client span or the policy server's);
2. ``spanrl.state.id`` on the last tool span (``execute_tool``) of the rollout that ended after the
   previous call started and before this call started: the state the tool's result left the agent in
   (``algorithms/call_facts.py`` reads both);
3. a canonical key of the messages the call was sent since the last assistant turn (what the environment
   said since the agent last spoke: the tool results, a user turn; the tool calls' ids left out, as they
   differ in every rollout), so an earlier free-text turn does not make every later state unique;
4. the prompt's token ids (``state_ids``), for calls recorded without messages.

States are compared within a task group only, and kinds never mix (an explicit id never equals a message key).
The step term (``step_group_advantage``) compares each call's discounted step return with its step group's.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["anchor_states", "group_stats", "message_state_key", "state_ids", "step_group_advantage"]


def state_ids(prompts: list[Any]) -> np.ndarray:
    """One integer per prompt, equal exactly when the prompts' token ids are equal."""
    index: dict[tuple[int, ...], int] = {}
    return np.array([index.setdefault(tuple(p or ()), len(index)) for p in prompts], dtype=np.int64)


def message_state_key(messages: Any) -> str | None:
    """A canonical key of the messages after the last assistant message (all of them when there is none), the
    tool calls' ids left out (``_without_ids``), or None when ``messages`` (a list, or its JSON text) cannot be
    read."""
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            return None
    if not isinstance(messages, list) or not messages:
        return None
    last = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"),
               default=-1)
    return json.dumps(_without_ids(messages[last + 1:]), sort_keys=True, separators=(",", ":"), default=str)


_CALL_PARTS = frozenset({"tool_call", "tool_call_response"})
"""GenAI message parts whose ``id`` is a tool call's id (OpenAI's messages carry it as ``tool_call_id``): random per
call (the policy server draws one per tool call), so it names the call, not the state."""


def _without_ids(messages: list[Any]) -> list[Any]:
    """``messages`` without the tool calls' ids (a message's ``tool_call_id``, the ``id`` of a ``_CALL_PARTS``
    part): two rollouts that got the same tool result under other call ids observed the same state. Ids inside a
    result's content stay: they are what the environment said."""
    out = []
    for message in messages:
        if isinstance(message, dict):
            message = {k: v for k, v in message.items() if k != "tool_call_id"}
            if isinstance(message.get("parts"), list):
                message["parts"] = [{k: v for k, v in part.items() if k != "id"}
                                    if isinstance(part, dict) and part.get("type") in _CALL_PARTS else part
                                    for part in message["parts"]]
        out.append(message)
    return out


def anchor_states(explicit: list[str | None], messages: list[Any], prompts: list[Any]) -> np.ndarray:
    """One integer per call, equal exactly when the calls observed the same state (module docstring):
    ``explicit`` (the ``spanrl.state.id`` found for the call, or None), else the message key, else the prompt."""
    index: dict[tuple[str, Any], int] = {}
    out = np.empty(len(explicit), dtype=np.int64)
    for i, (state, msgs, prompt) in enumerate(zip(explicit, messages, prompts)):
        if state is not None:
            key: tuple[str, Any] = ("id", str(state))
        else:
            text = message_state_key(msgs)
            key = ("messages", text) if text is not None else ("tokens", tuple(prompt or ()))
        out[i] = index.setdefault(key, len(index))
    return out


def group_stats(values: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, total and std (ddof 1; NaN for a group of one) of ``values`` per group."""
    count = np.bincount(groups, minlength=n_groups).astype(np.float64)
    total = np.bincount(groups, weights=values, minlength=n_groups)
    mean = np.divide(total, count, out=np.zeros(n_groups), where=count > 0)
    sq = np.bincount(groups, weights=(values - mean[groups]) ** 2, minlength=n_groups)
    std = np.sqrt(np.divide(sq, count - 1, out=np.full(n_groups, np.nan), where=count > 1))
    return count, total, std


def step_group_advantage(config: Any, returns: np.ndarray, call_keep: np.ndarray, call_group: np.ndarray,
                          call_state: np.ndarray, report: dict[str, int]) -> np.ndarray:
    """GiGPO's step-level advantage: each kept call's step return against the kept calls of its step group
    (same task group, same state), ``(G^s - mean_sg) / std_sg`` (scaled as credit's baselines); 0 alone."""
    keyed = np.stack([np.asarray(call_group, np.int64), np.asarray(call_state, np.int64)], axis=1)
    _, sg = np.unique(keyed, axis=0, return_inverse=True)
    sg = sg.reshape(-1)
    n = int(sg.max()) + 1 if len(sg) else 0
    g = np.nan_to_num(returns)
    count, total, std = group_stats(g[call_keep], sg[call_keep], n)
    mean = np.divide(total, count, out=np.zeros(n), where=count > 0)
    adv = np.where(count[sg] > 1, g - mean[sg], 0.0)
    if config.scale_std:
        s = std[sg]
        scalable = np.isfinite(s) & (s >= config.eps)
        adv = np.where(scalable, adv / (np.where(scalable, s, 1.0) + config.eps), adv)
    report["step_groups"] = int((count > 1).sum())
    return np.where(call_keep, adv, 0.0)
