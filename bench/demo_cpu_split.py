"""CPU seconds a GRPO step of ``spanrl demo`` in the trainer's process and in its ``spanrl serve`` subprocess
(``serving: {placement: process}``), against the policy server in the trainer's process (``local``).

Runs the demo in this process with ``--grpo-steps N`` and samples ``/proc`` every 0.2 s: this process's CPU
(user + system) and that of its ``spanrl serve`` children. A step is bounded by the first span of its rollouts
(the store); steps 2..N-1 are averaged (step 1 warms up). On a shared machine compare CPU, not wall.

    .venv/bin/python bench/demo_cpu_split.py {local,process} [--grpo-steps N] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import tempfile
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _servers(parent: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and "\0serve\0" in Path(f"/proc/{name}/cmdline").read_text():
                found.append(int(name))
        except OSError:
            continue
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("placement", choices=("local", "process"))
    parser.add_argument("--grpo-steps", type=int, default=6)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    from spanrl.demo.demo import DemoConfig, run_demo

    out = Path(args.output_dir or tempfile.mkdtemp(prefix="demo-cpu-"))
    samples: list[tuple[float, float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            samples.append((time.time(), _cpu(os.getpid()), sum(map(_cpu, _servers(os.getpid())))))

    threading.Thread(target=sample, daemon=True).start()
    started, load = time.time(), os.getloadavg()
    result = run_demo(DemoConfig(output_dir=str(out / "demo"), grpo_steps=args.grpo_steps, progress=False,
                                 serving={"placement": args.placement}))
    done.set()
    print(f"wall {time.time() - started:.1f} s, load {load[0]:.1f} -> {os.getloadavg()[0]:.1f}, held-out "
          f"{result.sft_success:.2f} -> {result.grpo_success:.2f}")
    import duckdb

    with duckdb.connect(str(result.db_path), read_only=True) as con:
        rows = con.execute("SELECT rollout_id, min(start_ns) FROM spans WHERE rollout_id IS NOT NULL "
                           "GROUP BY 1").fetchall()
    by_tag: dict[str, dict[int, float]] = {}
    for rollout_id, t in rows:  # ``<tag>-s<step>-<i>-a<n>``; GRPO's tag is the one whose step 1 began last
        match = re.search(r"^(.+)-s(\d+)-\d+-a\d+$", rollout_id)
        if match:
            steps = by_tag.setdefault(match.group(1), {})
            steps[int(match.group(2))] = min(steps.get(int(match.group(2)), t / 1e9), t / 1e9)
    starts = max(by_tag.values(), key=lambda steps: steps.get(1, 0.0))
    times = [s[0] for s in samples]
    first, last = 2, args.grpo_steps
    a, z = (samples[min(bisect.bisect_left(times, starts[s]), len(samples) - 1)] for s in (first, last))
    n = last - first
    print(f"GRPO steps {first}..{last - 1}: wall {(z[0] - a[0]) / n:.2f} s a step, trainer process "
          f"{(z[1] - a[1]) / n:.2f} CPU-s, policy server processes {(z[2] - a[2]) / n:.2f} CPU-s")


if __name__ == "__main__":
    main()
