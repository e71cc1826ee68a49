"""The rows' shared prompt prefix runs once: the same log-probs and gradients as the padded pass, less work."""

from __future__ import annotations

import pytest
import torch
from toy_task import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.batching import completion_logprobs
from spanrl.algorithms.batching import MIN_SHARED_PREFIX, shared_prefix_length


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    path = build_model(tmp_path_factory.mktemp("tiny") / "model")
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert lm.config._attn_implementation == "sdpa"  # the case the sharing is for
    return lm.train()


def _rows(prompts: list[list[int]], completions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """TRL's layout: prompts left-padded, completions right-padded (pad id 0, mask 0)."""
    p_width, c_width = max(map(len, prompts)), max(map(len, completions))
    ids, mask = [], []
    for p, c in zip(prompts, completions):
        ids.append([0] * (p_width - len(p)) + p + c + [0] * (c_width - len(c)))
        mask.append([0] * (p_width - len(p)) + [1] * (len(p) + len(c)) + [0] * (c_width - len(c)))
    return torch.tensor(ids), torch.tensor(mask), c_width


def test_the_shared_length_counts_from_each_rows_first_real_token() -> None:
    ids, mask, width = _rows([[5, 6, 7, 8, 9], [5, 6, 7, 4], [5, 6, 7, 8, 1, 2]], [[1, 2], [3], [1, 2]])
    assert shared_prefix_length(ids, mask, width) == 3  # 5 6 7, wherever the left padding ends
    # capped at the shortest prompt less one: its last position predicts its first completion token
    ids, mask, width = _rows([[5, 6, 7], [5, 6, 7, 8]], [[1], [2]])
    assert shared_prefix_length(ids, mask, width) == 2
    ids, mask, width = _rows([[5, 6], [4, 6]], [[1], [1]])
    assert shared_prefix_length(ids, mask, width) == 0
    assert shared_prefix_length(ids[:1], mask[:1], width) == 0  # one row: nothing to share


def _run(lm, ids: torch.Tensor, mask: torch.Tensor, width: int, share: bool):
    """Log-probs, entropies, every parameter's gradient, and how many tokens went through the embedding."""
    seen = []
    hook = lm.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].numel()))
    lm.zero_grad()
    try:
        logps, entropy = completion_logprobs(lm, ids, mask, width, temperature=0.7, fp32_head=True, entropy=True,
                                             share_prefix=share)
    finally:
        hook.remove()
    weights = torch.linspace(-1.0, 1.0, logps.numel()).view_as(logps)  # a loss that reaches every token
    ((logps * weights).sum() + entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in lm.named_parameters() if p.grad is not None}
    return logps.detach(), entropy.detach(), grads, sum(seen)


def test_sharing_gives_the_padded_pass_log_probs_and_gradients_for_less_work(model) -> None:
    """Four rows of an agent's calls: one long system prompt, then each row's own question (other lengths,
    so other left padding) and completion (other lengths: right padding), in fp32."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    system = torch.randint(4, vocab, (MIN_SHARED_PREFIX + 8,), generator=gen).tolist()
    prompts = [system + torch.randint(4, vocab, (n,), generator=gen).tolist() for n in (3, 9, 1, 6)]
    completions = [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in (5, 2, 4, 1)]
    ids, mask, width = _rows(prompts, completions)
    assert shared_prefix_length(ids, mask, width) == len(system)

    plain = _run(model, ids, mask, width, share=False)
    shared = _run(model, ids, mask, width, share=True)
    assert plain[3] == ids.numel() and shared[3] < plain[3] - 2 * len(system)  # the prefix ran once, not 4 times
    real = mask[:, -width:].bool()
    assert torch.equal(shared[0][~real], torch.zeros_like(shared[0][~real]))  # padding stays zero
    assert float((shared[0] - plain[0]).abs().max()) < 2e-5
    assert float((shared[1] - plain[1]).abs().max()) < 2e-5
    assert shared[2].keys() == plain[2].keys() and len(plain[2]) > 5
    for name, grad in plain[2].items():
        err = float((shared[2][name] - grad).norm() / grad.norm().clamp_min(1e-12))
        assert err < 1e-4, (name, err)


def test_no_common_prefix_or_a_short_one_runs_the_padded_pass(model) -> None:
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompts = [torch.randint(4, vocab, (MIN_SHARED_PREFIX + 4,), generator=gen).tolist() for _ in range(3)]
    prompts = [[7] * (MIN_SHARED_PREFIX - 1) + p for p in prompts]  # 31 shared tokens: too few to split off
    ids, mask, width = _rows(prompts, [[5, 6], [7], [8, 9]])
    plain, shared = _run(model, ids, mask, width, share=False), _run(model, ids, mask, width, share=True)
    assert shared[3] == plain[3] == ids.numel()
    assert torch.equal(shared[0], plain[0])


def test_gradient_checkpointing_turns_sharing_off(model) -> None:
    # its recompute would write the prefix's cache twice: the padded pass, the same numbers
    gen = torch.Generator().manual_seed(2)
    system = torch.randint(4, model.config.vocab_size, (MIN_SHARED_PREFIX + 2,), generator=gen).tolist()
    ids, mask, width = _rows([system + [9], system + [10, 11]], [[5, 6], [7]])
    from spanrl.hf_compat import checkpoint_activations

    checkpoint_activations(model)
    try:
        shared = _run(model, ids, mask, width, share=True)
    finally:  # either transformers' name (the newer one warns about the older)
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    assert shared[3] == ids.numel()
