"""POST /v1/responses with the real openai client (``client.responses``) on a tiny model: the same prompt,
tokens, log-probs and server span as the chat route, streaming events, a function-call round trip, errors."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import torch
from test_policy_server import _rescore
from test_tool_calls import ASK, _teach
from transformers import AutoTokenizer

from spanrl import semconv
from spanrl.serving import PolicyServer, ServerConfig, decode_float32, decode_int32

SYSTEM = "Add the two numbers."
QUESTION = "what is 3 add 4 ?"
TOOLS = [{"type": "function", "name": "add", "description": "add two integers", "strict": False,
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]


def _client(served, rollout: str | None = None) -> openai.OpenAI:
    base = served.server.rollout_base_url(rollout) if rollout else f"{served.server.base_url}/v1"
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0)


def test_response_is_the_chat_completion_with_exact_ids_and_span(served, tiny_model_dir) -> None:
    client = _client(served, rollout="r-resp")
    resp = client.responses.create(model="tiny", instructions=SYSTEM, input=QUESTION, max_output_tokens=6,
                                   temperature=0)
    data = resp.model_dump()
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        max_tokens=6, temperature=0).model_dump()
    assert data["prompt_token_ids"] == chat["prompt_token_ids"]  # the same chat template
    assert data["token_ids"] == chat["choices"][0]["token_ids"]
    assert resp.output_text == chat["choices"][0]["message"]["content"] and resp.output[0].type == "message"
    assert (resp.status, resp.incomplete_details.reason) == ("incomplete", "max_output_tokens")  # 6 tokens, cut
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (len(data["prompt_token_ids"]), 6)
    rescored = _rescore(tiny_model_dir, data["prompt_token_ids"], data["token_ids"])
    assert torch.allclose(torch.tensor(data["token_logprobs"]), rescored, atol=1e-4)
    span = served.spans()[0]
    attrs = span.attributes
    assert (attrs[semconv.GEN_AI_OPERATION_NAME], attrs[semconv.GEN_AI_RESPONSE_ID]) == ("chat", resp.id)
    assert (attrs[semconv.ROLLOUT_ID], attrs[semconv.POLICY_VERSION]) == ("r-resp", 0)
    assert decode_int32(attrs[semconv.LLM_PROMPT_TOKEN_IDS]) == data["prompt_token_ids"]
    assert decode_int32(attrs[semconv.LLM_COMPLETION_TOKEN_IDS]) == data["token_ids"]
    assert decode_float32(attrs[semconv.LLM_LOGPROBS]) == pytest.approx(data["token_logprobs"], abs=1e-6)
    assert [m["role"] for m in json.loads(attrs[semconv.GEN_AI_INPUT_MESSAGES])] == ["system", "user"]


def test_streamed_events_add_up_to_the_response(served) -> None:
    client = _client(served)
    whole = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, temperature=0)
    events = list(client.responses.create(model="tiny", input=QUESTION, max_output_tokens=8, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.model_dump()["token_ids"] == whole.model_dump()["token_ids"]
    with client.responses.stream(model="tiny", input=[{"role": "user", "content": QUESTION}], max_output_tokens=8,
                                 temperature=0) as stream:  # the SDK's helper: incomplete, so no final response
        helped = [e for e in stream if e.type == "response.incomplete"]
    assert [e.response.output_text for e in helped] == [whole.output_text]
    assert len(served.spans()) == 3


def test_function_call_round_trip(served, tiny_model_dir) -> None:
    assert served.server.reload(_teach(tiny_model_dir)) == 1
    client = _client(served)
    first = client.responses.create(model="tiny", input=ASK, tools=TOOLS, max_output_tokens=10, temperature=0)
    [call] = first.output
    assert (call.type, call.name, json.loads(call.arguments), call.status) == ("function_call", "add",
                                                                                {"a": 3, "b": 4}, "completed")
    events = list(client.responses.create(model="tiny", input=ASK, tools=TOOLS, max_output_tokens=10, temperature=0,
                                          stream=True))
    args = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in args] == [{"a": 3, "b": 4}]
    assert events[-1].type == "response.completed" and events[-1].response.output[0].name == "add"
    # the SDK's way: the call item as given, then its output
    second = client.responses.create(
        model="tiny", input=ASK + [call.model_dump(exclude_none=True),
                                   {"type": "function_call_output", "call_id": call.call_id, "output": "7"}],
        tools=TOOLS, max_output_tokens=10, temperature=0)
    assert (second.output_text, second.status) == ("7", "completed")
    prompt = AutoTokenizer.from_pretrained(tiny_model_dir).decode(second.model_dump()["prompt_token_ids"])
    assert prompt.endswith("<assistant> <call> add 3 4 </call> <eos> <tool> 7 <eos> <assistant>")
    spans = served.spans()
    out = json.loads(spans[0].attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert out[0]["parts"][0] == {"type": "tool_call", "id": call.call_id, "name": "add", "arguments": {"a": 3, "b": 4}}
    assert {s.attributes[semconv.POLICY_VERSION] for s in spans} == {1}


@pytest.mark.parametrize(
    "body, status, param, needle",
    [
        ({"input": QUESTION, "previous_response_id": "resp_1"}, 400, "previous_response_id", "keeps no state"),
        ({"input": QUESTION, "tools": [{"type": "web_search"}]}, 400, "tools[0]", "only function tools"),
        ({"input": QUESTION, "max_output_tokens": 10**6}, 400, "max_output_tokens", "context"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, 400, "input[0]", "not supported"),
        ({"input": []}, 400, "input", "non-empty"),
        ({"input": QUESTION, "model": "gpt-9"}, 404, "model", "does not exist"),
    ],
)
def test_bad_input_gets_openai_error(served, body, status, param, needle) -> None:
    reply = httpx.post(f"{served.server.base_url}/v1/responses", json={"model": "tiny", **body}, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and needle in error["message"], error
    assert served.spans() == []


def test_openai_client_raises_its_own_errors(served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _client(served).responses.create(model="tiny", input=QUESTION, previous_response_id="resp_1")
    assert caught.value.body["param"] == "previous_response_id"


def test_both_apis_reach_the_store_under_rollout_prefixes(collector, tiny_model_dir) -> None:
    """Responses and Messages calls under ``/rollouts/<id>/attempts/<n>``: their spans in the collector's DuckDB."""
    import anthropic

    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=collector.grpc_endpoint, served_model_name="tiny")
    with PolicyServer(config) as server:
        base = server.rollout_base_url("rollout-7", attempt=3)
        resp = openai.OpenAI(base_url=base, api_key="unused", max_retries=0).responses.create(
            model="tiny", input=QUESTION, max_output_tokens=4).model_dump()
        msg = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="unused", max_retries=0).messages.create(
            model="tiny", messages=[{"role": "user", "content": QUESTION}], max_tokens=4).model_dump()
        assert server.force_flush()
    query = ("SELECT response_id, kind, rollout_id, attempt, operation_name, policy_version, prompt_token_ids, "
             "completion_token_ids, logprobs FROM spans WHERE response_id IN (?, ?) ORDER BY start_ns")
    rows: list = []
    deadline = time.monotonic() + 20
    while len(rows) < 2 and time.monotonic() < deadline:
        rows = collector.store.sql(query, [resp["id"], msg["id"]]).to_pylist()
        time.sleep(0.1)
    assert [r["response_id"] for r in rows] == [resp["id"], msg["id"]]
    for row, answer in zip(rows, (resp, msg)):
        assert ((row["kind"], row["rollout_id"], row["attempt"], row["operation_name"], row["policy_version"])
                == ("SERVER", "rollout-7", 3, "chat", 0))
        assert (row["prompt_token_ids"], row["completion_token_ids"]) == (answer["prompt_token_ids"],
                                                                          answer["token_ids"])
        assert row["logprobs"] == pytest.approx(answer["token_logprobs"], abs=1e-6)
