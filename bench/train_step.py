"""Seconds per GRPO update: spanrl's GRPO (TRL's loss fed external transitions) vs TRL's own GRPOTrainer.

Same run, same tiny model folder, same batches, same hyperparameters (lr 5e-4, loss_type dapo, beta 0,
epsilon 0.2, one optimizer step per batch, gradient clipping at 1.0), measured step by step, interleaved:

1. TRL baseline: `trl.GRPOTrainer.train()` with its own generation (transformers `generate` on CPU,
   `--prompts` prompts x `--generations` completions of up to `--new-tokens` tokens, temperature 1) and
   a reward function. Timed per optimizer step: `on_step_begin` -> `on_step_end` (forward, loss,
   backward, clipping, optimizer and scheduler step, TRL's bookkeeping) MINUS the time spent in
   `_generate_and_score_completions` (generation, reward, advantages), measured separately.
2. spanrl, right after each TRL step (in its `on_step_end` callback, so both sides see the same machine
   load): `GRPO.update(transitions)` on the batch TRL just generated (padding stripped, TRL's
   advantages), on a second model that started from the same weights. Old log-probs stand in for the
   policy server's: computed from spanrl's current policy just before, not timed. Timed: the whole
   `update()` call (transitions -> tensors, TRL's `training_step`, clipping, optimizer step, metrics).

Medians over `--steps` steps after `--warmup` steps; ratio = spanrl / TRL (goal <= 1.1), both as the
ratio of medians and the median of per-step ratios.

Measured here (2 shared cores, OMP_NUM_THREADS=1, load ~2, 15 steps after 3 warm-up): TRL 144 ms,
spanrl 120 ms per update: 0.84x (0.83x median per step). Under heavy load (8-15 on 2 cores, default
threads) runs gave 0.65x-0.91x interleaved; a non-interleaved run once gave 1.12x (load drift).

Usage:
    OMP_NUM_THREADS=1 .venv/bin/python bench/train_step.py [--steps 20] [--warmup 3] [--prompts 16] [--generations 8]
        [--new-tokens 8] [--hidden 128] [--layers 4]

SmolLM2 case (``--model smollm2``, bench/train_step_smollm2.py): a real 134.5M-parameter model's GRPO
update in tokens/s against this machine's matmul bound measured in the same run:

    .venv/bin/python bench/train_step.py --model smollm2 [--rollouts 16] [--steps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

LEARNING_RATE = 5e-4
WORDS = [f"w{i}" for i in range(64)] + ["yes", "no"]


def build_model(out_dir: Path, hidden: int, layers: int) -> Path:
    from spanrl.demo.tiny import build_tiny_model

    return build_tiny_model(out_dir, words=WORDS, hidden_size=hidden, num_layers=layers,
                            intermediate_size=2 * hidden, num_heads=4, seed=0)


def to_transitions(batch: dict, logprobs: torch.Tensor | None) -> list:
    """TRL's generated batch as spanrl transitions (padding stripped)."""
    from spanrl.algorithms.transitions import Transition

    out = []
    for i in range(batch["prompt_ids"].size(0)):
        p = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        keep = batch["completion_mask"][i].bool()
        c = batch["completion_ids"][i][keep].tolist()
        out.append(Transition(
            rollout_id=f"r{i}", task_id=f"t{i // 8}", attempt=1, agent=None, step=0, prompt_ids=p, completion_ids=c,
            completion_mask=[1] * len(c), old_logprobs=[] if logprobs is None else logprobs[i][keep].tolist(),
            reward=0.0, advantage=float(batch["advantages"][i]), policy_version=0, retokenized=False,
        ))
    return out


class SpanrlSide:
    """spanrl's GRPO on its own copy of the model, updated on each batch TRL generates."""

    def __init__(self, model_path: Path, out_dir: Path, args: argparse.Namespace) -> None:
        from spanrl.algorithms.grpo import GRPO

        self.algo = GRPO(learning_rate=LEARNING_RATE, loss_type="dapo", beta=0.0, epsilon=0.2, max_grad_norm=1.0,
                         max_completion_length=args.new_tokens)
        self.algo.setup(model_path=model_path, output_dir=out_dir, seed=0)
        self.seconds: list[float] = []

    def update(self, batch: dict) -> None:
        from spanrl.algorithms.tables import pad_transitions

        # the policy server's log-probs: spanrl's current policy, computed outside the timer
        data = pad_transitions(to_transitions(batch, None), pad_token_id=self.algo.tokenizer.pad_token_id)
        data.old_logprobs = torch.zeros(data.completion_ids.shape)
        logps = self.algo._logprobs(self.algo.model, data)
        transitions = to_transitions(batch, logps)
        start = time.perf_counter()
        self.algo.update(transitions)
        self.seconds.append(time.perf_counter() - start)


