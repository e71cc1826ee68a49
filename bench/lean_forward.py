"""The policy server's transformers backend on the demo's tiny Llama, with its lean forward
(``serving/lean_llama.py``) and with ``transformers``' own: process CPU time per batch, and whether the two
generate the same tokens and log-probs (they should: the lean forward's logits are bit-identical).

Batches of 4 requests x 6 new tokens from a 7-token prompt (the demo's calculator call), seeded sampling,
one torch thread; the two backends alternate, ``--rounds`` times each.

    .venv/bin/python bench/lean_forward.py [--batches 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

from spanrl.demo.calculator import tasks as calculator  # noqa: E402
from spanrl.demo.tiny import build_tiny_model  # noqa: E402
from spanrl.serving.backend import GenerationRequest, SamplingParams  # noqa: E402
from spanrl.serving.hf_backend import TransformersBackend  # noqa: E402


def _batch(seed: int) -> list[GenerationRequest]:
    return [GenerationRequest([5, 6, 7, 8, 9, 10, 11], SamplingParams(max_tokens=6, temperature=1.0, seed=seed + k))
            for k in range(4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model", words=calculator.vocabulary(), seed=0)
        lean, plain = TransformersBackend(model), TransformersBackend(model)
        plain._lean = None  # transformers' own forward
        same = all(
            [(c.token_ids, c.logprobs) for c in a] == [(c.token_ids, c.logprobs) for c in b]
            for seed in range(0, 400, 10) for a, b in zip(lean.generate(_batch(seed)), plain.generate(_batch(seed)))
        )
        print(f"same tokens and log-probs: {same}")
        for _ in range(args.rounds):
            for name, backend in (("lean", lean), ("transformers", plain)):
                started = time.process_time()
                for i in range(args.batches):
                    backend.generate(_batch(i))
                print(f"{name:12s} {(time.process_time() - started) / args.batches * 1000:6.2f} ms CPU a batch")


if __name__ == "__main__":
    main()
