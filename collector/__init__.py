"""spanrl.collector: OTLP/gRPC + OTLP/HTTP receivers, group-commit batcher, DuckDB writer, SQL endpoint.

    from spanrl.collector import Collector, CollectorConfig
    c = Collector(CollectorConfig(db_path="x.duckdb", grpc_port=0, http_port=0)).start()
    c.grpc_endpoint, c.http_endpoint, c.store
    c.shutdown()
"""

from __future__ import annotations

from spanrl.collector.batcher import BatcherConfig
from spanrl.collector.config import CollectorConfig, default_config
from spanrl.collector.server import Collector

__all__ = ["BatcherConfig", "Collector", "CollectorConfig", "default_config"]
