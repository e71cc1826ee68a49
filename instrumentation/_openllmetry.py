"""Adjustments to OpenLLMetry (``opentelemetry-instrumentation-openai``, tested with 0.62.x), applied by
the ``spanrl`` instrumentor. Each replaces a module-level name in OpenLLMetry's modules and is undone by
``unpatch()``; the span shape OpenLLMetry writes does not change.

* ``propagate_trace_context``: also sends the W3C ``baggage`` header, so requests made inside
  ``spanrl.rollout`` carry the rollout ids to the server.
* ``run_async`` (speed): OpenLLMetry runs its request hook, a coroutine, through ``asyncio.run`` on
  every synchronous call: a new event loop per call (~0.3 ms), or a new thread inside a running loop.
  The hook never suspends unless an async image uploader is configured, so it is driven to completion
  directly; if it ever suspends, it is closed and the call is logged.
* ``is_openai_v1`` / ``is_reasoning_supported`` (speed): version strings parsed six times per call;
  the answers are computed once.
* ``_set_response_attributes`` (speed): a response whose ``usage.prompt_tokens_details`` is null (vLLM,
  most OpenAI-compatible servers) makes it raise ``dict(None)``, caught by ``dont_throw`` which formats
  a traceback on every call (~0.3 ms) and skips ``gen_ai.usage.cache_read.input_tokens``. The null is
  read as ``{}``, the case the code was written for.

* ``_get_openai_base_url`` (speed): ``str(client.base_url)`` rebuilt from the parsed URL three times per
  call; the string is kept per URL object (a client given a new ``base_url`` gets a new object).

``SPANRL_OPENLLMETRY_SPEEDUPS=0`` keeps the speedups out (the baggage header stays).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from typing import Any

from opentelemetry.baggage.propagation import W3CBaggagePropagator

from spanrl import env

_logger = logging.getLogger(__name__)
_PACKAGE = "opentelemetry.instrumentation.openai"
_MODULES = (
    f"{_PACKAGE}.utils",
    f"{_PACKAGE}.shared",
    f"{_PACKAGE}.shared.chat_wrappers",
    f"{_PACKAGE}.shared.completion_wrappers",
    f"{_PACKAGE}.shared.embeddings_wrappers",
    f"{_PACKAGE}.shared.image_gen_wrappers",
    _PACKAGE,
)
_MARK = "_spanrl_original"
_baggage = W3CBaggagePropagator()


def _with_baggage(original: Any) -> Any:
    def propagate_trace_context(span: Any, kwargs: dict[str, Any]) -> None:
        original(span, kwargs)
        try:
            headers = kwargs.get("extra_headers" if "extra_headers" in kwargs else "headers")
            if isinstance(headers, dict):
                _baggage.inject(headers)
        except Exception:
            _logger.exception("spanrl could not add the baggage header")

    return propagate_trace_context


def _fast_run_async(original: Any) -> Any:
    config = sys.modules.get(f"{_PACKAGE}.shared.config")

    seen: list[Any] = [object(), False]  # the uploader last checked, and whether it is async

    def run_async(method: Any) -> None:
        uploader = getattr(getattr(config, "Config", None), "upload_base64_image", None)
        if uploader is not seen[0]:  # inspect it once, not on every call
            seen[:] = [uploader, asyncio.iscoroutinefunction(uploader)]
        if seen[1] or not asyncio.iscoroutine(method):
            return original(method)
        try:
            method.send(None)
        except StopIteration:
            return None
        method.close()  # it awaited something real: give up on this hook rather than block
        _logger.debug("spanrl: OpenLLMetry request hook suspended; its attributes were skipped")
        return None

    return run_async


def _constant(original: Any) -> Any:
    value = original()

    def answer() -> Any:
        return value

    return answer


def _null_details_as_empty(original: Any) -> Any:
    def _set_response_attributes(span: Any, response: Any) -> Any:
        usage = response.get("usage") if isinstance(response, dict) else None
        if isinstance(usage, dict) and usage.get("prompt_tokens_details", {}) is None:
            response = {**response, "usage": {**usage, "prompt_tokens_details": {}}}
        return original(span, response)

    return _set_response_attributes


def _cached_base_url(original: Any) -> Any:
    cache: dict[int, tuple[Any, Any]] = {}  # id(client's URL object) -> (that object, the answer)

    def _get_openai_base_url(instance: Any) -> Any:
        url = getattr(getattr(instance, "_client", None), "_base_url", None)
        if url is None:
            return original(instance)
        entry = cache.get(id(url))
        if entry is not None and entry[0] is url:
            return entry[1]
        value = original(instance)
        if len(cache) < _BASE_URL_CACHE_MAX:  # the URL object is kept: its id cannot be reused meanwhile
            cache[id(url)] = (url, value)
        return value

    return _get_openai_base_url


_BASE_URL_CACHE_MAX = 256
_SPEEDUPS = {
    "_get_openai_base_url": _cached_base_url,
    "run_async": _fast_run_async,
    "is_openai_v1": _constant,
    "is_reasoning_supported": _constant,
    "_set_response_attributes": _null_details_as_empty,
}


def _replacements(speedups: bool) -> dict[str, Any]:
    found: dict[str, Any] = {"propagate_trace_context": _with_baggage}
    if speedups:
        found.update(_SPEEDUPS)
    return found


def patch() -> int:
    """Apply the adjustments to every loaded OpenLLMetry module; return how many names were replaced."""
    speedups = env.get_str(env.SPANRL_OPENLLMETRY_SPEEDUPS, "1") not in ("0", "false", "False")
    made: dict[str, Any] = {}  # one replacement per original function, shared by every module that binds it
    count = 0
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # OpenLLMetry missing or incompatible: nothing to adjust
            continue
        for attr, factory in _replacements(speedups).items():
            current = getattr(module, attr, None)
            if current is None or hasattr(current, _MARK) or not callable(current):
                continue
            key = f"{attr}:{id(current)}"
            if key not in made:
                try:
                    replacement = factory(current)
                except Exception:
                    _logger.exception("spanrl could not adjust %s.%s", name, attr)
                    continue
                setattr(replacement, _MARK, current)
                made[key] = replacement
            setattr(module, attr, made[key])
            count += 1
    return count


def unpatch() -> None:
    """Put every original function back."""
    for name in _MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        for attr in ("propagate_trace_context", *_SPEEDUPS):
            current = getattr(module, attr, None)
            original = getattr(current, _MARK, None)
            if original is not None:
                setattr(module, attr, original)


# What OpenLLMetry 0.62 wraps, as (module, "Class.method"): its own _uninstrument() passes these to
# OpenTelemetry's unwrap(), which splits the *module* path at its last dot and then looks up the dotted
# "Class.method" as one attribute, so nothing is unwrapped and a later instrument() wraps twice.
_OPENAI_WRAPPED = (
    ("openai.resources.chat.completions", "Completions.create"),
    ("openai.resources.chat.completions", "AsyncCompletions.create"),
    ("openai.resources.completions", "Completions.create"),
    ("openai.resources.completions", "AsyncCompletions.create"),
    ("openai.resources.embeddings", "Embeddings.create"),
    ("openai.resources.embeddings", "AsyncEmbeddings.create"),
    ("openai.resources.images", "Images.generate"),
    ("openai.resources.beta.chat.completions", "Completions.parse"),
    ("openai.resources.beta.chat.completions", "AsyncCompletions.parse"),
    ("openai.resources.responses", "Responses.create"),
    ("openai.resources.responses", "AsyncResponses.create"),
)


def uninstrument_openai() -> None:
    """``OpenAIInstrumentor().uninstrument()`` that really removes OpenLLMetry's wrappers."""
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from wrapt import BaseObjectProxy

    OpenAIInstrumentor().uninstrument()
    for module_name, dotted in _OPENAI_WRAPPED:
        module = sys.modules.get(module_name)
        class_name, method = dotted.split(".")
        owner = getattr(module, class_name, None) if module is not None else None
        func = vars(owner).get(method) if owner is not None else None
        if isinstance(func, BaseObjectProxy) and hasattr(func, "__wrapped__"):
            setattr(owner, method, func.__wrapped__)
