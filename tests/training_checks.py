"""What the "trains" tests assert, and the tiny model set-up that makes it hold.

An untrained tiny model almost never earns a 0/1 reward, so every group's rewards are equal, GRPO's
group-relative advantages are all 0, the gradient is 0 and one "training" step leaves the weights as they
were: a test that asserts only ``policy_version == 1`` passes with nothing trained (issue 35).

``prime_half_right`` fixes the set-up: a few hundred real Adam steps of supervised training on each task's
prompt with two completions, one right and one wrong, weighted equally. Cross-entropy is minimised by
``P(right) = P(wrong) = 1/2``, so the primed model answers each task right about half the time (checked:
every prompt ends with P(right) in ``_PRIME_BAND``, mostly in ``_PRIME_TARGET``). A group of ``n`` rollouts
then has equal rewards with probability about ``2 * 0.5**n`` (at most ``0.8**n + 0.2**n``).

``assert_trained`` checks the step row and the weights; ``assert_served_policy_changed`` checks that the
policy server answers with the trained weights' log-probs, not the initial ones. ``report_figures`` records
what a learning test measured, so its bound can be set from the spread over many runs.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_PRIME_STEPS_MAX = 1000
# Tried in order, each from the initial weights: at 1e-2 Adam can settle where the prompts are not told apart
# (four gold answers that differ in one digit stall at 1/8 each, text2sql's on transformers 5.24), 3e-3 does not
_PRIME_LRS = (1e-2, 3e-3, 1e-3)
# Priming stops once P(right completion | prompt) is in _PRIME_TARGET on every prompt, and fails unless it
# is in _PRIME_BAND when the steps run out (a prompt the tiny model cannot tell from another stalls at 1/4).
_PRIME_TARGET = (0.35, 0.65)
_PRIME_BAND = (0.2, 0.8)


def _sequences(tokenizer: Any, messages: list[dict[str, Any]], completion: str) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
        prompt = prompt["input_ids"]
    answer = tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id]
    return list(prompt), answer


def _batch(pairs: list[tuple[list[int], list[int]]]) -> tuple[Any, Any, Any]:
    """Right-padded (N, L) ids, the (N, L-1) next-token targets and the mask of completion targets."""
    import torch

    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.zeros(len(pairs), width, dtype=torch.long)
    mask = torch.zeros(len(pairs), width - 1)
    for i, (prompt, answer) in enumerate(pairs):
        ids[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        mask[i, len(prompt) - 1 : len(prompt) + len(answer) - 1] = 1.0
    return ids, ids[:, 1:], mask


def _prime(model: Any, ids: Any, targets: Any, mask: Any, banded: Any, lr: float) -> Any:
    """Supervised steps towards every completion at once; P(right) of the banded prompts where it stopped."""
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    right = torch.zeros(0)
    for _ in range(_PRIME_STEPS_MAX + 1):
        logprobs = torch.log_softmax(model(ids).logits[:, :-1].float(), -1).gather(2, targets[..., None])[..., 0]
        sequence = (logprobs * mask).sum(1)  # (N,) log P(completion | prompt)
        right = sequence[0::2].detach().exp()[banded]
        if bool(((right >= _PRIME_TARGET[0]) & (right <= _PRIME_TARGET[1])).all()):
            break
        optimizer.zero_grad()
        (-sequence.mean()).backward()
        optimizer.step()
    return right


def prime_half_right(model_dir: Path, examples: Sequence[tuple[list[dict[str, Any]], str, str]]) -> Path:
    """Train the tiny model at ``model_dir`` in place so that, for each ``(messages, right, wrong)``, the
    reply to ``messages`` is ``right`` (then ``<eos>``) with a probability in ``_PRIME_BAND``: supervised
    steps towards ``right`` and ``wrong`` equally, stopped once every prompt is in the band.
    An example whose ``right`` and ``wrong`` are the same text is taught outright (no band: e.g. a
    reviewer's "OK"). Returns ``model_dir``; raises if the band is not reached."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pairs = [_sequences(tokenizer, m, c) for m, right, wrong in examples for c in (right, wrong)]
    banded = torch.tensor([right != wrong for _, right, wrong in examples])
    ids, targets, mask = _batch(pairs)
    for lr in _PRIME_LRS:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        right = _prime(model, ids, targets, mask, banded, lr)
        if bool(((right >= _PRIME_BAND[0]) & (right <= _PRIME_BAND[1])).all()):
            break
    else:
        raise AssertionError(f"priming did not bring every P(right) into {_PRIME_BAND}: {right.tolist()}")
    model.save_pretrained(model_dir)
    print(f"primed {model_dir}: P(right) = {[round(p, 2) for p in right.tolist()]}")
    return model_dir


def _state(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def weights_digest(model_dir: Path) -> str:
    """SHA-256 of an HF folder's weights, tensor by tensor in name order: equal for bit-identical weights."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(_state(model_dir).items()):
        digest.update(name.encode() + tensor.float().contiguous().numpy().tobytes())  # exact for fp32/16, bf16
    return digest.hexdigest()[:16]


def max_weight_change(initial: Path, checkpoint: Path) -> float:
    """The largest absolute difference between two HF folders' weights (same keys)."""
    before, after = _state(initial), _state(checkpoint)
    assert before.keys() == after.keys()
    return max(float((after[k].float() - before[k].float()).abs().max()) for k in before)


def assert_trained(row: dict[str, Any], *, initial: Path, checkpoint: Path) -> None:
    """The step's rewards varied within a group, the gradient was non-zero and the weights moved.

    On the untrained set-up (equal rewards in every group) each of these measures exactly 0."""
    assert row["charts/advantage_std"] > 0, row  # 0.0 when every group's rewards are equal
    assert row["charts/grad_norm"] > 0, row  # 0.0 when every advantage is 0
    assert max_weight_change(initial, checkpoint) > 0, "the checkpoint's weights equal the initial model's"


def served_logprobs(base_url: str, messages: list[dict[str, Any]], max_tokens: int = 4, *,
                    api_key: str | None = None) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, completion ids, their logprobs) of one greedy reply from spanrl's policy server (with
    ``api_key``: the Trainer's running server takes only its run's key, which ``deploy()``'s client carries)."""
    body = json.dumps({"model": "policy", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.loads(response.read())
    choice = reply["choices"][0]
    return reply["prompt_token_ids"], choice["token_ids"], choice["token_logprobs"]


def _token_logprobs(model_dir: Path, prompt: list[int], answer: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : len(prompt) + len(answer) - 1]
        return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(answer)[:, None])[:, 0].tolist()


def assert_served_policy_changed(client: Any, messages: list[dict[str, Any]], *, initial: Path,
                                 checkpoint: Path) -> None:
    """The log-probs of ``client``'s (``Trainer.deploy()``'s) server for its own greedy reply are the trained
    checkpoint's (to 1e-4), not the initial model's: a server still on the initial weights fails."""
    prompt, answer, served = served_logprobs(str(client.base_url), messages, api_key=client.api_key)
    trained, untrained = _token_logprobs(checkpoint, prompt, answer), _token_logprobs(initial, prompt, answer)
    assert max(abs(a - b) for a, b in zip(served, trained)) < 1e-4, (served, trained)
    assert max(abs(a - b) for a, b in zip(served, untrained)) > 1e-4, (served, untrained)


def val_success_in_store(db_path: Path, step: int, n_tasks: int) -> float:
    """Held-out success at ``step`` recomputed from the span store: the reward spans of the greedy
    evaluation rollouts (ids ``<run>-v<step>-<i>-a<attempt>``, one reward each), summed over ``n_tasks``."""
    from spanrl.store import SpanStore

    with SpanStore.open(db_path, read_only=True) as store:
        rows = store.sql("SELECT rollout_id, reward_value FROM spans WHERE name = 'spanrl.reward' "
                         f"AND rollout_id LIKE '%-v{int(step)}-%'").to_pylist()
    assert len({r["rollout_id"] for r in rows}) == len(rows) == n_tasks, rows
    return sum(r["reward_value"] for r in rows) / n_tasks


def report_figures(test: str, **figures: Any) -> None:
    """Print what a learning test measured (``-s`` shows it) and, where ``SPANRL_LEARNING_FIGURES`` names a
    file, append it there as one JSON line: how docs/measurements.md's spreads over repeated runs are
    gathered (call it before the assertions, so a failing run is recorded too)."""
    line = json.dumps({"test": test, **figures}, default=str)
    print(f"learning figures: {line}")
    if path := os.environ.get("SPANRL_LEARNING_FIGURES"):
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
