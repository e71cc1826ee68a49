"""A learning test run over and over, for the spread of its figures (issue 55; docs/measurements.md, "Learning
tests over repeated runs").

``loop``: runs one pytest target back to back under ``nice -n 19`` (its session's autogroup too), ``--runs`` times
or until ``--until`` (HH:MM UTC, the next such time: no run starts after it). Run ``i`` leaves in ``DIR``:
``fig-i.jsonl``, the figures the test recorded (tests/training_checks.py ``report_figures`` through
``SPANRL_LEARNING_FIGURES``, written before its assertions, so a failed run's too), ``out-i.log``, pytest's output,
and one line of ``runs.jsonl``: exit status, wall seconds, CPU seconds (user + sys of pytest and the processes it
waited for: the figure to compare under load), the 1-minute load average at its start and end, the UTC time at its
end. Run numbers continue those already in ``DIR``.

``summary``: over the runs of one or more such folders, the count, the failed runs with pytest's last error
line, the load range, wall and CPU seconds and each numeric figure as min / median / max (``rise`` is
``late - early`` where a test records both).

    .venv/bin/python bench/learning_runs.py loop DIR [--runs 20] [--until 14:55] -- tests/x.py::test_y
    .venv/bin/python bench/learning_runs.py summary DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _runs(folder: Path) -> list[dict[str, Any]]:
    path = folder / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _run_niced(command: list[str], env: dict[str, str], out: Any) -> int:
    """``command`` under ``nice -n 19`` in a session of its own whose autogroup is niced too: with Linux's
    autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each session gets an equal share of the
    CPU and nice orders processes within one session only, so a plain ``nice -n 19`` run beside another
    session's job took as much CPU as that job (measured 2026-12-08: 65% of a core each, with two study runs)."""
    child = subprocess.Popen(["nice", "-n", "19", *command], cwd=REPO, env=env, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        Path(f"/proc/{child.pid}/autogroup").write_text("19")
    except OSError:  # no autogroup scheduling (another OS, or a kernel without it): plain nice it is
        pass
    try:
        return child.wait()
    except BaseException:  # Ctrl-C reaches this process only: end the run's session too
        os.killpg(child.pid, 15)
        child.wait()
        raise


def loop(folder: Path, target: list[str], runs: int, until: str | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    first = max((r["run"] for r in _runs(folder)), default=0) + 1
    stop = None
    if until:
        hour, minute = (int(x) for x in until.split(":"))
        stop = _now().replace(hour=hour, minute=minute, second=0, microsecond=0)
        if stop <= _now():  # a time of day already past: tomorrow's (a loop started at 23:50 --until 02:05)
            stop += datetime.timedelta(days=1)
    for i in range(first, first + runs):
        if stop is not None and _now() >= stop:
            break
        load_start, started, cpu = os.getloadavg()[0], time.monotonic(), _children_cpu()
        env = {**os.environ, "SPANRL_LEARNING_FIGURES": str(folder / f"fig-{i}.jsonl")}
        with open(folder / f"out-{i}.log", "w") as out:
            rc = _run_niced([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *target], env, out)
        row = {"run": i, "rc": rc, "seconds": round(time.monotonic() - started, 1),
               "cpu_s": round(_children_cpu() - cpu, 1), "load_start": round(load_start, 2),
               "load_end": round(os.getloadavg()[0], 2), "date": _now().strftime("%Y-%m-%dT%H:%M:%SZ")}
        with open(folder / "runs.jsonl", "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def _spread(values: list[float]) -> str:
    return " / ".join(f"{v:.3g}" for v in (min(values), statistics.median(values), max(values)))


def _last_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    causes = [line for line in lines if line.startswith("E ")]  # the raised error's own line, else the verdict
    verdicts = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return " ".join((causes or verdicts or lines or ["(no output)"])[-1].split())[:240]


def summary(folders: list[Path]) -> None:
    rows, figures = [], []
    for folder in folders:
        for row in _runs(folder):
            rows.append(row)
            path = folder / f"fig-{row['run']}.jsonl"
            for line in path.read_text().splitlines() if path.exists() else []:
                figures.append(json.loads(line))
            if row["rc"] != 0:
                log = folder / f"out-{row['run']}.log"
                print(f"failed: {folder.name} run {row['run']} rc {row['rc']} at {row['date']}: {_last_error(log)}")
    loads = [row[k] for row in rows for k in ("load_start", "load_end")]
    print(f"runs {len(rows)}, failed {sum(row['rc'] != 0 for row in rows)}, with figures {len(figures)}, "
          f"load {min(loads)}-{max(loads)}, {min(r['date'] for r in rows)} .. {max(r['date'] for r in rows)}")
    print(f"wall s {_spread([r['seconds'] for r in rows])}")
    if cpu := [r["cpu_s"] for r in rows if "cpu_s" in r]:
        print(f"CPU s (user+sys, {len(cpu)} runs) {_spread(cpu)}")
    for figure in figures:
        if isinstance(figure.get("early"), (int, float)) and isinstance(figure.get("late"), (int, float)):
            figure["rise"] = figure["late"] - figure["early"]
    for test in sorted({f["test"] for f in figures}):
        of = [f for f in figures if f["test"] == test]
        keys = [k for k in of[0] if all(isinstance(f.get(k), (int, float)) for f in of)]
        print(f"{test} ({len(of)} runs): " + "; ".join(f"{k} {_spread([f[k] for f in of])}" for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    looping = sub.add_parser("loop")
    looping.add_argument("folder", type=Path)
    looping.add_argument("--runs", type=int, default=20)
    looping.add_argument("--until", default=None, help="HH:MM UTC: start no run after it")
    looping.add_argument("target", nargs="+", help="pytest arguments, after --")
    sub.add_parser("summary").add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args()
    if args.what == "loop":
        loop(args.folder.resolve(), args.target, args.runs, args.until)
    else:
        summary(args.folders)


if __name__ == "__main__":
    main()
