"""``spanrl ui``: the viewer in the browser (see `spanrl.ui`)."""

from __future__ import annotations

import argparse
import sys

from spanrl.trust import add_token_option, token_from_args
from spanrl.extras import needs_extra

_DEFAULT_PORT = 4320
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ui", help="the viewer: rollouts, span trees with credit, runs, SQL, in the browser")
    p.add_argument("--db", default=None,
                   help="DuckDB file, read-only when no collector serves it (env SPANRL_DB, default spanrl.duckdb)")
    p.add_argument("--url", default=None,
                   help="collector to read through first (env SPANRL_SQL_URL, default http://127.0.0.1:4318)")

    add_token_option(p, "--token", "the collector's read token; the viewer asks for it too "
                     "(env SPANRL_COLLECTOR_READ_TOKEN, else SPANRL_COLLECTOR_TOKEN)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=_DEFAULT_PORT,
                   help=f"port (default {_DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--run", action="append", default=[], metavar="DIR",
                   help="a training run's output folder (history.jsonl), or a folder of them; repeatable "
                        "(default: the runs beside the --db file)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="folder with tokenizer.json to show completions as text (default: the runs' model)")
    p.set_defaults(func=_ui)
    needs_extra(p, "collector")


def _ui(args: argparse.Namespace) -> int:
    from spanrl.errors import SpanRLError, cli_error
    from spanrl.ui.server import UiServer

    try:
        server = UiServer.from_args(db=args.db, url=args.url, token=token_from_args(args, "--token"), runs=args.run,
                                    tokenizer=args.tokenizer, host=args.host, port=args.port)
    except SpanRLError as exc:
        return cli_error(exc)
    if args.host not in _LOOPBACK and server.token is None:
        print(f"spanrl: warning: serving spans on {args.host} without a token; set SPANRL_COLLECTOR_TOKEN",
              file=sys.stderr)

    print(f"spanrl ui: reading {server.app.source.description}; open {server.url}", flush=True)
    server.run()
    return 0
