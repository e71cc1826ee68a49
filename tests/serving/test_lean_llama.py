"""The lean Llama forward (serving/lean_llama.py) against transformers' own: the same tokens and log-probs."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from spanrl.serving.backend import GenerationRequest, SamplingParams
from spanrl.hf_compat import kv_cache_argument
from spanrl.serving.hf_backend import TransformersBackend
from spanrl.serving.lean_llama import LeanCache, LeanLlama, supports


def _requests(rng: random.Random, vocab: int, batch: int) -> list[GenerationRequest]:
    """Prompts of unequal length (left padding), greedy and seeded sampling, n of 1 or 2, unequal max_tokens."""
    return [
        GenerationRequest(
            [rng.randrange(4, vocab) for _ in range(rng.randrange(2, 12))],
            SamplingParams(max_tokens=rng.randrange(1, 10), temperature=rng.choice([0.0, 0.7, 1.0]),
                           seed=batch * 10 + k),
            n=rng.choice([1, 2]),
        )
        for k in range(rng.randrange(1, 6))
    ]


def test_the_backend_generates_what_transformers_forward_generates(tiny_model_dir) -> None:
    lean = TransformersBackend(tiny_model_dir)
    plain = TransformersBackend(tiny_model_dir)
    plain._lean = None  # transformers' forward
    assert lean._lean is not None, "the tiny Llama should take the lean forward"
    rng = random.Random(0)
    for batch in range(12):
        requests = _requests(rng, len(lean.tokenizer), batch)
        for a, b in zip(lean.generate(requests), plain.generate(requests), strict=True):
            assert [c.token_ids for c in a] == [c.token_ids for c in b]
            for x, y in zip(a, b):
                assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


def test_requests_that_join_a_running_batch_decode_as_if_alone(tiny_model_dir) -> None:
    backend = TransformersBackend(tiny_model_dir)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    first, late = GenerationRequest([5, 20, 30], params), GenerationRequest([7, 8, 9, 10, 11, 12, 13], params)
    alone = {id(r): backend.generate([r])[0][0] for r in (first, late)}
    done: dict[int, object] = {}
    joined = [late]
    backend.run([first], on_done=lambda r, c, _n: done.__setitem__(id(r), c[0]),
                admit=lambda _rows: [joined.pop()] if joined else [])
    for request in (first, late):
        assert done[id(request)].token_ids == alone[id(request)].token_ids
        assert torch.allclose(torch.tensor(done[id(request)].logprobs), torch.tensor(alone[id(request)].logprobs),
                              atol=1e-5)


def test_grouped_query_attention_matches_transformers(tmp_path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    assert supports(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    lean, cache = LeanLlama(model), DynamicCache(config=config)
    mine = lean.new_cache()
    with torch.inference_mode():
        for _ in range(3):  # the prefill, then two decode steps
            ours = lean(ids, mask, positions, mine)
            theirs = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                           **{kv_cache_argument(model): cache}).logits[:, -1, :]
            assert torch.allclose(ours, theirs, atol=1e-5)
            ids = ours.argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1


def test_models_it_does_not_compute_keep_transformers_forward(tiny_model_dir, tmp_path) -> None:
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, attention_bias=True)
    assert not supports(LlamaForCausalLM(config))
    scaled = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                 "rope_theta": 10000.0})
    assert not supports(LlamaForCausalLM(scaled))
    eager = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, attn_implementation="eager")
    assert not supports(LlamaForCausalLM(eager))
    assert TransformersBackend(tiny_model_dir)._lean is not None  # loaded as served: SDPA attention


@pytest.mark.parametrize("with_adapter", [False, True])
def test_lora_adapters_turn_the_lean_forward_off(tiny_model_dir, tmp_path, with_adapter) -> None:
    from peft import LoraConfig, get_peft_model

    adapters = {}
    if with_adapter:
        peft_model = get_peft_model(LlamaForCausalLM.from_pretrained(tiny_model_dir),
                                    LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        peft_model.save_pretrained(tmp_path / "writer")
        adapters = {"writer": tmp_path / "writer"}
    backend = TransformersBackend(tiny_model_dir, adapters=adapters)
    assert backend._lean_now() is (not with_adapter)
    request = GenerationRequest([5, 20, 30], SamplingParams(max_tokens=3, temperature=0.0))
    backend.generate([request])
    assert isinstance(backend._prefill(backend._rows([request]))[0], LeanCache) is (not with_adapter)
