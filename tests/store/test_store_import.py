"""``spanrl store import``: OTLP JSON lines as the OpenTelemetry Collector's file exporter writes them (one
ExportTraceServiceRequest in OTLP/JSON per line, upper- or lowercase hex ids), through the collector's
ingest (its reward check refuses what live ingest refuses), stored once however often imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from spanrl.algorithms.transitions import load_transitions
from spanrl.store import SpanStore

_T = "5B8EFFF798038103D269B633813FC60C"  # the OTLP spec example's trace id, in its uppercase hex


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    if isinstance(value, list):
        return {"key": key, "value": {"arrayValue": {"values": [_kv("", v)["value"] for v in value]}}}
    return {"key": key, "value": {"stringValue": value}}


def _request(service: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{"resource": {"attributes": [_kv("service.name", service)]},
                               "scopeSpans": [{"scope": {"name": "file-export"}, "spans": spans}]}]}


def _span(span_id: str, name: str, *, parent: str | None = None, kind: int = 1, start_s: float = 0.0,
          attrs: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    start = 1_800_000_000_000_000_000 + int(start_s * 1e9)
    span = {"traceId": _T, "spanId": span_id, "name": name, "kind": kind, "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 100_000_000), "attributes": [_kv(k, v) for k, v in (attrs or {}).items()],
            "events": events or [], "status": {}}
    if parent:
        span["parentSpanId"] = parent
    return span


def _file(path: Path) -> Path:
    rollout = {"spanrl.rollout.id": "imported-1", "spanrl.task.id": "t-1"}
    lines = [
        _request("agent", [_span("00000000000000A1", "spanrl.rollout", attrs=rollout, start_s=0.0),
                           _span("00000000000000A2", "chat tiny", parent="00000000000000A1", kind=3, start_s=0.1,
                                 attrs={**rollout, "gen_ai.operation.name": "chat", "gen_ai.response.id": "c-1"})]),
        _request("spanrl-policy", [_span("00000000000000B1", "chat tiny", parent="00000000000000A2", kind=2,
                                         start_s=0.1, attrs={
                                             **rollout, "gen_ai.operation.name": "chat", "gen_ai.response.id": "c-1",
                                             "spanrl.policy.version": 0, "spanrl.llm.prompt_token_ids": [1, 2, 3],
                                             "spanrl.llm.completion_token_ids": [4, 5],
                                             "spanrl.llm.logprobs": [-0.5, -0.25]})]),
        _request("agent", [_span("00000000000000A3", "spanrl.reward", parent="00000000000000A1", start_s=0.3,
                                 attrs={**rollout, "spanrl.reward.value": 0.75}),
                           _span("00000000000000A4", "spanrl.reward", parent="00000000000000A1", start_s=0.4,
                                 attrs={**rollout, "spanrl.reward.value": 1e300})]),  # refused, as live
        "",
    ]
    path.write_text("\n".join(json.dumps(line) if line else "" for line in lines))
    return path


def _spanrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spanrl", *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd)


def test_otlp_json_lines_import_through_the_collector_once(collector: Any, tmp_path: Path) -> None:
    path = _file(tmp_path / "traces.jsonl")
    db = tmp_path / "imported.duckdb"
    no_collector = "http://127.0.0.1:9"  # nothing answers: the command starts its own collector on the file
    first = _spanrl("store", "import", str(path), "--db", str(db), "--url", no_collector, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "imported 4 spans from 3 lines" in first.stdout and "1 rejected" in first.stdout
    assert "reward" in first.stderr  # the collector's reason for the refused span
    again = _spanrl("store", "import", str(path), "--db", str(db), "--url", no_collector, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "imported 0 spans from 3 lines of" in again.stdout  # the refused span is refused again, never stored
    assert "(4 already stored, 1 rejected)" in again.stdout

    with SpanStore.open(db, read_only=True) as store:
        spans = store.sql("SELECT trace_id, span_id, count(*) AS n FROM spans GROUP BY ALL").to_pylist()
        assert len(spans) == 4 and {s["n"] for s in spans} == {1} and spans[0]["trace_id"] == _T.lower()
        assert store.sql("SELECT final_reward FROM rollouts").to_pylist() == [{"final_reward": 0.75}]
        imported = load_transitions(store).to_arrow()

    # into a running collector, through its endpoint: the same transitions
    live = _spanrl("store", "import", str(path), "--db", str(collector.config.db_path), "--url",
                   collector.http_endpoint, cwd=tmp_path)
    assert live.returncode == 0, live.stderr
    assert "imported 4 spans" in live.stdout
    assert load_transitions(collector.store).to_arrow().equals(imported)


def test_a_logs_line_imports_its_genai_events_once(tmp_path: Path) -> None:
    """The file exporter's logs lines (OTLP/JSON ExportLogsServiceRequest): each GenAI event becomes the span live
    /v1/logs makes of it (collector/logs.py), a re-import skips it, a plain log record is left out and counted."""
    decision = {"timeUnixNano": "1800000000200000000", "traceId": _T, "spanId": "00000000000000A1",
                "eventName": "gen_ai.tool.call.decision",
                "attributes": [_kv("gen_ai.tool.call.decision.outcome", "deny"), _kv("gen_ai.tool.name", "Bash"),
                               _kv("gen_ai.tool.call.id", "toolu_1")]}
    plain = {"timeUnixNano": "1800000000300000000", "body": {"stringValue": "agent started"}}
    logs = {"resourceLogs": [{"resource": {"attributes": [_kv("spanrl.rollout.id", "imported-1")]},
                              "scopeLogs": [{"scope": {"name": "gen_ai.reference"},
                                             "logRecords": [decision, plain]}]}]}
    path = _file(tmp_path / "traces.jsonl")
    path.write_text(path.read_text().rstrip("\n") + "\n" + json.dumps(logs) + "\n")
    db = tmp_path / "imported.duckdb"
    no_collector = "http://127.0.0.1:9"
    first = _spanrl("store", "import", str(path), "--db", str(db), "--url", no_collector, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "imported 5 spans from 4 lines" in first.stdout
    assert "1 log records without an event name left out" in first.stdout
    again = _spanrl("store", "import", str(path), "--db", str(db), "--url", no_collector, cwd=tmp_path)
    assert "imported 0 spans from 4 lines" in again.stdout and "(5 already stored" in again.stdout, again.stdout
    with SpanStore.open(db, read_only=True) as store:
        assert store.sql("SELECT rollout_id, span_id, outcome, tool_call_id FROM tool_decisions").to_pylist() == [
            {"rollout_id": "imported-1", "span_id": "00000000000000a1", "outcome": "deny", "tool_call_id": "toolu_1"}]
