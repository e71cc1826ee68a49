"""Chat message checks and tool-call parsing (pure functions, no model)."""

from __future__ import annotations

import json

import pytest

from spanrl.serving.chat import normalize_messages, parse_tool_calls
from spanrl.serving.errors import RequestError

TOOLS = [
    {"type": "function",
     "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "lookup", "parameters": {"properties": {"q": {"type": "string"}}}}},
]


def test_parse_word_calls_into_typed_arguments() -> None:
    content, calls = parse_tool_calls("<call> add 3 4.5 </call>", TOOLS)
    assert content is None
    assert ([(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
            == [("add", {"a": 3, "b": 4.5})])
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"


def test_parse_json_tool_calls_keeps_surrounding_text() -> None:
    text = 'let me look <tool_call>{"name": "lookup", "arguments": {"q": "paris"}}</tool_call>'
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "let me look"
    assert json.loads(calls[0]["function"]["arguments"]) == {"q": "paris"}


@pytest.mark.parametrize(
    "text",
    [
        "<call> mul 3 4 </call>",  # undeclared tool
        "<call> add 3 </call>",  # wrong number of values
        "<call> add x 4 </call>",  # not an integer
        '<tool_call>{"name": "add", "arguments": </tool_call>',  # broken JSON
        '<tool_call>{"name": "add", "arguments": [56, 0]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "add", "arguments": "7"}</tool_call>',  # a JSON string that is not an object
        "plain answer 7",
    ],
)
def test_unparseable_calls_stay_text(text) -> None:
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_no_tools_means_no_parsing() -> None:
    assert parse_tool_calls("<call> add 3 4 </call>", None) == ("<call> add 3 4 </call>", [])


def test_normalize_messages_maps_openai_shapes_for_templates() -> None:
    out = normalize_messages(
        [
            {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
        ]
    )
    assert out[0] == {"role": "system", "content": "be brief"}
    assert out[1]["content"] == "" and out[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert out[2] == {"role": "tool", "content": "1", "tool_call_id": "c1"}


def test_image_parts_are_refused_by_name() -> None:
    with pytest.raises(RequestError, match=r"messages\[0\].content\[0\] must be a text part") as info:
        normalize_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert info.value.param == "messages[0].content[0]" and info.value.status == 400


def test_a_parsed_call_goes_back_in_the_next_request() -> None:
    # what the server hands out as `tool_calls`, the agent sends back as the assistant turn: it must be accepted
    _, calls = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 56, "b": 0}}</tool_call>', TOOLS)
    messages = [{"role": "user", "content": "56 + 0?"}, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "56"}]
    assert normalize_messages(messages)[1]["tool_calls"][0]["function"]["arguments"] == {"a": 56, "b": 0}
