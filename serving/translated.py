"""What the Responses and Messages routes share: a request already translated to chat messages and tools
becomes the chat route's `Call` (same chat template, same sampling checks, same server span), and its
generation is followed token by token for streaming.

Each API keeps its own field names in errors: the sampling fields are checked by the chat route's
`parse_params` under their chat names, and ``renames`` names them back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.requests import Request

from spanrl import semconv
from spanrl.serving.backend import GenerationRequest, GenerationResult
from spanrl.serving.chat import normalize_messages, render_prompt
from spanrl.serving.errors import RequestError
from spanrl.serving.responses import Call, cancel, complete, complete_while_connected

__all__ = ["Finished", "build_call", "finish", "follow", "refuse_set", "sent_text"]

Finished = tuple[list[GenerationResult], dict[str, Any]]
"""The results of a one-choice call and its chat choice (``message``, ``finish_reason``, ``token_ids`` ...)."""


def refuse_set(body: Mapping[str, Any], names: tuple[str, ...], why: str) -> None:
    """A RequestError for the first of ``names`` that ``body`` sets to anything but null / false / empty."""
    for name in names:
        if body.get(name) not in (None, False, {}, [], ""):
            raise RequestError(f"{name} is not supported by this server: {why}", param=name)


def _renamed(exc: RequestError, renames: Mapping[str, str]) -> RequestError:
    name = renames.get(exc.param or "")
    if name is None:
        return exc
    return RequestError(exc.message.replace(exc.param or "", name, 1), param=name, status=exc.status, code=exc.code,
                        type=exc.type)


async def build_call(
    routes: Any,
    request: Request,
    rollout_of: Callable[..., dict[str, Any]],
    *,
    body: Mapping[str, Any],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sampling: dict[str, Any],
    response_id: str,
    renames: Mapping[str, str],
) -> Call:
    """The chat `Call` of a translated request: ``messages`` and ``tools`` in the chat route's shape, ``sampling``
    the chat fields (``temperature``, ``max_completion_tokens``, ``stop``, ``stream``, ``logprobs`` ...); ``body``
    the request as sent, for its conversation id (``metadata``, ``serving/attribution.py``)."""
    start_ns = time.time_ns()
    rollout = rollout_of(request, body)
    try:
        messages = normalize_messages(messages)
        prompt_ids = await routes.tokenize.run(render_prompt, messages, tools)
        params = routes._params(sampling, len(prompt_ids), chat=True)
    except RequestError as exc:
        raise _renamed(exc, renames) from None
    return Call(
        operation=semconv.OP_CHAT,
        response_id=response_id,
        start_ns=start_ns,
        parent=routes.state.recorder.parent_from_headers(request.headers),
        rollout=rollout,
        params=params,
        requests=[GenerationRequest(prompt_ids, params.sampling, n=1, adapter=routes._adapter(body))],
        input_messages=[messages],
        tools=tools,
    )


async def finish(state: Any, call: Call, request: Request) -> Finished:
    """Generate the one choice of ``call`` (its span is recorded before this returns); cancelled when the
    client of ``request`` hangs up first."""
    results, choices = await complete_while_connected(state, call, request.receive)
    return results, choices[0]


async def follow(state: Any, call: Call) -> AsyncIterator[str | Finished]:
    """Text increments while the choice is generated, then its `Finished`. With tools or stop strings no
    increment comes (the text may still become a tool call or be cut): the whole text is in the choice.
    A failed generation raises its RequestError after the increments sent so far."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[int | None] = asyncio.Queue()

    def on_token(_: int, token: int, __: float) -> None:
        loop.call_soon_threadsafe(events.put_nowait, token)

    task = asyncio.ensure_future(complete(state, call, on_token=[on_token]))
    task.add_done_callback(lambda _: events.put_nowait(None))
    held = bool(call.params.sampling.stop or call.tools)
    ids: list[int] = []
    sent = ""
    try:
        while (token := await events.get()) is not None:
            ids.append(token)
            if held:
                continue
            text = state.tokenizer.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd") or len(text) <= len(sent):
                continue
            yield text[len(sent):]
            sent = text
    finally:  # the client hung up: stop generating for it
        cancel(call, task)
    results, choices = task.result()
    yield results, choices[0]


def sent_text(choice: Mapping[str, Any], sent: str) -> str:
    """What of the choice's final content the stream has not sent yet."""
    content = choice["message"]["content"] or ""
    return content[len(sent):] if content.startswith(sent) else content
