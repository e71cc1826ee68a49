"""GRPO update speed on a real model (SmolLM2-135M-Instruct) against this machine's matmul bound.

    .venv/bin/python bench/train_step.py --model smollm2 [--rollouts 16] [--steps 3] [--threads 2]

Each case builds spanrl's ``GRPO`` on the model and times ``update()`` on the same batch of synthetic
agent transitions (random token ids; groups of ``GROUP`` rollouts share a prompt, as in GRPO; prompt
and completion lengths drawn uniformly from the given ranges, as an agent's calls vary; old log-probs
from the model itself, as the policy server records them, computed outside the timer). Right before
each timed update, the same process times a 2048x2048 ``torch.matmul`` in fp32 and in bf16: the bound,
under the same machine load.

Cases: ``fp32`` (the update before this bench: fp32, micro-batches in random order) and ``bf16``
(bf16 autocast with an fp32 LM head, micro-batches sorted by length: GRPOConfig's defaults on a CPU
with AVX512-BF16). Useful FLOPs = 6 x (linear-layer parameters outside the embedding) x real tokens
+ 6 x (LM head parameters) x completion tokens (TRL projects only completion positions); attention
score FLOPs and padding are not counted. Fraction = useful GFLOP/s / the matmul bound of the
update's dtype.

Measured (this 2-core shared machine, ``--rollouts 16 --steps 3 --threads 2``, defaults otherwise):

- before (15:04 UTC, load 1-2): fp32 52.7 s = 59 GFLOP/s = 41% of the fp32 bound (143); bf16 then was
  18% of the bf16 bound (379) in the issue's measurement.
- after the LM head runs only at completion positions and autocast casts the weights once per step
  (15:55 UTC, load 1.1-1.9): bf16 23.4 s (23.4, 23.8,
  23.0) = 196 tokens/s = 132 GFLOP/s = **37%** of the bf16 bound measured beside it (354); 2.25x the
  fp32 update. Repeated at 16:06 UTC (load 0.3-1.7): 19.8 s (18.7, 19.8, 21.1) = 232 tokens/s = 156
  GFLOP/s = **39%** of 403; again at 16:08 (load 1.6-2.0): 21.4 s = 144 GFLOP/s = 38% of 383. Median
  of the three runs: 38%. ``--micro 16`` is slower (25.4 s, 31%: more padding). At load 9-12: 105 s
  median, 17%.
- after the CPU fp32 LM head keeps its log-probs (``batching.head_logprobs``; 17:00 UTC, load ~2, one
  process alternating the two heads on this batch, 4 updates each): 20.3 s against TRL's chunked head's
  22.0 s = 152 against 141 GFLOP/s = **40%** against 37% of the bound's median over the 8 readings (381;
  single readings 202-412). Repeated at 17:03 (load 0.9-1.9, 3 each): 19.5 s against 21.7 s, per-update
  fractions 41.6% against 37.3% (medians). Back to back through this script at load 1.2-2: before 28.1 s at a 296
  bound (37%), after 23.6 s at a 360 bound (36%): the bound reading moves as much as the update.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

LEARNING_RATE = 1e-6
GROUP = 4
"""Rollouts per prompt (a GRPO group)."""
MATMUL_SIZE = 2048
CASES = {
    "fp32": {"bf16": False, "length_bucketing": False, "share_prefix": False},
    "bf16": {"bf16": True, "length_bucketing": True, "share_prefix": False},
    "bf16_shared": {"bf16": True, "length_bucketing": True, "share_prefix": True},
}


def matmul_gflops(dtype: torch.dtype, size: int = MATMUL_SIZE, repeats: int = 3) -> float:
    """Median GFLOP/s of ``size`` x ``size`` matmuls in ``dtype`` (one warm-up)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(seconds) / 1e9


def synthetic_transitions(model: Any, vocab: int, n: int, prompt: tuple[int, int], completion: tuple[int, int],
                          seed: int) -> list:
    """``n`` transitions of random tokens with the model's own (fp32) log-probs as the old ones."""
    from spanrl.algorithms.transitions import Transition

    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % GROUP == 0:  # a GRPO group's rollouts share the prompt
            p = [rng.randrange(100, vocab) for _ in range(rng.randint(*prompt))]
        c = [rng.randrange(100, vocab) for _ in range(rng.randint(*completion))]
        with torch.no_grad():
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float()
        logps = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None]).squeeze(1)
        out.append(Transition(
            rollout_id=f"r{i}", task_id=f"t{i // 8}", attempt=1, agent=None, step=0, prompt_ids=p, completion_ids=c,
            completion_mask=[1] * len(c), old_logprobs=logps.tolist(), reward=float(i % 2),
            advantage=1.0 if i % 2 else -1.0, policy_version=0, retokenized=False,
        ))
    return out


