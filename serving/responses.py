"""Turning generation results into OpenAI responses, SSE streams and server spans.

One SERVER span per generated choice, carrying the full request attributes and that choice's exact
token ids and logprobs (see ``docs/architecture.md``, "Policy-server API").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from spanrl import semconv
from spanrl.seeding import CallSeeds
from spanrl.serving.backend import GenerationRequest, GenerationResult
from spanrl.serving.batcher import Batcher, QueueFullError
from spanrl.serving.chat import parse_tool_calls, semconv_messages
from spanrl.serving.config import ServerConfig
from spanrl.serving.errors import RequestError, error_body
from spanrl.serving.protocol import ParsedParams
from spanrl.serving.telemetry import SpanRecorder

__all__ = ["Call", "ServerState", "complete", "respond", "stream"]

_logger = logging.getLogger(__name__)

PROVIDER = "spanrl"
"""``gen_ai.provider.name`` of the server's spans."""


@dataclasses.dataclass
class ServerState:
    """What the routes share: the batcher (which owns the model), the tokenizer and the span recorder."""

    config: ServerConfig
    batcher: Batcher
    tokenizer: Any
    max_context_tokens: int
    recorder: SpanRecorder
    seeds: CallSeeds = dataclasses.field(default_factory=CallSeeds)
    """The seeds of seeded rollouts' calls that name none (``spanrl.seeding``)."""


@dataclasses.dataclass
class Call:
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


async def _generate(
    state: ServerState, call: Call, on_token: list[Callable[[int, int, float], None]] | None = None
) -> list[GenerationResult]:
    futures: list[concurrent.futures.Future[GenerationResult]] = []
    _seed_rollout_calls(state, call)
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
    if any(req.cancelled for req in call.requests):  # its client went away: an error span, no partial tokens
        _record(state, call, None, error=CANCELLED)
        raise RequestError(CANCELLED, status=499, type="cancelled")
    return results


def cancel(call: Call, task: asyncio.Future[Any]) -> None:
    """The client of ``call`` went away before ``task`` (its `complete`) finished: end its generation."""
    if not task.done():
        for req in call.requests:
            req.cancelled = True
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its RequestError reaches nobody


def _seed_rollout_calls(state: ServerState, call: Call) -> None:
    """A seeded rollout's requests that name no ``seed`` sample from one derived from the rollout's seed and
    their prompt (``spanrl.seeding``); an explicit ``seed`` stays as the client gave it."""
    rollout_seed = call.rollout.get(semconv.ROLLOUT_SEED)
    if rollout_seed is None:
        return
    rollout_id = str(call.rollout.get(semconv.ROLLOUT_ID))
    for req in call.requests:
        if req.params.seed is None:
            seed = state.seeds.seed(rollout_id, rollout_seed, req.prompt_ids)
            req.params = dataclasses.replace(req.params, seed=seed)


def _choices(state: ServerState, call: Call, results: list[GenerationResult]) -> list[dict[str, Any]]:
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
                                "top_logprobs": [
                                    {"token": decode([i]), "logprob": v, "bytes": list(decode([i]).encode())}
                                    for i, v in top
                                ],
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


CANCELLED = "the client disconnected: generation cancelled"


async def complete(
    state: ServerState, call: Call, on_token: list[Callable[[int, int, float], None]] | None = None
) -> tuple[list[GenerationResult], list[dict[str, Any]]]:
    """Generate, build the OpenAI choices, and record the spans (before any reply is sent, so a client
    that hangs up still leaves them)."""
    results = await _generate(state, call, on_token)
    choices = _choices(state, call, results)
    _record(state, call, (results, choices))
    return results, choices


async def complete_while_connected(
    state: ServerState, call: Call, receive: Callable[[], Awaitable[dict[str, Any]]]
) -> tuple[list[GenerationResult], list[dict[str, Any]]]:
    """`complete` for a non-streamed reply, cancelled as a dropped stream is when the client hangs up first:
    ``receive`` (the request's ASGI receive, its body already read) then yields ``http.disconnect``, as vLLM's
    server listens for it. The cancelled call leaves its error span; nobody is left to read the 499."""
    task = asyncio.ensure_future(complete(state, call))
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        cancel(call, task)
        raise RequestError(CANCELLED, status=499, type="cancelled")
    return task.result()


