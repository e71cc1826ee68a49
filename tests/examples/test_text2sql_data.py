"""The text-to-SQL example's data and reward: deterministic generation, sound gold queries, an honest
execution-match reward."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from examples.text2sql import make_data
from examples.text2sql.sqltools import (
    DATA_DIR,
    execution_reward,
    extract_sql,
    load_questions,
    run_sql,
)

_DUMP = "SELECT * FROM {t} ORDER BY 1, 2"
_TABLES = ("departments", "employees", "projects", "assignments")


def _dump(db: Path) -> dict[str, list[tuple]]:
    con = sqlite3.connect(db)
    try:
        return {t: con.execute(_DUMP.format(t=t)).fetchall() for t in _TABLES}
    finally:
        con.close()


def test_make_data_reproduces_committed_files(tmp_path):
    make_data.main(tmp_path)
    for name in ("train.jsonl", "val.jsonl", "tiny_train.jsonl", "tiny_val.jsonl", "tiny_vocab.txt"):
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes(), name
    assert _dump(tmp_path / make_data.DB_NAME) == _dump(DATA_DIR / make_data.DB_NAME)


def test_data_is_small_and_split_without_overlap():
    total = sum(p.stat().st_size for p in DATA_DIR.iterdir())
    assert total < 1_000_000
    train, val = load_questions("train"), load_questions("val")
    assert len(train) + len(val) >= 300 and len(val) >= 50
    assert not {q["question"] for q in train} & {q["question"] for q in val}
    assert len({q["template"] for q in val}) >= 5  # val covers many shapes, not one


def test_every_gold_query_runs_and_returns_rows():
    for split in ("train", "val", "tiny_train", "tiny_val"):
        for q in load_questions(split):
            result = run_sql(q["sql"])
            assert result.ok and result.rows, (split, q)
            assert execution_reward(q["sql"], q["sql"]) == 1.0


def test_tiny_subset_uses_only_vocabulary_words():
    vocab = set((DATA_DIR / "tiny_vocab.txt").read_text().split())
    questions = load_questions("tiny_train") + load_questions("tiny_val")
    assert len(questions) == 30
    for q in questions:
        assert set(q["question"].split()) <= vocab and set(q["sql"].split()) <= vocab, q


def test_reward_ignores_row_order_without_order_by():
    gold = "SELECT name FROM departments WHERE city = 'Paris'"
    pred = "SELECT name FROM departments WHERE city = 'Paris' ORDER BY name DESC"
    assert execution_reward(pred, gold) == 1.0


def test_reward_checks_row_order_when_gold_orders():
    gold = "SELECT name FROM employees ORDER BY salary DESC, id LIMIT 3"
    pred = "SELECT name FROM employees ORDER BY salary ASC, id LIMIT 3"
    assert execution_reward(pred, gold) == 0.0
    reversed_rows = ("SELECT name FROM (SELECT name, salary, id FROM employees ORDER BY salary DESC, id LIMIT 3) "
                     "ORDER BY salary, id DESC")
    assert execution_reward(reversed_rows, gold) == 0.0  # same multiset, wrong order


def test_reward_counts_duplicates():
    gold = "SELECT city FROM departments"  # Paris and Berlin twice
    assert execution_reward("SELECT DISTINCT city FROM departments", gold) == 0.0


def test_reward_rounds_floats_so_equivalent_averages_match():
    gold = "SELECT AVG(salary) FROM employees"
    assert execution_reward("SELECT SUM(salary) * 1.0 / COUNT(*) FROM employees", gold) == 1.0


def test_reward_is_zero_on_error_and_partial_credit_only_when_asked():
    gold = "SELECT COUNT(*) FROM projects"
    assert execution_reward("SELECT nope FROM projects", gold) == 0.0
    assert execution_reward("", gold, executable_credit=0.1) == 0.0
    assert execution_reward("SELECT COUNT(*) FROM employees", gold) == 0.0
    assert execution_reward("SELECT COUNT(*) FROM employees", gold, executable_credit=0.1) == 0.1


def test_reward_rejects_bad_credit_and_bad_gold():
    with pytest.raises(ValueError, match="executable_credit must be in"):
        execution_reward("SELECT 1", "SELECT 1", executable_credit=1.5)
    with pytest.raises(ValueError, match="gold_sql does not run"):
        execution_reward("SELECT 1", "SELECT nope FROM nowhere")


def test_run_sql_is_read_only_and_reports_errors():
    result = run_sql("DELETE FROM employees")
    assert not result.ok and "readonly" in result.error.replace(" ", "").lower()
    assert run_sql("SELECT COUNT(*) FROM employees").rows == [(60,)]
    assert "syntax error" in run_sql("SELEC name FROM employees").error
    assert run_sql("SELECT 1; SELECT 2").error  # one statement only


def test_run_sql_interrupts_runaway_queries():
    cross = "SELECT COUNT(*) FROM employees a, employees b, employees c, employees d, employees e"
    result = run_sql(cross)
    assert not result.ok and "too long" in result.error


@pytest.mark.parametrize(
    ("reply", "sql"),
    [
        ("```sql\nSELECT name FROM employees;\n```", "SELECT name FROM employees"),
        ("Here it is: SELECT COUNT(*) FROM projects; thanks", "SELECT COUNT(*) FROM projects"),
        ("SELECT name FROM employees WHERE dept_id = 3", "SELECT name FROM employees WHERE dept_id = 3"),
        ("I do not know.", ""),
        ("with a salary above 10:\n\n```sql\nSELECT name FROM employees WHERE salary > 10",
         "SELECT name FROM employees WHERE salary > 10"),
        ("WITH t AS (SELECT 1) SELECT * FROM t;", "WITH t AS (SELECT 1) SELECT * FROM t"),
        ("Use the employees table with care: SELECT name FROM employees", "SELECT name FROM employees"),
    ],
)
def test_extract_sql(reply, sql):
    assert extract_sql(reply) == sql


def test_load_questions_names_bad_split():
    with pytest.raises(ValueError, match="split must be one of .* got 'test'"):
        load_questions("test")
    assert json.loads((DATA_DIR / "val.jsonl").read_text().splitlines()[0])["id"] == "val-0000"
