"""Seconds per GRPO update: spanrl's GRPO (TRL's loss fed external transitions) vs TRL's own GRPOTrainer.

Same run, same tiny model folder, same batches, same hyperparameters (lr 5e-4, loss_type dapo, beta 0,
epsilon 0.2, one optimizer step per batch, gradient clipping at 1.0).

1. TRL baseline: `trl.GRPOTrainer.train()` with its own generation (transformers `generate` on CPU,
   `--prompts` prompts x `--generations` completions of `--new-tokens` tokens, temperature 1) and a
   reward function. Timed per optimizer step: `on_step_begin` -> `on_step_end` (forward, loss,
   backward, clipping, optimizer and scheduler step, TRL's bookkeeping) MINUS the time spent in
   `_generate_and_score_completions` (generation, reward, advantages), which is measured separately.
   Each generated batch (ids, masks, advantages) is kept.
2. spanrl: `GRPO.update(batch)` on each kept batch, turned into `Transition`s (padding stripped; old
   log-probs computed beforehand from the initial model, standing in for the policy server's, not
   timed). Timed: the whole `update()` call (padding into tensors, TRL's `training_step`, clipping,
   optimizer step, metrics).

Both start from the same weights. Medians over `--steps` steps after `--warmup` steps (of every
round: `--rounds` alternates TRL and spanrl runs, so load drift on a shared machine hits both); the
ratio is spanrl / TRL (goal <= 1.1).

Usage:
    .venv/bin/python bench/train_step.py [--steps 20] [--warmup 3] [--prompts 16] [--generations 8]
        [--new-tokens 8] [--hidden 128] [--layers 4] [--rounds 1]
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
    from spanrl.algorithms.tiny import build_tiny_model

    return build_tiny_model(out_dir, words=WORDS, hidden_size=hidden, num_layers=layers,
                            intermediate_size=2 * hidden, num_heads=4, seed=0)


def run_trl(model_path: Path, out_dir: Path, args: argparse.Namespace) -> tuple[list[float], list[float], list[dict]]:
    """TRL's GRPOTrainer with its own generation: (update seconds, generation seconds, batches)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    gen_seconds: list[float] = []
    step_seconds: list[float] = []
    batches: list[dict] = []

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: Any) -> dict:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen_seconds.append(time.perf_counter() - start)
            batches.append({k: out[k].detach().clone() for k in
                            ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")})
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            step_seconds.append(time.perf_counter() - self.start)

    yes = "yes"

    def reward(completions: list, **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if t.split()[:1] == [yes] else 0.0 for t in texts]

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    n_batch = args.prompts * args.generations
    steps = args.warmup + args.steps
    prompts = [[{"role": "user", "content": f"w{i % 64}"}] for i in range(args.prompts * steps)]
    config = GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, report_to="none", seed=0,
        learning_rate=LEARNING_RATE, max_grad_norm=1.0, loss_type="dapo", beta=0.0, epsilon=0.2,
        per_device_train_batch_size=n_batch, num_generations=args.generations,
        max_completion_length=args.new_tokens, temperature=1.0, max_steps=steps, lr_scheduler_type="constant",
        logging_steps=10_000, save_strategy="no", disable_tqdm=True, log_completions=False,
    )
    trainer = Timed(model=model, reward_funcs=reward, args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
                    processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    update_seconds = [s - g for s, g in zip(step_seconds, gen_seconds)]
    return update_seconds, gen_seconds, batches


def to_transitions(batch: dict, logprobs: torch.Tensor) -> list:
    from spanrl.algorithms.transitions import Transition

    out = []
    for i in range(batch["prompt_ids"].size(0)):
        p = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        keep = batch["completion_mask"][i].bool()
        c = batch["completion_ids"][i][keep].tolist()
        out.append(Transition(
            rollout_id=f"r{i}", task_id=f"t{i // 8}", attempt=1, agent=None, step=0, prompt_ids=p, completion_ids=c,
            completion_mask=[1] * len(c), old_logprobs=logprobs[i][keep].tolist(),
            reward=0.0, advantage=float(batch["advantages"][i]), policy_version=0, retokenized=False,
        ))
    return out


def run_spanrl(model_path: Path, out_dir: Path, batches: list[dict], args: argparse.Namespace) -> list[float]:
    """spanrl's GRPO.update on the same batches: seconds per update."""
    from spanrl.algorithms.base import pad_transitions
    from spanrl.algorithms.grpo import GRPO

    algo = GRPO(learning_rate=LEARNING_RATE, loss_type="dapo", beta=0.0, epsilon=0.2, max_grad_norm=1.0,
                max_completion_length=args.new_tokens)
    algo.setup(model_path=model_path, output_dir=out_dir, seed=0)
    seconds = []
    for batch in batches:
        transitions = to_transitions(batch, torch.zeros_like(batch["completion_ids"], dtype=torch.float32))
        # the policy server's log-probs: the current policy, computed outside the timer
        logps = algo._logprobs(algo.model, pad_transitions(transitions, pad_token_id=algo.tokenizer.pad_token_id))
        transitions = to_transitions(batch, logps)
        start = time.perf_counter()
        algo.update(transitions)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="TRL then spanrl, this many times")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    trl_update: list[float] = []
    trl_gen: list[float] = []
    ours: list[float] = []
    w = args.warmup
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model_path = build_model(tmp_path / "model", args.hidden, args.layers)
        for r in range(args.rounds):  # alternate the two sides so load drift on a shared machine hits both
            update_s, gen_s, batches = run_trl(model_path, tmp_path / f"trl{r}", args)
            trl_update += update_s[w:]
            trl_gen += gen_s[w:]
            ours += run_spanrl(model_path, tmp_path / f"spanrl{r}", batches, args)[w:]
    trl_med, ours_med, gen_med = (statistics.median(x) for x in (trl_update, ours, trl_gen))
    print(f"model: tiny Llama hidden {args.hidden}, {args.layers} layers; batch {args.prompts} prompts x "
          f"{args.generations} completions x {args.new_tokens} new tokens; {args.rounds} round(s) of {args.steps} "
          f"timed steps after {w} warm-up, sides alternating")
    print(f"TRL GRPOTrainer  update (step minus generation): median {trl_med * 1000:8.1f} ms")
    print(f"TRL GRPOTrainer  generation + scoring (not compared): median {gen_med * 1000:8.1f} ms")
    print(f"spanrl GRPO      update() on the same batches:       median {ours_med * 1000:8.1f} ms")
    print(f"ratio spanrl / TRL update time: {ours_med / trl_med:.2f}x (goal <= 1.10x)")


if __name__ == "__main__":
    main()
