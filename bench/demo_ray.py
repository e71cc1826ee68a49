"""Learning figures of the demo's default setting: rollouts by the local runner vs on a two-node local Ray cluster.

The calculator demo (``spanrl demo`` without ``--quick``: SFT warm start on 800 demonstrations, then 30 GRPO
steps of 16 tasks x 8 rollouts) run once per backend and seed, every rollout (demonstrations, GRPO, the
held-out evaluations) going through that backend. With ``ray`` the 4 jsonl workers are Ray actors on a
``ray.cluster_utils.Cluster`` of two nodes of 1 CPU each (0.5 CPU per actor, so all four are placed, two a
node). Prints and appends one JSON line per run to ``--results``: held-out success after SFT, at each
evaluation of GRPO and after it, the demonstrations' reward, wall time, load and the nodes rollouts ran on.

    .venv/bin/python bench/demo_ray.py --backend local --seed 0
    .venv/bin/python bench/demo_ray.py --backend ray --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # Ray's node processes: no gRPC fork notices on screen

_NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
_NODE_START_TIMEOUT_S = 180  # Ray's default 30 s is too short for a second raylet on busy shared cores


@contextmanager
def _two_nodes() -> Iterator[dict[str, Any]]:
    """A two-node local Ray cluster (1 CPU a node, no dashboard) and the demo's ``rollouts`` for it."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**_NODE, "include_dashboard": False})
    try:
        cluster.add_node(**_NODE)
        cluster.wait_for_nodes(timeout=_NODE_START_TIMEOUT_S)
        yield {"backend": "ray", "address": cluster.address, "resources": {"CPU": 0.5}}
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@contextmanager
def _local() -> Iterator[None]:
    yield None


def _nodes(out: Path) -> list[str | None]:
    rows = [json.loads(line) for stage in ("sft", "grpo")
            for line in (out / stage / "rollouts.jsonl").read_text().splitlines()]
    return sorted({r.get("node") for r in rows}, key=str)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("local", "ray"), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", help="the demo's folder (default: a temporary one)")
    parser.add_argument("--results", default="demo_ray_results.jsonl", help="one JSON line per run is appended here")
    args = parser.parse_args()

    from spanrl.demo.demo import DemoConfig, run_demo

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="spanrl-demo-ray-") as scratch:
        out = Path(args.output_dir or Path(scratch) / "demo")
        with (_two_nodes() if args.backend == "ray" else _local()) as rollouts:
            started = time.perf_counter()
            result = run_demo(DemoConfig(output_dir=str(out), seed=args.seed, progress=False, rollouts=rollouts))
            seconds = time.perf_counter() - started
        nodes = _nodes(out)
    row = {
        "backend": args.backend, "seed": args.seed,
        "demonstrations": round(result.demonstrator_success, 3),
        "after_sft": round(result.sft_success, 3),
        "curve": [(h["step"], round(float(h["val_success"]), 3)) for h in result.history if "val_success" in h],
        "after_grpo": round(result.grpo_success, 3),
        "seconds": round(seconds, 1), "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
        "nodes": len(nodes), "cpus": os.cpu_count(),
    }
    print(json.dumps(row), flush=True)
    with open(args.results, "a") as results:
        results.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
