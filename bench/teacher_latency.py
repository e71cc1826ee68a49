"""The latency of one chat call to the scripted teacher (``DemonstratorServer``, what the demo's SFT stage and
the examples' warm starts talk to), over one kept-alive connection as the OpenAI client holds it, with
TCP_NODELAY (as served) and without it (the baseline, in the same run).

Without TCP_NODELAY the body, written after the headers, waits for the client's delayed ACK: ~40 ms a call.

    .venv/bin/python bench/teacher_latency.py [--calls N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import openai

from spanrl.demo.calculator import tasks as calculator
from spanrl.demo.calculator.demonstrator import DemonstratorServer


def median_ms(server: DemonstratorServer, question: str, calls: int) -> float:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="bench", max_retries=0)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        client.chat.completions.create(model="teacher", messages=[{"role": "user", "content": question}],
                                       tools=calculator.TOOL_SCHEMAS, max_tokens=8)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    train, _ = calculator.split_tasks(8, 2, seed=0)
    question = train[0]["question"]
    figures = {"load_before": os.getloadavg()[0]}
    with DemonstratorServer(seed=0) as server:
        figures["nodelay_median_ms"] = median_ms(server, question, args.calls)
        server._server.RequestHandlerClass.disable_nagle_algorithm = False  # the baseline: Nagle's algorithm on
        figures["nagle_median_ms"] = median_ms(server, question, args.calls)
    figures["ratio"] = figures["nagle_median_ms"] / figures["nodelay_median_ms"]
    figures["load_after"] = os.getloadavg()[0]
    print(json.dumps({k: round(v, 2) for k, v in figures.items()}, indent=1))


if __name__ == "__main__":
    main()
