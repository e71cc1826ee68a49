"""The policy server end to end: openai client -> HTTP -> batcher -> tiny model -> spans."""

from __future__ import annotations

import concurrent.futures
import pathlib
import threading
import time

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spanrl.errors import ServingError
from spanrl import semconv
from spanrl.serving import PolicyServer, ServerConfig, decode_float32, decode_int32

CHAT = [{"role": "user", "content": "what is 3 add 4 ?"}]
ADMIN_TOKEN = "reload-s3cret"  # the `served` fixture's admin token (conftest.py)


def _client(served, rollout: str | None = None) -> openai.OpenAI:
    base = served.server.rollout_base_url(rollout) if rollout else f"{served.server.base_url}/v1"
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0)


def _rescore(model_dir: pathlib.Path, prompt_ids: list[int], completion_ids: list[int],
             temperature: float = 1.0) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature  # (T, V)
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chat_ids_decode_to_text_and_logprobs_rescore(served, tiny_model_dir, temperature) -> None:
    resp = _client(served).chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=12, temperature=temperature, top_p=1.0, seed=5, logprobs=True
    )
    data = resp.model_dump()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    choice = data["choices"][0]
    expected_prompt = tok(tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)["input_ids"]
    assert data["prompt_token_ids"] == expected_prompt
    assert tok.decode(choice["token_ids"], skip_special_tokens=True) == choice["message"]["content"]
    assert len(choice["token_ids"]) == data["usage"]["completion_tokens"] <= 12
    served_lps = torch.tensor(choice["token_logprobs"])
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == pytest.approx(choice["token_logprobs"])
    rescored = _rescore(tiny_model_dir, data["prompt_token_ids"], choice["token_ids"], temperature)
    assert torch.allclose(served_lps, rescored, atol=1e-4), (served_lps - rescored).abs().max()


def test_completions_models_and_n_choices(served, tiny_model_dir) -> None:
    client = _client(served)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    resp = client.completions.create(model="tiny", prompt="3 add 4", max_tokens=6, n=3, temperature=1.0,
                                     seed=1).model_dump()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert resp["prompt_token_ids"] == tok("3 add 4")["input_ids"]
    assert [c["index"] for c in resp["choices"]] == [0, 1, 2]
    for c in resp["choices"]:
        assert tok.decode(c["token_ids"], skip_special_tokens=True) == c["text"]
    spans = served.spans()
    assert sorted(s.attributes[semconv.LLM_CHOICE_INDEX] for s in spans) == [0, 1, 2]
    assert {s.attributes[semconv.GEN_AI_OPERATION_NAME] for s in spans} == {semconv.OP_TEXT_COMPLETION}
    assert {s.attributes[semconv.GEN_AI_RESPONSE_ID] for s in spans} == {resp["id"]}


@pytest.mark.parametrize("compact", [True, False], ids=["base64", "arrays"])
def test_server_span_reaches_collector_with_ids_and_rollout(collector, tiny_model_dir, compact) -> None:
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    config = ServerConfig(
        model=tiny_model_dir, port=0, otlp_endpoint=collector.grpc_endpoint, served_model_name="tiny",
        compact_token_arrays=compact
    )
    server = PolicyServer(config)
    with server:
        client = openai.OpenAI(base_url=server.rollout_base_url("rollout-42", attempt=2), api_key="unused",
                               max_retries=0)
        resp = client.chat.completions.create(
            model="tiny", messages=CHAT, max_tokens=8, extra_headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}
        ).model_dump()
        assert server.force_flush()
    query = (
        "SELECT trace_id, parent_span_id, kind, rollout_id, attempt, operation_name, policy_version, "
        f"prompt_token_ids, completion_token_ids, logprobs FROM spans WHERE response_id = '{resp['id']}'"
    )
    rows: list = []
    deadline = time.monotonic() + 20
    while not rows and time.monotonic() < deadline:
        rows = collector.store.sql(query).to_pylist()
        time.sleep(0.1)
    assert len(rows) == 1, rows
    row = rows[0]
    choice = resp["choices"][0]
    assert (row["trace_id"], row["parent_span_id"], row["kind"]) == (trace_id, parent_id, "SERVER")
    assert ((row["rollout_id"], row["attempt"], row["operation_name"], row["policy_version"])
            == ("rollout-42", 2, "chat", 0))
    assert row["prompt_token_ids"] == resp["prompt_token_ids"]
    assert row["completion_token_ids"] == choice["token_ids"]
    assert row["logprobs"] == pytest.approx(choice["token_logprobs"], abs=1e-6)


def test_concurrent_requests_are_batched_and_match_sequential_greedy(served) -> None:
    client = _client(served)
    prompts = [[{"role": "user", "content": f"what is {i} add {2 * i} ?" + " the" * (i % 3)}] for i in range(8)]

    def ask(i: int) -> list[int]:
        resp = client.chat.completions.create(model="tiny", messages=prompts[i], max_tokens=4 + i, temperature=0)
        return resp.model_dump()["choices"][0]["token_ids"]

    sequential = [ask(i) for i in range(8)]
    assert max(s.attributes[semconv.LLM_BATCH_SIZE] for s in served.spans()) == 1
    served.exporter.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, range(8)))
    assert together == sequential
    assert [len(ids) for ids in together] == [4 + i for i in range(8)]
    assert max(s.attributes[semconv.LLM_BATCH_SIZE] for s in served.spans()) > 1


