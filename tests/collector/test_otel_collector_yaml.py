"""otel-collector.yaml (the OpenTelemetry Collector fan-in) is internally consistent and targets us."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from spanrl import env

_FILE = Path(__file__).resolve().parents[2] / "otel-collector.yaml"


def _load() -> dict:
    return yaml.safe_load(_FILE.read_text())


def test_every_pipeline_component_is_defined():
    doc = _load()
    service = doc["service"]
    for kind in ("receivers", "processors", "exporters"):
        for pipeline in service["pipelines"].values():
            for name in pipeline[kind]:
                assert name in doc[kind], f"{kind[:-1]} {name!r} used in a pipeline but not defined"
    for name in service["extensions"]:
        assert name in doc["extensions"], f"extension {name!r} enabled but not defined"


def test_exporter_targets_spanrl_grpc_port_with_persistent_retrying_queue():
    doc = _load()
    exporters = doc["service"]["pipelines"]["traces"]["exporters"]
    assert len(exporters) == 1 and exporters[0].split("/")[0] == "otlp"
    exporter = doc["exporters"][exporters[0]]
    port = re.search(r":(\d+)\}?$", exporter["endpoint"])
    assert port and int(port.group(1)) == env.DEFAULT_GRPC_PORT
    queue = exporter["sending_queue"]
    assert queue["enabled"] is True
    assert queue["storage"] in doc["service"]["extensions"] and queue["storage"].startswith("file_storage")
    assert exporter["retry_on_failure"]["enabled"] is True
    assert "Bearer" in exporter["headers"]["authorization"]


def test_memory_limiter_runs_first_then_batch():
    processors = _load()["service"]["pipelines"]["traces"]["processors"]
    assert processors[0] == "memory_limiter" and "batch" in processors
    receivers = _load()["receivers"]["otlp"]["protocols"]
    assert set(receivers) == {"grpc", "http"}
