"""How a command reaches the span store: through a running collector that serves the same file, else
the DuckDB file itself. ``spanrl sql``, ``spanrl store`` and ``spanrl export`` share these options.

    add_store_options(parser)          # --db, --url, --token
    remote = remote_store(args)        # a RemoteStore, or None: open db_path(args) yourself
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["DEFAULT_URL", "add_store_options", "db_path", "remote_store"]

DEFAULT_URL = "http://127.0.0.1:4318"


def add_store_options(p: argparse.ArgumentParser) -> None:
    """``--db``, ``--url`` and ``--token`` (each with its SPANRL_* variable as the default)."""
    p.add_argument("--db", default=None, help="DuckDB file (env SPANRL_DB, default spanrl.duckdb)")
    p.add_argument("--url", default=None, help=f"collector to ask first (env SPANRL_SQL_URL, default {DEFAULT_URL})")
    from spanrl.trust import add_token_option

    add_token_option(p, "--token", "bearer token for the collector: its read token for SQL and export, its admin token "
                     "for prune and materialize "
                     "(env SPANRL_COLLECTOR_READ_TOKEN / _ADMIN_TOKEN, else SPANRL_COLLECTOR_TOKEN)")



def remote_store(args: argparse.Namespace, *, scope: str = "read") -> Any:
    """The running collector to use (a :class:`~spanrl.store.remote.RemoteStore`), or None to open the file.
    ``scope``: ``read`` (SQL, export) or ``admin`` (prune, materialize): which token variable is the default."""
    from spanrl import env
    from spanrl.store.remote import RemoteStore
    from spanrl.trust import env_token, token_from_args

    url = args.url or env.get_str(env.SPANRL_SQL_URL, DEFAULT_URL)
    scoped = env.SPANRL_COLLECTOR_ADMIN_TOKEN if scope == "admin" else env.SPANRL_COLLECTOR_READ_TOKEN
    token = token_from_args(args, "--token") or env_token(scoped) or env_token(env.SPANRL_COLLECTOR_TOKEN)
    remote = RemoteStore(url, token=token)
    health = remote.health()
    if health is None:
        return None
    served = health.get("db")
    if args.db is not None and served and os.path.abspath(served) != os.path.abspath(args.db):
        return None  # that collector serves another file; read ours directly
    return remote


def db_path(args: argparse.Namespace) -> str:
    """The DuckDB file: ``--db``, else SPANRL_DB, else the default."""
    from spanrl import env

    return args.db or env.get_str(env.SPANRL_DB, env.DEFAULT_DB_PATH) or env.DEFAULT_DB_PATH
