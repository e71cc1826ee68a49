"""The transformers backend's prefix cache (serving/prefix_cache.py): the same completions as without it, fewer
prompt tokens prefilled, counted on ``/metrics`` as vLLM counts its prefix-cache hits."""

from __future__ import annotations

import random

import httpx
import pytest
import torch

from spanrl.serving import PolicyServer, ServerConfig
from spanrl.serving.backend import GenerationRequest, SamplingParams
from spanrl.serving.hf_backend import TransformersBackend
from spanrl.serving.prefix_cache import BLOCK_TOKENS

SHARED = [random.Random(1).randrange(4, 100) for _ in range(40)]  # 2 full blocks and 8 tokens


def _greedy(prompt: list[int], n: int = 1, max_tokens: int = 6) -> GenerationRequest:
    return GenerationRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), n=n)


def _counts(backend: TransformersBackend) -> tuple[int, int, int]:
    cache = backend.prefix_cache
    return cache.queries, cache.hits, cache.prefill_tokens


def test_a_repeated_prompt_prefills_only_past_its_cached_blocks(tiny_model_dir) -> None:
    backend = TransformersBackend(tiny_model_dir, enable_prefix_caching=True)
    first = backend.generate([_greedy(SHARED)])[0][0]
    assert _counts(backend) == (40, 0, 40)
    again = backend.generate([_greedy(SHARED)])[0][0]
    assert _counts(backend) == (80, 32, 48)  # 2 blocks of 16 found; the last 8 tokens computed
    assert again.token_ids == first.token_ids
    exact = SHARED[:32]  # a whole number of blocks: its last block is computed all the same (its logits start it)
    backend.generate([_greedy(exact)])
    assert _counts(backend) == (112, 48, 64)


def test_rows_that_share_a_prompt_compute_it_once(tiny_model_dir) -> None:
    backend = TransformersBackend(tiny_model_dir, enable_prefix_caching=True)
    backend.generate([_greedy(SHARED, n=3)])
    # the prompt alone first (40 tokens, its 2 blocks stored), then the 3 rows from the cached 32: 40 + 3 * 8
    assert _counts(backend) == (120, 96, 64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_completions_equal_those_without_the_cache(tiny_model_dir, seed) -> None:
    on = TransformersBackend(tiny_model_dir, enable_prefix_caching=True)
    off = TransformersBackend(tiny_model_dir, enable_prefix_caching=False)
    assert off.prefix_cache is None
    rng = random.Random(seed)
    for _ in range(3):  # later batches hit what earlier ones stored
        batch = [GenerationRequest(
            SHARED[:rng.randrange(1, 41)] + [rng.randrange(4, 100) for _ in range(rng.randrange(1, 30))],
            SamplingParams(max_tokens=8, temperature=rng.choice([0.0, 1.0]), seed=rng.randrange(99)),
            n=rng.choice([1, 2, 3])) for _ in range(rng.randrange(1, 5))]
        for mine, theirs in zip(on.generate(batch), off.generate(batch), strict=True):
            assert [c.token_ids for c in mine] == [c.token_ids for c in theirs]
            for a, b in zip(mine, theirs):
                assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert on.prefix_cache.hits > 0


def test_a_request_that_joins_a_running_batch_with_a_hit_decodes_as_if_alone(tiny_model_dir) -> None:
    backend = TransformersBackend(tiny_model_dir, enable_prefix_caching=True)
    first, late = _greedy([5, 20, 30], max_tokens=8), _greedy(SHARED + [7, 8], max_tokens=4)
    backend.generate([_greedy(SHARED)])  # stores SHARED's blocks
    alone = TransformersBackend(tiny_model_dir, enable_prefix_caching=False)
    expected = {id(r): alone.generate([r])[0][0] for r in (first, late)}
    done: dict[int, object] = {}
    joined = [late]
    hits = backend.prefix_cache.hits
    backend.run([first], on_done=lambda r, c, _n: done.__setitem__(id(r), c[0]),
                admit=lambda _rows: [joined.pop()] if joined else [])
    assert backend.prefix_cache.hits == hits + 32
    for request in (first, late):
        assert done[id(request)].token_ids == expected[id(request)].token_ids


def test_the_byte_budget_evicts_least_recently_used_blocks(tiny_model_dir) -> None:
    backend = TransformersBackend(tiny_model_dir, enable_prefix_caching=True)
    block = backend.prefix_cache.bytes
    backend.generate([_greedy(SHARED[:17])])  # one block stored
    block = backend.prefix_cache.bytes - block
    backend.prefix_cache.max_bytes = 2 * block
    other = [9] * 40
    backend.generate([_greedy(SHARED)])  # SHARED's 2 blocks: the budget is full
    backend.generate([_greedy(other)])  # 2 more: SHARED's go (leaves first, then their parent)
    assert backend.prefix_cache.bytes == 2 * block
    hits = backend.prefix_cache.hits
    backend.generate([_greedy(SHARED)])
    assert backend.prefix_cache.hits == hits  # evicted: computed again
    backend.generate([_greedy(other[:20])])  # ... and other's blocks went for it in turn
    assert backend.prefix_cache.hits == hits


def test_new_weights_empty_the_cache(tiny_model_dir, tiny_model_dir_other) -> None:
    backend = TransformersBackend(tiny_model_dir, enable_prefix_caching=True)
    backend.generate([_greedy(SHARED)])
    backend.load_weights(tiny_model_dir_other)
    assert backend.prefix_cache.bytes == 0
    fresh = TransformersBackend(tiny_model_dir_other, enable_prefix_caching=False)
    hits = backend.prefix_cache.hits
    assert backend.generate([_greedy(SHARED)])[0][0].token_ids == fresh.generate([_greedy(SHARED)])[0][0].token_ids
    assert backend.prefix_cache.hits == hits


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}


