"""The HTTP API: OpenAI-compatible routes on top of the batcher, one span per generated choice.

Routes (each ``/v1/...`` route also lives under the rollout prefixes below)::

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models
    GET  /health                POST /v1/weights/reload {"path": ...}

    /rollouts/{rollout_id}/v1/...                         attribute the request to a rollout
    /rollouts/{rollout_id}/attempts/{attempt}/v1/...      ... and an attempt
    /tasks/{task_id}/rollouts/{rollout_id}[/attempts/{attempt}]/v1/...

Headers ``x-spanrl-rollout-id``, ``x-spanrl-task-id``, ``x-spanrl-attempt`` do the same (the path wins).

Besides the OpenAI fields, every response carries ``prompt_token_ids`` (top level; a list of lists for
a completions request with several prompts), ``policy_version``, and on each choice ``token_ids`` (the
exact sampled ids, end token included) and ``token_logprobs`` (their logprobs, see ``Completion``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from spanrl.errors import ServingError
from spanrl.instrumentation import semconv
from spanrl.serving.backend import GenerationRequest, GenerationResult
from spanrl.serving.batcher import Batcher, QueueFullError
from spanrl.serving.chat import normalize_messages, normalize_tools, parse_tool_calls, render_prompt, semconv_messages
from spanrl.serving.config import ServerConfig
from spanrl.serving.errors import RequestError, error_body
from spanrl.serving.protocol import ParsedParams, parse_params
from spanrl.serving.telemetry import SpanRecorder

__all__ = ["ServerState", "build_app"]

_logger = logging.getLogger(__name__)

_PROVIDER = "spanrl"
_ROLLOUT_HEADER, _TASK_HEADER, _ATTEMPT_HEADER = "x-spanrl-rollout-id", "x-spanrl-task-id", "x-spanrl-attempt"
_PREFIXES = (
    "",
    "/rollouts/{rollout_id}",
    "/rollouts/{rollout_id}/attempts/{attempt}",
    "/tasks/{task_id}/rollouts/{rollout_id}",
    "/tasks/{task_id}/rollouts/{rollout_id}/attempts/{attempt}",
)


@dataclasses.dataclass
class ServerState:
    """What the routes share: the batcher (which owns the model), the tokenizer and the span recorder."""

    config: ServerConfig
    batcher: Batcher
    tokenizer: Any
    max_context_tokens: int
    recorder: SpanRecorder


@dataclasses.dataclass
class _Call:
    """One chat or completions request on its way through."""

    operation: str
    response_id: str
    start_ns: int
    parent: Any
    rollout: dict[str, Any]
    params: ParsedParams
    requests: list[GenerationRequest]
    input_messages: list[list[dict[str, Any]]]
    tools: list[dict[str, Any]] | None = None


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI application serving ``state``."""
    app = FastAPI(title="spanrl policy server")
    model_name = state.config.model_name

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, type=exc.type, param=exc.param, code=exc.code), status_code=exc.status)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        _logger.exception("unexpected error serving a request")
        return JSONResponse(error_body(f"internal error: {exc}", type="server_error"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), type=kind), status_code=exc.status_code)

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            raise RequestError(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if model is not None and model not in (model_name, str(state.config.model)):
            raise RequestError(
                f"The model {model!r} does not exist; this server serves {model_name!r}",
                param="model",
                status=404,
                code="model_not_found",
            )
        return body

    def rollout_of(request: Request) -> dict[str, Any]:
        path, headers = request.path_params, request.headers
        attrs: dict[str, Any] = {}
        rollout = path.get("rollout_id") or headers.get(_ROLLOUT_HEADER)
        task = path.get("task_id") or headers.get(_TASK_HEADER)
        attempt = path.get("attempt") or headers.get(_ATTEMPT_HEADER)
        if rollout:
            attrs[semconv.ROLLOUT_ID] = rollout
        if task:
            attrs[semconv.TASK_ID] = task
        if attempt:
            try:
                attrs[semconv.ATTEMPT] = int(attempt)
            except ValueError:
                raise RequestError(f"attempt must be an integer, got {attempt!r}", param="attempt") from None
        return attrs

    def params_of(body: dict[str, Any], prompt_tokens: int, *, chat: bool) -> ParsedParams:
        return parse_params(
            body,
            chat=chat,
            prompt_tokens=prompt_tokens,
            max_context_tokens=state.max_context_tokens,
            default_max_tokens=state.config.default_max_tokens,
        )

    async def chat_completions(request: Request) -> Any:
        start_ns = time.time_ns()
        body = await body_of(request)
        rollout = rollout_of(request)
        messages = normalize_messages(body.get("messages"))
        tools = normalize_tools(body.get("tools"))
        prompt_ids = render_prompt(state.tokenizer, messages, tools)
        params = params_of(body, len(prompt_ids), chat=True)
        call = _Call(
            operation=semconv.OP_CHAT,
            response_id="chatcmpl-" + uuid.uuid4().hex,
            start_ns=start_ns,
            parent=state.recorder.parent_from_headers(request.headers),
            rollout=rollout,
            params=params,
            requests=[GenerationRequest(prompt_ids, params.sampling, n=params.n)],
            input_messages=[messages],
            tools=tools if body.get("tool_choice") != "none" else None,
        )
        if params.stream:
            return StreamingResponse(_stream(state, call), media_type="text/event-stream")
        results = await _generate(state, call)
        return _response(state, call, results)

    async def completions(request: Request) -> Any:
        start_ns = time.time_ns()
        body = await body_of(request)
        rollout = rollout_of(request)
        prompts = _prompts(state.tokenizer, body.get("prompt"))
        params = [params_of(body, len(ids), chat=False) for ids, _ in prompts]
        call = _Call(
            operation=semconv.OP_TEXT_COMPLETION,
            response_id="cmpl-" + uuid.uuid4().hex,
            start_ns=start_ns,
            parent=state.recorder.parent_from_headers(request.headers),
            rollout=rollout,
            params=params[0],
            requests=[GenerationRequest(ids, p.sampling, n=p.n) for (ids, _), p in zip(prompts, params)],
            input_messages=[[{"role": "user", "content": text}] for _, text in prompts],
        )
        if call.params.stream:
            return StreamingResponse(_stream(state, call), media_type="text/event-stream")
        results = await _generate(state, call)
        return _response(state, call, results)

    async def models(request: Request) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": _PROVIDER,
                    "max_model_len": state.max_context_tokens,
                    "policy_version": state.batcher.version,
                }
            ],
        }

    for prefix in _PREFIXES:
        app.add_api_route(f"{prefix}/v1/chat/completions", chat_completions, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/completions", completions, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/models", models, methods=["GET"])

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "policy_version": state.batcher.version}

    @app.post("/v1/weights/reload")
    async def reload(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise RequestError(f"path must be a model folder path, got {path!r}", param="path")
        try:
            version = await asyncio.wrap_future(state.batcher.reload_async(path))
        except ServingError as exc:
            raise RequestError(str(exc), param="path") from None
        return {"status": "ok", "policy_version": version}

    return app


def _prompts(tokenizer: Any, prompt: Any) -> list[tuple[list[int], str]]:
    """(ids, text) per prompt: a string, a list of ids, or a list of either."""

    def one(value: Any, where: str) -> tuple[list[int], str]:
        if isinstance(value, str):
            if not value:
                raise RequestError(f"{where} must not be empty", param=where)
            return list(tokenizer(value)["input_ids"]), value
        if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            bad = [t for t in value if not 0 <= t < len(tokenizer)]
            if bad:
                raise RequestError(f"{where} has token ids outside the vocabulary (0..{len(tokenizer) - 1}): {bad[:5]}", param=where)
            return list(value), tokenizer.decode(value)
        raise RequestError(f"{where} must be a non-empty string or list of token ids", param=where)

    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [one(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [one(prompt, "prompt")]


async def _generate(state: ServerState, call: _Call, on_token: list[Callable[[int, int, float], None]] | None = None) -> list[GenerationResult]:
    futures: list[concurrent.futures.Future[GenerationResult]] = []
    try:
        for i, req in enumerate(call.requests):
            if on_token is not None:
                req.on_token = on_token[i]
            futures.append(state.batcher.submit(req))
    except QueueFullError as exc:
        for fut in futures:
            fut.cancel()
        raise RequestError(str(exc), status=503, type="server_busy", code="queue_full") from None
    try:
        results = list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
    except Exception as exc:  # one failed generation fails this request only
        _logger.warning("request %s failed: %s", call.response_id, exc)
        _record(state, call, None, error=str(exc))
        raise RequestError(f"generation failed: {exc}", status=500, type="server_error") from None
    return results


def _choices(state: ServerState, call: _Call, results: list[GenerationResult]) -> list[dict[str, Any]]:
    """OpenAI choices (plus token_ids / token_logprobs) for every completion of every request."""
    out: list[dict[str, Any]] = []
    decode = state.tokenizer.decode
    for result in results:
        for completion in result.completions:
            index = len(out)
            choice: dict[str, Any] = {"index": index, "finish_reason": completion.finish_reason}
            logprobs = None
            if call.params.logprobs:
                toks = [decode([t]) for t in completion.token_ids]
                tops = completion.top_logprobs or [[] for _ in toks]
                if call.operation == semconv.OP_CHAT:
                    logprobs = {
                        "content": [
                            {
                                "token": tok,
                                "logprob": lp,
                                "bytes": list(tok.encode()),
                                "top_logprobs": [{"token": decode([i]), "logprob": v, "bytes": list(decode([i]).encode())} for i, v in top],
                            }
                            for tok, lp, top in zip(toks, completion.logprobs, tops)
                        ]
                    }
                else:
                    offsets, at = [], 0
                    for tok in toks:
                        offsets.append(at)
                        at += len(tok)
                    logprobs = {
                        "tokens": toks,
                        "token_logprobs": completion.logprobs,
                        "top_logprobs": [{decode([i]): v for i, v in top} for top in tops],
                        "text_offset": offsets,
                    }
            if call.operation == semconv.OP_CHAT:
                content, calls = parse_tool_calls(completion.text, call.tools)
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                    if completion.finish_reason == "stop":
                        choice["finish_reason"] = "tool_calls"
                choice["message"] = message
            else:
                choice["text"] = completion.text
            choice["logprobs"] = logprobs
            choice["token_ids"] = completion.token_ids
            choice["token_logprobs"] = completion.logprobs
            out.append(choice)
    return out


def _response(state: ServerState, call: _Call, results: list[GenerationResult]) -> dict[str, Any]:
    choices = _choices(state, call, results)
    _record(state, call, (results, choices))
    prompt_tokens = sum(len(r.prompt_ids) for r in results)
    completion_tokens = sum(len(c.token_ids) for r in results for c in r.completions)
    return {
        "id": call.response_id,
        "object": "chat.completion" if call.operation == semconv.OP_CHAT else "text_completion",
        "created": call.start_ns // 1_000_000_000,
        "model": state.config.model_name,
        "system_fingerprint": f"spanrl-policy-v{results[0].policy_version}",
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
        "prompt_token_ids": results[0].prompt_ids if len(results) == 1 else [r.prompt_ids for r in results],
        "policy_version": results[0].policy_version,
    }


def _record(
    state: ServerState, call: _Call, done: tuple[list[GenerationResult], list[dict[str, Any]]] | None, error: str | None = None
) -> None:
    """One SERVER span per choice (each with the full request attributes and its own token arrays)."""
    rec = state.recorder
    model = state.config.model_name
    base: dict[str, Any] = {
        semconv.GEN_AI_OPERATION_NAME: call.operation,
        semconv.GEN_AI_PROVIDER_NAME: _PROVIDER,
        semconv.GEN_AI_REQUEST_MODEL: model,
        semconv.GEN_AI_RESPONSE_MODEL: model,
        semconv.GEN_AI_RESPONSE_ID: call.response_id,
        semconv.GEN_AI_REQUEST_TEMPERATURE: call.params.sampling.temperature,
        semconv.GEN_AI_REQUEST_MAX_TOKENS: call.params.sampling.max_tokens,
        **call.rollout,
    }
    if call.tools and state.config.record_content:
        base[semconv.GEN_AI_TOOL_DEFINITIONS] = json.dumps(call.tools)
    name = f"{call.operation} {model}"
    if done is None:
        attrs = dict(base, **{semconv.POLICY_VERSION: state.batcher.version})
        rec.record(name, parent=call.parent, start_ns=call.start_ns, attributes=attrs, error=error)
        return
    results, choices = done
    index = 0
    for r, result in enumerate(results):
        for completion in result.completions:
            choice = choices[index]
            attrs = dict(base)
            attrs.update(
                {
                    semconv.POLICY_VERSION: result.policy_version,
                    semconv.LLM_BATCH_SIZE: result.batch_size,
                    semconv.LLM_CHOICE_INDEX: index,
                    semconv.GEN_AI_RESPONSE_FINISH_REASONS: [choice["finish_reason"]],
                    semconv.GEN_AI_USAGE_INPUT_TOKENS: len(result.prompt_ids),
                    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: len(completion.token_ids),
                    semconv.LLM_PROMPT_TOKEN_IDS: rec.tokens(result.prompt_ids),
                    semconv.LLM_COMPLETION_TOKEN_IDS: rec.tokens(completion.token_ids),
                    semconv.LLM_LOGPROBS: rec.floats(completion.logprobs),
                }
            )
            if state.config.record_content:
                attrs[semconv.GEN_AI_INPUT_MESSAGES] = json.dumps(semconv_messages(call.input_messages[r]))
                message = choice.get("message") or {"role": "assistant", "content": choice.get("text")}
                attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
                    semconv_messages([dict(message, finish_reason=choice["finish_reason"])])
                )
            rec.record(name, parent=call.parent, start_ns=call.start_ns, attributes=attrs)
            index += 1


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _stream(state: ServerState, call: _Call) -> AsyncIterator[str]:
    """Server-sent events: a chunk per token (text held back while it may still change), then the
    finish reasons, optional usage, and ``[DONE]``. With stop strings or tools the text of each choice
    comes in one chunk at the end, because it may still be cut or turned into tool calls."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[int, int, float] | None] = asyncio.Queue()
    offsets, total = [], 0
    for req in call.requests:
        offsets.append(total)
        total += req.n

    def callback(offset: int) -> Callable[[int, int, float], None]:
        return lambda choice, token, logprob: loop.call_soon_threadsafe(events.put_nowait, (offset + choice, token, logprob))

    chat = call.operation == semconv.OP_CHAT
    kind = "chat.completion.chunk" if chat else "text_completion"
    created = call.start_ns // 1_000_000_000
    model = state.config.model_name

    def chunk(index: int, delta: dict[str, Any], token_ids: list[int], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish, "token_ids": token_ids}
        if chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta.get("content") or ""
        choice.update(extra)
        return {"id": call.response_id, "object": kind, "created": created, "model": model, "choices": [choice]}

    async def generate_and_record() -> tuple[list[GenerationResult], list[dict[str, Any]]]:
        # recorded here, not after the last chunk: a client that hangs up still leaves its span
        results = await _generate(state, call, on_token=[callback(o) for o in offsets])
        choices = _choices(state, call, results)
        _record(state, call, (results, choices))
        return results, choices

    task = asyncio.ensure_future(generate_and_record())
    task.add_done_callback(lambda _: events.put_nowait(None))
    first = chunk(0, {"role": "assistant", "content": ""} if chat else {}, [])
    first["prompt_token_ids"] = call.requests[0].prompt_ids if len(call.requests) == 1 else [r.prompt_ids for r in call.requests]
    yield _sse(first)
    held = bool(call.params.sampling.stop or call.tools)
    ids: list[list[int]] = [[] for _ in range(total)]
    sent = ["" for _ in range(total)]
    pending: list[list[int]] = [[] for _ in range(total)]
    while (event := await events.get()) is not None:
        index, token, _ = event
        ids[index].append(token)
        pending[index].append(token)
        if held:
            continue
        text = state.tokenizer.decode(ids[index], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            continue
        yield _sse(chunk(index, {"content": text[len(sent[index]) :]}, pending[index]))
        sent[index], pending[index] = text, []
    try:
        results, choices = task.result()
    except RequestError as exc:
        yield _sse(error_body(exc.message, type=exc.type, param=exc.param, code=exc.code))
        yield "data: [DONE]\n\n"
        return
    for choice in choices:
        i = choice["index"]
        if chat:
            message = choice["message"]
            delta: dict[str, Any] = {"content": (message["content"] or "")[len(sent[i]) :] if not held else message["content"]}
            if message.get("tool_calls"):
                delta["tool_calls"] = [dict(c, index=k) for k, c in enumerate(message["tool_calls"])]
        else:
            delta = {"content": choice["text"][len(sent[i]) :]}
        yield _sse(chunk(i, delta, pending[i], choice["finish_reason"], logprobs=choice["logprobs"], token_logprobs=choice["token_logprobs"]))
    if call.params.include_usage:
        prompt_tokens = sum(len(r.prompt_ids) for r in results)
        completion_tokens = sum(len(c) for c in ids)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
        yield _sse({"id": call.response_id, "object": kind, "created": created, "model": model, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"
