"""Print an Arrow result as a text table, CSV, JSON or Parquet (``spanrl sql --format``)."""

from __future__ import annotations

import csv
import io
from typing import Any, BinaryIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from spanrl.errors import one_of

__all__ = ["FORMATS", "write_result"]

FORMATS = ("table", "csv", "json", "parquet")
_MAX_CELL_CHARS = 60


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (list, dict)):
        return orjson.dumps(value, default=str).decode()
    return str(value)


def _text_table(table: pa.Table) -> str:
    names = table.column_names
    rows = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
    rows = [[c if len(c) <= _MAX_CELL_CHARS else c[: _MAX_CELL_CHARS - 1] + "…" for c in r] for r in rows]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(names), "-+-".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    out.append(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})")
    return "\n".join(out) + "\n"


def write_result(table: pa.Table, fmt: str, out: BinaryIO) -> None:
    """Write ``table`` to the binary stream ``out`` in ``fmt`` (one of `FORMATS`)."""
    one_of("format", fmt, FORMATS)
    if fmt == "table":
        out.write(_text_table(table).encode())
    elif fmt == "csv":
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(table.column_names)
        for row in table.to_pylist():
            writer.writerow([
                "" if v is None else (orjson.dumps(v, default=str).decode() if isinstance(v, (list, dict)) else v)
                for v in row.values()
            ])

        out.write(text.getvalue().encode())
    elif fmt == "json":
        out.write(orjson.dumps(table.to_pylist(), default=str) + b"\n")
    else:
        pq.write_table(table, out)
