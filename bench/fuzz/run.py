"""Coverage-guided fuzzing of the collector's C protobuf decoder (`make fuzz`; a short run in `make test`).

    .venv/bin/python bench/fuzz/run.py [--runs N] [--diff-runs N] [--seconds S] [--jobs J] [--quick]

Builds two libFuzzer binaries with Debian's clang (AddressSanitizer + UndefinedBehaviorSanitizer, UBSan
aborting on its first report; coverage and comparison tracing in the decoder's files only) from
`collector/wire_*.c` and `bench/fuzz/fuzz_wire.c` (+ the protobuf-aware mutator `proto_mutator.c`),
into `bench/fuzz/build/`:

  fuzz_wire       native: the decoder's own checks (columns well formed, valid UTF-8, the budget path),
                  no Python: 2,600-8,400 executions a second per process measured on 2 shared cores;
  fuzz_wire_diff  the same, plus Python embedded and `differential.check` on every input: the sanitized
                  decoder against the Python path (same columns, same JSON text, floats bit for bit);
                  300-3,000 a second (the Python path's cost, on the inputs the fast path takes).

Both start from `seeds.py` (the project's corpus in tests/collector/corpus, the test generators, the
bench workloads, the fault suite's requests) and grow one corpus (`bench/fuzz/build/corpus`, kept
between runs). J processes of each run side by side (distinct seeds, one shared corpus) for N
executions each (or S seconds); a crash leaves `bench/fuzz/build/crash-*` (the input) and fails the
run. The summary (executions, seconds, execs/s, edges / features / corpus of each process, load
average) is printed as JSON and written to `bench/fuzz/build/last-run.json`; docs/measurements.md's reliability
table quotes one (12,000,000 executions, 2026-12-01).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD = HERE / "build"
SOURCES = [REPO / "collector" / f for f in ("wire_text.c", "wire_attrs.c", "wire_spans.c")]
HARNESS = [HERE / "fuzz_wire.c", HERE / "proto_mutator.c"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
CFLAGS = ["-g", "-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers", *SANITIZE]
# Coverage (and comparison tracing) in the decoder only: in the harness and the mutator it would cost
# ~40% of the time and count their own branches as the decoder's.
COVERAGE = ["-fsanitize=fuzzer-no-link"]
MAX_LEN = 4096

__all__ = ["build", "fuzz", "main"]


def clang() -> str:
    """Debian's clang, or a clear error (`make clang` installs it)."""
    found = shutil.which(os.environ.get("CLANG", "clang"))
    if not found:
        raise SystemExit("clang is not installed: `make clang` (apt-get install clang libclang-rt-dev)")
    return found


def _python_flags() -> tuple[list[str], list[str]]:
    include = ["-I" + sysconfig.get_paths()["include"]]
    libdir, libpl, version = (sysconfig.get_config_var(v) for v in ("LIBDIR", "LIBPL", "LDVERSION"))
    link = [f"-L{libdir}", f"-L{libpl}", f"-Wl,-rpath,{libdir}",
            f"-lpython{version}"] + (sysconfig.get_config_var("LIBS") or "").split()
    return include, link


def build() -> dict[str, Path]:
    """Both fuzzers, rebuilt when a source is newer; {"native": path, "diff": path}."""
    BUILD.mkdir(exist_ok=True)
    include, link = _python_flags()
    # flags too
    inputs = SOURCES + HARNESS + [REPO / "collector" / "wire.h", REPO / "collector" / "_wire.c", Path(__file__)]
    newest = max(p.stat().st_mtime for p in inputs)
    out = {"native": BUILD / "fuzz_wire", "diff": BUILD / "fuzz_wire_diff"}
    if all(b.exists() and b.stat().st_mtime > newest for b in out.values()):
        return out
    objects = BUILD / "obj"
    objects.mkdir(exist_ok=True)
    units = [(src, src.stem, COVERAGE) for src in SOURCES] + [(src, src.stem, []) for src in HARNESS]
    units += [(HERE / "fuzz_wire.c", "fuzz_wire_diff", ["-DFUZZ_DIFF"]), (REPO / "collector" / "_wire.c", "_wire", [])]
    _run_all([[clang(), *CFLAGS, *flags, *include, "-c", str(src),
               "-o", str(objects / f"{name}.o")] for src, name, flags in units])
    decoder = [str(objects / f"{src.stem}.o") for src in SOURCES]
    _run_all([
        [clang(), *SANITIZE,
         "-fsanitize=fuzzer", *decoder, str(objects / "fuzz_wire.o"), str(objects / "proto_mutator.o"),
         "-o", str(out["native"])],
        [clang(), *SANITIZE,
         "-fsanitize=fuzzer", *decoder, str(objects / "fuzz_wire_diff.o"), str(objects / "proto_mutator.o"),
         str(objects / "_wire.o"), "-o", str(out["diff"]), *link],
    ])
    return out


def _run_all(commands: list[list[str]]) -> None:
    """The commands side by side; CalledProcessError for the first that fails."""
    procs = [(subprocess.Popen(cmd), cmd) for cmd in commands]
    for proc, cmd in procs:
        if proc.wait():
            raise subprocess.CalledProcessError(proc.returncode, cmd)


