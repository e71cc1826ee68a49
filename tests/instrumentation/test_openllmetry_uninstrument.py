"""Uninstrumenting OpenLLMetry leaves the openai client as it was (its own uninstrument() does not)."""

from __future__ import annotations

import openai.resources.chat.completions as chat
from opentelemetry.instrumentation.openai import OpenAIInstrumentor

from spanrl.instrumentation._openllmetry import uninstrument_openai


def test_uninstrument_openai_removes_the_wrappers():
    original = chat.Completions.create
    if OpenAIInstrumentor().is_instrumented_by_opentelemetry:  # another test left it on
        uninstrument_openai()
        original = chat.Completions.create
    OpenAIInstrumentor().instrument()
    assert chat.Completions.create is not original
    uninstrument_openai()
    assert chat.Completions.create is original
    assert chat.AsyncCompletions.create.__class__.__name__ == "function"
