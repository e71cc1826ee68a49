"""Request parameters of the OpenAI API, checked: each bad value is a RequestError naming its field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from spanrl.serving.backend import SamplingParams
from spanrl.serving.errors import RequestError

__all__ = ["ParsedParams", "parse_params"]

_MAX_N = 64
_MAX_STOP_STRINGS = 16
_MAX_TOP_LOGPROBS_CHAT = 20
_MAX_LOGPROBS_COMPLETIONS = 5
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1  # OpenAI's seed is an int64


@dataclasses.dataclass(frozen=True)
class ParsedParams:
    """What a request asks for besides its prompt."""

    sampling: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    """Return the OpenAI ``logprobs`` object (token ids and per-token logprobs are always returned)."""


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    bad_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad_type or not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
        low = f"> {lo}" if lo_open else f">= {lo}"
        raise RequestError(f"{name} must be a number {low} and <= {hi}, got {value!r}", param=name)
    return float(value)


def _int(body: dict[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise RequestError(f"{name} must be an integer {bound}, got {value!r}", param=name)
    return value


def _unsupported(body: dict[str, Any], name: str, allowed: tuple[Any, ...]) -> None:
    value = body.get(name)
    if value not in allowed and value not in ({}, []):
        raise RequestError(f"{name}={value!r} is not supported by this server (allowed: {list(allowed)})", param=name)


def parse_params(
    body: dict[str, Any], *, chat: bool, prompt_tokens: int, max_context_tokens: int, default_max_tokens: int
) -> ParsedParams:
    """Check the sampling fields of a chat or completions request against the prompt length."""
    for name, allowed in (("presence_penalty", (None, 0, 0.0)), ("frequency_penalty", (None, 0, 0.0)),
                          ("logit_bias", (None,)), ("suffix", (None,)), ("echo", (None, False))):
        _unsupported(body, name, allowed)
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise RequestError(f"response_format={response_format!r} is not supported (only {{'type': 'text'}})",
                           param="response_format")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    n = _int(body, "n", 1, _MAX_N) or 1
    best_of = _int(body, "best_of", 1, _MAX_N)
    if best_of is not None and best_of != n:
        raise RequestError(f"best_of must equal n ({n}) on this server, got {best_of}", param="best_of")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not _SEED_MIN <= seed <= _SEED_MAX):
        raise RequestError(f"seed must be an integer between {_SEED_MIN} and {_SEED_MAX}, got {seed!r}", param="seed")
    stop_raw = body.get("stop")
    stop: tuple[str, ...]
    if stop_raw is None:
        stop = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,) if stop_raw else ()
    elif (isinstance(stop_raw, list) and len(stop_raw) <= _MAX_STOP_STRINGS
          and all(isinstance(s, str) and s for s in stop_raw)):
        stop = tuple(stop_raw)
    else:
        raise RequestError(
            f"stop must be a string or a list of at most {_MAX_STOP_STRINGS} non-empty strings, got {stop_raw!r}",
            param="stop",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise RequestError(f"stream must be a boolean, got {stream!r}", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(f"stream_options must be an object, got {options!r}", param="stream_options")
    if chat:
        logprobs_flag = body.get("logprobs")
        if logprobs_flag is not None and not isinstance(logprobs_flag, bool):
            raise RequestError(f"logprobs must be a boolean, got {logprobs_flag!r}", param="logprobs")
        top = _int(body, "top_logprobs", 0, _MAX_TOP_LOGPROBS_CHAT) or 0
        if top and not logprobs_flag:
            raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        want_logprobs = bool(logprobs_flag)
    else:
        count = _int(body, "logprobs", 0, _MAX_LOGPROBS_COMPLETIONS)
        want_logprobs, top = count is not None, count or 0
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens = next((v for v in (_int(body, name, 1) for name in names) if v is not None), None)
    room = max_context_tokens - prompt_tokens
    if room < 1:
        raise RequestError(
            f"the prompt has {prompt_tokens} tokens and the model's context is {max_context_tokens} tokens",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    if max_tokens is not None and max_tokens > room:
        raise RequestError(
            f"max_tokens={max_tokens} plus the prompt's {prompt_tokens} tokens exceeds the model's context of "
            f"{max_context_tokens} tokens",

            param="max_tokens",
            code="context_length_exceeded",
        )
    sampling = SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else min(default_max_tokens, room),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=stop,
        top_logprobs=top,
    )
    return ParsedParams(sampling, n, bool(stream), bool(options.get("include_usage")), want_logprobs)
