"""CPU seconds of each thread of a ``spanrl`` command's main process, by thread name (the demo's: ``MainThread``
(SFT/GRPO updates, decomposition), ``spanrl-batcher`` (the policy server's generation), ``spanrl-rollout`` (the
runner's end records and readiness polls: DuckDB), ``spanrl-writer`` (the collector's commits), ...).

Runs the command in this process (``python -m spanrl ARGS``); a daemon thread reads every thread's user + system
time from ``/proc/self/task`` every 0.2 s and, at exit, writes the totals by name to OUT (numbered pool threads
summed under one name; ``native``: threads Python did not start, e.g. DuckDB's and torch's). On a shared machine
CPU seconds move less with the load than wall seconds: two runs of N and M GRPO steps, subtracted, give the CPU of
(M - N) steps by thread. Agents and other child processes are not counted (``bench/demo_wall.py`` gives the tree).

    .venv/bin/python bench/demo_threads.py OUT -- demo --no-progress --output-dir DIR --grpo-steps 5
"""

from __future__ import annotations

import atexit
import collections
import os
import re
import runpy
import sys
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK")
_cpu: dict[int, tuple[str, float]] = {}  # thread id -> (name, CPU seconds at the last read)


def _sample() -> None:
    names = {t.native_id: t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended between the listing and the read
            continue
        t = int(tid)
        name = names.get(t) or _cpu.get(t, ("native", 0.0))[0]
        _cpu[t] = (name, (int(fields[11]) + int(fields[12])) / _TICK)


def _watch() -> None:
    while True:
        _sample()
        time.sleep(0.2)


def _write(out: str) -> None:
    _sample()
    totals: dict[str, float] = collections.defaultdict(float)
    for name, seconds in _cpu.values():
        totals[re.sub(r"[-_]?\d+$", "", re.sub(r"\s*\(.*\)", "", name))] += seconds
    with open(out, "w") as f:
        f.write(f"total {sum(totals.values()):.1f}\n")
        for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
            f.write(f"{seconds:8.1f} {name}\n")


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit("usage: demo_threads.py OUT -- SPANRL_ARGS...")
    out = sys.argv[1]
    sys.argv = ["spanrl", *sys.argv[3:]]
    threading.Thread(target=_watch, daemon=True, name="demo-threads").start()
    atexit.register(_write, out)
    runpy.run_module("spanrl", run_name="__main__")


if __name__ == "__main__":
    main()
