"""The text-to-SQL example's tool and reward: run SQL read-only on the shipped SQLite database, and
score a predicted query by execution match against the gold one.

Reward (``execution_reward``):
    1.0   the predicted query's result set equals the gold query's: compared as multisets of rows
          (order-insensitive) unless the gold query has ORDER BY, then as ordered lists; numbers
          compare after rounding to 6 decimals, so ``AVG`` written two ways still matches.
    executable_credit (default 0.0)   the query ran but returned a different result. Set it to a
          small value (0.1) to give a weak model a gradient toward valid SQL; leave 0.0 for
          evaluation (reported accuracy always uses 0.0).
    0.0   the query failed (syntax error, unknown column, timeout, not a SELECT) or was empty.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
DB_PATH = DATA_DIR / "company.sqlite"
MAX_ROWS = 200  # rows fetched from a predicted query; more counts as a mismatch, never an error
MAX_VM_STEPS = 2_000_000  # SQLite VM instructions before a query is aborted (runaway joins)
_PROGRESS_EVERY_STEPS = 10_000
_FLOAT_DIGITS = 6

_FENCE = re.compile(r"```(?:sql|SQL)?\s*(.*?)(?:```|$)", re.DOTALL)  # an unclosed fence (truncated reply) too
_SQL_START = re.compile(r"\bSELECT\b|\bWITH\s+\w+\s+AS\s*\(", re.IGNORECASE)  # not the prose word "with"


@dataclass(frozen=True)
class SqlResult:
    """What running one query gave: rows, or an error message the agent can read."""

    rows: list[tuple] | None
    error: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def preview(self, max_rows: int = 5) -> str:
        """A short text view of the result, as an agent would show it to the model."""
        if self.error is not None:
            return f"ERROR: {self.error}"
        shown = "\n".join(" | ".join(str(v) for v in row) for row in self.rows[:max_rows])
        more = len(self.rows) - max_rows
        return (shown or "(no rows)") + (f"\n... {more} more rows" if more > 0 else "")


def schema_text(db_path: Path = DB_PATH) -> str:
    """The database's CREATE TABLE statements, one line each, for the prompt."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY rowid").fetchall()
    finally:
        con.close()
    return "\n".join(" ".join(sql.split()) + ";" for (sql,) in rows)


def extract_sql(text: str) -> str:
    """The SQL statement in a model's reply: a fenced block if any (closed or cut off), else from the
    first SELECT (or ``WITH name AS (``), cut at the first semicolon. Returns "" when there is none."""
    fenced = _FENCE.search(text or "")
    body = fenced.group(1) if fenced else (text or "")
    start = _SQL_START.search(body)
    if start is None:
        return ""
    return body[start.start():].split(";", 1)[0].strip()


def run_sql(sql: str, db_path: Path = DB_PATH, *, max_rows: int = MAX_ROWS) -> SqlResult:
    """Run one statement read-only with a step budget. Never raises on bad SQL: the error comes back
    in ``SqlResult.error`` (what the agent shows the model on its next try)."""
    if not sql.strip():
        return SqlResult(None, "empty query")
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    steps = [0]

    def _budget() -> int:
        steps[0] += _PROGRESS_EVERY_STEPS
        return 1 if steps[0] > MAX_VM_STEPS else 0

    con.set_progress_handler(_budget, _PROGRESS_EVERY_STEPS)
    try:
        cur = con.execute(sql)
        rows = cur.fetchmany(max_rows + 1)
    except sqlite3.Error as exc:
        message = "query took too long (interrupted)" if "interrupt" in str(exc).lower() else str(exc)
        return SqlResult(None, message)
    except (ValueError, OverflowError) as exc:  # e.g. "You can only execute one statement at a time."
        return SqlResult(None, str(exc))
    finally:
        con.close()
    return SqlResult(rows[:max_rows], None, truncated=len(rows) > max_rows)


def _norm(row: tuple) -> tuple:
    return tuple(round(v, _FLOAT_DIGITS) if isinstance(v, float) else v for v in row)


def results_match(pred: list[tuple], gold: list[tuple], *, ordered: bool) -> bool:
    """Row multisets equal (or row lists, when ``ordered``), after rounding floats."""
    p, g = [_norm(r) for r in pred], [_norm(r) for r in gold]
    return p == g if ordered else Counter(p) == Counter(g)


def execution_reward(pred_sql: str, gold_sql: str, db_path: Path = DB_PATH, *,
                     executable_credit: float = 0.0) -> float:
    """Score ``pred_sql`` against ``gold_sql`` by execution (see the module docstring)."""
    if not 0.0 <= executable_credit < 1.0:
        raise ValueError(f"executable_credit must be in [0, 1), got {executable_credit!r}")
    pred = run_sql(pred_sql, db_path)
    if not pred.ok or pred.truncated:
        return 0.0 if not pred.ok else executable_credit
    gold = run_sql(gold_sql, db_path)
    if not gold.ok:
        raise ValueError(f"gold_sql does not run: {gold.error} (gold_sql={gold_sql!r})")
    ordered = re.search(r"\bORDER\s+BY\b", gold_sql, re.IGNORECASE) is not None
    return 1.0 if results_match(pred.rows, gold.rows, ordered=ordered) else executable_credit


def load_questions(split: str, data_dir: Path = DATA_DIR) -> list[dict]:
    """Questions of one split: ``train``, ``val``, ``tiny_train`` or ``tiny_val``."""
    path = data_dir / f"{split}.jsonl"
    if not path.exists():
        allowed = sorted(p.stem for p in data_dir.glob("*.jsonl"))
        raise ValueError(f"split must be one of {allowed}, got {split!r}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
