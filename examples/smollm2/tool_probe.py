"""The base model on the tool task (``spanrl.demo.smollm2.tools``), with plain transformers ``generate`` (no server).

    python examples/smollm2/tool_probe.py [--n 48] [--shots 3] [--sample]

Prints, for the same tasks: success in its head (no tools, "Reply with only the number."); with the
tools, the share of first replies that are a parsable ``<tool_call>``, the share with the right tool and
arguments, and the episode's success (the agent's loop: run the tool, ask again, up to ``MAX_CALLS``
calls) with its calls per episode. ``--shots 0`` drops the three solved examples from the conversation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spanrl.demo.smollm2.agentic import MAX_CALLS
from spanrl.demo.smollm2.tools import SHOTS, TOOLS, make_tasks, reward, run_tool, tool_model


class Generator:
    """Greedy or sampled replies of one model folder to batches of chats, rendered with ``TOOLS``."""

    def __init__(self, model_dir: Path, *, sample: bool, threads: int | None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.torch, self.sample = torch, sample
        self.tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    def __call__(
        self, chats: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None, max_tokens: int
    ) -> list[str]:
        from spanrl.serving.chat import normalize_messages

        texts = [self.tok.apply_chat_template(normalize_messages(c), tools=tools, add_generation_prompt=True,
                                              tokenize=False)
                 for c in chats]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        options = ({"do_sample": True, "temperature": 1.0, "top_p": None, "top_k": None} if self.sample
                   else {"do_sample": False})

        with self.torch.no_grad():
            ids = self.model.generate(**enc, max_new_tokens=max_tokens, pad_token_id=self.tok.pad_token_id, **options)
        return self.tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def episodes(gen: Generator, tasks: list[dict[str, Any]], shots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's loop for every task at once: the first reply, and the final reward and calls."""
    from spanrl.serving.chat import parse_tool_calls

    chats = [[*shots, {"role": "user", "content": t["question"]}] for t in tasks]
    out = [{"calls": 0, "reward": 0.0, "first": None} for _ in tasks]
    live = list(range(len(tasks)))
    for _ in range(MAX_CALLS):
        if not live:
            break
        replies = gen([chats[i] for i in live], TOOLS, 40)
        still = []
        for i, text in zip(live, replies):
            out[i]["calls"] += 1
            content, calls = parse_tool_calls(text, TOOLS)
            if out[i]["first"] is None:
                out[i]["first"] = calls[0]["function"] if calls else None
            if not calls:
                out[i]["reward"] = reward(text, tasks[i]["answer"])
                continue
            chats[i].append({"role": "assistant", "content": content, "tool_calls": calls})
            for call in calls:
                result = run_tool(call["function"]["name"], call["function"]["arguments"])
                chats[i].append({"role": "tool", "tool_call_id": call["id"], "content": result})
            still.append(i)
        live = still
    return out


def right_call(call: dict[str, Any] | None, task: dict[str, Any]) -> bool:
    if call is None:
        return False
    op, a, b = task["key"].split(":")
    args = json.loads(call["arguments"])
    return call["name"] == op and args.get("a") == int(a) and args.get("b") == int(b)


def main(argv: list[str] | None = None) -> int:
    from spanrl.serving.models import SMOLLM2, resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--shots", type=int, choices=(0, 3), default=3)
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 instead of greedy")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    base = resolve_model(SMOLLM2)
    gen = Generator(tool_model(base, base.with_name(base.name + "-tools")), sample=args.sample, threads=args.threads)
    tasks = make_tasks(args.n, seed=1)
    started = time.perf_counter()
    head = gen([[{"role": "user", "content": f"{t['question']} Reply with only the number."}] for t in tasks], None, 16)
    in_head = sum(reward(r, t["answer"]) for r, t in zip(head, tasks)) / len(tasks)
    runs = episodes(gen, tasks, SHOTS if args.shots else [])
    n = len(tasks)
    print(f"{'sampled' if args.sample else 'greedy'}, {n} tasks, {args.shots} shots: in its head {in_head:.3f} | "
          f"with tools: parsable first call {sum(r['first'] is not None for r in runs) / n:.3f}, right tool and "
          f"arguments {sum(right_call(r['first'], t) for r, t in zip(runs, tasks)) / n:.3f}, success "
          f"{sum(r['reward'] for r in runs) / n:.3f}, calls per episode {sum(r['calls'] for r in runs) / n:.2f} "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
