"""Seeded rollouts on the policy server (``/rollouts/<id>/seeds/<seed>/v1``, ``spanrl.seeding``): each call that
names no ``seed`` samples from one derived from the rollout's seed and its prompt, whatever else is in the batch;
a call's own ``seed`` wins; the spans record both."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai

from spanrl import semconv

CHAT = [{"role": "user", "content": "what is 3 add 4 ?"}]


def _tokens(served, rollout: str, path_seed: int | None, max_tokens: int = 12, **kwargs) -> list[int]:
    base = semconv.rollout_base_url(served.server.base_url, rollout, seed=path_seed)
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=max_tokens, temperature=1.0,
                                           **kwargs)
    return reply.model_dump()["choices"][0]["token_ids"]


def test_a_seeded_rollout_samples_the_same_calls_alone_or_in_a_crowd(served) -> None:
    first, second = _tokens(served, "r1", 11), _tokens(served, "r1", 11)
    assert first != second  # the same prompt asked again in one rollout: the next sample, not the same one
    assert _tokens(served, "r2", 11) == first  # the seed, not the rollout's id, decides
    assert _tokens(served, "r3", 12) != first
    # the same rollout again while 6 long unseeded requests share its batches (continuous batching admits new
    # requests between decode steps; the noise runs 200 steps, the seeded calls 12)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        noise = [pool.submit(_tokens, served, f"noise{i}", None, 200, stop=None) for i in range(6)]
        again = [pool.submit(_tokens, served, "r4", 11) for _ in range(2)]
        [f.result() for f in noise]
        assert sorted(f.result() for f in again) == sorted([first, second])  # its two calls, in either order
    batched = [s for s in served.spans() if s.attributes.get(semconv.ROLLOUT_ID) == "r4"]
    assert max(s.attributes[semconv.LLM_BATCH_SIZE] for s in batched) > 1  # it did share a batch
    assert all(s.attributes[semconv.ROLLOUT_SEED] == 11 for s in batched)
    assert len({s.attributes[semconv.GEN_AI_REQUEST_SEED] for s in batched}) == 2


def test_a_calls_own_seed_wins_and_a_bad_path_seed_is_refused(served) -> None:
    assert _tokens(served, "r5", 11, seed=5) == _tokens(served, "r6", None, seed=5)
    spans = served.spans()
    assert spans[-1].attributes[semconv.GEN_AI_REQUEST_SEED] == 5
    assert semconv.ROLLOUT_SEED not in spans[-1].attributes and spans[-2].attributes[semconv.ROLLOUT_SEED] == 11
    bad = httpx.post(f"{served.server.base_url}/rollouts/r7/seeds/seven/v1/chat/completions",
                     json={"model": "tiny", "messages": CHAT, "max_tokens": 2})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "seed" and "'seven'" in bad.json()["error"]["message"]
