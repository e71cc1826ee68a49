"""A toy task for the algorithm tests: answer ``<user> wN <eos> <assistant>`` with the word ``yes`` first.

Completions are sampled from the tiny model itself (real old log-probs), the reward is 1 when the first
completion token is ``yes``, and advantages are group-relative (GRPO style), so every algorithm gets the
transitions a Trainer would hand it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from spanrl.demo.tiny import build_tiny_model
from spanrl.algorithms.transitions import TRANSITIONS_SCHEMA, Transition, TransitionBatch

WORDS = [f"w{i}" for i in range(24)] + ["yes", "no", "maybe"]
TARGET = "yes"
N_NEW_TOKENS = 3



def batch_of(transitions: Sequence[Transition]) -> TransitionBatch:
    """A real ``TransitionBatch`` (Arrow-backed, as ``load_transitions`` returns) of ``transitions``."""
    import dataclasses

    import pyarrow as pa

    table = pa.Table.from_pylist([dataclasses.asdict(t) for t in transitions], schema=TRANSITIONS_SCHEMA)
    batch = TransitionBatch(table, {}, {t.rollout_id: t.reward for t in transitions})
    batch.__dict__["transitions"] = list(transitions)  # keep the objects the test mutates
    return batch


def build_model(out_dir: Path) -> Path:
    """The tiny model (~0.6M parameters) with the toy vocabulary."""
    return build_tiny_model(out_dir, words=WORDS, seed=0)


def prompt_ids(tokenizer, task: int) -> list[int]:
    """``<bos> <user> wN <eos> <assistant>`` as ids."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"w{task}"}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def sample(model, prompts: Sequence[list[int]], *, n_new: int, generator: torch.Generator, greedy: bool = False):
    """Sample ``n_new`` tokens per prompt (equal-length prompts) at temperature 1; ids and log-probs."""
    was_training = model.training
    model.eval()
    ids = torch.tensor(prompts, dtype=torch.long)  # (B, P)
    out_ids, out_logps = [], []
    for _ in range(n_new):
        logits = model(input_ids=ids).logits[:, -1, :].float()  # (B, V)
        logps = torch.log_softmax(logits, dim=-1)
        if greedy:
            nxt = logps.argmax(-1)
        else:
            nxt = torch.multinomial(logps.exp(), 1, generator=generator).squeeze(1)  # (B,)
        out_ids.append(nxt)
        out_logps.append(logps.gather(1, nxt[:, None]).squeeze(1))
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    model.train(was_training)
    return torch.stack(out_ids, 1).tolist(), torch.stack(out_logps, 1).tolist()


def rollouts(model, tokenizer, *, tasks: Sequence[int], group: int, generator: torch.Generator, step: int = 0):
    """One group of ``group`` sampled answers per task, rewarded and with group-relative advantages."""
    target = tokenizer.convert_tokens_to_ids(TARGET)
    prompts = [prompt_ids(tokenizer, task) for task in tasks for _ in range(group)]
    completions, logps = sample(model, prompts, n_new=N_NEW_TOKENS, generator=generator)
    out = []
    for i, (p, c, lp) in enumerate(zip(prompts, completions, logps)):
        task = tasks[i // group]
        out.append(
            Transition(
                rollout_id=f"r{step}-{i}", task_id=f"t{task}", attempt=1, agent=None, step=0,
                prompt_ids=p, completion_ids=c, completion_mask=[1] * len(c), old_logprobs=lp,
                reward=1.0 if c[0] == target else 0.0, advantage=0.0, policy_version=step, retokenized=False,
            )
        )
    for g in range(len(tasks)):
        members = out[g * group : (g + 1) * group]
        rewards = torch.tensor([t.reward for t in members])
        adv = (rewards - rewards.mean()) / (rewards.std(correction=0) + 1e-4)
        for t, a in zip(members, adv.tolist()):
            t.advantage = a
    return out


def success_rate(model, tokenizer, *, tasks: Sequence[int], samples: int, seed: int) -> float:
    """Mean reward of ``samples`` sampled answers per task (fresh seeded generator)."""
    gen = torch.Generator().manual_seed(seed)
    batch = rollouts(model, tokenizer, tasks=tasks, group=samples, generator=gen)
    return sum(t.reward for t in batch) / len(batch)