def agent_transitions(model: Any, tokenizer: Any, n: int, completion: tuple[int, int], seed: int) -> list:
    """``n`` calls laid out as the SmolLM2 tool agent's (``spanrl.demo.smollm2.agentic``, one transition per
    call): the real prompt (its solved examples, the question, the ``tools``) through the tool chat template;
    8 rollouts of two calls per task, the second call carrying a multiply tool call (random operands) and the
    tool's result. Completions are random tokens, old log-probs the model's own."""
    from spanrl.algorithms.transitions import Transition
    from spanrl.demo.smollm2.tools import SHOTS, TOOLS, make_tasks

    rng = random.Random(seed)
    tasks = make_tasks(n, seed=seed)
    out: list = []
    for i in range(n):
        task = tasks[(i // 16) % len(tasks)]  # 16 calls: 8 rollouts of a task, half of them with a second call
        messages = [*SHOTS, {"role": "user", "content": task["question"]}]
        if i % 2:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            call = {"id": f"call_{i}", "type": "function",
                    "function": {"name": "multiply", "arguments": json.dumps({"a": a, "b": b})}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": str(a * b)}]
        p = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
        c = [rng.randrange(100, model.config.vocab_size) for _ in range(rng.randint(*completion))]
        with torch.no_grad():
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float()
        logps = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None]).squeeze(1)
        out.append(Transition(
            rollout_id=f"r{i // 2}", task_id=f"t{i // 16}", attempt=1, agent=None, step=i % 2, prompt_ids=list(p),
            completion_ids=c, completion_mask=[1] * len(c), old_logprobs=logps.tolist(), reward=float(i % 3 == 0),
            advantage=1.0 if i % 3 == 0 else -0.5, policy_version=0, retokenized=False,
        ))
    return out


def flop_counts(model: Any) -> tuple[int, int]:
    """(linear-layer parameters outside the embedding, LM head parameters)."""
    head = model.get_output_embeddings().weight
    body = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and p is not head and "embed" not in n)
    return body, head.numel()


def run_case(name: str, model_path: Path, out: Path, transitions: list, args: argparse.Namespace) -> dict[str, Any]:
    """Timed updates of one case, each right after a matmul-bound measurement."""
    from spanrl.algorithms.grpo import GRPO

    algo = GRPO(learning_rate=LEARNING_RATE, micro_batch_size=args.micro, max_completion_length=args.completion[1],
                **CASES[name])
    algo.setup(model_path=model_path, output_dir=out / name, seed=0)
    algo.update(transitions)  # warm-up: allocator, kernels, optimizer state
    seconds, fp32, bf16 = [], [], []
    for _ in range(args.steps):
        fp32.append(matmul_gflops(torch.float32))
        bf16.append(matmul_gflops(torch.bfloat16))
        start = time.perf_counter()
        algo.update(transitions)
        seconds.append(time.perf_counter() - start)
    return {"seconds": statistics.median(seconds), "fp32": statistics.median(fp32), "bf16": statistics.median(bf16),
            "bound": statistics.median(bf16 if algo.bf16 else fp32), "all_seconds": seconds}


def padding_share(transitions: list, micro: int, sort: bool) -> float:
    """Share of the computed positions that are padding, for one pass in random (or length) order."""
    from spanrl.algorithms.batching import length_sorted_micro_batches, padded_tokens

    p = torch.tensor([len(t.prompt_ids) for t in transitions])
    c = torch.tensor([len(t.completion_ids) for t in transitions])
    rows = torch.randperm(len(transitions), generator=torch.Generator().manual_seed(0))
    batches = list(length_sorted_micro_batches(rows, p, c, micro, sort=sort))
    return 1 - int((p + c).sum()) / padded_tokens(p, c, batches)


