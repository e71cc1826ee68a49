"""Per-agent LoRA policies: memory of base + N adapters against N full copies, and update time per step.

    .venv/bin/python bench/agent_policies.py [--model smollm2] [--agents 2] [--calls 16] [--repeats 5]

Memory is parameter bytes (``numel x element size``) of what is held: one base plus each agent's adapter, against one
full model per agent (what training a separate policy per agent holds). Step time is ``MultiLoRA.update`` on one
step's calls (``--calls`` per agent, 24 prompt + 16 completion tokens), median of ``--repeats`` after one warm-up:
one adapter per agent against one shared adapter on the same calls. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _calls(agents: list[str], per_agent: int, vocab: int, seed: int) -> list:
    from spanrl.algorithms.transitions import Transition

    rng = random.Random(seed)
    out = []
    for a in agents:
        for i in range(per_agent):
            out.append(Transition(rollout_id=f"{a}{i}", task_id="t", attempt=1, agent=a, step=0,
                                  prompt_ids=[rng.randrange(5, vocab) for _ in range(24)],
                                  completion_ids=[rng.randrange(5, vocab) for _ in range(16)],
                                  completion_mask=[1] * 16, old_logprobs=[], reward=float(i % 2),
                                  advantage=1.0 if i % 2 else -1.0, policy_version=0, retokenized=False))
    return out


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _time(algo, calls, repeats: int) -> float:
    algo.update(calls)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        algo.update(calls)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (built here), 'smollm2', or an HF folder")
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--calls", type=int, default=16, help="calls per agent per step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--r", type=int, default=8, help="LoRA rank")
    args = parser.parse_args()
    import torch

    from spanrl.algorithms.lora import LoRAConfig
    from spanrl.algorithms.policies import AgentPolicy, MultiLoRA, MultiLoRAConfig

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="agent-policies-"))
    if args.model == "tiny":
        from spanrl.demo.tiny import build_tiny_model

        model = build_tiny_model(tmp / "tiny", words=[str(i) for i in range(200)])
    elif args.model == "smollm2":
        from spanrl.serving.models import resolve_model

        model = resolve_model("smollm2")
    else:
        model = Path(args.model)
    agents = [f"agent{i}" for i in range(args.agents)]
    lora = LoRAConfig(r=args.r, alpha=2 * args.r)
    per = MultiLoRA(MultiLoRAConfig(policies={a: AgentPolicy(lora=lora) for a in agents}, default=agents[0]))
    per.setup(model_path=model, output_dir=tmp / "per", seed=0)
    base_bytes = _bytes(p for n, p in per.model.named_parameters() if ".lora_" not in n)
    adapter_bytes = {a: _bytes(per._params(a)) for a in agents}
    vocab = per.model.config.vocab_size
    calls = _calls(agents, args.calls, vocab, seed=0)
    per_step = _time(per, calls, args.repeats)
    del per
    shared = MultiLoRA(MultiLoRAConfig(policies={"shared": AgentPolicy(lora=lora)}, default="shared"))
    shared.setup(model_path=model, output_dir=tmp / "shared", seed=0)
    shared_step = _time(shared, calls, args.repeats)
    row = {
        "model": str(args.model), "agents": args.agents, "lora_r": args.r, "calls_per_agent": args.calls,
        "base_mib": base_bytes / 2**20, "adapter_mib": adapter_bytes[agents[0]] / 2**20,
        "base_plus_adapters_mib": (base_bytes + sum(adapter_bytes.values())) / 2**20,
        "full_copies_mib": args.agents * base_bytes / 2**20,
        "update_s_per_agent_adapters": per_step, "update_s_shared_adapter": shared_step,
        "load_1min": os.getloadavg()[0], "repeats": args.repeats,
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