def run(model_path: Path, out_dir: Path, args: argparse.Namespace) -> tuple[list[float], ...]:
    """(TRL update, TRL generation, spanrl update, TRL training_step minus generation) seconds per step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    ours = SpanrlSide(model_path, out_dir / "spanrl", args)
    gen_seconds: list[float] = []
    trl_seconds: list[float] = []
    trl_loss_seconds: list[float] = []
    batches: list[dict] = []

    class Timed(GRPOTrainer):
        def training_step(self, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            out = super().training_step(*a, **k)
            trl_loss_seconds.append(time.perf_counter() - start - gen_seconds[-1])
            return out

        def _generate_and_score_completions(self, inputs: Any) -> dict:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen_seconds.append(time.perf_counter() - start)
            batches.append({k: out[k].detach().clone() for k in
                            ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")})
            return out

    class Interleave(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            trl_seconds.append(time.perf_counter() - self.start - gen_seconds[-1])
            ours.update(batches[-1])

    def reward(completions: list, **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if t.split()[:1] == ["yes"] else 0.0 for t in texts]

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    steps = args.warmup + args.steps
    prompts = [[{"role": "user", "content": f"w{i % 64}"}] for i in range(args.prompts * steps)]
    config = GRPOConfig(
        output_dir=str(out_dir / "trl"), use_cpu=True, bf16=False, report_to="none", seed=0,
        learning_rate=LEARNING_RATE, max_grad_norm=1.0, loss_type="dapo", beta=0.0, epsilon=0.2,
        per_device_train_batch_size=args.prompts * args.generations, num_generations=args.generations,
        max_completion_length=args.new_tokens, temperature=1.0, max_steps=steps, lr_scheduler_type="constant",
        logging_steps=10_000, save_strategy="no", disable_tqdm=True, log_completions=False,
    )
    trainer = Timed(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
                    processing_class=tokenizer, callbacks=[Interleave()])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trl_seconds, gen_seconds, ours.seconds, trl_loss_seconds


def main() -> None:
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    chosen, rest = first.parse_known_args()
    if chosen.model == "smollm2":  # its own options (train_step_smollm2.py)
        import train_step_smollm2

        train_step_smollm2.main(rest)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny",
                        help="tiny: spanrl vs TRL on the tiny model; smollm2: tokens/s against the matmul bound")
    args = parser.parse_args(rest)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_model(Path(tmp) / "model", args.hidden, args.layers)
        trl, gen, ours, trl_loss = (x[args.warmup :] for x in run(model_path, Path(tmp), args))
    trl_med, gen_med, ours_med = statistics.median(trl), statistics.median(gen), statistics.median(ours)
    loss_med = statistics.median(trl_loss)
    per_step = statistics.median(o / t for o, t in zip(ours, trl))
    print(f"model: tiny Llama hidden {args.hidden}, {args.layers} layers; batch {args.prompts} prompts x "
          f"{args.generations} completions x <= {args.new_tokens} new tokens; {len(trl)} timed steps after "
          f"{args.warmup} warm-up, interleaved step by step")
    print(f"TRL GRPOTrainer  update (step minus generation):        median {trl_med * 1000:8.1f} ms")
    print(f"  of which training_step minus generation (loss+backward): {loss_med * 1000:8.1f} ms")
    print(f"TRL GRPOTrainer  generation + scoring (not compared):   median {gen_med * 1000:8.1f} ms")
    print(f"spanrl GRPO      update() on the same batch, same step: median {ours_med * 1000:8.1f} ms")
    print(f"ratio spanrl / TRL update time: {ours_med / trl_med:.2f}x of medians, {per_step:.2f}x median per step "
          f"(goal <= 1.10x)")


if __name__ == "__main__":
    main()
