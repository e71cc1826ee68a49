"""The policy server's prefix cache on the calc-verify probe's requests: CPU seconds and prompt tokens prefilled,
with and without it, and whether the replies agree; ``--bits``: whether its log-probs are bit-equal.

    nice .venv/bin/python bench/prefix_cache.py --tasks 8 --group 4 --threads 1
    nice .venv/bin/python bench/prefix_cache.py --bits --shared 300 --threads 1

Plays the probe's episodes (``examples/smollm2/verify_probe.py``'s ``probe``: SmolLM2-135M-Instruct, the task's
shots and ``--recovery-shots`` solved recoveries, temperature 1, a seeded generator per episode and call) through
the transformers backend the server runs (``TransformersBackend.generate``, every live episode's call in one
batch, ``--group`` episodes a task as GRPO sends them), once with the cache and once without, in one process. CPU
time is this process's user + sys (``time.process_time``), the figure to read on a busy machine.

``--bits``: greedy batches of random prompts behind a ``--shared``-token prefix, with and without the cache, then a
prompt alone twice on one backend (a miss, then a hit), then batching's own effect (a request alone and in a
batch, no cache): tokens equal, log-probs bit-equal, the largest log-prob difference.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class BackendGenerator:
    """The probe's generator, through ``TransformersBackend``: each chat rendered with the tools, one request each,
    sampled at temperature 1 with a seed of its episode and turn (the same draws with and without the cache)."""

    def __init__(self, backend: Any, seed: int) -> None:
        self.backend, self.seed, self.turn, self.prompt_tokens = backend, seed, 0, 0
        self.replies: list[str] = []

    def __call__(self, chats: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None,
                 max_tokens: int) -> list[str]:
        from spanrl.serving.backend import GenerationRequest, SamplingParams
        from spanrl.serving.chat import normalize_messages

        tok = self.backend.tokenizer
        prompts = [list(tok.apply_chat_template(normalize_messages(c), tools=tools, add_generation_prompt=True,
                                                tokenize=True, return_dict=True)["input_ids"]) for c in chats]
        self.turn += 1
        requests = [GenerationRequest(p, SamplingParams(max_tokens=max_tokens, temperature=1.0,
                                                        seed=self.seed + 1000 * self.turn + i))
                    for i, p in enumerate(prompts)]
        self.prompt_tokens += sum(len(p) for p in prompts)
        texts = [out[0].text for out in self.backend.generate(requests)]
        self.replies += texts
        return texts


def arm(model: Path, caching: bool, tasks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    from examples.smollm2.verify_probe import probe
    from spanrl.demo.smollm2.verify import Episode
    from spanrl.serving.hf_backend import TransformersBackend

    backend = TransformersBackend(model, enable_prefix_caching=caching)
    gen = BackendGenerator(backend, args.seed)
    cpu, wall = time.process_time(), time.perf_counter()
    figures = probe(gen, [Episode(t, recovery=args.recovery_shots) for t in tasks for _ in range(args.group)],
                    args.max_tokens)
    cache = backend.prefix_cache
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, "calls": len(gen.replies),
            "prompt_tokens": gen.prompt_tokens, "prefilled": cache.prefill_tokens if cache else gen.prompt_tokens,
            "hits": cache.hits if cache else 0, "replies": gen.replies, "figures": figures}


def bits(model: Path, shared_tokens: int) -> None:
    """The ``--bits`` comparisons; see the module docstring."""
    import random

    from spanrl.serving.backend import GenerationRequest, SamplingParams
    from spanrl.serving.hf_backend import TransformersBackend

    on = TransformersBackend(model, enable_prefix_caching=True)
    off = TransformersBackend(model, enable_prefix_caching=False)
    rng = random.Random(0)
    vocab = len(on.tokenizer)
    shared = [rng.randrange(4, vocab - 10) for _ in range(shared_tokens)]

    def requests(k: int, n: int | None = None) -> list[Any]:
        return [GenerationRequest(shared + [rng.randrange(4, vocab - 10) for _ in range(rng.randrange(1, 40))],
                                  SamplingParams(max_tokens=12, temperature=0.0), n=n or rng.choice([1, 2]))
                for _ in range(k)]

    def compare(pairs: list[tuple[Any, Any]], what: str) -> None:
        same = [a.token_ids == b.token_ids for a, b in pairs]
        diff = max((max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) for a, b in pairs
                    if a.token_ids == b.token_ids), default=0.0)
        print(f"{what}: tokens equal {sum(same)}/{len(pairs)}, log-probs bit-equal "
              f"{sum(a.logprobs == b.logprobs for a, b in pairs)}/{len(pairs)}, max |d log-prob| {diff:.3g}")

    pairs = []
    for _ in range(4):
        batch = requests(3)
        pairs += [(a, b) for x, y in zip(on.generate(batch), off.generate(batch)) for a, b in zip(x, y)]
    compare(pairs, "batches, cache on vs off")
    pairs = []
    for request in requests(4, n=1):
        fresh = TransformersBackend(model)
        pairs.append((fresh.generate([request])[0][0], fresh.generate([request])[0][0]))
    compare(pairs, "a prompt alone, miss vs hit")
    batch = requests(3)
    pairs = [(c, off.generate([GenerationRequest(r.prompt_ids, r.params)])[0][0])
             for r, out in zip(batch, off.generate(batch)) for c in out]
    compare(pairs, "no cache, in a batch vs alone")


def main(argv: list[str] | None = None) -> int:
    import torch

    from spanrl.demo.smollm2.tools import tool_model
    from spanrl.demo.smollm2.verify import split
    from spanrl.serving.models import SMOLLM2, resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=2, help="episodes a task (GRPO's group)")
    parser.add_argument("--recovery-shots", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bits", action="store_true", help="the bit-equality comparisons instead")
    parser.add_argument("--shared", type=int, default=300, help="--bits: tokens of the shared prefix")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = resolve_model(SMOLLM2)
    model = tool_model(base, base.with_name(base.name + "-tools"))
    if args.bits:
        bits(model, args.shared)
        return 0
    tasks, _ = split(args.tasks, 0, seed=args.seed)
    runs = {caching: arm(model, caching, tasks, args) for caching in (True, False)}
    same = sum(a == b for a, b in zip(runs[True]["replies"], runs[False]["replies"]))
    for caching, run in runs.items():
        print(f"cache {'on ' if caching else 'off'}: {run['cpu_s']:.1f} CPU-s ({run['wall_s']:.1f} s wall), "
              f"{run['calls']} calls, {run['prompt_tokens']} prompt tokens, {run['prefilled']} prefilled "
              f"({run['hits']} from the cache); rejected-then-right {run['figures']['rejected_then_right']:.3f}")
    print(f"replies equal: {same} of {len(runs[True]['replies'])} (calls with the cache / without: "
          f"{runs[True]['calls']} / {runs[False]['calls']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
