"""``spanrl collector``: run the OTLP collector until SIGTERM / SIGINT, then flush and exit 0."""

from __future__ import annotations

import argparse
import signal
import threading

from spanrl.trust import add_token_option, token_from_args
from spanrl.extras import needs_extra

READY_PREFIX = "spanrl collector ready"
"""First line printed on stdout once both receivers accept: ``spanrl collector ready grpc=H:P http=URL db=PATH``."""

EXIT_STORE_FAILED = 3
"""Exit status when DuckDB invalidated the store and reopening it failed; a restart replays its WAL."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("collector", help="OTLP/gRPC + OTLP/HTTP collector writing the DuckDB span store")
    p.add_argument("--db", default=None, help="DuckDB file (env SPANRL_DB, default spanrl.duckdb)")
    p.add_argument("--host", default=None, help="address to bind (env SPANRL_COLLECTOR_HOST, default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, default=None, help="OTLP/gRPC port, 0 = any free, -1 = off (default 4317)")
    p.add_argument("--http-port", type=int, default=None,
                   help="OTLP/HTTP + SQL port, 0 = any free, -1 = off (default 4318)")
    add_token_option(p, "--token",
                     "token of every scope: require 'Authorization: Bearer TOKEN' (env SPANRL_COLLECTOR_TOKEN)")
    add_token_option(p, "--ingest-token",
                     "token for OTLP export only, the one agents get (env SPANRL_COLLECTOR_INGEST_TOKEN)")
    add_token_option(p, "--policy-token",
                     "the policy server's OTLP token: only its token ids count (env SPANRL_COLLECTOR_POLICY_TOKEN)")
    add_token_option(p, "--read-token", "token for POST /v1/sql (env SPANRL_COLLECTOR_READ_TOKEN)")
    add_token_option(p, "--admin-token",
                     "token for POST /v1/prune and /v1/materialize (env SPANRL_COLLECTOR_ADMIN_TOKEN)")
    p.add_argument("--duckdb-memory-limit", default=None,
                   help="DuckDB memory cap, e.g. 2GB (env SPANRL_DUCKDB_MEMORY_LIMIT, default 1GB)")
    p.add_argument("--checkpoint-threshold", default=None,
                   help="WAL size that triggers a checkpoint, e.g. 64MB "
                        "(env SPANRL_DUCKDB_CHECKPOINT_THRESHOLD, default 512MB)")
    p.add_argument("--duckdb-threads", type=int, default=None,
                   help="DuckDB worker threads (default one per core); "
                        "1 cuts insert CPU ~25%% but runs SQL queries on one core")
    p.add_argument("--max-inflight-bytes", type=int, default=None,
                   help="request bytes being decoded at once; more get a retryable 503 "
                        "(env SPANRL_COLLECTOR_MAX_INFLIGHT_BYTES, default 256 MiB)")
    p.add_argument("--max-queue-bytes", type=int, default=None,
                   help="Arrow bytes waiting for the writer (default 256 MiB)")
    p.add_argument("--max-request-bytes", type=int, default=None, help="largest request body (default 64 MiB)")
    p.add_argument("--sql-timeout-s", type=float, default=None,
                   help="interrupt a /v1/sql query after this (env SPANRL_COLLECTOR_SQL_TIMEOUT_S, default 30)")
    p.add_argument("--sql-max-rows", type=int, default=None,
                   help="rows a /v1/sql result may have, else 400 (env SPANRL_COLLECTOR_SQL_MAX_ROWS, default 1000000)")
    p.add_argument("--sql-max-bytes", type=int, default=None,
                   help="bytes a /v1/sql result may take, else 400 "
                        "(env SPANRL_COLLECTOR_SQL_MAX_BYTES, default 256 MiB)")
    p.add_argument("--materialize-interval-s", type=float, default=None,
                   help="shortest wait between background runs keeping finished rollouts' decomposition "
                        "(default 2; 0 = off)")
    p.add_argument("--retention", default=None, metavar="DURATION",
                   help="delete spans ingested longer ago than this (e.g. 7d, 12h), in the background "
                        "(default: keep all)")
    p.add_argument("--reward-range", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                   help="reject spans whose reward is outside [LOW, HIGH] or not finite "
                        "(default -1e6 1e6, the widest allowed)")
    p.set_defaults(func=_run)
    needs_extra(p, "collector")


def _run(args: argparse.Namespace) -> int:
    from spanrl.collector import Collector, CollectorConfig
    from spanrl.errors import ConfigError, SpanRLError, cli_error

    try:
        config = CollectorConfig.from_env(
            db_path=args.db, host=args.host, grpc_port=args.grpc_port, http_port=args.http_port,
            token=token_from_args(args, "--token"), ingest_token=token_from_args(args, "--ingest-token"),
            policy_token=token_from_args(args, "--policy-token"), read_token=token_from_args(args, "--read-token"),
            admin_token=token_from_args(args, "--admin-token"),
            duckdb_memory_limit=args.duckdb_memory_limit, duckdb_checkpoint_threshold=args.checkpoint_threshold,
            duckdb_threads=args.duckdb_threads,
            max_inflight_bytes=args.max_inflight_bytes, max_request_bytes=args.max_request_bytes,
            sql_timeout_s=args.sql_timeout_s, sql_max_rows=args.sql_max_rows, sql_max_bytes=args.sql_max_bytes,
        )
        if args.materialize_interval_s is not None:
            config.materialize_interval_s = args.materialize_interval_s or None  # 0: off
        if args.retention is not None:
            from spanrl.store.maintenance import parse_duration_s

            try:
                config.retention_s = parse_duration_s(args.retention)
            except SpanRLError:
                raise ConfigError(
                    f"--retention must be a number and a unit s/m/h/d/w (e.g. 7d), got {args.retention!r}"
                ) from None
        if args.reward_range is not None:
            config.reward_range = tuple(args.reward_range)
        if args.max_queue_bytes is not None:
            config.batcher.max_queue_bytes = args.max_queue_bytes
        config.validate()
        collector = Collector(config)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        collector.start()
    except SpanRLError as exc:
        return cli_error(exc)
    print(f"{READY_PREFIX} grpc={collector.grpc_endpoint} http={collector.http_endpoint} db={config.db_path}",
          flush=True)

    try:
        while not stop.wait(0.5):
            if collector.failed.is_set():
                break
    finally:
        collector.shutdown()
    if collector.failed.is_set():
        error = collector.health().get("error")
        return cli_error(f"the span store failed and could not be reopened ({error}); exiting {EXIT_STORE_FAILED} "
                         "so a supervisor restarts it on the same file", EXIT_STORE_FAILED)
    print(f"spanrl collector stopped; {collector.committed_spans} spans committed this run", flush=True)
    return 0
