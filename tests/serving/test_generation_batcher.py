"""The batcher with the real transformers backend: grouping, failure isolation, reload ordering."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from spanrl.errors import ServingError
from spanrl.serving.backend import GenerationRequest, SamplingParams
from spanrl.serving.batcher import Batcher, QueueFullError
from spanrl.serving.hf_backend import TransformersBackend

GREEDY = SamplingParams(max_tokens=5, temperature=0.0)


@pytest.fixture
def backend(tiny_model_dir) -> TransformersBackend:
    return TransformersBackend(tiny_model_dir)


def test_failed_generation_fails_that_request_only(backend) -> None:
    batcher = Batcher(backend, max_batch_size=8)
    good = [batcher.submit(GenerationRequest([5, 20, 30], GREEDY)) for _ in range(2)]
    bad = batcher.submit(GenerationRequest([5, 10**6], GREEDY))  # an id past the embedding table
    batcher.start()  # all three were queued: they form one batch, which fails, then run one by one
    try:
        with pytest.raises(ServingError, match="generation failed"):
            bad.result(timeout=60)
        results = [f.result(timeout=60) for f in good]
    finally:
        batcher.shutdown()
    assert all(len(r.completions[0].token_ids) == 5 for r in results)
    assert results[0].completions[0].token_ids == results[1].completions[0].token_ids


def test_requests_queued_together_form_one_batch(backend) -> None:
    batcher = Batcher(backend, max_batch_size=6)
    futures = [batcher.submit(GenerationRequest([5, 20 + i], GREEDY, n=2)) for i in range(4)]
    batcher.start()
    try:
        sizes = [f.result(timeout=60).batch_size for f in futures]
    finally:
        batcher.shutdown()
    assert sizes == [6, 6, 6, 2]  # n counts: 3 requests x 2 fill the first batch, the 4th waits


def test_reload_applies_between_batches_in_queue_order(backend, tiny_model_dir_other) -> None:
    batcher = Batcher(backend, max_batch_size=8)
    before = batcher.submit(GenerationRequest([5, 20, 30], GREEDY))
    swap = batcher.reload_async(tiny_model_dir_other)
    after = batcher.submit(GenerationRequest([5, 20, 30], GREEDY))
    batcher.start()
    try:
        assert swap.result(timeout=60) == 1
        first, second = before.result(timeout=60), after.result(timeout=60)
    finally:
        batcher.shutdown()
    assert (first.policy_version, second.policy_version) == (0, 1)
    assert first.completions[0].token_ids != second.completions[0].token_ids


def test_a_call_runs_on_the_batcher_thread_between_batches(backend) -> None:
    """``Batcher.call``: how ``PolicyServer.sleep`` reaches the backend (vLLM's sleep mode) without racing a batch."""
    batcher = Batcher(backend, max_batch_size=8)
    seen: list[str] = []
    before = batcher.submit(GenerationRequest([5, 20, 30], GREEDY))
    before.add_done_callback(lambda _: seen.append("batch"))
    call = batcher.call(lambda: seen.append("call") or threading.current_thread().name)
    batcher.start()
    try:
        assert call.result(timeout=60) == "spanrl-batcher"
        before.result(timeout=60)
        failed = batcher.call(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(timeout=60)
        assert batcher.submit(GenerationRequest([5, 20, 30], GREEDY)).result(timeout=60).completions  # still serving
    finally:
        batcher.shutdown()
    assert seen == ["batch", "call"]


def test_full_queue_refuses_and_shutdown_is_safe_twice(backend) -> None:
    batcher = Batcher(backend, max_queue_size=1)
    batcher.submit(GenerationRequest([5], GREEDY))
    with pytest.raises(QueueFullError, match="1 requests are already waiting"):
        batcher.submit(GenerationRequest([5], GREEDY))
    batcher.shutdown()
    batcher.shutdown()
    with pytest.raises(ServingError, match="cannot submit to a batcher that is stopped"):
        batcher.submit(GenerationRequest([5], GREEDY))


def test_request_arriving_mid_batch_joins_it_and_returns_first(backend) -> None:
    batcher = Batcher(backend, max_batch_size=8)
    batcher.start()
    started, queued, looked = threading.Event(), threading.Event(), threading.Event()
    pending: list[Any] = []

    def on_long_token(*_: object) -> None:  # holds the long request's decoding at two points (hang guards: 60 s)
        started.set()
        queued.wait(60)  # until the short one is queued: it joins mid-batch however late this thread wakes
        if pending and pending[0].done():
            looked.wait(60)  # the short one was answered: until the test has seen the long one still running

    try:
        long = batcher.submit(
            GenerationRequest([5, 20, 30], SamplingParams(max_tokens=150, temperature=1.0, seed=0),
                              on_token=on_long_token)
        )
        assert started.wait(60)
        short_request = GenerationRequest([5, 21], GREEDY)
        pending.append(batcher.submit(short_request))
        queued.set()
        short = pending[0].result(timeout=60)
        assert not long.done()  # delivered while the long one still runs
        looked.set()
        assert short.batch_size == 2
        assert len(long.result(timeout=120).completions[0].token_ids) >= 1
        alone = batcher.submit(GenerationRequest([5, 21], GREEDY)).result(timeout=60)
        assert alone.batch_size == 1
        assert short.completions[0].token_ids == alone.completions[0].token_ids  # merged cache, same result
    finally:
        queued.set()
        looked.set()  # a failed assert must not leave the batcher's thread held
        batcher.shutdown()
