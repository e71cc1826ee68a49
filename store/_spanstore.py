"""`SpanStore`: the DuckDB span store (schema, views, Arrow appends, read-only SQL).

DuckDB lets one process open a database file. Inside that process, one connection is shared and each
thread works through its own cursor (`SpanStore.cursor`). Other processes read through the collector's
SQL endpoint (`spanrl.store.RemoteStore`) or open the file once no collector holds it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import duckdb
import orjson
import pyarrow as pa

from spanrl import env
from spanrl.errors import StoreBusyError, StoreError
from spanrl.store import duckdb_errors

__all__ = ["READ_STATEMENT_TYPES", "SpanStore"]

_logger = logging.getLogger(__name__)

_SCHEMA_FILE = "schema.sql"
_VIEWS_FILE = "views.sql"
_BATCH_VIEW = "__spanrl_append_batch"
# EXPLAIN [ANALYZE | (options)] <statement>: the statement after it must itself be a read (EXPLAIN
# ANALYZE runs it: `EXPLAIN ANALYZE COPY ... TO 'file'` would write).
_EXPLAIN_PREFIX = re.compile(r"^\s*EXPLAIN\s+(?:ANALY[SZ]E\s+|\([^)]*\)\s*)?", re.IGNORECASE)

READ_STATEMENT_TYPES = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})
"""Statement types `SpanStore.read_sql` accepts (SELECT covers WITH, FROM-first, DESCRIBE, SHOW, SUMMARIZE)."""


def _check_read_only_statement(cur: duckdb.DuckDBPyConnection, query: str) -> None:
    try:
        statements = cur.extract_statements(query)
    except duckdb.Error as exc:
        raise StoreError(f"SQL does not parse: {exc}") from exc
    if len(statements) != 1:
        raise StoreError(f"exactly one SQL statement is allowed, got {len(statements)}")
    kind = statements[0].type
    if kind not in READ_STATEMENT_TYPES:
        raise StoreError(f"only read statements (SELECT, EXPLAIN) are allowed, got {kind.name}")
    if kind == duckdb.StatementType.EXPLAIN:
        inner = _EXPLAIN_PREFIX.sub("", query, count=1)
        try:
            inner_kinds = [st.type for st in cur.extract_statements(inner)]
        except duckdb.Error:
            inner_kinds = []
        if inner_kinds != [duckdb.StatementType.SELECT]:
            raise StoreError("EXPLAIN is allowed only of a SELECT statement (EXPLAIN ANALYZE runs what it explains)")
        query = inner
    _refuse_modifying_ctes(cur, query)


_MODIFYING_NODES = {"INSERT_QUERY_NODE": "INSERT", "UPDATE_QUERY_NODE": "UPDATE", "DELETE_QUERY_NODE": "DELETE"}


def _refuse_modifying_ctes(cur: duckdb.DuckDBPyConnection, query: str) -> None:
    """A SELECT whose CTE writes (``WITH d AS (DELETE ... RETURNING *) SELECT ...``) parses as a SELECT: look
    for a writing node in its parse tree (the read-only transaction would refuse it too, later and vaguer)."""
    try:
        tree = orjson.loads(cur.execute("SELECT json_serialize_sql(?)", [query]).fetchone()[0])
    except (duckdb.Error, orjson.JSONDecodeError, TypeError):
        return
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = _MODIFYING_NODES.get(node.get("type"))  # type: ignore[arg-type]
            if kind is not None:
                raise StoreError(f"only plain SELECTs are allowed: this one's WITH clause runs {kind} "
                                 "(a data-modifying CTE)")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


_BATCH_ROWS = 16_384


def _bounded(relation: duckdb.DuckDBPyRelation, max_rows: int | None, max_bytes: int | None) -> pa.Table:
    """The relation's rows, read a batch at a time; `StoreError` as soon as they pass a cap."""
    reader = relation.to_arrow_reader(_BATCH_ROWS)
    batches, rows, size = [], 0, 0
    for batch in reader:
        rows, size = rows + batch.num_rows, size + batch.nbytes
        if max_rows is not None and rows > max_rows:
            raise StoreError(f"the result has more than {max_rows} rows, the limit (sql_max_rows): "
                             "add a LIMIT or aggregate, or raise the collector's --sql-max-rows")
        if max_bytes is not None and size > max_bytes:
            raise StoreError(f"the result is larger than {max_bytes} bytes, the limit (sql_max_bytes): select fewer "
                             "columns or rows, or raise the collector's --sql-max-bytes")
        batches.append(batch)
    return pa.Table.from_batches(batches, reader.schema)


def _sql_resource(name: str) -> str:
    text = resources.files("spanrl.store").joinpath(name).read_text(encoding="utf-8")
    return text.replace("__TASK_FROM__", _task_from()) if name == _VIEWS_FILE else text


