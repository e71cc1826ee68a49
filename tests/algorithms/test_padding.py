"""The columnar training path: Arrow columns -> padded tensors and checks, without dataclasses."""

import math
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

from spanrl.algorithms.tables import check_transitions, fill_rows, pad_transitions
from spanrl.algorithms.transitions import TRANSITIONS_SCHEMA, Transition, TransitionBatch
from spanrl.errors import ConfigError


def _row(rid: str, prompt: list[int], completion: list[int], mask: list[int], logprobs: list[float],
         advantage: float = 0.5) -> dict:
    return dict(rollout_id=rid, task_id="t", attempt=1, agent=None, step=0, prompt_ids=prompt,
                completion_ids=completion, completion_mask=mask, old_logprobs=logprobs, reward=1.0,
                advantage=advantage, policy_version=0, retokenized=not logprobs, temperature=None)


def _batch(rows: list[dict]) -> TransitionBatch:
    return TransitionBatch(pa.Table.from_pylist(rows, schema=TRANSITIONS_SCHEMA), {}, {})


def test_padding_from_arrow_columns_matches_the_layout() -> None:
    batch = _batch([
        _row("a", [5, 6, 7], [8], [1], [-0.5]),
        _row("b", [9], [10, 11, 12], [1, 0, 1], [], advantage=-1.0),  # logprobs unknown: NaN on its tokens
    ])
    data = batch.to_padded(pad_token_id=0)
    assert "transitions" not in vars(batch)  # no dataclass was built on the way
    assert data.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    T, F = True, False
    assert data.prompt_mask.tolist() == [[T, T, T], [F, F, T]]
    assert data.completion_ids.tolist() == [[8, 0, 0], [10, 11, 12]]
    assert data.completion_mask.tolist() == [[T, F, F], [T, T, T]]
    assert data.loss_mask.tolist() == [[T, F, F], [T, F, T]]
    assert {data.prompt_mask.dtype, data.completion_mask.dtype, data.loss_mask.dtype} == {torch.bool}  # 1 byte a token
    assert data.old_logprobs[0].tolist() == [-0.5, 0.0, 0.0]
    assert all(math.isnan(x) for x in data.old_logprobs[1].tolist())
    assert data.advantages.tolist() == [0.5, -1.0] and data.prompt_ids.dtype == torch.long


def test_no_logprobs_anywhere_gives_none_and_edits_of_the_dataclass_view_count() -> None:
    batch = _batch([_row("a", [5], [8, 9], [1, 1], [])])
    assert pad_transitions(batch, pad_token_id=0).old_logprobs is None
    batch.transitions[0].advantage = 2.0  # the dataclass view, once built, is what trains
    assert pad_transitions(batch, pad_token_id=0).advantages.tolist() == [2.0]
    plain = [Transition(**_row("p", [1, 2], [3], [1], [-1.0]))]  # a plain list (a sampled mini-batch)
    assert pad_transitions(plain, pad_token_id=0).prompt_ids.tolist() == [[1, 2]]


def test_full_rows_are_copied_per_arrow_chunk_including_sliced_ones() -> None:
    rows = [_row(f"r{i}", [10 * i, 10 * i + 1], [100 + i], [i % 2], [-float(i)]) for i in range(5)]
    table = pa.Table.from_pylist(rows, schema=TRANSITIONS_SCHEMA)
    table = pa.concat_tables([table.slice(3), table.slice(0, 1), table.slice(1, 2)])  # offsets into the values
    assert table.column("prompt_ids").num_chunks == 3
    data = TransitionBatch(table, {}, {}).to_padded(pad_token_id=0)
    order = [3, 4, 0, 1, 2]
    assert data.prompt_ids.tolist() == [[10 * i, 10 * i + 1] for i in order]
    assert data.completion_ids.tolist() == [[100 + i] for i in order]
    assert data.loss_mask.tolist() == [[bool(i % 2)] for i in order]
    assert data.old_logprobs.tolist() == [[-float(i)] for i in order]
    assert data.prompt_mask.all() and data.completion_mask.all()


