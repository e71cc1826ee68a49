"""``spanrl collector``: run the OTLP collector until SIGTERM / SIGINT, then flush and exit 0."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

READY_PREFIX = "spanrl collector ready"
"""First line printed on stdout once both receivers accept: ``spanrl collector ready grpc=H:P http=URL db=PATH``."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("collector", help="OTLP/gRPC + OTLP/HTTP collector writing the DuckDB span store")
    p.add_argument("--db", default=None, help="DuckDB file (env SPANRL_DB, default spanrl.duckdb)")
    p.add_argument("--host", default=None, help="address to bind (env SPANRL_COLLECTOR_HOST, default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, default=None, help="OTLP/gRPC port, 0 = any free, -1 = off (default 4317)")
    p.add_argument("--http-port", type=int, default=None, help="OTLP/HTTP + SQL port, 0 = any free, -1 = off (default 4318)")
    p.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (env SPANRL_COLLECTOR_TOKEN)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from spanrl.collector import Collector, CollectorConfig
    from spanrl.errors import SpanRLError

    try:
        config = CollectorConfig.from_env(db_path=args.db, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port, token=args.token)
        collector = Collector(config)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        collector.start()
    except SpanRLError as exc:
        print(f"spanrl collector: error: {exc}", file=sys.stderr)
        return 1
    print(f"{READY_PREFIX} grpc={collector.grpc_endpoint} http={collector.http_endpoint} db={config.db_path}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        collector.shutdown()
    print(f"spanrl collector stopped; {collector.committed_spans} spans committed this run", flush=True)
    return 0