def _task_from() -> str:
    """How views.sql derives a task for rollouts that name none (``SPANRL_TASK_FROM``)."""
    value = env.get_str(env.SPANRL_TASK_FROM, env.TASK_FROM_CHOICES[0])
    if value not in env.TASK_FROM_CHOICES:
        _logger.warning("%s=%r is not one of %s; using %s", env.SPANRL_TASK_FROM, value,
                        ", ".join(env.TASK_FROM_CHOICES), env.TASK_FROM_CHOICES[0])
        return env.TASK_FROM_CHOICES[0]
    return value


class SpanStore:
    """The span store on one DuckDB file (or ``":memory:"``).

    Open it with `SpanStore.open`. Every method is safe to call from several threads: each call takes
    its own cursor on the shared connection.
    """

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: str, *, read_only: bool) -> None:
        """Wrap an open connection; use `SpanStore.open` instead."""
        self._con = connection
        self._path = path
        self._read_only = read_only
        self._closed = False
        self._close_lock = threading.Lock()
        # held from an append's ingested_ns stamp to its commit, so the stamps grow with the commit order
        # whoever appends (the collector's writer, the Trainer's record_end): a reader that sees a stamp
        # sees every older one (store/kept_rollouts.py's watermark)
        self._append_lock = threading.Lock()
        self._config: dict[str, str | int | bool] = {}
        self._sandboxed = False
        self.generation = 0
        """How many times `reopen` replaced the connection (cursor holders compare it)."""
        self._span_columns: list[str] = []
        self.has_kept_rows = False
        """Whether the file has the table of kept decomposed rollouts (store/kept_rollouts.py) of this version."""
        self._batch_columns: frozenset[str] | None = None  # a full batch's columns: all but ingested_ns last

    # --- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        read_only: bool = False,
        memory_limit: str | None = None,
        checkpoint_threshold: str | None = None,
        threads: int | None = None,
        sandboxed: bool = False,
    ) -> "SpanStore":
        """Open (and, unless ``read_only``, create) the store at ``path``.

        ``memory_limit`` caps DuckDB's buffer memory (DuckDB syntax, e.g. ``"1GB"``; default: DuckDB's,
        80% of RAM). ``checkpoint_threshold``: WAL size that triggers a checkpoint (DuckDB's default
        16MB; larger amortizes checkpoints over more spans, a restart replays more WAL). ``threads``:
        DuckDB worker threads (default: one per core; 1 costs inserts less CPU, slows big queries).
        ``sandboxed`` (the collector's store, which serves SQL to other processes): DuckDB may touch no
        file but its own and its settings are locked, so no SQL can read ``/etc/passwd``, COPY a file
        out, ATTACH, or SET a limit. Raises `StoreBusyError` when another process holds the file,
        `StoreError` when a read-only open finds no file.
        """
        path = str(path)
        if read_only and path != ":memory:" and not Path(path).exists():
            raise StoreError(f"no span store at {path!r}: the file does not exist")
        if not read_only and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        config: dict[str, str | int | bool] = {}
        if memory_limit:
            config["memory_limit"] = memory_limit
        if checkpoint_threshold and not read_only:
            config["checkpoint_threshold"] = checkpoint_threshold
        if threads is not None:
            config["threads"] = threads
        if sandboxed:
            config["enable_external_access"] = False
        store = cls(_connect(path, read_only, config), path, read_only=read_only)
        store._config = config
        store._sandboxed = sandboxed
        try:
            _check_not_truncated(store._con, path)
            store._prepare()
        except (duckdb.Error, StoreError) as exc:
            store._con.close()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(_open_failure(path, exc)) from exc
        return store

    def _prepare(self) -> None:
        con = self._con
        if not self._read_only:
            con.execute(_sql_resource(_SCHEMA_FILE))
            con.execute(_sql_resource(_VIEWS_FILE))
        else:
            # The file's views may be older than this spanrl, or missing: temporary ones (and their macros)
            # live in memory, so read-only is fine, and they shadow the stored ones.
            views = _sql_resource(_VIEWS_FILE).replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW")
            con.execute(views.replace("CREATE OR REPLACE MACRO", "CREATE OR REPLACE TEMP MACRO"))
        from spanrl.store import kept_rollouts  # the decomposer's kept rows (imports the decomposer)

        self.has_kept_rows = kept_rollouts.prepare(con, read_only=self._read_only)
        self._span_columns = [row[0] for row in con.execute("DESCRIBE spans").fetchall()]
        last = self._span_columns[-1] if self._span_columns else None
        self._batch_columns = frozenset(self._span_columns[:-1]) if last == "ingested_ns" else None
        if self._sandboxed:
            con.execute("SET lock_configuration = true")

    def reopen(self) -> None:
        """Close the connection and open the file again (after DuckDB invalidated the database).

        Cursors taken before fail from then on; take new ones. Raises `StoreError` when the file
        cannot be opened again.
        """
        with self._close_lock:
            if self._closed:
                raise StoreError(f"the span store {self._path!r} is closed; open it again")
            try:
                self._con.close()
            except duckdb.Error:
                pass  # an invalidated database may fail to close cleanly; its file is what matters
            self._con = _connect(self._path, self._read_only, self._config)
            try:
                _check_not_truncated(self._con, self._path)
                self._prepare()
            except duckdb.Error as exc:
                raise StoreError(f"cannot reopen: {_open_failure(self._path, exc)}") from exc
            self.generation += 1

    def close(self) -> None:
        """Checkpoint (when writable) and close. Safe to call twice, and after DuckDB invalidated the
        database (the WAL then holds the last commits; the next open replays it)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                if not self._read_only:
                    self._con.execute("CHECKPOINT")
            except duckdb.Error as exc:
                _logger.warning("closing %s without a checkpoint: %s", self._path, str(exc).splitlines()[0])
            finally:
                try:
                    self._con.close()
                except duckdb.Error:
                    pass

    def __enter__(self) -> "SpanStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- properties --------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The database file (or ``":memory:"``)."""
        return self._path

    @property
    def read_only(self) -> bool:
        """Whether this store was opened read-only."""
        return self._read_only

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    # --- access ------------------------------------------------------------------------------------
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new DuckDB cursor on the shared connection, for use by one thread."""
        with self._close_lock:
            if self._closed:
                raise StoreError(f"the span store {self._path!r} is closed; open it again")
            return self._con.cursor()

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Run any SQL statement and return its result as an Arrow table (empty for statements without one)."""
        cur = self.cursor()
        try:
            rel = cur.sql(query, params=params)
            return rel.to_arrow_table() if rel is not None else pa.table({})
        except duckdb.Error as exc:
            raise StoreError(_damaged(self._path, exc) or f"SQL failed: {exc}") from exc
        finally:
            cur.close()

    def read_sql(
        self, query: str, params: Sequence[Any] | dict[str, Any] | None = None, *, timeout_s: float | None = None,
        max_rows: int | None = None, max_bytes: int | None = None,
    ) -> pa.Table:
        """Run one read statement (SELECT / EXPLAIN of a SELECT) and return its rows; anything else is refused.

        The statement runs in a read-only transaction that is rolled back, so a read cannot write, not even
        through a CTE. ``timeout_s``: interrupt the query (and the reading of its rows) after that many
        seconds. ``max_rows`` / ``max_bytes``: rows are read a batch at a time and the query stops as soon as
        they pass either cap (Arrow bytes). Raises `StoreError` naming the refused statement type, the cap
        passed, or the time limit reached.
        """
        cur = self.cursor()
        try:
            _check_read_only_statement(cur, query)
            timer = None
            if timeout_s is not None:
                timer = threading.Timer(timeout_s, cur.interrupt)
                timer.daemon = True
                timer.start()
            cur.execute("BEGIN TRANSACTION READ ONLY")
            try:
                if max_rows is None and max_bytes is None:
                    return cur.sql(query, params=params).to_arrow_table()
                return _bounded(cur.sql(query, params=params), max_rows, max_bytes)
            except duckdb.InterruptException:
                raise StoreError(
                    f"SQL interrupted: it ran longer than the time limit of {timeout_s:g} s (sql_timeout_s)"
                ) from None
            except duckdb.Error as exc:
                raise StoreError(_damaged(self._path, exc) or f"SQL failed: {exc}") from exc
            finally:
                if timer is not None:
                    timer.cancel()
                try:
                    cur.rollback()
                except duckdb.Error:
                    pass
        finally:
            cur.close()

    def span_count(self, rollout_id: str | None = None) -> int:
        """Number of stored spans, of one rollout when ``rollout_id`` is given."""
        if rollout_id is None:
            table = self.sql("SELECT count(*) AS n FROM spans")
        else:
            table = self.sql("SELECT count(*) AS n FROM spans WHERE rollout_id = ?", [rollout_id])
        return int(table.column("n")[0].as_py())

    # --- writes (the collector's writer) -----------------------------------------------------------
    def append(self, batch: pa.Table, *, cursor: duckdb.DuckDBPyConnection | None = None) -> int:
        """Insert Arrow span rows (columns by name, see schema.sql) in one transaction; return the count.

        ``ingested_ns`` is set here to the commit time; appends are serialized, so it grows with the commit
        order. Runs on ``cursor`` when given (the writer thread keeps one), else on a fresh one.
        """
        if self._read_only:
            raise StoreError(f"the span store {self._path!r} was opened read-only; cannot append")
        if batch.num_rows == 0:
            return 0
        if "ingested_ns" in batch.column_names:
            batch = batch.drop_columns(["ingested_ns"])
        cur = cursor if cursor is not None else self.cursor()
        try:
            with self._append_lock:
                return self._insert(cur, batch)
        finally:
            if cursor is None:
                cur.close()

    def _insert(self, cur: duckdb.DuckDBPyConnection, batch: pa.Table) -> int:
        """One autocommitted insert of ``batch`` stamped now (`append` holds the append lock)."""
        now = time.time_ns()
        names = batch.column_names
        if len(names) == len(self._batch_columns or ()) and frozenset(names) == self._batch_columns:
            # Every column (the collector's batches): in the table's order, appended through the
            # relation API, which skips the SQL parse, bind and view registration of the INSERT below
            # (~1.3 ms CPU per commit, ~3 us per span at one request per commit).
            stamp = pa.repeat(pa.scalar(now, pa.int64()), batch.num_rows)
            cur.from_arrow(batch.append_column("ingested_ns", stamp).select(self._span_columns)).insert_into("spans")
            return batch.num_rows
        cur.register(_BATCH_VIEW, batch)
        try:
            cur.execute(f"INSERT INTO spans BY NAME SELECT *, ?::BIGINT AS ingested_ns FROM {_BATCH_VIEW}", [now])
        finally:
            cur.unregister(_BATCH_VIEW)
        return batch.num_rows


