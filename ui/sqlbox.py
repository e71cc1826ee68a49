"""The SQL box: one read statement through the `Source`, as a table for the page or a file download."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from spanrl.errors import ConfigError, one_of
from spanrl.ui.source import Source

__all__ = ["FORMATS", "MAX_SHOWN_ROWS", "run_sql"]

MAX_SHOWN_ROWS = 1000
"""Rows sent to the page; downloads carry every row."""
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet may run as a formula
FORMATS = {"json": "application/json", "csv": "text/csv; charset=utf-8", "parquet": "application/vnd.apache.parquet"}


def run_sql(source: Source, query: Any, fmt: Any) -> tuple[bytes | dict[str, Any], str]:
    """(body, content type): a dict for ``json`` (columns, the first rows, the total), bytes otherwise."""
    if not isinstance(query, str) or not query.strip():
        raise ConfigError(f"sql must be a non-empty string with one SELECT statement, got {query!r}")
    one_of("format", fmt, FORMATS)
    table = source.sql(query)
    if fmt == "json":
        shown = table.slice(0, MAX_SHOWN_ROWS)
        return {
            "columns": [{"name": f.name, "type": str(f.type)} for f in table.schema],
            "rows": [list(r.values()) for r in shown.to_pylist()],
            "total": table.num_rows,
        }, FORMATS[fmt]
    out = io.BytesIO()
    if fmt == "csv":
        pacsv.write_csv(_csv_safe(table), out)
    else:
        pq.write_table(table, out)
    return out.getvalue(), FORMATS[fmt]


def _csv_safe(table: pa.Table) -> pa.Table:
    """CSV has no lists or structs: write those columns as their JSON-like text. A text cell starting with
    one of `_FORMULA_STARTS` is prefixed with ``'`` so a spreadsheet shows it instead of running it as a
    formula (OWASP "CSV injection": span attributes are whatever an agent sent)."""
    columns = []
    for column in table.columns:
        if pa.types.is_nested(column.type):
            column = pa.array([None if v is None else str(v) for v in column.to_pylist()], pa.string())
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = pa.array([_cell(v) for v in column.to_pylist()], column.type)
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _cell(value: str | None) -> str | None:
    return "'" + value if value is not None and value.startswith(_FORMULA_STARTS) else value
