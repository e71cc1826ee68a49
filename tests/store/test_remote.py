"""RemoteStore: SQL through a collector's HTTP endpoint keeps Arrow types; errors carry the message."""

from __future__ import annotations

import pyarrow as pa
import pytest

from _otlp import make_request
from spanrl.collector.encoding import encode_request
from spanrl.errors import StoreError
from spanrl import semconv as sc
from spanrl.store import RemoteStore


def test_remote_sql_keeps_types_and_params(collector):
    collector.store.append(
        encode_request(make_request(3, rollout_id="rem", attributes={sc.LLM_PROMPT_TOKEN_IDS: [4, 5]})[0]).table
    )
    remote = RemoteStore(collector.http_endpoint)
    assert remote.health() == {"status": "ok", "db": str(collector.store.path)}
    table = remote.sql(
        "SELECT rollout_id, prompt_token_ids, start_ns FROM spans WHERE rollout_id = ? ORDER BY start_ns", ["rem"]
    )
    assert table.schema.field("prompt_token_ids").type == pa.list_(pa.int32())
    assert table.schema.field("start_ns").type == pa.int64()
    assert table.column("prompt_token_ids").to_pylist() == [[4, 5]] * 3


def test_remote_errors_name_the_problem(collector):
    """A wrong query is a plain StoreError; a store that cannot be reached is a StoreUnavailableError (retrying
    may help), told apart by its class, not by its message."""
    from spanrl.errors import StoreUnavailableError

    remote = RemoteStore(collector.http_endpoint)
    with pytest.raises(StoreError, match="answered 400: only read statements") as wrong:
        remote.sql("DROP TABLE spans")
    assert not isinstance(wrong.value, StoreUnavailableError)
    with pytest.raises(StoreError, match="answered 400: SQL failed: .*no_such_table"):
        remote.sql("SELECT * FROM no_such_table")
    assert RemoteStore("http://127.0.0.1:9").health() is None
    with pytest.raises(StoreUnavailableError, match="no collector answered at http://127.0.0.1:9"):
        RemoteStore("http://127.0.0.1:9").sql("SELECT 1")