def test_servers_with_and_without_the_cache_answer_alike_and_metrics_count_the_hits(tiny_model_dir) -> None:
    servers = [PolicyServer(ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None,
                                         enable_prefix_caching=caching)).start() for caching in (True, False)]
    try:
        answers = []
        for server in servers:
            with httpx.Client(base_url=f"{server.base_url}/v1", timeout=60) as client:
                answers.append([client.post("/completions", json={
                    "model": server.config.model_name, "prompt": SHARED + tail, "max_tokens": 6, "temperature": 0,
                    "n": 2}).json()["choices"] for tail in ([5], [6, 7], [8, 9, 10])])
        assert [[c["token_ids"] for c in a] for a in answers[0]] == [[c["token_ids"] for c in a] for a in answers[1]]
        cached = _metrics(servers[0].base_url)
        assert cached["spanrl:prefix_cache_queries_total"] == 2 * (41 + 42 + 43)
        assert cached["spanrl:prefix_cache_hits_total"] == 2 * 3 * 2 * BLOCK_TOKENS  # 2 blocks per row
        # the first prompt alone once (41), then every row from its cached 32 tokens: 41 + 2 * (9 + 10 + 11)
        assert cached["spanrl:prefill_tokens_total"] == 101
        generated = sum(len(c["token_ids"]) for a in answers[0] for c in a)  # every choice's tokens, vLLM's count
        assert cached["spanrl:generation_tokens_total"] == generated
        assert _metrics(servers[1].base_url) == {"spanrl:generation_tokens_total": generated}  # no cache counters
    finally:
        for server in servers:
            server.shutdown()


def test_a_deterministic_runs_server_has_no_prefix_cache(tiny_model_dir) -> None:
    from spanrl.trainer.services import start_policy_server

    server = start_policy_server(tiny_model_dir, otlp_endpoint=None, max_batch_size=1, prefix_caching=False)
    try:
        assert server.config.enable_prefix_caching is False
        assert _metrics(server.base_url) == {"spanrl:generation_tokens_total": 0}  # no prefix cache counters
    finally:
        server.shutdown()