def test_reload_changes_outputs_and_version(served, tiny_model_dir_other) -> None:
    client = _client(served)

    def greedy() -> list[int]:
        return client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8,
                                              temperature=0).model_dump()["choices"][0]["token_ids"]

    before = greedy()
    reply = httpx.post(f"{served.server.base_url}/v1/weights/reload", json={"path": str(tiny_model_dir_other)},
                       headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    assert reply.status_code == 200 and reply.json()["policy_version"] == 1
    assert served.server.version == 1
    after = greedy()
    assert after != before
    versions = [s.attributes[semconv.POLICY_VERSION] for s in served.spans()]
    assert versions == [0, 1]
    # in-process, from a module: copied, so later changes to that module do not leak in
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir_other)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    assert served.server.reload(other) == 2
    halved = greedy()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    assert greedy() == halved != after


def test_reload_does_not_drop_requests_in_flight(served, tiny_model_dir_other) -> None:
    """A reload asked for while a streamed reply is mid-generation: the reply still comes whole (tokens
    keep arriving after the reload was asked for, so it was in flight), as do the requests around it;
    a request after the reload is served by version 1. (Before, reload() raced 16 requests that could
    all be done, or not started, when it ran: `{versions} <= {0, 1}` held with nothing in flight.)"""
    client = _client(served)

    def ask(i: int) -> dict:
        return client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=16, temperature=1.0,
                                              seed=i).model_dump()

    reload_asked = threading.Event()
    after_reload: list[int] = []
    version: list[int] = []
    reloader = threading.Thread(target=lambda: (reload_asked.set(),
                                                version.append(served.server.reload(tiny_model_dir_other))))
    ids, finish = [], None
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, i) for i in range(8)]
        for chunk in client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=64, temperature=0,
                                                    stream=True):
            choice = chunk.model_dump()["choices"][0]
            ids += choice["token_ids"]
            finish = choice["finish_reason"] or finish
            if reload_asked.is_set():
                after_reload += choice["token_ids"]
            elif ids:
                reloader.start()  # the stream has begun: ask for the reload now
                reload_asked.wait()
        reloader.join(60)
        results = [f.result() for f in futures]
    assert version == [1]
    assert after_reload, "the stream had finished before the reload was asked for: nothing was in flight"
    assert finish in ("length", "stop") and len(ids) >= len(after_reload) + 1
    assert all(len(r["choices"][0]["token_ids"]) >= 1 for r in results)
    assert {r["policy_version"] for r in results} <= {0, 1}
    assert ask(99)["policy_version"] == 1