_FILE_HEADERS_BYTES = 3 * 4096  # DuckDB's main header and its two database headers, before the first block
def _check_not_truncated(con: duckdb.DuckDBPyConnection, path: str) -> None:
    """`StoreError` when the file is shorter than the blocks its header names (truncated, or partly
    copied): DuckDB itself opens such a file, answers counts from its metadata, takes writes into the
    WAL, and fails only when a query or a checkpoint reads a missing block."""
    if path == ":memory:" or not Path(path).is_file():
        return
    _, _, block_size, total_blocks, *_ = con.execute("PRAGMA database_size").fetchone()
    expected, actual = _FILE_HEADERS_BYTES + int(total_blocks) * int(block_size), Path(path).stat().st_size
    if actual < expected:
        raise StoreError(
            f"the span store {path!r} is damaged: the file has {actual} bytes, "
            f"its header names {total_blocks} blocks of "
            f"{block_size} ({expected} bytes); it was truncated or only partly copied. "
            "Restore it from a backup, or move "

            "it away to start a new store"
        )


def _damaged(path: str, exc: BaseException) -> str | None:
    """The message for a file DuckDB found damaged (a block whose checksum fails, a header it cannot read), else None.
    Blocks are checked as they are read: at start for what the collector reads then, later for the rest."""
    if not duckdb_errors.damaged(exc):
        return None
    first = str(exc).splitlines()[0]
    return (f"the span store {path!r} is damaged: {first}. Restore it from a backup, or move it away to start a "
            "new store")


