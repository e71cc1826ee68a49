"""Run the benches of the README's comparison table, one after another, and rewrite the table from their
figures (``make bench``).

    .venv/bin/python bench/report.py [--only NAME,...] [--skip NAME,...] [--from-results] [--no-readme]

Each bench runs as a subprocess with the settings below (the ones the README's figures come from), its
output streamed to ``bench/results/<name>.log``; it leaves its figures in ``bench/results/<name>.json``
(``SPANRL_BENCH_RESULTS``, ``bench/_results.py``) and this runner leaves ``<name>.run.json`` (command,
start, duration, exit status, load average before and after). Then the table between the README's
``<!-- bench:table:begin/end -->`` markers is rebuilt from every bench's latest results
(``bench/report_table.py``). A bench that fails, or whose prerequisite is missing (the anchor venv,
``.venv-vllm``), shows as NOT MEASURED, never as an old number. ``--only`` / ``--skip`` rerun parts
(the others keep their latest results); ``--from-results`` only rebuilds the table.

Settings (about 18 minutes in all on 2 quiet cores: 1100 s on 2026-12-01):
  tracer              tracer_overhead.py, 300 timed calls x 5 rounds per mode, 2 ms calls, breakdown 2000 calls
  ingest              ingest.py, 20 s per run (DuckDB's checkpoints in it), median of 3, 1 and 4 senders, 3 workloads,
                      anchor in /tmp/anchor-venv
  decompose           decompose.py, 1M spans (10k rollouts), median of 3, the per-row path once, anchor on all
  serve_transformers  serve_throughput.py, SmolLM2-135M, 16 new tokens, 2 torch threads, median of 2
  serve_vllm          the same with --backend vllm, server in .venv-vllm (`make vllm-venv`)
  demo_wall           demo_wall.py: `spanrl demo` once, wall and CPU time, beside the figure of commit 80ed807
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import report_table
from spanrl.env import SPANRL_BENCH_RESULTS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ANCHOR_VENV = Path("/tmp/anchor-venv")
VLLM_VENV = ROOT / ".venv-vllm"
BENCH_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Spec:
    script: str
    args: tuple[str, ...]
    needs: str = ""  # "anchor" or "vllm": checked before the run


SPECS: dict[str, Spec] = {
    "tracer": Spec("tracer_overhead.py", ("--calls", "300", "--rounds", "5", "--call-ms", "2.0",
                                          "--breakdown-calls", "2000"), "anchor"),
    "ingest": Spec("ingest.py", ("--seconds", "20", "--repeats", "3", "--senders", "1,4"), "anchor"),
    "decompose": Spec("decompose.py", ("--rollouts", "10000", "--rounds", "3", "--old-rounds", "1"), "anchor"),
    "serve_transformers": Spec("serve_throughput.py", ("--model", "smollm2", "--max-tokens", "16", "--threads", "2",
                                                       "--repeats", "2")),
    "serve_vllm": Spec("serve_throughput.py", ("--model", "smollm2", "--max-tokens", "16", "--threads", "2",
                                               "--repeats", "2", "--backend", "vllm"), "vllm"),
    "demo_wall": Spec("demo_wall.py", ()),
}


def command(name: str, anchor_venv: Path, vllm_venv: Path) -> list[str]:
    spec = SPECS[name]
    extra: list[str] = []
    if spec.needs == "anchor":  # ingest.py takes the venv, the others its python
        extra = (["--anchor-venv", str(anchor_venv)] if name == "ingest"
                 else ["--anchor-python", str(anchor_venv / "bin" / "python")])
    elif spec.needs == "vllm":
        extra = ["--server-python", str(vllm_venv / "bin" / "python")]
    return [sys.executable, str(ROOT / "bench" / spec.script), *spec.args, *extra]


def prerequisite(name: str, anchor_venv: Path, vllm_venv: Path) -> str | None:
    """Why ``name`` cannot run here, or None. The anchor's absence only blanks the anchor's figures."""
    if SPECS[name].needs == "vllm" and not (vllm_venv / ".spanrl-installed").exists():
        return f"no vLLM venv at {vllm_venv}: run `make vllm-venv` (~2 min, ~3.4 GB)"
    return None


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_one(name: str, anchor_venv: Path, vllm_venv: Path, results: Path) -> dict[str, object]:
    """Run one bench, output to ``<name>.log``; returns (and writes) its run record."""
    for stale in (results / f"{name}.json", results / f"{name}.run.json"):
        stale.unlink(missing_ok=True)
    cmd = command(name, anchor_venv, vllm_venv)
    record: dict[str, object] = {"name": name, "command": cmd,
                                 "settings": " ".join([SPECS[name].script, *SPECS[name].args]),
                                 "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_before": _load()}
    missing = prerequisite(name, anchor_venv, vllm_venv)
    log = results / f"{name}.log"
    if missing:
        record["skipped"] = missing
        log.write_text(f"skipped: {missing}\n")
    else:
        env = {**os.environ, SPANRL_BENCH_RESULTS: str(results), "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
        t0 = time.monotonic()
        with log.open("w") as out:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            try:
                record["rc"] = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                              timeout=BENCH_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                record["rc"] = f"timed out after {BENCH_TIMEOUT_S} s"
        record["elapsed_s"] = round(time.monotonic() - t0, 1)
        if record["rc"] == 0 and not (results / f"{name}.json").exists():
            record["rc"] = "exit 0 but no figures written"
    record["load_after"] = _load()
    (results / f"{name}.run.json").write_text(json.dumps(record, indent=1))
    return record


def machine() -> str:
    """Cores, CPU model, memory, and when the table was built (a date and a machine: users read it)."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor() or "?") if Path("/proc/cpuinfo").exists() else "?"
    mem = next((int(ln.split()[1]) / 2**20 for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), 0.0) if Path("/proc/meminfo").exists() else 0.0
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM; table built "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")


