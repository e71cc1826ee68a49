"""The decomposer's last step: its one result split by ``row_kind`` and sorted on light keys, and the report's
sums. Arrow tables built by hand, every expected row order written out."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spanrl.store.decomposer import _column_sum, _count_equal, _row_kind_part, decompose


def _rows(kinds: list[str], keys: list[Any]) -> pa.Table:
    return pa.table({"row_kind": kinds, "k": pa.array(keys, pa.int64()), "v": [f"{k}{i}" for i, k in enumerate(kinds)]})


def _part(rows: pa.Table, kind: str) -> list[tuple[Any, str]]:
    part = _row_kind_part(rows, kind, ("k", "v"), ("k",))
    assert part.column_names == ["k", "v"]
    return list(zip(part.column("k").to_pylist(), part.column("v").to_pylist()))


def _chunks(rows: pa.Table, kind: str) -> list[int]:
    """Per chunk of the part's key column, where its values start in memory (a slice shares the input's)."""
    part = _row_kind_part(rows, kind, ("k", "v"), ("k",))
    return [c.buffers()[1].address + c.offset * 8 for c in part.column("k").chunks]


def _at(rows: pa.Table, row: int) -> int:
    return rows.column("k").chunk(0).buffers()[1].address + row * 8


def test_contiguous_sorted_rows_come_back_as_they_are() -> None:
    rows = _rows(["reward", "call", "call", "call", "rollout"], [9, 1, 2, 3, 0])
    assert _part(rows, "call") == [(1, "call1"), (2, "call2"), (3, "call3")]
    assert _part(rows, "reward") == [(9, "reward0")] and _part(rows, "rollout") == [(0, "rollout4")]
    assert _chunks(rows, "call") == [_at(rows, 1)]  # one zero-copy slice of the decomposer's rows


def test_rows_in_a_few_ordered_runs_are_zero_copy_slices_a_run_each() -> None:
    rows = _rows(["call"] * 4, [3, 4, 1, 2])  # DuckDB's threads emit ordered runs: a rotation
    assert [k for k, _ in _part(rows, "call")] == [1, 2, 3, 4]
    assert _chunks(rows, "call") == [_at(rows, 2), _at(rows, 0)]
    one = _rows(["reward", "call"], [0, 7])
    assert _chunks(one, "call") == [_at(one, 1)]


def test_no_row_of_a_kind_is_an_empty_table_with_the_columns() -> None:
    part = _row_kind_part(_rows(["call"], [1]), "reward", ("k", "v"), ("k",))
    assert part.num_rows == 0 and part.column_names == ["k", "v"]


def test_interleaved_kinds_and_out_of_order_runs_are_sorted() -> None:
    # calls at rows 0, 2, 3, 5 (not contiguous), in two ordered runs: keys 5, 6 then 1, 2 (a rotation)
    rows = _rows(["call", "reward", "call", "call", "reward", "call"], [5, 0, 6, 1, 0, 2])
    assert _part(rows, "call") == [(1, "call3"), (2, "call5"), (5, "call0"), (6, "call2")]
    # one run that starts later in the part: keys 3, 1, 2 -> 1, 2 first
    assert _part(_rows(["call"] * 3, [3, 1, 2]), "call") == [(1, "call1"), (2, "call2"), (3, "call0")]


def test_many_runs_are_taken_in_order_and_nulls_sort_last() -> None:
    keys = [k for pair in zip(range(300, 0, -1), range(301, 601)) for k in pair]  # 600 rows, ~300 runs
    many = _rows(["call"] * len(keys), keys)
    got = _part(many, "call")
    assert [k for k, _ in got] == sorted(keys)
    assert len(_chunks(many, "call")) == 1  # past _MAX_SORTED_RUNS: one `take`, not 600 slices
    with_null = _part(_rows(["call"] * 3, [None, 2, 1]), "call")
    assert [k for k, _ in with_null] == [1, 2, None]


def test_sums_and_counts_of_empty_and_null_columns() -> None:
    empty = pa.table({"n": pa.array([], pa.int64()), "s": pa.array([], pa.string())})
    assert _column_sum(empty, "n") == 0 and _count_equal(empty, "s", "error") == 0
    nulls = pa.table({"n": pa.array([None, None], pa.int64()), "s": pa.array([None, "x"], pa.string())})
    assert _column_sum(nulls, "n") == 0 and _count_equal(nulls, "s", "error") == 0
    some = pa.table({"n": [2, 3], "s": ["error", "ok"]})
    assert _column_sum(some, "n") == 5 and _count_equal(some, "s", "error") == 1


def test_an_empty_store_decomposes_to_empty_tables_and_a_zero_report(collector: Any) -> None:
    d = decompose(collector.store)
    assert (d.calls.num_rows, d.rewards.num_rows, d.rollouts.num_rows) == (0, 0, 0)
    assert d.report == {"rollouts": 0, "calls": 0, "rewards": 0, "duplicate_spans": 0, "orphan_calls": 0,
                        "duplicate_calls": 0, "late_arrivals": 0, "failed_rollouts": 0, "open_rollouts": 0,
                        "message_refs_read": 0, "message_refs_unread": 0}
