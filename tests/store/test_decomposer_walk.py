"""The decomposer's agent walk at every depth around its unrolled levels, and its query errors."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
from test_decomposer import Recorder, Rollout, _ns, deliver, rows

from spanrl.errors import StoreError
from spanrl.store.decomposer import Selection, decompose


def test_the_agent_is_found_at_every_depth_across_the_unrolled_walk(collector: Any) -> None:
    # call k has k framework spans between it and its agent: the agent is its ancestor at depth k + 1,
    # across the plain joins (depths 1..6) and the recursive walk beyond them
    rec = Recorder()
    r = Rollout(rec, "depths")
    root = r.root(0, 400)
    for k in range(9):
        parent = r.invoke_agent(f"a{k}", root, 10 + 40 * k, 45 + 40 * k)
        for depth in range(k):
            parent = rec.span(r.agent, f"step {k}.{depth}", start_ns=_ns(11 + 40 * k + depth),
                              end_ns=_ns(44 + 40 * k), parent=parent)
        r.call(parent, 25 + 40 * k, [k + 1], [k + 2])
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.calls, "step", "agent") == [(k, f"a{k}") for k in range(9)]
    assert rows(dec.rollouts, "orphan_calls") == [(0,)]
    # the selection by keyword, as the signature allows: the agent six spans up (the last plain join)
    assert rows(decompose(collector.store, selection=Selection(agents=["a5"])).calls, "prompt_ids") == [([6],)]


def test_a_failing_query_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="decomposer query failed"):
        decompose(duckdb.connect())  # no span tables
