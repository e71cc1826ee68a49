"""Multi-turn tool-agent rollouts per second: the policy server's batching against sequential ``generate``.

    .venv/bin/python bench/tool_rollouts.py [--episodes 32] [--concurrency 32] [--repeats 2] [--threads 2]

The episodes are the SmolLM2 tool agent's (``spanrl.demo.smollm2``: three solved examples, the question,
``tools=[add, subtract, multiply]``, each tool call run and its result sent back, at most ``MAX_CALLS``
calls; sampled at temperature 1, 40 tokens a call, as training samples them). Two ways, same tasks:

* baseline: plain transformers ``generate``, one episode after another, one call at a time (batch 1),
  the agent's loop written out beside it (``examples/smollm2/tool_probe.py: episodes``);
* spanrl: the example's own ``agent`` (an ``AsyncOpenAI`` client) against ``spanrl serve`` in a
  subprocess (span export off), ``--concurrency`` episodes at once, as the Trainer's runner runs a step.

Prints episodes/s and LLM calls/s of each, medians over repeats, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

# examples.smollm2.tool_probe: bench runs from the checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serve_throughput import _free_port, wait_ready  # noqa: E402

_MAX_TOKENS = 40


def sequential(model_dir: Path, tasks: list[dict[str, Any]], threads: int) -> tuple[float, float]:
    """(seconds, LLM calls) for the episodes one after another with plain ``generate`` at batch 1."""
    from examples.smollm2.tool_probe import Generator, episodes
    from spanrl.demo.smollm2.tools import SHOTS

    gen = Generator(model_dir, sample=True, threads=threads)
    started, calls = time.perf_counter(), 0
    for task in tasks:
        calls += episodes(gen, [task], SHOTS)[0]["calls"]
    return time.perf_counter() - started, calls


async def served(base_url: str, tasks: list[dict[str, Any]], concurrency: int) -> tuple[float, float]:
    """(seconds, LLM calls) for the example's agent against the server, ``concurrency`` episodes at once."""
    import dataclasses

    import openai

    from spanrl.demo.smollm2.agentic import agent
    from spanrl.rollouts.rollouts import LLMEndpoint

    calls = 0

    async def count(request: httpx.Request) -> None:
        nonlocal calls
        calls += request.url.path.endswith("/chat/completions")

    @dataclasses.dataclass(frozen=True)
    class Counted(LLMEndpoint):  # the endpoint the runner hands the agent, counting its chat requests
        def async_client(self) -> Any:
            http = httpx.AsyncClient(timeout=600, event_hooks={"request": [count]})
            return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0, http_client=http)

    llm = Counted(base_url=base_url + "/v1", model="bench", sampling={"temperature": 1.0, "max_tokens": _MAX_TOKENS})
    gate = asyncio.Semaphore(concurrency)

    async def one(task: dict[str, Any]) -> None:
        async with gate:
            await agent(task, llm)

    started = time.perf_counter()
    await asyncio.gather(*(one(t) for t in tasks))
    return time.perf_counter() - started, calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads for baseline and server")
    args = parser.parse_args(argv)

    from spanrl.demo.smollm2.tools import make_tasks, tool_model
    from spanrl.serving.models import SMOLLM2, resolve_model

    base = resolve_model(SMOLLM2)
    model_dir = tool_model(base, base.with_name(base.name + "-tools"))
    tasks = make_tasks(args.episodes, seed=1)
    print(f"model {model_dir.name}  {args.episodes} episodes  torch threads {args.threads} of {os.cpu_count()} cpus  "
          f"load {os.getloadavg()[0]:.1f}", flush=True)

    base_runs = [sequential(model_dir, tasks, args.threads) for _ in range(args.repeats)]
    base_s = statistics.median(s for s, _ in base_runs)
    base_calls = statistics.median(c for _, c in base_runs)
    print(f"baseline: sequential generate, batch 1   {args.episodes / base_s:6.2f} episodes/s  "
          f"{base_calls / base_s:6.2f} calls/s  ({base_s:.1f} s; {', '.join(f'{s:.1f}' for s, _ in base_runs)})",
          flush=True)

    port = _free_port()
    cmd = [sys.executable, "-m", "spanrl", "--log-level", "WARNING", "serve", "--model", str(model_dir),
           "--port", str(port), "--otlp-endpoint", "none", "--served-model-name", "bench",
           "--max-batch-size", "64", "--threads", str(args.threads)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(server, base_url)
        runs = [asyncio.run(served(base_url, tasks, args.concurrency)) for _ in range(args.repeats)]
    finally:
        server.terminate()
        server.wait(timeout=30)
    served_s = statistics.median(s for s, _ in runs)
    served_calls = statistics.median(c for _, c in runs)
    print(f"spanrl: policy server, {args.concurrency:2d} concurrent     {args.episodes / served_s:6.2f} episodes/s  "
          f"{served_calls / served_s:6.2f} calls/s  ({served_s:.1f} s; {', '.join(f'{s:.1f}' for s, _ in runs)})  "
          f"{base_s / served_s:.2f}x the baseline  "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