def _names(values: list[str]) -> list[str]:
    names = [n for v in values for n in v.split(",") if n]
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise SystemExit(f"unknown bench {', '.join(unknown)}: choose from {', '.join(SPECS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these (comma list)")
    parser.add_argument("--skip", action="append", default=[], metavar="NAME", help="do not run these")
    parser.add_argument("--from-results", action="store_true", help="run nothing: rebuild the table from the results")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--no-readme", action="store_true", help="print the table, leave the README alone")
    parser.add_argument("--anchor-venv", type=Path, default=ANCHOR_VENV)
    parser.add_argument("--vllm-venv", type=Path, default=VLLM_VENV)
    args = parser.parse_args(argv)
    only, skip = _names(args.only), _names(args.skip)
    args.results.mkdir(parents=True, exist_ok=True)
    todo = [] if args.from_results else [n for n in SPECS if (not only or n in only) and n not in skip]
    if todo and not (args.anchor_venv / "bin" / "python").exists():
        print(f"no anchor venv at {args.anchor_venv}: the anchor's figures will be NOT MEASURED (`make anchor-venv`)")
    start = time.monotonic()
    tty = sys.stdout.isatty()  # on a terminal the result overwrites the "running" line
    for name in todo:
        running = f"  {name:20s} running, log {args.results / name}.log ..."
        print(running, end="" if tty else "\n", flush=True)
        rec = run_one(name, args.anchor_venv, args.vllm_venv, args.results)
        verdict = (f"SKIPPED: {rec['skipped']}" if rec.get("skipped") else "ok" if rec.get("rc") == 0
                   else f"FAILED ({rec['rc']}), see {args.results / name}.log")
        took = f"{rec['elapsed_s']:6.0f} s" if "elapsed_s" in rec else ""
        done = f"  {name:20s} {took:>8s}  load {rec['load_before'][0]:.1f} -> {rec['load_after'][0]:.1f}  {verdict}"
        print(("\r" + done.ljust(len(running))) if tty else done, flush=True)
    if todo:
        print(f"  {'all':20s} {time.monotonic() - start:6.0f} s")
    section = report_table.build_section(report_table.load_results(args.results, list(SPECS)), machine())
    (args.results / "table.md").write_text(section + "\n")
    if args.no_readme:
        print(section)
    else:
        report_table.rewrite_readme(args.readme, section)
        print(
            f"{args.readme.name}: comparison table rewritten from {args.results} (also in {args.results / 'table.md'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