def test_many_row_blocks_padded_and_full_match_a_row_by_row_layout() -> None:
    rng = np.random.default_rng(0)  # 10k rows: several blocks of fill_rows, over Arrow chunks of 3000
    n_p, n_c = rng.integers(1, 9, 10_000), rng.integers(1, 5, 10_000)
    rows = [_row(f"r{i}", list(range(i, i + p)), [i % 7] * c, [1] * c, [-1.0] * c)
            for i, (p, c) in enumerate(zip(n_p, n_c))]
    table = pa.Table.from_batches(pa.Table.from_pylist(rows, schema=TRANSITIONS_SCHEMA).to_batches(max_chunksize=3000))
    data = TransitionBatch(table, {}, {}).to_padded(pad_token_id=-1)
    assert data.prompt_ids.tolist() == [[-1] * (8 - len(r["prompt_ids"])) + r["prompt_ids"] for r in rows]
    assert data.completion_ids.tolist() == [r["completion_ids"] + [-1] * (4 - len(r["completion_ids"])) for r in rows]
    full = table.set_column(table.schema.get_field_index("prompt_ids"), "prompt_ids",
                            pa.array([list(range(i, i + 8)) for i in range(10_000)], pa.list_(pa.int32())))
    padded = TransitionBatch(full, {}, {}).to_padded(pad_token_id=0)
    assert padded.prompt_ids.tolist() == [list(range(i, i + 8)) for i in range(10_000)]


def test_a_failing_block_raises_in_the_caller() -> None:
    column = pa.chunked_array([pa.array([[1, 2, 3]] * 5000, pa.list_(pa.int32()))])
    with pytest.raises(ValueError, match="reshape"):
        fill_rows(np.empty((5000, 2), dtype=np.int64), None, column, 0)  # rows of 3 values into width 2


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_row("x", [1], [2, 3], [1], []), r"transition 1 \(rollout_id='x', step=0\): completion_mask has 1 entries"),
        (_row("x", [1], [2], [1], [-1.0, -2.0]), "transition 1 .*old_logprobs has 2 entries, completion_ids 1"),
        (_row("x", [], [2], [1], []), "transition 1 .*prompt_ids is empty"),
        (_row("x", [1], [2], [1], [], advantage=float("nan")), "transition 1 .*advantage must be finite, got nan"),
        (_row("x", [1, 99], [2], [1], []), r"transition 1 .*token id 99 is outside the vocabulary \(size 50\)"),
        (_row("x", [1], [2, -3], [1, 1], []), "transition 1 .*token id -3 is outside the vocabulary"),
    ],
)
def test_checks_name_the_first_bad_row_and_field(bad: dict, message: str) -> None:
    good = _row("ok", [1, 2], [3], [1], [-0.1])
    batch = _batch([good, bad, _row("later", [], [], [], [])])
    with pytest.raises(ConfigError, match=message):
        check_transitions(batch, vocab_size=50)
    check_transitions(_batch([good]), vocab_size=50)  # a good batch passes


def test_out_of_vocabulary_id_in_a_later_arrow_chunk_is_found() -> None:
    good = pa.Table.from_pylist([_row(f"g{i}", [1, 2], [3], [1], [-0.1]) for i in range(4)], schema=TRANSITIONS_SCHEMA)
    bad = pa.Table.from_pylist([_row("late", [4], [70], [1], [])], schema=TRANSITIONS_SCHEMA)
    table = pa.concat_tables([good.slice(1, 2), bad, good.slice(3)])  # chunks, one of them a slice
    assert table.column("prompt_ids").num_chunks == 3
    with pytest.raises(ConfigError, match=r"transition 2 \(rollout_id='late'.*token id 70 is outside the vocabulary"):
        check_transitions(TransitionBatch(table, {}, {}), vocab_size=50)
    check_transitions(TransitionBatch(pa.concat_tables([good.slice(1, 2), good.slice(3)]), {}, {}), vocab_size=50)


def test_the_table_and_its_checks_load_without_torch() -> None:
    # the collector extra (spanrl export transitions, the viewer's credit) has no torch: only padding imports it
    code = "import sys, spanrl.algorithms.transitions, spanrl.algorithms.tables; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
