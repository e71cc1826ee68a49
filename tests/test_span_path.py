"""docs/architecture.md's "A span's path, file by file" is the path a span really takes: the product files
bench/span_path.py sees run, in order, from OTLP bytes posted to the collector to GRPO's backward pass."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _documented() -> dict[str, list[str]]:
    """Stage name -> the files the doc lists for it, in its order."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## A span's path, file by file", 1)[1].split("\n## ", 1)[0]
    stages = re.split(r"\n\d\. (\w+): ", section)[1:]  # the numbered stages after the explaining paragraph
    return {name: re.findall(r"`([\w/]+\.py)`", body) for name, body in zip(stages[::2], stages[1::2])}


def test_the_documented_path_is_the_traced_one() -> None:
    spec = importlib.util.spec_from_file_location("span_path", REPO / "bench" / "span_path.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    steps = bench.trace_path()
    assert steps["ingest"][0] == "collector/http.py" and "store/_spanstore.py" in steps["ingest"]
    assert "algorithms/batching.py" in steps["update"]  # the backward pass ran
    documented = _documented()
    assert list(documented) == ["ingest", "transitions", "update"]
    listed = [f for files in documented.values() for f in files]
    # threads interleave, so the order within a stage may vary from run to run: each file once, at its stage
    assert len(listed) == len(set(listed)) and set(listed) == set(steps["path"])
    assert len(steps["path"]) <= bench.MAX_FILES, steps["path"]  # issue 31's goal, kept
    for name, files in documented.items():
        assert set(files) <= set(steps[name]), name
