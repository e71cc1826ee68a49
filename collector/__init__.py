"""spanrl.collector: OTLP/gRPC + OTLP/HTTP receivers, group-commit batcher, DuckDB writer, SQL endpoint.

    from spanrl.collector import Collector, CollectorConfig
    c = Collector(CollectorConfig(db_path="x.duckdb", grpc_port=0, http_port=0)).start()
    c.grpc_endpoint, c.http_endpoint, c.store
    c.shutdown()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanrl._lazy import lazy_getattr

# public name -> module that defines it; loaded on first use, so `spanrl <command> --help` and the
# agent-side install import this package without its extra (duckdb, pyarrow, ...).
_LAZY: dict[str, str] = {
    "BatcherConfig": "spanrl.collector.batcher",
    "Collector": "spanrl.collector.server",
    "CollectorConfig": "spanrl.collector.config",
    "default_config": "spanrl.collector.config",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.collector.batcher import BatcherConfig
    from spanrl.collector.config import CollectorConfig, default_config
    from spanrl.collector.server import Collector
