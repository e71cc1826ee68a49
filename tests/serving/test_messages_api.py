"""POST /v1/messages with the real anthropic client (``messages.create``, ``messages.stream``) on a tiny model:
the chat route's prompt, tokens, log-probs and server span, streaming events, a tool_use round trip, and errors
in Anthropic's shape (529 overloaded with retry-after when the queue is full)."""

from __future__ import annotations

import json
import threading

import anthropic
import httpx
import openai
import pytest
from test_tool_calls import _teach
from transformers import AutoTokenizer

from spanrl import semconv
from spanrl.serving import PolicyServer, ServerConfig, decode_int32
from spanrl.serving.backend import GenerationRequest, SamplingParams

SYSTEM = "Add the two numbers."
QUESTION = "what is 3 add 4 ?"
TOOLS = [{"name": "add", "description": "add two integers",
          "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]
_GREEDY = {"temperature": 0}  # the anthropic client has no sampling arguments: the body's field, as its users send it


def _client(server, rollout: str | None = None) -> anthropic.Anthropic:
    base = server.rollout_base_url(rollout).removesuffix("/v1") if rollout else server.base_url
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)


def test_message_is_the_chat_completion_with_exact_ids_and_span(served) -> None:
    msg = _client(served.server, "r-msg").messages.create(
        model="tiny", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}], max_tokens=6, extra_body=_GREEDY)
    data = msg.model_dump()
    chat = openai.OpenAI(base_url=f"{served.server.base_url}/v1", api_key="unused", max_retries=0)
    whole = chat.chat.completions.create(
        model="tiny", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        max_tokens=6, extra_body=_GREEDY).model_dump()
    choice = whole["choices"][0]
    assert data["prompt_token_ids"] == whole["prompt_token_ids"] and data["token_ids"] == choice["token_ids"]
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == choice["message"]["content"]
    assert (msg.stop_reason, msg.usage.output_tokens, msg.usage.input_tokens) == (
        "max_tokens", 6, len(data["prompt_token_ids"]))
    attrs = served.spans()[0].attributes
    assert (attrs[semconv.GEN_AI_OPERATION_NAME], attrs[semconv.GEN_AI_RESPONSE_ID]) == ("chat", msg.id)
    assert (attrs[semconv.ROLLOUT_ID], attrs[semconv.POLICY_VERSION]) == ("r-msg", 0)
    assert decode_int32(attrs[semconv.LLM_COMPLETION_TOKEN_IDS]) == data["token_ids"]
    assert len(data["token_logprobs"]) == 6


def test_stream_adds_up_to_the_message(served) -> None:
    client = _client(served.server)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8,
           "extra_body": _GREEDY}
    whole = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text == final.content[0].text
    assert (final.stop_reason, final.usage.output_tokens, final.id.startswith("msg_")) == ("max_tokens", 8, True)
    kinds = [e.type for e in client.messages.create(**ask, stream=True)]
    assert kinds[:2] == ["message_start", "content_block_start"] and set(kinds[2:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_tool_use_round_trip(served, tiny_model_dir) -> None:
    assert served.server.reload(_teach(tiny_model_dir)) == 1
    client = _client(served.server)
    ask = [{"role": "user", "content": QUESTION}]
    first = client.messages.create(model="tiny", messages=ask, tools=TOOLS, max_tokens=10, extra_body=_GREEDY)
    [use] = first.content
    assert (first.stop_reason, use.type, use.name, use.input) == ("tool_use", "tool_use", "add", {"a": 3, "b": 4})
    with client.messages.stream(model="tiny", messages=ask, tools=TOOLS, max_tokens=10, extra_body=_GREEDY) as stream:
        streamed = stream.get_final_message()  # built from content_block_start + input_json_delta
    assert [(b.type, b.name, b.input) for b in streamed.content] == [("tool_use", "add", {"a": 3, "b": 4})]
    history = ask + [{"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "7"}]}]
    second = client.messages.create(model="tiny", messages=history, tools=TOOLS, max_tokens=10, extra_body=_GREEDY)
    assert ([b.text for b in second.content], second.stop_reason) == (["7"], "end_turn")
    prompt = AutoTokenizer.from_pretrained(tiny_model_dir).decode(second.model_dump()["prompt_token_ids"])
    assert prompt.endswith("<assistant> <call> add 3 4 </call> <eos> <tool> 7 <eos> <assistant>")
    parts = json.loads(served.spans()[-1].attributes[semconv.GEN_AI_INPUT_MESSAGES])[-1]["parts"]
    assert parts == [{"type": "tool_call_response", "id": use.id, "response": "7"}]


@pytest.mark.parametrize(
    "body, status, kind, needle",
    [
        ({"messages": [{"role": "user", "content": QUESTION}]}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error", "role"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400,
         "invalid_request_error", "not supported"),
        ({"max_tokens": 10**6, "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error",
         "max_tokens="),
        ({"max_tokens": 4, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]}, 400,
         "invalid_request_error", "between 0 and 1"),
        ({"model": "claude-9", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, 404,
         "not_found_error", "does not exist"),
    ],
)
def test_bad_input_gets_anthropic_error(served, body, status, kind, needle) -> None:
    reply = httpx.post(f"{served.server.base_url}/v1/messages", json={"model": "tiny", **body}, timeout=30)
    assert reply.status_code == status, reply.text
    data = reply.json()
    assert data["type"] == "error" and data["error"]["type"] == kind and needle in data["error"]["message"], data
    assert served.spans() == []


def test_full_queue_is_overloaded_with_retry_after(tiny_model_dir) -> None:
    """The batcher thread is held inside a token callback, one request waits, the next is refused: 529."""
    server = PolicyServer(ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                                       max_queue_size=1, max_batch_size=1)).start()
    release, busy = threading.Event(), threading.Event()

    def hold(*_: object) -> None:
        busy.set()
        release.wait(30)

    try:
        batcher = server._require_state().batcher
        held = batcher.submit(GenerationRequest([1, 2], SamplingParams(max_tokens=2), on_token=hold))
        assert busy.wait(30)
        waiting = batcher.submit(GenerationRequest([1, 2], SamplingParams(max_tokens=2)))
        with pytest.raises(anthropic.InternalServerError) as caught:  # the SDK's class for 529
            _client(server).messages.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        assert caught.value.status_code == 529 and caught.value.response.headers["retry-after"] == "1"
        assert caught.value.body["error"]["type"] == "overloaded_error"
        release.set()
        held.result(30), waiting.result(30)
    finally:
        release.set()
        server.shutdown()


def test_stop_sequence_is_named(served) -> None:
    client = _client(served.server)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "what is"}], "max_tokens": 20,
           "extra_body": _GREEDY}
    whole = client.messages.create(**ask).content[0].text
    words = whole.split()
    stop = words[next(i for i in range(1, len(words)) if words[i] not in " ".join(words[:i]))]
    cut = client.messages.create(**ask, stop_sequences=[stop, "never-generated"])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert whole.startswith(cut.content[0].text.rstrip()) and stop not in cut.content[0].text.split()