def start_fresh(args: list[str], **popen: Any) -> subprocess.Popen[Any]:
    """``args`` started by a small ``sh`` that forks them, in a session of their own. libFuzzer's
    ``-rss_limit_mb`` reads getrusage's ``ru_maxrss``, and exec adds in the peak RSS of the image it replaces:
    started straight from a big process (a pytest worker that trained a model, 5.7 GB), the fuzzer was out of
    memory in its first second; forked by a fresh ``sh``, it starts from that small image. Stop it with
    :func:`kill_group`: killing the ``sh`` alone leaves the fuzzer running."""
    return subprocess.Popen(["sh", "-c", '"$@" & wait $!', "sh", *args], start_new_session=True, **popen)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """Kill what :func:`start_fresh` started, the ``sh`` and the fuzzer, unless it has finished."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def run_fresh(args: list[str], *, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` through :func:`start_fresh`, with its output; on a timeout or Ctrl-C the whole
    process group is killed."""
    proc = start_fresh(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _env(kind: str) -> dict[str, str]:
    env = dict(os.environ)
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    # the embedded interpreter keeps its objects
    env["ASAN_OPTIONS"] = "detect_leaks=" + ("0" if kind == "diff" else "1")
    if kind == "diff":
        env["FUZZ_PYTHON"] = str(Path(sys.executable))
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
        env["SPANRL_COLLECTOR_DECODER"] = "auto"
    return env


def _stat(log: str, name: str) -> int:
    found = re.findall(rf"stat::{name}:\s+(\d+)", log)
    return int(found[-1]) if found else 0


def fuzz(kind: str, binary: Path, *, runs: int, seconds: int, jobs: int, corpus: Path, seeds: Path) -> dict:
    """``jobs`` processes of one fuzzer side by side on one corpus; their summed figures."""
    limit = [f"-runs={runs}"] if runs else [f"-max_total_time={seconds}"]
    procs = []
    started = time.monotonic()
    for job in range(jobs):
        log = BUILD / f"{kind}-{job}.log"
        args = [str(binary), f"-max_len={MAX_LEN}", "-print_final_stats=1",
                f"-seed={job + 1 + int(time.time()) % 100000}",
                f"-artifact_prefix={BUILD}/", f"-dict={HERE / 'otlp.dict'}", "-timeout=20", "-rss_limit_mb=4096",
                *limit, str(corpus), str(seeds)]
        procs.append((start_fresh(args, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=_env(kind)), log))
    try:
        codes = [p.wait() for p, _ in procs]
    except BaseException:  # Ctrl-C or a test's timeout: no fuzzer outlives the run
        for proc, _ in procs:
            kill_group(proc)
        raise
    elapsed = time.monotonic() - started
    logs = [log.read_text(errors="replace") for _, log in procs]
    execs = sum(_stat(text, "number_of_executed_units") for text in logs)
    crashes = (sorted(str(p.relative_to(REPO)) for p in BUILD.glob("crash-*"))
               + sorted(str(p.relative_to(REPO)) for p in BUILD.glob("leak-*")))
    failed = [f"{kind}-{job}.log: exit {code}: {_tail(text)}" for job, (code, text) in enumerate(zip(codes, logs))
              if code]
    status = [re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)/", text)[-1:] for text in logs]
    return {"kind": kind, "jobs": jobs, "executions": execs, "seconds": round(elapsed, 1),
            "execs_per_s": round(execs / max(elapsed, 1e-9)),
            "edges_features_corpus": [tuple(map(int, s[0])) if s else None for s in status], "crashes": crashes,
            "failed": failed}


def _tail(log: str) -> str:
    lines = [ln for ln in log.splitlines() if "ERROR" in ln or "SUMMARY" in ln or "check failed" in ln
             or "disagree" in ln or "Error" in ln]
    return " | ".join(lines[-6:]) or log[-800:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5_000_000,
                        help="executions of each native process (0: use --seconds)")
    parser.add_argument("--diff-runs", type=int, default=1_000_000,
                        help="executions of each differential process (0: use --seconds)")
    parser.add_argument("--seconds", type=int, default=60, help="time per fuzzer where its runs are 0")
    parser.add_argument("--jobs", type=int, default=2, help="processes of each fuzzer side by side")
    parser.add_argument("--quick", action="store_true",
                        help="a short run for `make test`: 15 s native, 15 s differential, 1 job each")
    parser.add_argument("--fresh", action="store_true", help="start from the seeds alone (empty the kept corpus)")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = args.diff_runs = 0
        args.seconds, args.jobs = 15, 1
    sys.path.insert(0, str(HERE))
    from seeds import write_seeds

    binaries = build()
    seeds, corpus = BUILD / "seeds", BUILD / ("corpus-quick" if args.quick else "corpus")
    for stale in [*BUILD.glob("crash-*"), *BUILD.glob("leak-*"),
                  *(corpus.glob("*") if args.fresh or args.quick else [])]:
        stale.unlink()
    corpus.mkdir(exist_ok=True)
    n_seeds = write_seeds(seeds)
    load_before = os.getloadavg()
    results = [fuzz(kind, binaries[kind], runs=runs, seconds=args.seconds, jobs=args.jobs, corpus=corpus, seeds=seeds)
               for kind, runs in (("native", args.runs), ("diff", args.diff_runs))]
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seeds": n_seeds,
               "corpus": len(list(corpus.iterdir())),
               "executions": sum(r["executions"] for r in results),
               "load_avg_before": [round(x, 1) for x in load_before],
               "load_avg_after": [round(x, 1) for x in os.getloadavg()], "cores": os.cpu_count(), "runs": results}
    text = json.dumps(summary, indent=1)
    (BUILD / ("last-quick-run.json" if args.quick else "last-run.json")).write_text(text + "\n")
    print(text)
    return 1 if any(r["crashes"] or r["failed"] for r in results) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
