"""The HTTP API: OpenAI-compatible routes on top of the batcher, one span per generated choice.

Routes (each ``/v1/...`` route also lives under the rollout prefixes below)::

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models
    POST /v1/responses (OpenAI Responses, `openai_responses`)   POST /v1/messages (Anthropic, `anthropic_messages`)
    GET  /health                POST /v1/weights/reload {"path": ..., "model": adapter (optional)}
    GET  /metrics               Prometheus text: tokens generated, the prefix cache's counters
    POST /v1/weights/load       whole weights as one safetensors file in the body (application/octet-stream)

    /rollouts/{rollout_id}/v1/...                         attribute the request to a rollout
    /rollouts/{rollout_id}/attempts/{attempt}/v1/...      ... and an attempt
    /tasks/{task_id}/rollouts/{rollout_id}[/attempts/{attempt}]/v1/...
    /rollouts/{rollout_id}/seeds/{seed}/v1/...            ... and seed its calls that name no seed (spanrl.seeding)

Who may do what (docs/architecture.md, "Trust"): every request passes `spanrl.trust.browser_refusal` (a POST
must be ``application/json``, a foreign ``Origin`` is refused, and bound to loopback a non-loopback ``Host``);
``/v1/weights/reload`` needs ``Authorization: Bearer <admin_token>`` and loads only folders under
``checkpoint_root``, local files only (403 when either is not configured, 401 without the token);
``"dry_run": true`` makes every check and loads nothing (the online trainer's check at start).
``/v1/weights/load`` takes the same admin token (403 without one configured; no folder, so no root) and a body of
at most ``max_weights_bytes``, loaded in memory. With API keys
(``api_keys``, ``serving/tenants.py``) every other ``/v1`` route needs ``Authorization: Bearer <key>`` (401), and a
request naming a rollout, conversation or trace id another tenant opened gets 403.

Headers ``x-spanrl-rollout-id``, ``x-spanrl-task-id``, ``x-spanrl-attempt`` do the same (the path wins); a request
with none of them may name its conversation instead (``serving/attribution.py``).

Besides the OpenAI fields, every response carries ``prompt_token_ids`` (top level; a list of lists for
a completions request with several prompts), ``policy_version``, and on each choice ``token_ids`` (the
exact sampled ids, end token included) and ``token_logprobs`` (their logprobs, see ``Completion``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from spanrl.errors import ServingError
from spanrl import semconv
from spanrl.serving.anthropic_messages import create_message
from spanrl.serving.attribution import rollout_of as _rollout_of
from spanrl.serving.backend import GenerationRequest
from spanrl.serving.chat import normalize_messages, normalize_tools, render_prompt
from spanrl.serving.errors import RequestError, error_body
from spanrl.serving.intake import TokenizerPool, read_body_bytes, read_json_body
from spanrl.serving.openai_responses import create_response
from spanrl.serving.protocol import ParsedParams, parse_params
from spanrl.serving.responses import PROVIDER, Call, ServerState, complete_while_connected, respond, stream
from spanrl.serving.tenants import Tenants
from spanrl.trust import Tokens, browser_refusal

__all__ = ["ServerState", "build_app"]

_logger = logging.getLogger(__name__)

_PREFIXES = semconv.ROLLOUT_PATH_PREFIXES

def build_app(state: ServerState) -> FastAPI:
    """The FastAPI application serving ``state``."""
    app = FastAPI(title="spanrl policy server")
    routes = _Routes(state)
    app.state.tokenizer_pool = routes.tokenize
    _add_error_handlers(app)
    for prefix in _PREFIXES:
        app.add_api_route(f"{prefix}/v1/chat/completions", routes.chat_completions, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/completions", routes.completions, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/models", routes.models, methods=["GET"])
        app.add_api_route(f"{prefix}/v1/responses", routes.responses, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/messages", routes.messages, methods=["POST"])
    app.add_api_route("/health", routes.health, methods=["GET"])
    app.add_api_route("/metrics", routes.metrics, methods=["GET"])
    app.add_api_route("/v1/weights/reload", routes.reload, methods=["POST"])
    app.add_api_route(_LOAD_PATH, routes.load_weights, methods=["POST"])
    app.add_middleware(_ApiKeyGuard, tenants=routes.tenants)
    app.add_middleware(_BrowserGuard, bound_host=state.config.host)  # added last: runs first
    return app


_LOAD_PATH = "/v1/weights/load"
# the weight routes have their own admin token; /metrics holds only server-wide counts (as vLLM's)
_KEYLESS_PATHS = ("/health", "/metrics", "/v1/weights/reload", _LOAD_PATH)
# The weights' body is raw safetensors; a browser cannot send that type without a CORS preflight (which fails).
_LOAD_TYPES = ("application/octet-stream",)


class _ApiKeyGuard:
    """ASGI middleware: with API keys configured, a request without a known key gets 401 before its body is read;
    the key's tenant goes to ``request.state.tenant``."""

    def __init__(self, app: Any, *, tenants: Tenants) -> None:
        self.app = app
        self.tenants = tenants

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.tenants.enabled and scope["path"] not in _KEYLESS_PATHS:
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"), None)
            try:
                scope.setdefault("state", {})["tenant"] = self.tenants.tenant_of(header)
            except RequestError as exc:
                body = error_body(exc.message, type=exc.type, code=exc.code)
                await JSONResponse(body, status_code=exc.status, headers={"www-authenticate": "Bearer"})(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BrowserGuard:
    """ASGI middleware: `spanrl.trust.browser_refusal` on every request, answered as an OpenAI error body."""

    def __init__(self, app: Any, *, bound_host: str) -> None:
        self.app = app
        self.bound_host = bound_host

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            types = _LOAD_TYPES if scope["path"] == _LOAD_PATH else ("application/json",)
            refusal = browser_refusal(scope["method"], headers, bound_host=self.bound_host, content_types=types)
            if refusal is not None:
                kind = "permission_error" if refusal[0] == 403 else "invalid_request_error"
                await JSONResponse(error_body(refusal[1], type=kind), status_code=refusal[0])(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _reload_folder(path: Any, root: str | Path) -> str:
    """The folder ``path`` names, resolved, when it and every file in it lie under ``root`` (links followed: a
    link inside the folder to a file outside is refused too); else a `RequestError` that says nothing about
    whether ``path`` exists."""
    base = Path(root).resolve()
    if isinstance(path, str) and path and "\x00" not in path:
        try:
            folder = (base / path).resolve()  # an absolute path replaces base; links are followed before the check
            if folder.is_relative_to(base) and folder.is_dir():
                outside = next((p for p in folder.rglob("*") if not p.resolve().is_relative_to(base)), None)
                if outside is None:
                    return str(folder)
                raise RequestError(f"path: {outside.relative_to(folder)} in the checkpoint folder links out of the "
                                   "server's checkpoint root: refused", param="path")
        except (OSError, RuntimeError):  # a name too long, a symlink loop
            pass
    raise RequestError("path must name a model folder under the server's checkpoint root", param="path")


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as an OpenAI-style body: ours with their status, unexpected ones as 500."""

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, type=exc.type, param=exc.param, code=exc.code),
                            status_code=exc.status)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        _logger.exception("unexpected error serving a request")
        return JSONResponse(error_body(f"internal error: {exc}", type="server_error"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), type=kind), status_code=exc.status_code)


class _Routes:
    """The route handlers of one server, as bound methods (``build_app`` only wires them)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.model_name = state.config.model_name
        self.tokenize = TokenizerPool(state.tokenizer)  # templating and tokenizing off the event loop
        self.tenants = Tenants(state.config.api_keys)

    def rollout(self, request: Request, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The request's rollout attributes (`attribution.rollout_of`), its ids bound to the caller's tenant (403
        when another tenant's), and the tenant recorded on its span."""
        attrs = _rollout_of(request, body)
        tenant = getattr(request.state, "tenant", None)
        self.tenants.bind(tenant, attrs, request.headers)
        return attrs if tenant is None else {**attrs, semconv.TENANT: tenant}

    async def _body(self, request: Request) -> dict[str, Any]:
        body = await read_json_body(request, self.state.config.max_body_bytes)
        self._adapter(body)
        return body

    def _adapter(self, body: dict[str, Any], *, new_ok: bool = False) -> str | None:
        """The LoRA adapter the body's ``model`` names (vLLM's convention), None for the base (or no ``model``);
        404 for a name this server does not serve (``new_ok``: a reload may add an adapter)."""
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise RequestError(f"model must be a string naming a served model, got {type(model).__name__} "
                               f"{model!r:.80}", param="model")
        if model is None or model in (self.model_name, str(self.state.config.model)):
            return None
        if model in self.state.batcher.adapters or (new_ok and isinstance(model, str) and model and "/" not in model):
            return model
        served = ", ".join(repr(n) for n in [self.model_name, *self.state.batcher.adapters])
        raise RequestError(f"The model {model!r} does not exist; this server serves {served}", param="model",
                           status=404, code="model_not_found")

    def _params(self, body: dict[str, Any], prompt_tokens: int, *, chat: bool) -> ParsedParams:
        return parse_params(
            body,
            chat=chat,
            prompt_tokens=prompt_tokens,
            max_context_tokens=self.state.max_context_tokens,
            default_max_tokens=self.state.config.default_max_tokens,
        )

    async def chat_completions(self, request: Request) -> Any:
        state, start_ns = self.state, time.time_ns()
        body = await self._body(request)
        rollout = self.rollout(request, body)
        messages = normalize_messages(body.get("messages"))
        tools = normalize_tools(body.get("tools"))
        prompt_ids = await self.tokenize.run(render_prompt, messages, tools)
        params = self._params(body, len(prompt_ids), chat=True)
        call = Call(
            operation=semconv.OP_CHAT,
            response_id="chatcmpl-" + uuid.uuid4().hex,
            start_ns=start_ns,
            parent=state.recorder.parent_from_headers(request.headers),
            rollout=rollout,
            params=params,
            requests=[GenerationRequest(prompt_ids, params.sampling, n=params.n, adapter=self._adapter(body))],
            input_messages=[messages],
            tools=tools if body.get("tool_choice") != "none" else None,
        )
        if params.stream:
            return StreamingResponse(stream(state, call), media_type="text/event-stream")
        return respond(state, call, *(await complete_while_connected(state, call, request.receive)))

    async def completions(self, request: Request) -> Any:
        state, start_ns = self.state, time.time_ns()
        body = await self._body(request)
        rollout = self.rollout(request, body)
        prompts = await self.tokenize.run(_prompts, body.get("prompt"))
        params = [self._params(body, len(ids), chat=False) for ids, _ in prompts]
        call = Call(
            operation=semconv.OP_TEXT_COMPLETION,
            response_id="cmpl-" + uuid.uuid4().hex,
            start_ns=start_ns,
            parent=state.recorder.parent_from_headers(request.headers),
            rollout=rollout,
            params=params[0],
            requests=[GenerationRequest(ids, p.sampling, n=p.n, adapter=self._adapter(body))
                      for (ids, _), p in zip(prompts, params)],
            input_messages=[[{"role": "user", "content": text}] for _, text in prompts],
        )
        if call.params.stream:
            return StreamingResponse(stream(state, call), media_type="text/event-stream")
        return respond(state, call, *(await complete_while_connected(state, call, request.receive)))

    async def responses(self, request: Request) -> Any:
        return await create_response(self, request, self.rollout)

    async def messages(self, request: Request) -> Any:
        return await create_message(self, request, self.rollout)

    async def models(self) -> dict[str, Any]:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": PROVIDER,
                 "max_model_len": self.state.max_context_tokens, "policy_version": self.state.batcher.version}
        # adapters as vLLM lists its LoRA modules: their own id, the base as parent
        adapters = [dict(model, id=name, parent=self.model_name, root=name, policy_version=version)
                    for name, version in self.state.batcher.adapters.items()]
        return {"object": "list", "data": [model, *adapters]}

    async def health(self) -> dict[str, Any]:
        adapters = self.state.batcher.adapters
        return {"status": "ok", "model": self.model_name, "policy_version": self.state.batcher.version,
                **({"adapters": adapters} if adapters else {})}

    async def metrics(self) -> PlainTextResponse:
        """vLLM's counters, in tokens, under spanrl's prefix: tokens generated, and the prefix cache's (none where
        no prefix cache runs)."""
        backend = self.state.batcher.backend
        cache = getattr(backend, "prefix_cache", None)
        counters = [("generation_tokens", backend.generation_tokens, "Tokens generated, every sequence's.")
                    ] if hasattr(backend, "generation_tokens") else []
        if cache is not None:
            counters += [
                ("prefix_cache_queries", cache.queries, "Prompt tokens looked up in the prefix cache."),
                ("prefix_cache_hits", cache.hits, "Prompt tokens found in the prefix cache (not prefilled)."),
                ("prefill_tokens", cache.prefill_tokens, "Prompt tokens put through the model.")]
        lines = []
        for name, value, text in counters:
            lines += [f"# HELP spanrl:{name}_total {text}", f"# TYPE spanrl:{name}_total counter",
                      f"spanrl:{name}_total {value}"]
        return PlainTextResponse("".join(f"{line}\n" for line in lines), media_type="text/plain; version=0.0.4")

    def _require_admin(self, request: Request, *, folder: bool) -> None:
        """403 unless the weight routes are on (an admin token; ``folder``: and a checkpoint root), 401 without it."""
        config = self.state.config
        if config.admin_token is None or (folder and config.checkpoint_root is None):
            flags = "--admin-token-file and --checkpoint-root" if folder else "--admin-token-file"
            raise RequestError(f"weight reloads over HTTP are off: start the server with {flags}", status=403,
                               type="permission_error")
        if not Tokens.of(admin=config.admin_token).allows(request.headers.get("authorization"), "admin"):
            raise RequestError("missing or wrong admin token (header 'Authorization: Bearer <token>')", status=401,
                               type="authentication_error")

    async def load_weights(self, request: Request) -> dict[str, Any]:
        """Whole weights sent in the body (one safetensors file), loaded in memory: no folder is read or written."""
        self._require_admin(request, folder=False)
        data = await read_body_bytes(request, self.state.config.max_weights_bytes, "max_weights_bytes")
        state = await asyncio.to_thread(_safetensors_of, data)
        try:
            version = await asyncio.wrap_future(self.state.batcher.reload_async(state, None))
        except ServingError as exc:
            raise RequestError(str(exc), param="body") from None
        return {"status": "ok", "policy_version": version, "model": self.model_name}

    async def reload(self, request: Request) -> dict[str, Any]:
        config = self.state.config
        self._require_admin(request, folder=True)
        body = await read_json_body(request, config.max_body_bytes)
        adapter = self._adapter(body, new_ok=True)  # {"model": name}: that adapter's folder (added when new)
        path = _reload_folder(body.get("path"), config.checkpoint_root)
        if body.get("dry_run") is True:  # allowed, and the folder is under the root: say so, load nothing
            return {"status": "ok", "dry_run": True, "policy_version": self.state.batcher.version}
        try:
            version = await asyncio.wrap_future(self.state.batcher.reload_async(path, adapter))
        except ServingError as exc:
            raise RequestError(str(exc), param="path") from None
        return {"status": "ok", "policy_version": version, "model": adapter or self.model_name}


def _safetensors_of(data: bytes) -> dict[str, Any]:
    """The tensors of a safetensors file's bytes; 400 for anything else or for no tensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        state = load(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise RequestError(f"the body is not a safetensors file ({len(data)} bytes): {exc}", param="body") from None
    if not state:
        raise RequestError("the body is a safetensors file with no tensors; send the model's weights", param="body")
    return state


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
                raise RequestError(
                    f"{where} has token ids outside the vocabulary (0..{len(tokenizer) - 1}): {bad[:5]}", param=where
                )

            return list(value), tokenizer.decode(value)
        raise RequestError(f"{where} must be a non-empty string or list of token ids", param=where)

    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [one(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [one(prompt, "prompt")]
