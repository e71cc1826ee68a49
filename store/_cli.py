"""``spanrl sql`` and ``spanrl store export|prune|materialize|import``.

Each command first asks the collector at ``--url`` (env SPANRL_SQL_URL, default http://127.0.0.1:4318)
and goes through it when it answers and serves the same ``--db``; otherwise it opens the file itself
(read-only for sql/export). A file held by another process with no collector answering is
`StoreBusyError`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# the options and the collector-or-file choice are shared with `spanrl export` (store/access.py)
from spanrl.store.access import add_store_options, db_path, remote_store
from spanrl.extras import needs_extra


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sql", help="SQL over the span store (through a running collector, or the file)")
    p.add_argument("query", help='one read statement, e.g. "SELECT * FROM rollouts"')
    add_store_options(p)
    p.add_argument("--format", "-f", default="table", choices=("table", "csv", "json", "parquet"),
                   help="output format (default table)")

    p.add_argument("--output", "-o", default=None, help="write to this file instead of stdout")
    p.set_defaults(func=_sql)
    needs_extra(p, "collector")

    store = subparsers.add_parser("store", help="span store maintenance: export, prune, materialize")
    sub = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    e = sub.add_parser("export", help="write spans and the views to Parquet files")
    e.add_argument("--parquet", required=True, metavar="DIR", help="output folder (created)")
    add_store_options(e)
    e.set_defaults(func=_export)
    needs_extra(e, "collector")
    r = sub.add_parser("prune", help="delete rollouts whose last span was stored longer ago than --older-than")
    r.add_argument("--older-than", required=True, metavar="AGE", help="age such as 7d, 12h, 30m, 2w")
    add_store_options(r)
    r.set_defaults(func=_prune)
    needs_extra(r, "collector")
    m = sub.add_parser("materialize", help="keep the decomposition of finished rollouts (reads then take it)")
    add_store_options(m)
    m.set_defaults(func=_materialize)
    needs_extra(m, "collector")
    i = sub.add_parser("import", help="store trajectories from a file (OTLP JSON lines, as the OpenTelemetry "
                       "Collector's file exporter writes them), through the collector's ingest checks")
    i.add_argument("file", help="otlp: one OTLP/JSON ExportTraceServiceRequest per line (or ExportLogsServiceRequest: "
                   "its GenAI events, as live /v1/logs stores them); atif: an ATIF trajectory, a JSON array of them, "
                   "or one per line")
    i.add_argument("--format", "-f", default="otlp", choices=("otlp", "atif"), help="the file's format (default otlp)")
    add_store_options(i)
    i.set_defaults(func=_import)
    needs_extra(i, "collector")
    _register_export_trajectories(subparsers)


def _sql(args: argparse.Namespace) -> int:
    from spanrl.errors import SpanRLError, cli_error
    from spanrl.store import SpanStore
    from spanrl.store._format import write_result

    try:
        remote = remote_store(args)
        if remote is not None:
            table = remote.sql(args.query)
        else:
            with SpanStore.open(db_path(args), read_only=True) as store:
                table = store.read_sql(args.query)
        if args.output:
            with open(args.output, "wb") as out:
                write_result(table, args.format, out)
        else:
            write_result(table, args.format, sys.stdout.buffer)
            sys.stdout.flush()
    except SpanRLError as exc:
        return cli_error(exc)
    return 0


def _export(args: argparse.Namespace) -> int:
    from spanrl.errors import SpanRLError, cli_error
    from spanrl.store import SpanStore
    from spanrl.store.maintenance import export_parquet

    try:
        remote = remote_store(args)
        if remote is not None:
            paths = export_parquet(remote, args.parquet)
        else:
            with SpanStore.open(db_path(args), read_only=True) as store:
                paths = export_parquet(store, args.parquet)
    except SpanRLError as exc:
        return cli_error(exc)
    for path in paths:
        print(path)
    return 0


def _prune(args: argparse.Namespace) -> int:
    from spanrl.errors import SpanRLError, cli_error
    from spanrl.store import SpanStore
    from spanrl.store.maintenance import parse_duration_s, prune

    try:
        older_than_s = parse_duration_s(args.older_than)
        remote = remote_store(args, scope="admin")
        if remote is not None:
            deleted = remote.prune(older_than_s)
        else:
            with SpanStore.open(db_path(args)) as store:
                deleted = prune(store, older_than_s)
    except SpanRLError as exc:
        return cli_error(exc)
    print(f"deleted {deleted} spans ended more than {args.older_than} ago")
    return 0


def _materialize(args: argparse.Namespace) -> int:
    from spanrl.errors import SpanRLError, cli_error
    from spanrl.store import SpanStore
    from spanrl.store.kept_rollouts import materialize

    try:
        remote = remote_store(args, scope="admin")
        if remote is not None:
            done = remote.materialize()
        else:
            with SpanStore.open(db_path(args)) as store:
                done = materialize(store)
    except SpanRLError as exc:
        return cli_error(exc)
    print(f"kept {done['rollouts_kept']} decomposed rollouts (dropped {done['rows_dropped']} stale rows)")
    return 0


def _import(args: argparse.Namespace) -> int:
    from spanrl.errors import SpanRLError, cli_error
    from spanrl.store.atif import atif_requests, read_atif
    from spanrl.store.importing import import_otlp_lines, read_otlp_lines

    left_out = [0]  # log records without an event name (collector/logs.py)

    def otlp() -> Any:
        from spanrl.collector.logs import logs_json_as_traces

        for number, doc in read_otlp_lines(args.file):
            if "resourceLogs" in doc or "resource_logs" in doc:  # a logs line: its GenAI events, as spans
                spans, skipped = logs_json_as_traces(doc)
                left_out[0] += skipped
                doc = {"resourceSpans": [*(doc.get("resourceSpans") or ()), *spans.get("resourceSpans", ())]}
            yield number, doc

    def requests() -> Any:
        if args.format == "otlp":
            return otlp()
        return ((i, r) for i, traj in enumerate(read_atif(args.file), 1) for r in atif_requests(traj))

    try:
        remote = remote_store(args)
        if remote is not None:  # one token for both: ingest and read (and policy, for token ids to count)
            from spanrl import env
            from spanrl.store.remote import RemoteStore
            from spanrl.trust import env_token, token_from_args

            token = token_from_args(args, "--token") or env_token(env.SPANRL_COLLECTOR_TOKEN)
            report = import_otlp_lines(requests(), url=remote.url, token=token,
                                       stored=_stored_ids(RemoteStore(remote.url, token=token)))
        else:
            from spanrl.collector import Collector, CollectorConfig

            import secrets

            token = secrets.token_urlsafe(24)  # this import's own collector: no scope open to other local users
            config = CollectorConfig(db_path=db_path(args), grpc_port=-1, http_port=0, materialize_interval_s=None,
                                     token=token)
            with Collector(config) as collector:
                report = import_otlp_lines(requests(), url=collector.http_endpoint, token=token,
                                           stored=_stored_ids(collector.store))
    except SpanRLError as exc:
        return cli_error(exc)
    unit = "lines" if args.format == "otlp" else "trajectories"
    print(f"imported {report.spans_sent} spans from {report.lines} {unit} of {args.file} "
          f"({report.spans_already_stored} already stored, {report.spans_rejected} rejected"
          + (f"; {left_out[0]} log records without an event name left out" if left_out[0] else "") + ")")
    for error in report.errors:
        print(f"  rejected: {error}", file=sys.stderr)
    return 0


def _stored_ids(store: object) -> object:
    def stored(trace_ids: list[str]) -> set[tuple[str, str]]:
        query = "SELECT DISTINCT trace_id, span_id FROM spans WHERE list_contains($t, trace_id)"
        rows = store.sql(query, {"t": trace_ids}).to_pylist()  # type: ignore[attr-defined]
        return {(r["trace_id"], r["span_id"]) for r in rows}

    return stored


def _register_export_trajectories(subparsers: argparse._SubParsersAction) -> None:
    """``spanrl export trajectories``: a subcommand of ``spanrl export`` (``spanrl.cli_groups``)."""
    from spanrl.cli_groups import command_group

    t = command_group(subparsers, "export").add_parser(
        "trajectories", help="rollouts as ATIF trajectories (Harbor's Agent Trajectory Interchange "
        "Format), with token ids and log-probs where the store has them")
    t.add_argument("--output", "-o", required=True, help="output file: a JSON array of trajectories")
    t.add_argument("--format", "-f", default="atif", choices=("atif",), help="output format (default atif)")
    t.add_argument("--rollout-id", action="append", default=None, help="only this rollout (repeatable)")
    add_store_options(t)
    t.set_defaults(func=_export_trajectories)
    needs_extra(t, "collector")


def _export_trajectories(args: argparse.Namespace) -> int:
    import orjson

    from spanrl.errors import SpanRLError, cli_error
    from spanrl.store import SpanStore
    from spanrl.store.atif import export_atif

    try:
        remote = remote_store(args)
        if remote is not None:
            trajectories = export_atif(remote, rollout_ids=args.rollout_id)
        else:
            with SpanStore.open(db_path(args), read_only=True) as store:
                trajectories = export_atif(store, rollout_ids=args.rollout_id)
    except SpanRLError as exc:
        return cli_error(exc)
    with open(args.output, "wb") as out:
        out.write(orjson.dumps(trajectories, option=orjson.OPT_INDENT_2))
    print(f"wrote {len(trajectories)} trajectories to {args.output}")
    return 0
