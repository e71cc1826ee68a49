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
    assert (batch.error_message.count("expected an array of integers") == 5
            and batch.error_message.endswith("(and 3 more)"))


def test_batch_columns_are_store_columns():
    from spanrl.store import SpanStore

    with SpanStore.open(":memory:") as store:
        columns = [r["column_name"] for r in store.sql(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'spans'"
        ).to_pylist()]
    # Columns added to schema.sql later are filled with NULL (the insert is BY NAME).
    assert set(SPANS_ARROW_SCHEMA.names) <= set(columns) and "ingested_ns" not in SPANS_ARROW_SCHEMA.names


def test_plain_arrays_across_a_request_keep_each_span_its_own_values():
    """The request's plain arrays are decoded together; each span still gets exactly its own ids."""
    from _otlp import kv

    req, ids = make_request(6)
    spans = req.resource_spans[0].scope_spans[0].spans
    expected = {}
    for i, span in enumerate(spans):
        if i == 3:
            continue  # a span without token arrays between ones with them
        prompt = [i, 0, 127, 128, 16383, 16384, 2**31 - 1, -(2**31), -1][: 3 + i]
        logprobs = [-0.25 * i, 0.0, 1e-30][: 1 + i % 3]
        span.attributes.extend([kv(sc.LLM_PROMPT_TOKEN_IDS, prompt), kv(sc.LLM_LOGPROBS, logprobs),
                                kv(sc.LLM_COMPLETION_TOKEN_IDS, [] if i == 1 else [7] * i)])
        expected[ids[i]] = (prompt, logprobs, [] if i == 1 else [7] * i)
    batch = encode_request(req)
    assert (batch.accepted, batch.rejected) == (6, 0)
    for row in batch.table.to_pylist():
        got = (row["prompt_token_ids"], row["logprobs"], row["completion_token_ids"])
        want = expected.get(row["span_id"], (None, None, None))
        assert got[0] == want[0] and got[2] == want[2]
        assert got[1] == (None if want[1] is None else pytest.approx(want[1]))


def test_one_bad_plain_array_rejects_only_its_span_and_errors_stay_in_span_order():
    from _otlp import kv

    req, ids = make_request(4)
    spans = req.resource_spans[0].scope_spans[0].spans
    for i, span in enumerate(spans):
        span.attributes.append(kv(sc.LLM_PROMPT_TOKEN_IDS, [1, 2, 3]))
    spans[2].attributes.append(kv(sc.LLM_COMPLETION_TOKEN_IDS, [5, 2**40]))  # found late, after the walk
    spans[3].trace_id = b"\x01" * 3  # found during the walk
    batch = encode_request(req)
    assert (batch.accepted, batch.rejected) == (2, 2)
    assert [r["span_id"] for r in batch.table.to_pylist()] == ids[:2]
    assert [r["prompt_token_ids"] for r in batch.table.to_pylist()] == [[1, 2, 3], [1, 2, 3]]
    assert batch.error_message.index("span 2 ") < batch.error_message.index("span 3 ")
    assert "spanrl.llm.completion_token_ids has a value outside the int32 range" in batch.error_message


def test_wire_decoders_match_protobuf_and_refuse_other_shapes():
    from opentelemetry.proto.common.v1 import common_pb2

    from _otlp import any_value
    from spanrl.collector.tokens import wire_doubles, wire_ints

    rng = np.random.default_rng(0)
    ints = [0, 1, 127, 128, 2**31 - 1, -1, -(2**31), 2**63 - 1, -(2**63)] + rng.integers(0, 200_000, 500).tolist()
    assert wire_ints(any_value(ints).array_value.SerializeToString()).tolist() == ints
    floats = [0.0, -0.5, 1e-300] + rng.normal(size=100).tolist()
    assert wire_doubles(any_value(floats).array_value.SerializeToString()).tolist() == floats
    assert wire_ints(b"").tolist() == [] and wire_doubles(b"").tolist() == []
    for mixed in ([1, "x"], [1, 0.5], [1, True], [1, [2]]):
        assert wire_ints(any_value(mixed).array_value.SerializeToString()) is None
    empty_element = common_pb2.ArrayValue(values=[common_pb2.AnyValue(int_value=3), common_pb2.AnyValue()])
    assert wire_ints(empty_element.SerializeToString()) is None
    # an int among floats: the walk reads it
    assert wire_doubles(any_value([0.5, 1]).array_value.SerializeToString()) is None


def test_many_large_plain_arrays_across_decode_chunks_with_one_bad():
    """More than one chunk of wire bytes (16 KiB) per column; a bad array in a later chunk rejects only its span."""
    from _otlp import kv

    req, ids = make_request(40)
    rng = np.random.default_rng(1)
    want = {}
    for i, span in enumerate(req.resource_spans[0].scope_spans[0].spans):
        prompt = rng.integers(0, 200_000, 300).tolist()
        if i == 30:
            prompt[17] = "x"
        span.attributes.append(kv(sc.LLM_PROMPT_TOKEN_IDS, prompt))
        want[ids[i]] = prompt
    batch = encode_request(req)
    assert (batch.accepted, batch.rejected) == (39, 1)
    assert "span 30 ('span'): spanrl.llm.prompt_token_ids[17] is string_value" in batch.error_message
    for row in batch.table.to_pylist():
        assert row["prompt_token_ids"] == want[row["span_id"]]
