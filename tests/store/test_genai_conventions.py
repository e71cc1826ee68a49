"""The GenAI conventions as semantic-conventions-genai writes them (docs/conventions.md names the version): a
framework runner's turn (handle_conversation_turn) and a workflow above the agent, messages carried by the
gen_ai.client.inference.operation.details event or kept elsewhere (*_ref URIs, read through fsspec), generic
message parts, and a tool call's decision and exit code. Real spans through an in-process collector."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from spanrl import semconv as sc
from spanrl.algorithms.retokenize import retokenize
from spanrl.store.decomposer import decompose

# The spec's own examples (docs/gen-ai/non-normative/tests/cases/input-messages-generic-part.yaml, the
# system instructions of gen-ai-agent-spans.md's table)
_GENERIC_INPUT = [{"role": "user", "parts": [
    {"type": "text", "content": "Answer using the attached search result."},
    {"type": "generic", "generic_type": "search_result", "source": "https://example.com/docs/otel",
     "title": "OpenTelemetry overview",
     "content": [{"type": "text", "text": "OpenTelemetry is an observability framework."}],
     "citations": {"enabled": True}}]}]
_SYSTEM = [{"type": "text", "content": "You are a language translator."},  # + system-instructions-text-and-generic-
           {"type": "generic", "generic_type": "cache_control", "cache_control": {"type": "ephemeral"}}]  # parts.yaml
# output-messages-reasoning-and-generic-parts.yaml: generic parts with no text (opaque data, a provider payload)
_OPAQUE_OUTPUT = [{"role": "assistant", "finish_reason": "stop", "parts": [
    {"type": "reasoning", "content": "The user wants a short answer."},
    {"type": "generic", "generic_type": "redacted_thinking",
     "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLt..."},
    {"type": "generic", "payload": {"kind": "provider-specific"}},
    {"type": "text", "content": "It is."}]}]
_OUTPUT = [{"role": "assistant", "parts": [{"type": "text", "content": "It is."}], "finish_reason": "stop"}]
_REF_INPUT = [{"role": "user", "parts": [{"type": "text", "content": "Kept in a bucket"}]}]


class Template:
    """A chat template in memory: one id per character of ``role: content`` lines."""

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
                            tokenize: bool = True) -> list[int]:
        text = "".join(f"{m['role']}: {m.get('content', '')}\n" for m in messages)
        return [ord(c) for c in text + ("assistant: " if add_generation_prompt else "")]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def _spans(collector: Any, refs: Path) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "adk-agent", sc.ROLLOUT_ID: "r-conv"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("google.adk")
    op = sc.GEN_AI_OPERATION_NAME
    (refs / "in.json").write_text(json.dumps(_REF_INPUT))
    (refs / "out.jsonl").write_text("\n".join(json.dumps(m) for m in _OUTPUT))
    with tracer.start_as_current_span("handle_conversation_turn", attributes={
            op: sc.OP_HANDLE_CONVERSATION_TURN, sc.GEN_AI_AGENT_NAME: "Runner", sc.GEN_AI_CONVERSATION_ID: "c-1"}), \
            tracer.start_as_current_span("invoke_workflow travel", attributes={op: sc.OP_INVOKE_WORKFLOW}), \
            tracer.start_as_current_span("invoke_agent Math Tutor", attributes={
                op: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "Math Tutor", sc.GEN_AI_INVOCATION_IS_NESTED: True}):
        with tracer.start_as_current_span("chat gpt-4", kind=SpanKind.CLIENT, attributes={op: "chat"}) as call:
            call.add_event(sc.GEN_AI_INFERENCE_DETAILS_EVENT, {  # the messages on the event only
                sc.GEN_AI_INPUT_MESSAGES: json.dumps(_GENERIC_INPUT), sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(_OUTPUT),
                sc.GEN_AI_SYSTEM_INSTRUCTIONS: json.dumps(_SYSTEM)})
        tracer.start_span("chat gpt-4", kind=SpanKind.CLIENT, attributes={  # content kept elsewhere, readable
            op: "chat", sc.GEN_AI_INPUT_MESSAGES_REF: f"file://{refs}/in.json",
            sc.GEN_AI_OUTPUT_MESSAGES_REF: f"file://{refs}/out.jsonl"}).end()
        tracer.start_span("chat gpt-4", kind=SpanKind.CLIENT, attributes={  # not under an allowed prefix
            op: "chat", sc.GEN_AI_INPUT_MESSAGES_REF: "file:///etc/hostname"}).end()
        shell = tracer.start_span("execute_tool run_shell", attributes={
            op: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "run_shell", sc.GEN_AI_TOOL_CALL_ID: "call_1",
            sc.PROCESS_EXIT_CODE: 2, sc.ERROR_TYPE: "2"})
        shell.set_status(Status(StatusCode.ERROR))
        shell.end()
        gated = tracer.start_span("execute_tool delete_file", attributes={
            op: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "delete_file", sc.GEN_AI_TOOL_CALL_ID: "call_2"})
        gated.add_event(sc.GEN_AI_TOOL_CALL_DECISION, {sc.GEN_AI_TOOL_CALL_DECISION_OUTCOME: "deny",
                                                       sc.GEN_AI_TOOL_CALL_ID: "call_2"})
        gated.end()
        tracer.start_span("execute_tool search", attributes={
            op: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "search", sc.GEN_AI_TOOL_CALL_DECISION: "allow"}).end()
    provider.shutdown()


def test_current_genai_conventions_are_read_as_written(collector: Any, tmp_path: Path, monkeypatch: Any,
                                                       caplog: Any) -> None:
    refs = tmp_path / "refs"
    refs.mkdir()
    monkeypatch.setenv("SPANRL_MESSAGE_REFS", f"file://{refs}/")
    _spans(collector, refs)
    with caplog.at_level(logging.WARNING, logger="spanrl.store.messages"):
        dec = decompose(collector.store, kept=False)
    calls = dec.calls.to_pylist()
    assert [c["agent"] for c in calls] == ["Math Tutor"] * 3  # not the runner's turn, not the workflow
    first, by_ref, unread = calls
    assert json.loads(first["input_messages"]) == [{"role": "system", "parts": _SYSTEM}, *_GENERIC_INPUT]
    assert json.loads(first["output_messages"]) == _OUTPUT
    assert (json.loads(by_ref["input_messages"]), json.loads(by_ref["output_messages"])) == (_REF_INPUT, _OUTPUT)
    assert unread["input_messages"] is None  # never an empty prompt: the call keeps none, and says why
    assert (dec.report["message_refs_read"], dec.report["message_refs_unread"]) == (1, 1)
    assert "rollout r-conv: 1 call(s)" in caplog.text and "'file:///etc/hostname'" in caplog.text
    assert "not under a prefix SPANRL_MESSAGE_REFS allows" in caplog.text

    prompt, _ = retokenize(Template(), first["input_messages"], first["output_messages"])
    assert "".join(map(chr, prompt)) == (  # the generic part's title, source and text reach the policy, on lines
        "system: You are a language translator.\n"  # of their own; cache_control is no text
        "user: Answer using the attached search result.\nOpenTelemetry overview\nhttps://example.com/docs/otel\n"
        "OpenTelemetry is an observability framework.\nassistant: ")

    llm = collector.store.sql("SELECT input_messages, input_messages_ref FROM llm_calls ORDER BY start_ns").to_pylist()
    assert json.loads(llm[0]["input_messages"]) == _GENERIC_INPUT
    assert llm[1] == {"input_messages": None, "input_messages_ref": f"file://{refs}/in.json"}
    tools = collector.store.sql("SELECT tool_name, tool_call_id, decision, exit_code, error_type, status_code "
                                "FROM tool_calls ORDER BY start_ns").to_pylist()
    assert tools == [
        {"tool_name": "run_shell", "tool_call_id": "call_1", "decision": None, "exit_code": 2, "error_type": "2",
         "status_code": "ERROR"},
        {"tool_name": "delete_file", "tool_call_id": "call_2", "decision": "deny", "exit_code": None,
         "error_type": None, "status_code": "UNSET"},
        {"tool_name": "search", "tool_call_id": None, "decision": "allow", "exit_code": None, "error_type": None,
         "status_code": "UNSET"},
    ]


def test_generic_parts_without_text_add_none_and_are_kept_whole(collector: Any) -> None:
    """The spec's opaque generic parts (redacted thinking's data, a provider payload) put no text in the
    completion the policy is trained on, and the store keeps them, every field, as recorded."""
    provider = TracerProvider(resource=Resource.create({sc.ROLLOUT_ID: "r-opaque"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    provider.get_tracer("t").start_span("chat m", kind=SpanKind.CLIENT, attributes={
        sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_INPUT_MESSAGES: json.dumps(_GENERIC_INPUT),
        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(_OPAQUE_OUTPUT)}).end()
    provider.shutdown()
    (call,) = decompose(collector.store, kept=False).calls.to_pylist()
    assert json.loads(call["output_messages"]) == _OPAQUE_OUTPUT
    prompt, completion = retokenize(Template(), call["input_messages"], call["output_messages"])
    assert "".join(map(chr, completion)) == "It is.\n"


def test_a_generate_content_call_is_an_llm_call(collector: Any) -> None:
    """registry.yaml @ e9de14b: generate_content is an inference operation (Gemini's, as the Google GenAI
    instrumentations write it), read like chat."""
    provider = TracerProvider(resource=Resource.create({sc.ROLLOUT_ID: "r-gemini"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("google.genai")
    tracer.start_span("generate_content gemini-2.5-flash", kind=SpanKind.CLIENT, attributes={
        sc.GEN_AI_OPERATION_NAME: "generate_content", sc.GEN_AI_PROVIDER_NAME: "gcp.gemini",
        sc.GEN_AI_INPUT_MESSAGES: json.dumps(_REF_INPUT), sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(_OUTPUT)}).end()
    provider.shutdown()
    (call,) = decompose(collector.store, kept=False).calls.to_pylist()
    assert (call["rollout_id"], json.loads(call["output_messages"])) == ("r-gemini", _OUTPUT)
    assert collector.store.sql("SELECT operation_name FROM llm_calls").to_pylist() == [
        {"operation_name": "generate_content"}]


def test_content_kept_elsewhere_is_read_from_the_storage_result_events(collector: Any, tmp_path: Path,
                                                                      monkeypatch: Any, caplog: Any) -> None:
    """The spec names the *_ref attributes on the upload's gen_ai.content.storage.result event only (reference/
    scenarios/opentelemetry-util-genai @ f5e81ce: one event per object, status stored, dropped when the upload
    queue is full, failed with error.type): a stored object's URI is read from there, and a dropped or failed
    upload is the rollout's note, the call keeping no prompt."""
    monkeypatch.setenv("SPANRL_MESSAGE_REFS", f"file://{tmp_path}/")
    (tmp_path / "in.json").write_text(json.dumps(_REF_INPUT))
    (tmp_path / "out.json").write_text(json.dumps(_OUTPUT))
    provider = TracerProvider(resource=Resource.create({sc.ROLLOUT_ID: "r-stored"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    tracer, status = provider.get_tracer("openai"), sc.GEN_AI_CONTENT_STORAGE_STATUS
    results = (
        ({sc.GEN_AI_INPUT_MESSAGES_REF: f"file://{tmp_path}/in.json", status: "stored"},
         {sc.GEN_AI_OUTPUT_MESSAGES_REF: f"file://{tmp_path}/out.json", status: "stored"}),
        ({sc.GEN_AI_INPUT_MESSAGES_REF: f"file://{tmp_path}/q.json", status: "dropped"},),
        ({sc.GEN_AI_INPUT_MESSAGES_REF: f"file://{tmp_path}/gone/in.json", status: "failed",
          sc.ERROR_TYPE: "FileNotFoundError"},),
    )
    for events in results:
        with tracer.start_as_current_span("chat gpt-4", kind=SpanKind.CLIENT, attributes={
                sc.GEN_AI_OPERATION_NAME: "chat"}) as span:
            for attributes in events:
                span.add_event(sc.GEN_AI_CONTENT_STORAGE_RESULT_EVENT, attributes)
    provider.shutdown()
    with caplog.at_level(logging.WARNING, logger="spanrl.store.messages"):
        dec = decompose(collector.store, kept=False)
    stored, dropped, failed = dec.calls.to_pylist()
    assert (json.loads(stored["input_messages"]), json.loads(stored["output_messages"])) == (_REF_INPUT, _OUTPUT)
    assert dropped["input_messages"] is None and failed["input_messages"] is None
    assert (dec.report["message_refs_read"], dec.report["message_refs_unread"]) == (1, 2)
    assert "rollout r-stored: 2 call(s)" in caplog.text
    assert f"input_messages_ref 'file://{tmp_path}/q.json': the upload reported it dropped" in caplog.text
    assert (f"input_messages_ref 'file://{tmp_path}/gone/in.json': the upload reported it failed "
            "(error.type FileNotFoundError)") in caplog.text


def test_a_message_reference_cannot_climb_out_of_its_allowed_prefix(tmp_path: Path) -> None:
    """Span data names the URI: ``..``, a sibling folder sharing the prefix's name, or fsspec chaining is
    refused, so no agent can pull other files into prompts, the viewer or exports."""
    from spanrl.store.messages import _read

    refs, other = tmp_path / "refs", tmp_path / "refs-other"
    refs.mkdir(), other.mkdir()
    (refs / "ok.json").write_text('[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]')
    (other / "secret.json").write_text('[{"role": "user", "parts": [{"type": "text", "content": "secret"}]}]')
    allowed = (f"file://{refs}",)
    assert _read(f"file://{refs}/ok.json", allowed)[1] is None
    for uri in (f"file://{refs}/../refs-other/secret.json", f"file://{other}/secret.json",
                f"simplecache::file://{refs}/ok.json", f"file://{refs}/./ok.json"):
        value, why = _read(uri, allowed)
        assert value is None and "not under a prefix" in why, uri
