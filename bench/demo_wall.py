"""The wall time of ``spanrl demo`` (what ``make demo`` runs), its CPU time and where a GRPO step goes.

Runs ``python -m spanrl demo --no-progress`` in a fresh folder as a subprocess, once, and reports: the wall
time, the CPU seconds of the whole process tree (the demo, its agents and servers: user + system, from
``RUSAGE_CHILDREN``), the seconds of each phase (from the moment each ``[n/4]`` line appears), the held-out
result, and the median of the Trainer's own per-step stage times over the GRPO steps (``grpo/history.jsonl``:
``time/rollouts_s``, ``time/decompose_s``, ``time/update_s``, ``time/reload_s``, ``time/step_s``). On a
shared machine the CPU time moves less with the load than the wall time does: compare those.

``--pythonpath DIR`` runs another spanrl (an old commit laid out as a package, for a before/after);
``--profile FILE`` runs the demo's main process under cProfile (cumulative times; its threads, the policy
server's generation included, are not profiled: read the stage times for them).

    .venv/bin/python bench/demo_wall.py [--pythonpath DIR] [--profile FILE] [--grpo-steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import record  # noqa: E402

_STAGES = ("rollouts", "decompose", "update", "reload", "step")
_PHASES = ("[1/4]", "[2/4]", "[3/4]", "[4/4]")
_RESULT = re.compile(r"after SFT (\d\.\d\d) -> after GRPO (\d\.\d\d)")


def run_demo(out: Path, *, pythonpath: str | None, profile: str | None, grpo_steps: int | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    main = ["-m", "cProfile", "-o", profile, "-m", "spanrl"] if profile else ["-m", "spanrl"]
    cmd = [sys.executable, *main, "demo", "--no-progress", "--output-dir", str(out / "demo"),
           *(["--grpo-steps", str(grpo_steps)] if grpo_steps else [])]
    before, load_before = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=out)
    marks: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        for phase in _PHASES:
            if line.startswith(phase):
                marks[phase] = time.perf_counter() - started
    code = proc.wait()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit("the demo failed:\n" + "\n".join(lines[-30:]))
    result = next((m.groups() for m in map(_RESULT.search, lines) if m), (None, None))
    rows = [json.loads(line) for line in (out / "demo" / "grpo" / "history.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "time/step_s" in row][1:]  # step 1 warms up
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "phases_s": {"build": marks["[2/4]"] - marks["[1/4]"], "sft": marks["[3/4]"] - marks["[2/4]"],
                     "grpo": marks["[4/4]"] - marks["[3/4]"]},
        "held_out": {"after_sft": result[0], "after_grpo": result[1]},
        "grpo_step_median_s": {k: statistics.median(r[f"time/{k}_s"] for r in steps) for k in _STAGES
                               if steps and f"time/{k}_s" in steps[0]},
        "load_before": load_before, "load_after": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pythonpath", default=None, help="another spanrl to time (PYTHONPATH)")
    parser.add_argument("--profile", default=None, help="write the main process's cProfile stats here")
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default: the demo's 30)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = run_demo(Path(tmp), pythonpath=args.pythonpath, profile=args.profile, grpo_steps=args.grpo_steps)
    print(json.dumps(figures, indent=1))
    if not args.pythonpath and not args.profile:  # make bench's figure: this checkout's demo, unprofiled
        record("demo_wall", figures)


if __name__ == "__main__":
    main()
