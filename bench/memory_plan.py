"""The memory plan (``spanrl.algorithms.memory_plan``) against a measured peak, on CPU; and what one GPU fits.

    .venv/bin/python bench/memory_plan.py [--model smollm2] [--rows 8] [--micro 4 8] [--prompt 256] [--completion 128]
    .venv/bin/python bench/memory_plan.py --gpu-table [--gpu-gib 80]

Each case runs in a fresh process: spanrl's ``GRPO`` set up on the model, one update of ``rows`` synthetic
transitions (random tokens, prompt and completion of fixed lengths, the model's own log-probs as the old
ones), and the process's peak resident memory (``ru_maxrss``) read after it. The plan for the same
config (no server in this process: ``embedded_server=False``) is printed beside it with the ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def one_case(model: str, rows: int, micro: int, prompt: int, completion: int, checkpointing: bool) -> dict:
    """Set up GRPO, run one update, return the measured peak and the plan (runs in a child process)."""
    import random

    import torch

    from spanrl.algorithms.grpo import GRPO
    from spanrl.algorithms.memory_plan import plan_memory
    from spanrl.algorithms.transitions import Transition
    from spanrl.serving.models import resolve_model

    torch.manual_seed(0)
    path = resolve_model(model)
    algo = GRPO(learning_rate=1e-6, micro_batch_size=micro, max_completion_length=completion, bf16=True,
                share_prefix=False, skip_zero_advantage=False, gradient_checkpointing=checkpointing)
    plan = plan_memory(path, algo.config, rows=rows, prompt_tokens=prompt, embedded_server=False)
    with tempfile.TemporaryDirectory() as out:
        algo.setup(model_path=path, output_dir=Path(out), seed=0)
        rng, vocab = random.Random(0), algo.model.config.vocab_size
        batch = []
        for i in range(rows):
            p = [rng.randrange(100, vocab) for _ in range(prompt)]
            c = [rng.randrange(100, vocab) for _ in range(completion)]
            batch.append(Transition(
                rollout_id=f"r{i}", task_id=f"t{i // 4}", attempt=1, agent=None, step=0, prompt_ids=p,
                completion_ids=c, completion_mask=[1] * completion, old_logprobs=[-5.0] * completion,
                reward=float(i % 2), advantage=1.0 if i % 2 else -1.0, policy_version=0, retokenized=False))
        algo.update(batch)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rows": rows, "micro": micro, "prompt": prompt, "completion": completion, "checkpointing": checkpointing,
            "measured_gib": peak / 1024**3, "plan_gib": plan.total / 1024**3, "ratio": plan.total / peak,
            "parts_gib": {k: round(v / 1024**3, 3) for k, v in plan.parts.items()}}


# Qwen2-shaped configs (Qwen2.5-0.5B and -1.5B's published shapes), built locally: no hub.
QWEN2_SHAPES = {
    "0.5B": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864},
    "1.5B": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960},
}


def gpu_table(gib: float) -> None:
    """The plan of a GRPO step (64 rows of 1024 + 512 tokens, micro-batches of 8, vLLM beside it at 0.3) for
    the two Qwen2 shapes, full fine-tuning and LoRA r=16, with and without gradient checkpointing."""
    from transformers import Qwen2Config

    from spanrl.algorithms.grpo import GRPOConfig
    from spanrl.algorithms.lora import LoRAConfig
    from spanrl.algorithms.memory_plan import plan_memory

    for size, shape in QWEN2_SHAPES.items():
        with tempfile.TemporaryDirectory() as folder:
            Qwen2Config(vocab_size=151936, tie_word_embeddings=True, **shape).save_pretrained(folder)
            for lora in (None, LoRAConfig(r=16)):
                for ckpt in (False, True):
                    cfg = GRPOConfig(micro_batch_size=8, max_completion_length=512, lora=lora, bf16=True,
                                     gradient_checkpointing=ckpt)
                    plan = plan_memory(folder, cfg, device="cuda", rows=64, prompt_tokens=1024,
                                       serving_backend="vllm", gpu_memory_utilization=0.3, capacity=int(gib * 1024**3))
                    what = f"{'LoRA r=16' if lora else 'full'}{', checkpointing' if ckpt else ''}"
                    parts = ", ".join(f"{k} {v / 1024**3:.1f}" for k, v in plan.parts.items())
                    print(f"memory_plan: Qwen2-{size} {what}: {plan.total / 1024**3:.1f} GiB of {gib:.0f} "
                          f"({'fits' if plan.fits else 'does not fit'}): {parts}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--micro", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--checkpointing", action="store_true", help="also each case with gradient checkpointing")
    parser.add_argument("--gpu-table", action="store_true", help="the plans of 0.5B and 1.5B Qwen2 shapes on a GPU")
    parser.add_argument("--gpu-gib", type=float, default=80.0)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child: one case as JSON
    args = parser.parse_args(argv)
    if args.gpu_table:
        gpu_table(args.gpu_gib)
        return
    if args.case:
        print(json.dumps(one_case(args.model, **json.loads(args.case))))
        return
    for micro in args.micro:
        for ckpt in (False, True) if args.checkpointing else (False,):
            case = {"rows": args.rows, "micro": micro, "prompt": args.prompt, "completion": args.completion,
                    "checkpointing": ckpt}
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--case", json.dumps(case)],
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            print(f"memory_plan: rows {r['rows']} micro {r['micro']} tokens {r['prompt']}+{r['completion']}"
                  f"{' checkpointing' if ckpt else ''}: measured {r['measured_gib']:.2f} GiB, "
                  f"plan {r['plan_gib']:.2f} GiB (plan/measured {r['ratio']:.2f}) {r['parts_gib']}")


if __name__ == "__main__":
    main()