async def _disconnected(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def respond(
    state: ServerState, call: Call, results: list[GenerationResult], choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON body of a non-streaming response."""
    prompt_tokens = sum(len(r.prompt_ids) for r in results)
    completion_tokens = sum(len(c.token_ids) for r in results for c in r.completions)
    return {
        "id": call.response_id,
        "object": "chat.completion" if call.operation == semconv.OP_CHAT else "text_completion",
        "created": call.start_ns // 1_000_000_000,
        "model": served_name(state, call),
        "system_fingerprint": f"spanrl-policy-v{results[0].policy_version}",
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "prompt_token_ids": results[0].prompt_ids if len(results) == 1 else [r.prompt_ids for r in results],
        "policy_version": results[0].policy_version,
    }


def _record(
    state: ServerState,
    call: Call,
    done: tuple[list[GenerationResult], list[dict[str, Any]]] | None,
    error: str | None = None,
) -> None:
    """One SERVER span per choice (each with the full request attributes and its own token arrays)."""
    rec = state.recorder
    model = served_name(state, call)
    adapter = call.requests[0].adapter if call.requests else None
    base: dict[str, Any] = {
        semconv.GEN_AI_OPERATION_NAME: call.operation,
        semconv.GEN_AI_PROVIDER_NAME: PROVIDER,
        semconv.GEN_AI_REQUEST_MODEL: model,
        semconv.GEN_AI_RESPONSE_MODEL: model,
        semconv.GEN_AI_RESPONSE_ID: call.response_id,
        semconv.GEN_AI_REQUEST_TEMPERATURE: call.params.sampling.temperature,
        semconv.GEN_AI_REQUEST_MAX_TOKENS: call.params.sampling.max_tokens,
        **call.rollout,
    }
    if adapter is not None:
        base[semconv.POLICY_ADAPTER] = adapter
    if call.tools and state.config.record_content:
        base[semconv.GEN_AI_TOOL_DEFINITIONS] = json.dumps(call.tools)
    name = f"{call.operation} {model}"
    if done is None:
        attrs = dict(base, **{semconv.POLICY_VERSION: state.batcher.version_of(adapter)})
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
                    semconv.LLM_LOGPROBS_TEMPERATURE: call.params.sampling.temperature or 1.0,  # greedy: softmax
                }
            )
            if call.requests[r].params.seed is not None:
                attrs[semconv.GEN_AI_REQUEST_SEED] = call.requests[r].params.seed
            if state.config.record_content:
                attrs[semconv.GEN_AI_INPUT_MESSAGES] = json.dumps(semconv_messages(call.input_messages[r]))
                message = choice.get("message") or {"role": "assistant", "content": choice.get("text")}
                attrs[semconv.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
                    semconv_messages([dict(message, finish_reason=choice["finish_reason"])])
                )
            rec.record(name, parent=call.parent, start_ns=call.start_ns, attributes=attrs)
            index += 1


def served_name(state: ServerState, call: Call) -> str:
    """The model id a call was served as: its adapter's name, else the base model's."""
    adapter = call.requests[0].adapter if call.requests else None
    return adapter if adapter is not None else state.config.model_name


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def stream(state: ServerState, call: Call) -> AsyncIterator[str]:
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
        return lambda choice, token, logprob: loop.call_soon_threadsafe(events.put_nowait,
                                                                        (offset + choice, token, logprob))

    chat = call.operation == semconv.OP_CHAT
    kind = "chat.completion.chunk" if chat else "text_completion"
    created = call.start_ns // 1_000_000_000
    model = served_name(state, call)

    def chunk(index: int, delta: dict[str, Any], token_ids: list[int], finish: str | None = None,
              **extra: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish, "token_ids": token_ids}
        if chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta.get("content") or ""
        choice.update(extra)
        return {"id": call.response_id, "object": kind, "created": created, "model": model, "choices": [choice]}

    task = asyncio.ensure_future(complete(state, call, on_token=[callback(o) for o in offsets]))
    task.add_done_callback(lambda _: events.put_nowait(None))
    first = chunk(0, {"role": "assistant", "content": ""} if chat else {}, [])
    first["prompt_token_ids"] = (call.requests[0].prompt_ids if len(call.requests) == 1
                                 else [r.prompt_ids for r in call.requests])
    yield _sse(first)
    held = bool(call.params.sampling.stop or call.tools)
    ids: list[list[int]] = [[] for _ in range(total)]
    sent = ["" for _ in range(total)]
    pending: list[list[int]] = [[] for _ in range(total)]
    try:
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
    finally:  # the client hung up (the stream was cancelled or closed): stop generating for it
        cancel(call, task)
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
            rest = (message["content"] or "")[len(sent[i]) :] if not held else message["content"]
            delta: dict[str, Any] = {"content": rest}
            if message.get("tool_calls"):
                delta["tool_calls"] = [dict(c, index=k) for k, c in enumerate(message["tool_calls"])]
        else:
            delta = {"content": choice["text"][len(sent[i]) :]}
        yield _sse(chunk(i, delta, pending[i], choice["finish_reason"],
                         logprobs=choice["logprobs"], token_logprobs=choice["token_logprobs"]))
    if call.params.include_usage:
        yield _sse({"id": call.response_id, "object": kind, "created": created, "model": model, "choices": [],
                    "usage": _usage(results, ids)})
    yield "data: [DONE]\n\n"


def _usage(results: list[GenerationResult], ids: list[list[int]]) -> dict[str, int]:
    """A stream's ``usage``: the prompts' tokens and the tokens streamed."""
    prompt_tokens = sum(len(r.prompt_ids) for r in results)
    completion_tokens = sum(len(c) for c in ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