def _open_failure(path: str, exc: BaseException) -> str:
    """The reason an open failed, and what to do when the disk is full or the file is damaged."""
    damaged = _damaged(path, exc)
    if damaged is not None:
        return damaged
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if duckdb_errors.disk_full(exc):
        return (f"cannot open the span store {path!r}: the disk is full (or a file size limit was reached): {first}. "
                "Nothing stored was lost; free some space and start again")
    return f"cannot open the span store {path!r}: {first}"


def _connect(path: str, read_only: bool, config: dict[str, str | int | bool]) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(path, read_only=read_only, config=config)
    except duckdb.IOException as exc:
        if duckdb_errors.locked(exc):
            raise StoreBusyError(
                f"the span store {path!r} is held by another process and no collector answered SQL "
                f"for it; query through that collector (spanrl sql --url URL) or stop it. ({exc})"
            ) from exc
        raise StoreError(_open_failure(path, exc)) from exc
    except duckdb.Error as exc:
        if "memory_limit" not in config or read_only or duckdb_errors.disk_full(exc):
            raise StoreError(_open_failure(path, exc)) from exc
        # Replaying a large WAL can need more than the configured cap: replay and checkpoint once
        # without it (DuckDB's default, 80% of RAM), then open again with the cap.
        _logger.warning("opening %s with memory_limit=%s failed (%s); replaying its WAL without the cap once",
                        path, config["memory_limit"], str(exc).splitlines()[0])
        relaxed = {k: v for k, v in config.items() if k != "memory_limit"}
        try:
            con = duckdb.connect(path, config=relaxed)
            con.execute("CHECKPOINT")
            con.close()
            return duckdb.connect(path, read_only=read_only, config=config)
        except duckdb.Error as exc2:
            raise StoreError(_open_failure(path, exc2)) from exc2
