"""The transformers backend directly: sampling semantics and weight sources."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from spanrl.serving.backend import GenerationRequest, SamplingParams
from spanrl.serving.hf_backend import TransformersBackend, _top_p_filter


def test_top_p_keeps_the_smallest_head_and_logprobs_stay_untruncated(tiny_model_dir) -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert (_top_p_filter(probs, torch.tensor([0.7])) > 0).tolist() == [[True, True, False, False]]
    assert (_top_p_filter(probs, torch.tensor([0.1])) > 0).tolist() == [[True, False, False, False]]
    assert torch.equal(_top_p_filter(probs, torch.tensor([1.0])), probs)
    backend = TransformersBackend(tiny_model_dir)
    prompt = [5, 20, 30]
    out = backend.generate(
        [GenerationRequest(prompt, SamplingParams(max_tokens=6, temperature=1.0, top_p=0.5, seed=3))]
    )[0][0]
    with torch.no_grad():
        logits = backend.model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    full = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(full, torch.tensor(out.logprobs), atol=1e-4)  # the full softmax, not renormalised


def test_reload_from_a_peft_model_serves_its_merged_weights(tiny_model_dir) -> None:
    from peft import LoraConfig, get_peft_model

    backend = TransformersBackend(tiny_model_dir)
    greedy = GenerationRequest([5, 20, 30], SamplingParams(max_tokens=8, temperature=0.0))
    before = backend.generate([greedy])[0][0].token_ids
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    backend.load_weights(peft_model)
    assert any("lora" in n for n, _ in peft_model.named_parameters())  # the trainer's model is untouched
    merged = backend.generate([greedy])[0][0].token_ids
    reference = peft_model.merge_and_unload().generate(torch.tensor([[5, 20, 30]]), max_new_tokens=8,
                                                       do_sample=False)[0, 3:].tolist()
    assert merged == reference[: len(merged)] and merged != before