def test_bad_reload_keeps_serving_old_weights(served, tiny_model_dir, tmp_path) -> None:
    reply = httpx.post(f"{served.server.base_url}/v1/weights/reload", json={"path": str(tmp_path / "missing")},
                       headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "path" and "checkpoint root" in reply.json()["error"]["message"]
    assert served.server.version == 0
    with pytest.raises(ServingError, match="missing .'model.layers.0.self_attn.q_proj.weight'"):
        served.server.reload({"model.embed_tokens.weight": torch.zeros(3, 3)})
    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    state["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ServingError, match=r"model.norm.weight has shape \(3,\), the model \(128,\)"):
        served.server.reload(state)
    assert served.server.version == 0
    assert (_client(served).chat.completions.create(model="tiny", messages=CHAT, max_tokens=2).choices[0].finish_reason
            == "length")


@pytest.mark.parametrize(
    ("body", "status", "param", "needle"),
    [
        ({"model": "gpt-9", "messages": CHAT}, 404, "model", "gpt-9"),
        ({"model": "tiny", "messages": []}, 400, "messages", "non-empty"),
        ({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "robot"),
        ({"model": "tiny", "messages": [{"role": "user"}]}, 400, "messages[0].content", "required"),
        ({"model": "tiny", "messages": CHAT, "temperature": 3}, 400, "temperature", "3"),
        ({"model": "tiny", "messages": CHAT, "top_p": 0}, 400, "top_p", "> 0.0"),
        ({"model": "tiny", "messages": CHAT, "max_tokens": 0}, 400, "max_tokens", "got 0"),
        ({"model": "tiny", "messages": CHAT, "n": 1000}, 400, "n", "1000"),
        ({"model": "tiny", "messages": CHAT, "stop": [""]}, 400, "stop", "non-empty"),
        ({"model": "tiny", "messages": CHAT, "max_tokens": 5000}, 400, "max_tokens", "context of 1024"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "1 " * 1100}]}, 400, "messages", "context is 1024"),
        ({"model": "tiny", "messages": CHAT, "presence_penalty": 1}, 400, "presence_penalty", "not supported"),
        (
            {"model": "tiny",
             "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "{oops"}}]}]},
            400,
            "messages[0].tool_calls[0].function.arguments",
            "JSON object",
        ),
    ],
)
def test_bad_chat_input_gets_openai_error(served, body, status, param, needle) -> None:
    reply = httpx.post(f"{served.server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and needle in error["message"], error
    assert served.spans() == []  # refused before generation


def test_bad_completions_input_and_unknown_route(served) -> None:
    base = served.server.base_url
    reply = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": [5, 99999]}, timeout=30)
    assert reply.status_code == 400 and "outside the vocabulary" in reply.json()["error"]["message"]
    reply = httpx.post(f"{base}/v1/completions", content=b"{not json", headers={"content-type": "application/json"},
                       timeout=30)
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]
    reply = httpx.get(f"{base}/v2/nothing", timeout=30)
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{base}/health", timeout=30).json() == {"status": "ok", "model": "tiny", "policy_version": 0}


def test_streaming_matches_non_streaming(served) -> None:
    client = _client(served, rollout="r-stream")
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=10, temperature=0).model_dump()
    text, ids, finish = "", [], None
    for chunk in client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        data = chunk.model_dump()
        if data["choices"]:
            choice = data["choices"][0]
            text += choice["delta"].get("content") or ""
            ids += choice["token_ids"]
            finish = choice["finish_reason"] or finish
        else:
            assert data["usage"]["completion_tokens"] == len(ids)
    assert ((text, ids, finish)
            == (whole["choices"][0]["message"]["content"], whole["choices"][0]["token_ids"], "length"))
    spans = served.spans()
    assert [s.attributes[semconv.ROLLOUT_ID] for s in spans] == ["r-stream", "r-stream"]
    assert decode_int32(spans[1].attributes[semconv.LLM_COMPLETION_TOKEN_IDS]) == ids


def test_stop_strings_seed_and_max_tokens(served) -> None:
    client = _client(served)
    kwargs = dict(model="tiny", prompt="what is", max_tokens=20, temperature=1.0)
    a = client.completions.create(seed=7, **kwargs).model_dump()["choices"][0]
    b = client.completions.create(seed=7, **kwargs).model_dump()["choices"][0]
    c = client.completions.create(seed=8, **kwargs).model_dump()["choices"][0]
    assert a["token_ids"] == b["token_ids"] != c["token_ids"]
    words = a["text"].split()
    at = next(i for i in range(1, len(words)) if words[i] not in " ".join(words[:i]))
    stop = words[at]
    cut = client.completions.create(seed=7, stop=[stop], **kwargs).model_dump()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert stop not in cut["text"].split() and a["text"].startswith(cut["text"].rstrip())
    assert cut["token_ids"] == a["token_ids"][: len(cut["token_ids"])]
    spans = served.spans()
    assert decode_float32(spans[-1].attributes[semconv.LLM_LOGPROBS]) == pytest.approx(cut["token_logprobs"], abs=1e-6)
    assert spans[-1].attributes[semconv.LLM_LOGPROBS_TEMPERATURE] == 1.0  # what training compares its own with


def test_completions_with_several_prompts_index_choices_in_order(served, tiny_model_dir) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    resp = _client(served).completions.create(model="tiny", prompt=["3 add 4", "5 sub 1 ?"], max_tokens=3, n=2,
                                              temperature=0).model_dump()
    assert resp["prompt_token_ids"] == [tok("3 add 4")["input_ids"], tok("5 sub 1 ?")["input_ids"]]
    assert [c["index"] for c in resp["choices"]] == [0, 1, 2, 3]
    assert resp["choices"][0]["token_ids"] == resp["choices"][1]["token_ids"]  # greedy: same per prompt
    spans = sorted(served.spans(), key=lambda s: s.attributes[semconv.LLM_CHOICE_INDEX])
    assert ([decode_int32(s.attributes[semconv.LLM_PROMPT_TOKEN_IDS]) for s in spans]
            == [resp["prompt_token_ids"][i // 2] for i in range(4)])


def test_rollout_task_and_attempt_from_headers_and_path(served) -> None:
    base = served.server.base_url
    body = {"model": "tiny", "prompt": "3", "max_tokens": 1}
    headers = {"x-spanrl-rollout-id": "r-h", "x-spanrl-task-id": "t-h", "x-spanrl-attempt": "3"}
    assert httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=30).status_code == 200
    assert (httpx.post(f"{base}/tasks/t-p/rollouts/r-p/attempts/2/v1/completions", json=body, headers=headers,
                       timeout=30).status_code == 200)
    bad = httpx.post(f"{base}/rollouts/r-x/attempts/two/v1/completions", json=body, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "attempt"
    keys = (semconv.ROLLOUT_ID, semconv.TASK_ID, semconv.ATTEMPT)
    assert [tuple(s.attributes.get(k) for k in keys) for s in served.spans()] == [("r-h", "t-h", 3), ("r-p", "t-p", 2)]
