"""The learned critic's value head: ``V(h) = w . LN(h) / sqrt(d) + b`` on the policy's own hidden state ``h``
(d wide; after the first ``depth`` of its layers, a quarter by default, and the final norm) at each call's last
prompt token, trained on the batch's returns-to-go (the math: ``algorithms/learned_credit.py``). ``LN`` (no
affine) makes the input unit length, so an AdamW step of ``lr`` moves ``V`` by at most about ``lr * sqrt(d)``
whatever the model's hidden-state scale; ``b`` starts at the first batch's mean return.

Where ``h`` comes from: the trainer's no-grad forward of the current policy over the calls' prompts, before the
update (`prompt_hidden`), not the policy server at sampling time. The trainer's is exact for the weights the update
starts from, needs nothing from the server (no weights of the head pushed with each reload, nothing stored on spans;
vLLM's OpenAI API does not return hidden states) and works for retokenized calls of external APIs. The update's
own forwards come after the advantages are fixed (and GRPO reads the server's log-probs: no pre-update forward to
share), so this is one extra forward pass: the backbone only (no LM head), no gradient, under the update's bf16
autocast, its rows sorted by their tokens so a micro-batch's calls share their prefix (system prompt, question,
earlier turns), which runs once (``batching.backbone_hidden``). Cost: docs/measurements.md.

Each training step (``load_training_batch`` with ``CreditConfig.critic``): `HeadCritic.value_calls` values the
calls with the head as it was (PPO's old values), credit adds the GAE term, then `HeadCritic.fit` runs
``epochs`` full-batch AdamW steps of ``mean((V(h) - G)^2)`` on the head alone (the policy's hidden states are
inputs, detached: the value loss never moves the policy). The head lives on the algorithm (``value_head``) and
is saved with its checkpoints (``algorithms/checkpoints.py``, ``VALUE_HEAD_FILE``).

PPO's critic (issue 57: a LoRA or a value head) could be this head: a (hidden + 1)-parameter regression on the
policy's hidden states instead of a second backbone. PPO is not rewired here; it refuses a ``critic`` section.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from spanrl.algorithms.batching import backbone_hidden, update_autocast
from spanrl.algorithms.learned_credit import CriticConfig
from spanrl.errors import ConfigError

__all__ = ["HeadCritic", "ValueHead", "first_layers", "head_critic", "prompt_hidden"]

_ROWS_PER_FORWARD = 16
"""Prompts per no-grad forward of `prompt_hidden`."""


class ValueHead:
    """The head's weights (fp32), its AdamW state and the number of batches it has trained on (``steps``)."""

    def __init__(self, hidden_size: int, learning_rate: float) -> None:
        self.linear = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.linear.weight)  # V = 0 until it has seen returns
        torch.nn.init.zeros_(self.linear.bias)
        self.optimizer = torch.optim.AdamW(self.linear.parameters(), lr=learning_rate, weight_decay=0.0)
        self.steps = 0

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """``V`` (N,) of hidden states (N, d)."""
        d = hidden.size(-1)
        return self.linear(torch.nn.functional.layer_norm(hidden, (d,)) / d**0.5).squeeze(-1)

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer and step count: tensors and plain values (``torch.load(weights_only=True)``)."""
        return {"head": self.linear.state_dict(), "optimizer": self.optimizer.state_dict(), "steps": self.steps,
                "hidden_size": self.linear.in_features, "learning_rate": self.optimizer.param_groups[0]["lr"]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ValueHead:
        """The head `state_dict` described."""
        head = cls(int(state["hidden_size"]), float(state["learning_rate"]))
        head.linear.load_state_dict(state["head"])
        head.optimizer.load_state_dict(state["optimizer"])
        head.steps = int(state["steps"])
        return head


@contextlib.contextmanager
def first_layers(lm: Any, depth: float) -> Iterator[None]:
    """Within: ``lm``'s backbone runs its first ``ceil(depth * L)`` decoder layers only (then its final norm)."""
    body = lm.base_model
    layers = getattr(body, "layers", None)
    if depth >= 1.0:
        yield
        return
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(f"critic.depth must be 1 for {type(lm).__name__}: its backbone has no decoder layer list "
                          f"(`layers`) to run the first of; got {depth!r}")
    body.layers = layers[: max(1, math.ceil(depth * len(layers)))]
    try:
        yield
    finally:
        body.layers = layers


