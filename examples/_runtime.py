"""What every example agent shares: reading the trainer's LLM settings, and the two ways a command-line
agent is started (see ``spanrl.rollouts.runner``):

- once per rollout: ``SPANRL_TASK`` (JSON), ``OPENAI_BASE_URL``, ``SPANRL_MODEL``, ``SPANRL_SAMPLING``;
- as a worker (``SPANRL_AGENT_PROTOCOL=jsonl``): one rollout per stdin line, each run inside
  ``spanrl.rollout(...)``, spans flushed, then ``{"spanrl_done": ROLLOUT_ID}`` on stdout.

An example defines ``episode(task, client, model, sampling)`` (which calls ``spanrl.emit_reward``) and
ends with ``sys.exit(serve(episode))``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "policy"
DEFAULT_API_KEY = "spanrl"
CLIENT_TIMEOUT_S = 300.0  # one completion; generous for a real model on CPU, finite for a dead server

_SHARED_CLIENTS: dict[str, Any] = {}  # api key -> the process's one openai.OpenAI (its HTTP client is shared)

Episode = Callable[[dict[str, Any], Any, str, dict[str, Any]], Any]


@dataclass(frozen=True)
class LLMSettings:
    """Where the agent's LLM is: the trainer's ``llm`` object, a dict, or the environment."""

    base_url: str
    model: str
    api_key: str
    sampling: dict[str, Any] = field(default_factory=dict)

    def client(self) -> Any:
        """An ``openai.OpenAI`` client (instrumented when running under opentelemetry-instrument); all of
        a process's clients share one HTTP client (a new one builds an SSL context: tens of ms a rollout)."""
        import openai

        shared = _SHARED_CLIENTS.get(self.api_key)
        if shared is None:
            shared = _SHARED_CLIENTS[self.api_key] = openai.OpenAI(
                base_url=self.base_url, api_key=self.api_key, max_retries=1, timeout=CLIENT_TIMEOUT_S)
        return shared.with_options(base_url=self.base_url)


def llm_settings(llm: Any = None) -> LLMSettings:
    """Settings from ``llm`` (an object or mapping with base_url / model / api_key / sampling); what it
    lacks comes from OPENAI_BASE_URL, SPANRL_MODEL, OPENAI_API_KEY, SPANRL_SAMPLING, then defaults."""
    def pick(name: str) -> Any:
        return llm.get(name) if isinstance(llm, Mapping) else getattr(llm, name, None)

    sampling = pick("sampling")
    if sampling is None:
        try:
            sampling = json.loads(os.environ.get("SPANRL_SAMPLING") or "{}")
        except ValueError:
            print("SPANRL_SAMPLING is not JSON; ignoring it", file=sys.stderr)
            sampling = {}
    return LLMSettings(
        base_url=str(pick("base_url") or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL),
        model=str(pick("model") or os.environ.get("SPANRL_MODEL") or DEFAULT_MODEL),
        api_key=str(pick("api_key") or os.environ.get("OPENAI_API_KEY") or DEFAULT_API_KEY),
        sampling=dict(sampling or {}),
    )


def sampling_value(sampling: Mapping[str, Any], task: Mapping[str, Any], name: str, default: Any) -> Any:
    """A sampling parameter: the trainer's request first, then the task's own setting, then default."""
    if name in sampling:
        return sampling[name]
    return task.get(name, default)


def _flush_spans() -> None:
    from opentelemetry import trace

    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        flush()


def serve_jsonl(episode: Episode, lines: Any = None, out: Any = None) -> None:
    """Worker mode: one rollout per input line; answer each with a ``spanrl_done`` line."""
    import spanrl

    lines = sys.stdin if lines is None else lines
    out = sys.stdout if out is None else out
    clients: dict[str, Any] = {}
    for line in lines:
        if not line.strip():
            continue
        job = json.loads(line)
        answer: dict[str, Any] = {"spanrl_done": job.get("rollout_id")}
        try:
            settings = llm_settings(job)
            client = clients.get(settings.base_url) or settings.client()
            clients[settings.base_url] = client
            with spanrl.rollout(job["rollout_id"], task_id=job.get("task_id"), attempt=job.get("attempt"),
                                mode=job.get("mode")):
                value = episode(job["task"], client, settings.model, settings.sampling)
            if isinstance(value, (int, float)):
                answer["reward"] = value
        except Exception as exc:  # the trainer records it and retries; the worker lives on
            answer["error"] = f"{type(exc).__name__}: {exc}"
        _flush_spans()
        out.write(json.dumps(answer) + "\n")
        out.flush()


def serve(episode: Episode) -> int:
    """Command-line entry point: one rollout from the environment, or the jsonl worker loop."""
    if os.environ.get("SPANRL_AGENT_PROTOCOL") == "jsonl":
        serve_jsonl(episode)
        return 0
    raw = os.environ.get("SPANRL_TASK")
    if not raw:
        print("SPANRL_TASK is not set: give the task as JSON, e.g. SPANRL_TASK='{\"question\": ...}'",
              file=sys.stderr)
        return 2
    try:
        task = json.loads(raw)
    except ValueError as exc:
        print(f"SPANRL_TASK is not valid JSON ({exc}): {raw[:200]!r}", file=sys.stderr)
        return 2
    settings = llm_settings(None)
    value = episode(task, settings.client(), settings.model, settings.sampling)
    print(json.dumps({"reward": value} if isinstance(value, (int, float)) else {"result": str(value)}))
    return 0
