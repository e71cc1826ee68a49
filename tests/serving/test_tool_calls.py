"""A tool-call round trip through the chat template, on a tiny model taught the two turns in-process."""

from __future__ import annotations

import json

import openai
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spanrl import semconv

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]
ASK = [{"role": "user", "content": "what is 3 add 4 ?"}]
CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]}


def _teach(model_dir, steps: int = 50) -> torch.nn.Module:
    """Fit the two assistant turns of the round trip (loss on the assistant tokens only)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    examples = [
        (ASK, "<call> add 3 4 </call> <eos>"),
        (ASK + [CALL, {"role": "tool", "tool_call_id": "c1", "content": "7"}], "7 <eos>"),
    ]
    batch = []
    for messages, answer in examples:
        prompt = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))["input_ids"]
        target = tok(answer)["input_ids"]
        batch.append((torch.tensor([prompt + target]), len(prompt)))
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(steps):  # on one torch thread, as every serving test (tests/serving/conftest.py)
        loss = torch.zeros(())
        for ids, start in batch:
            logits = model(ids).logits[0, start - 1 : -1]  # (T, V)
            loss = loss + torch.nn.functional.cross_entropy(logits, ids[0, start:])
        optim.zero_grad()
        loss.backward()
        optim.step()
    return model


def test_tool_call_round_trip_through_chat_template(served, tiny_model_dir) -> None:
    assert served.server.reload(_teach(tiny_model_dir)) == 1
    client = openai.OpenAI(base_url=served.server.rollout_base_url("r-tools"), api_key="unused", max_retries=0)
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=10, temperature=0)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    assert ([(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
            == [("add", {"a": 3, "b": 4})])
    # the client sends the call back as OpenAI JSON (arguments as a string), then the tool's result
    history = (ASK + [message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "7"}])
    second = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=10, temperature=0)
    assert (second.choices[0].message.content, second.choices[0].finish_reason) == ("7", "stop")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt_text = tok.decode(second.model_dump()["prompt_token_ids"])
    assert prompt_text.endswith("<assistant> <call> add 3 4 </call> <eos> <tool> 7 <eos> <assistant>")
    spans = served.spans()
    out = json.loads(spans[0].attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert out[0]["parts"][0]["type"] == "tool_call" and out[0]["parts"][0]["arguments"] == {"a": 3, "b": 4}
    assert out[0]["finish_reason"] == "tool_calls"
    parts = json.loads(spans[1].attributes[semconv.GEN_AI_INPUT_MESSAGES])[-1]["parts"]
    assert parts == [{"type": "tool_call_response", "id": message.tool_calls[0].id, "response": "7"}]
    assert {s.attributes[semconv.POLICY_VERSION] for s in spans} == {1}


def test_a_call_that_does_not_fit_an_odd_tool_schema_stays_content_and_its_span_is_kept(served, tiny_model_dir):
    """Issue 53, finding 7: properties given as a list, or a property's schema as a string, made the parse of the
    generated ``<call> add 3 4 </call>`` raise: a 500, and the call's span was lost."""
    assert served.server.reload(_teach(tiny_model_dir)) == 1
    client = openai.OpenAI(base_url=served.server.rollout_base_url("r-odd"), api_key="unused", max_retries=0)
    odd = [{"type": "object", "properties": ["a", "b"]}, {"type": "object", "properties": {"a": "integer", "b": 7}},
           {"type": "object", "properties": {"a": {"type": ["integer"]}, "b": {"type": {"x": 1}}}}]
    got = []
    for parameters in odd:
        tools = [{"type": "function", "function": dict(TOOLS[0]["function"], parameters=parameters)}]
        reply = client.chat.completions.create(model="tiny", messages=ASK, tools=tools, max_tokens=10, temperature=0)
        message = reply.choices[0].message
        got.append((message.content, [json.loads(c.function.arguments) for c in message.tool_calls or []]))
    # properties that are not an object: the text stays content; schemas or types that name no JSON type: strings
    assert got == [("<call> add 3 4 </call>", []), (None, [{"a": "3", "b": "4"}]), (None, [{"a": "3", "b": "4"}])]
    spans = served.spans()
    assert len(spans) == len(odd) and {s.attributes[semconv.ROLLOUT_ID] for s in spans} == {"r-odd"}
