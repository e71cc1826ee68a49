"""Protobuf -> Arrow walk: token arrays in both encodings, and the bad ones rejected alone."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from _otlp import b64_int32, make_request
from spanrl.collector.encoding import SPANS_ARROW_SCHEMA, encode_request
from spanrl import semconv as sc


def _one(attributes: dict) -> tuple[dict | None, str]:
    batch = encode_request(make_request(1, attributes=attributes)[0])
    row = batch.table.to_pylist()[0] if batch.table is not None else None
    return row, batch.error_message


def test_plain_arrays_with_zeros_and_integer_logprobs():
    row, err = _one({sc.LLM_PROMPT_TOKEN_IDS: [0, 5, 0, -3, 2**31 - 1], sc.LLM_LOGPROBS: [0, -0.5, 0.0, -2]})
    assert err == ""
    assert row["prompt_token_ids"] == [0, 5, 0, -3, 2**31 - 1]
    assert row["logprobs"] == [0.0, -0.5, 0.0, -2.0]
    assert row["completion_token_ids"] is None


def test_compact_and_raw_bytes_encodings_decode_the_same():
    ids = [17, 0, 31999, 2**31 - 1]
    raw = np.asarray(ids, "<i4").tobytes()
    row_b64, _ = _one({sc.LLM_COMPLETION_TOKEN_IDS: b64_int32(ids)})
    row_raw, _ = _one({sc.LLM_COMPLETION_TOKEN_IDS: raw})
    row_arr, _ = _one({sc.LLM_COMPLETION_TOKEN_IDS: ids})
    assert row_b64["completion_token_ids"] == row_raw["completion_token_ids"] == row_arr["completion_token_ids"] == ids
    assert sc.LLM_COMPLETION_TOKEN_IDS not in json.loads(row_b64["attributes"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, "x"], "spanrl.llm.prompt_token_ids[1] is string_value, expected an array of integers"),
        ([1, 0.5], "spanrl.llm.prompt_token_ids[1] is double_value, expected an array of integers"),
        ([1, 2**40], "spanrl.llm.prompt_token_ids has a value outside the int32 range"),
        ("!!!", "spanrl.llm.prompt_token_ids is a string but not valid base64"),
        (base64.b64encode(b"\x01\x02\x03").decode(), "holds 3 bytes, not a multiple of 4"),
        (True, "spanrl.llm.prompt_token_ids is bool_value; expected an array or a base64 string"),
    ],
)
def test_bad_token_ids_reject_the_span_with_a_message(value, message):
    row, err = _one({sc.LLM_PROMPT_TOKEN_IDS: value})
    assert row is None and message in err and err.startswith("1 span(s) rejected: span 0 ('span')")


def test_error_message_lists_five_then_counts_the_rest():
    req, _ = make_request(8, attributes={sc.LLM_PROMPT_TOKEN_IDS: [1, "x"]})
    batch = encode_request(req)
    assert (batch.accepted, batch.rejected, batch.table) == (0, 8, None)
    assert batch.error_message.count("expected an array of integers") == 5 and batch.error_message.endswith("(and 3 more)")


def test_batch_columns_are_store_columns():
    from spanrl.store import SpanStore

    with SpanStore.open(":memory:") as store:
        columns = [r["column_name"] for r in store.sql("SELECT column_name FROM duckdb_columns() WHERE table_name = 'spans'").to_pylist()]
    # Columns added to schema.sql later are filled with NULL (the insert is BY NAME).
    assert set(SPANS_ARROW_SCHEMA.names) <= set(columns) and "ingested_ns" not in SPANS_ARROW_SCHEMA.names