def computed_positions(transitions: list, micro: int) -> tuple[int, int]:
    """Positions one length-sorted pass computes: padded, and with each micro-batch's shared prefix once."""
    from spanrl.algorithms.batching import MIN_SHARED_PREFIX, length_sorted_micro_batches, shared_prefix_length
    from spanrl.algorithms.tables import pad_transitions

    p = torch.tensor([len(t.prompt_ids) for t in transitions])
    c = torch.tensor([len(t.completion_ids) for t in transitions])
    rows = torch.randperm(len(transitions), generator=torch.Generator().manual_seed(0))
    padded = shared = 0
    for batch in length_sorted_micro_batches(rows, p, c, micro):
        part = pad_transitions([transitions[i] for i in batch.tolist()], pad_token_id=0)  # as the update pads
        ids = torch.cat([part.prompt_ids, part.completion_ids], 1)
        mask = torch.cat([part.prompt_mask, part.completion_mask], 1)
        n = shared_prefix_length(ids, mask, part.completion_ids.size(1))
        padded += ids.numel()
        # as backbone_hidden splits it: the prefix once, then every row as wide as the longest row's rest
        shared += ids.numel() if n < MIN_SHARED_PREFIX else n + len(batch) * (ids.size(1) - n)
    return padded, shared


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--prompt", type=int, nargs=2, default=(60, 300), metavar=("MIN", "MAX"))
    parser.add_argument("--completion", type=int, nargs=2, default=(10, 120), metavar=("MIN", "MAX"))
    parser.add_argument("--micro", type=int, default=4, help="micro-batch rows")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--cases", default="fp32,bf16", help=f"of {', '.join(CASES)}")
    parser.add_argument("--agent-prompts", action="store_true",
                        help="the tool agent's real prompts (agent_transitions), not random ones")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from spanrl.serving.models import SMOLLM2, resolve_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model_path = resolve_model(SMOLLM2)
    if args.agent_prompts:
        from transformers import AutoTokenizer

        from spanrl.demo.smollm2.tools import tool_model

        model_path = tool_model(model_path, model_path.with_name(model_path.name + "-tools"))
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    if args.agent_prompts:
        transitions = agent_transitions(model, AutoTokenizer.from_pretrained(model_path), args.rollouts,
                                        tuple(args.completion), seed=0)
    else:
        transitions = synthetic_transitions(model, model.config.vocab_size, args.rollouts, tuple(args.prompt),
                                            tuple(args.completion), seed=0)
    body, head = flop_counts(model)
    del model
    tokens = sum(len(t.prompt_ids) + len(t.completion_ids) for t in transitions)
    completion = sum(len(t.completion_ids) for t in transitions)
    useful = 6 * body * tokens + 6 * head * completion
    print(f"SmolLM2-135M-Instruct: {body / 1e6:.1f}M linear + {head / 1e6:.1f}M LM head parameters; {args.rollouts} "
          f"transitions, {tokens} tokens ({completion} completion), micro-batches of {args.micro}; torch threads "
          f"{args.threads} of {os.cpu_count()} cpus; load {os.getloadavg()[0]:.1f}")
    print(f"padding share of computed positions: random order {padding_share(transitions, args.micro, False):.0%}, "
          f"length-sorted {padding_share(transitions, args.micro, True):.0%}")
    padded, shared = computed_positions(transitions, args.micro)
    print(f"positions a length-sorted pass computes: {padded} padded, {shared} with shared prefixes once "
          f"({shared / padded:.0%}); useful FLOPs below count every row's tokens (6 x parameters x {tokens})")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            r = results[name] = run_case(name, model_path, Path(tmp), transitions, args)
            gflops = useful / r["seconds"] / 1e9
            print(f"{name}: update median {r['seconds']:6.1f} s ({', '.join(f'{s:.1f}' for s in r['all_seconds'])}) "
                  f"= {tokens / r['seconds']:6.0f} tokens/s = {gflops:5.0f} GFLOP/s; matmul bound fp32 "
                  f"{r['fp32']:4.0f}, bf16 {r['bf16']:4.0f} GFLOP/s -> {gflops / r['bound']:.0%} of its dtype's bound; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    if {"bf16", "bf16_shared"} <= set(results):
        ratio = results["bf16"]["seconds"] / results["bf16_shared"]["seconds"]
        print(f"speed-up of the shared prefix in bf16: {ratio:.2f}x")
    if {"fp32", "bf16"} <= set(results):
        print(f"speed-up bf16 over fp32: {results['fp32']['seconds'] / results['bf16']['seconds']:.2f}x")
