"""The base model's greedy success on each task family, with plain transformers ``generate`` (no server).

    python examples/smollm2/probe.py [--n 60] [--max-tokens 24]

Prints, per family, the reward's success (the reply ends with the answer), ``exact`` (only the number)
and ``lenient`` (the arithmetic right, whatever follows), so a low reward tells a format problem, which
RL fixes fast, from an arithmetic one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.smollm2.tasks import FAMILIES, exact, lenient, make_tasks, messages, reward


def greedy_replies(model_dir: Path, chats: list[list[dict[str, str]]], max_tokens: int, batch: int = 32) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out: list[str] = []
    for i in range(0, len(chats), batch):
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats[i : i + batch]]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        out += tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from spanrl.serving.models import SMOLLM2, resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--shots", type=int, default=2, help="solved examples before the question (tasks.messages)")
    args = parser.parse_args(argv)
    model_dir = resolve_model(SMOLLM2)
    for family in args.families.split(","):
        tasks = make_tasks(family, args.n, seed=1)
        started = time.perf_counter()
        prompts = [messages(t["question"], family, args.shots) for t in tasks]
        replies = greedy_replies(model_dir, prompts, args.max_tokens)

        score = {f.__name__: sum(f(r, t["answer"]) for r, t in zip(replies, tasks)) / len(tasks)
                 for f in (reward, exact, lenient)}
        print(f"{family:5s} reward {score['reward']:.3f}  exact {score['exact']:.3f}  lenient {score['lenient']:.3f}  "
              f"({len(tasks)} tasks, {args.shots} shots, "
              f"{time.perf_counter() - started:.0f} s)  e.g. {tasks[0]['question']!r} -> {replies[0]!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