@torch.no_grad()
def prompt_hidden(model: Any, prompts: list[list[int]], *, pad_token_id: int, bf16: bool = False,
                  depth: float = 1.0) -> torch.Tensor:
    """The hidden state (N, d), fp32 on CPU, of ``model``'s backbone at each prompt's last token: after its final
    norm, of the last layer or of the first ``ceil(depth * L)`` (`first_layers`).

    Causal attention makes a prefix's hidden states the same inside a longer sequence, so a prompt that opens
    another (an earlier call of the conversation, a group's shared first prompt) is read from that one's row:
    one row per conversation, not per call. Rows sorted by their tokens share their leading tokens per micro-batch
    (``batching.backbone_hidden``), capped below the earliest position read."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    device = next(lm.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])  # a prefix sorts right before what extends it
    host = {}  # prompt index -> the index of the longest prompt it opens (its row)
    for k in range(len(order) - 1, -1, -1):
        i, nxt = order[k], order[k + 1] if k + 1 < len(order) else None
        opens = nxt is not None and prompts[nxt][: len(prompts[i])] == prompts[i]
        host[i] = host[nxt] if opens else i
    rows = sorted(set(host.values()), key=lambda i: prompts[i])
    reads: dict[int, list[int]] = {}
    for i, h in host.items():
        reads.setdefault(h, []).append(i)
    out = torch.zeros(len(prompts), lm.config.get_text_config().hidden_size)
    was_training = lm.training
    lm.eval()
    try:
        for start in range(0, len(rows), _ROWS_PER_FORWARD):
            part = rows[start : start + _ROWS_PER_FORWARD]
            width = max(len(prompts[h]) for h in part)
            ids = torch.full((len(part), width), pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(part), width), dtype=torch.long)
            for r, h in enumerate(part):  # left-padded
                ids[r, width - len(prompts[h]):] = torch.tensor(prompts[h], dtype=torch.long)
                mask[r, width - len(prompts[h]):] = 1
            first_read = min(len(prompts[i]) - 1 for h in part for i in reads[h])
            shortest = min(len(prompts[h]) for h in part)
            with update_autocast(bf16, device), first_layers(lm, depth):  # the shared prefix ends before the 1st read
                hidden = backbone_hidden(lm, ids.to(device), mask.to(device), max(0, shortest - 1 - first_read))
            offset = width - hidden.size(1)  # columns before the returned ones (the shared prefix)
            for r, h in enumerate(part):
                for i in reads[h]:
                    out[i] = hidden[r, width - len(prompts[h]) + len(prompts[i]) - 1 - offset].float().cpu()
    finally:
        lm.train(was_training)
    return out


class HeadCritic:
    """One step's `CallCritic` (``learned_credit``): values the calls, takes their returns, fits the head."""

    def __init__(self, head: ValueHead, algorithm: Any, config: CriticConfig) -> None:
        self.head, self.algorithm, self.config = head, algorithm, config
        self.hidden: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.returns: np.ndarray | None = None
        self.seconds = 0.0

    def credit(self, credit: Any) -> Any:
        """``credit`` for this step: the GAE term's weight 0 while the head has trained on < ``warmup_steps``."""
        if self.head.steps >= self.config.warmup_steps:
            return credit
        return dataclasses.replace(credit, critic=dataclasses.replace(self.config, weight=0.0))

    def value_calls(self, calls: Any) -> np.ndarray:
        started = time.perf_counter()
        algo = self.algorithm
        self.hidden = prompt_hidden(algo.model, calls.column("prompt_ids").to_pylist(),
                                    pad_token_id=algo.tokenizer.pad_token_id, bf16=bool(getattr(algo, "bf16", False)),
                                    depth=self.config.depth)
        with torch.no_grad():
            self.values = self.head(self.hidden)
        self.seconds += time.perf_counter() - started
        return self.values.double().numpy()

    def observe_returns(self, returns: np.ndarray) -> None:
        self.returns = np.asarray(returns, dtype=np.float64)

    def fit(self) -> dict[str, float]:
        """``epochs`` AdamW steps of the head on this step's calls; the figures the Trainer adds to its row:
        ``losses/value_head_loss`` (the values credit used against the returns, before fitting: a held-out
        error), ``losses/value_head_fit_loss`` (after), ``charts/value_head_explained_variance`` (before),
        ``time/value_head_s`` (the hidden-state forward and the fit)."""
        if self.hidden is None or self.values is None or self.returns is None:
            return {}
        started = time.perf_counter()
        kept = torch.from_numpy(np.isfinite(self.returns))
        if not bool(kept.any()):
            return {}
        hidden, target = self.hidden[kept], torch.from_numpy(self.returns[kept.numpy()]).float()
        before = self.values[kept]
        loss_before = float(((before - target) ** 2).mean())
        var = float(target.var()) if len(target) > 1 else 0.0
        explained = 1.0 - float((target - before).var()) / var if var > 0 else 0.0
        head = self.head
        if head.steps == 0:  # the mean return: the weights then learn what differs between calls
            with torch.no_grad():
                head.linear.bias.fill_(float(target.mean()))
        for _ in range(self.config.epochs):
            loss = ((head(hidden) - target) ** 2).mean()
            head.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            head.optimizer.step()
        with torch.no_grad():
            loss_after = float(((head(hidden) - target) ** 2).mean())
        head.steps += 1
        self.seconds += time.perf_counter() - started
        return {"losses/value_head_loss": loss_before, "losses/value_head_fit_loss": loss_after,
                "charts/value_head_explained_variance": explained, "time/value_head_s": self.seconds}


def head_critic(algorithm: Any, config: CriticConfig) -> HeadCritic:
    """This step's critic over ``algorithm.value_head`` (made on first use, with ``config.learning_rate``)."""
    hidden_size = algorithm.model.config.get_text_config().hidden_size
    head = getattr(algorithm, "value_head", None)
    if head is None or head.linear.in_features != hidden_size:
        head = ValueHead(hidden_size, config.learning_rate)
        algorithm.value_head = head
    return HeadCritic(head, algorithm, config)
