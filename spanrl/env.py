"""Every ``SPANRL_*`` environment variable, declared once.

Precedence everywhere in spanrl: an explicit argument, then the environment variable, then the default.
A bad value is logged with the default that is used instead, then ignored (as the OTel SDK does).
The standard ``OTEL_*`` variables keep their OpenTelemetry meaning and are not redeclared here.

This module imports nothing but the standard library: the agent side reads it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

_logger = logging.getLogger(__name__)

# --- Rollout context: set by the trainer for each agent process it starts --------------------------
SPANRL_ROLLOUT_ID = "SPANRL_ROLLOUT_ID"
"""Id of the rollout this agent process runs; becomes the resource attribute ``spanrl.rollout.id``."""

SPANRL_TASK_ID = "SPANRL_TASK_ID"
"""Id of the task of this rollout; resource attribute ``spanrl.task.id``."""

SPANRL_TASK = "SPANRL_TASK"
"""The task itself, as JSON, for agents started as a command line."""

SPANRL_ATTEMPT = "SPANRL_ATTEMPT"
"""Attempt number of this rollout (1 first, higher after a retry); ``spanrl.rollout.attempt``."""

SPANRL_MODE = "SPANRL_MODE"
"""``train`` or ``val``; resource attribute ``spanrl.rollout.mode``. Default ``train``."""

SPANRL_MODEL = "SPANRL_MODEL"
"""Model name the agent should pass to the OpenAI API (the policy server serves one policy)."""

SPANRL_MODEL_PREFIX = "SPANRL_MODEL_"
"""``SPANRL_MODEL_<AGENT>``: with per-agent policies (``Trainer(policies=...)``), the model name the calls of
agent ``<AGENT>`` pass to the OpenAI API (its LoRA adapter on the policy server); ``<AGENT>`` is the agent's
name upper-cased, each character other than a letter or digit an ``_`` (``agent_model_var``). An agent with
no variable of its own uses ``SPANRL_MODEL``. Read it with ``spanrl.env.agent_model(name)``."""

SPANRL_SEED = "SPANRL_SEED"
"""A seeded run's sampling seed for this rollout attempt (an integer; ``spanrl.seeding``): the policy server
already seeds the rollout's calls with it (through ``OPENAI_BASE_URL``); the agent may seed its own
randomness with it. Absent in an unseeded rollout."""

SPANRL_SAMPLING = "SPANRL_SAMPLING"
"""Sampling parameters the trainer asks the agent to use, as JSON, e.g. ``{"temperature": 1.0}``
(temperature 0 for held-out evaluation)."""

SPANRL_PROMPT_TEMPLATE = "SPANRL_PROMPT_TEMPLATE"
"""The prompt template the trainer asks the agent to use (a ``str.format`` template whose fields the
agent fills from its task), set only when the Trainer has one: ``Trainer(prompt_template=...)`` and
every candidate APO scores. Unset: the agent uses its own prompt. Callable agents get it as
``llm.prompt_template``; jsonl workers as the request's ``prompt_template`` key."""

SPANRL_AGENT_PROTOCOL = "SPANRL_AGENT_PROTOCOL"
"""``jsonl`` when the trainer runs the agent as a long-lived worker: one rollout per stdin line (JSON:
``rollout_id task_id task attempt mode base_url model sampling``), answered by a stdout line
``{"spanrl_done": "<rollout_id>"}`` (with ``"error"`` on failure). Unset: one rollout per process."""

# --- Agent-side instrumentation --------------------------------------------------------------------
SPANRL_OPENLLMETRY_SPEEDUPS = "SPANRL_OPENLLMETRY_SPEEDUPS"
"""``0`` keeps the ``spanrl`` instrumentor from replacing OpenLLMetry's per-call ``asyncio.run`` and
version parsing with cheaper equivalents (``instrumentation/_openllmetry.py``). Default ``1``."""

SPANRL_OPENAI_INSTRUMENTOR = "SPANRL_OPENAI_INSTRUMENTOR"
"""Which OpenAI instrumentor the ``spanrl`` distro loads when both are installed (both would record every
call): ``openllmetry`` (default: ``opentelemetry-instrumentation-openai``) or ``openai-v2`` (the official
``opentelemetry-instrumentation-openai-v2``). Other distros load both; the decomposer then keeps one
client span per call and counts the other (``duplicate_calls``)."""

SPANRL_CAPTURE = "SPANRL_CAPTURE"
"""What the agent side records: ``full`` (default: an LLM span per OpenAI call with messages, usage and
ids, plus tool and reward spans) or ``lean`` (for agents whose calls go to ``spanrl serve``, which records
each call with its token ids: no OpenAI instrumentor is loaded; W3C ``traceparent`` and ``baggage`` on each
request, tool and reward spans); measured side by side in ``docs/measurements.md``."""

# --- Collector and store ---------------------------------------------------------------------------
SPANRL_DB = "SPANRL_DB"
"""Path of the DuckDB span store. Default ``spanrl.duckdb`` in the working directory."""

SPANRL_COLLECTOR_TOKEN = "SPANRL_COLLECTOR_TOKEN"
"""Bearer token granting every collector scope (OTLP, SQL, prune, materialize). Unset: no auth. Agents read
it only when ``SPANRL_COLLECTOR_INGEST_TOKEN`` is unset; the viewer, ``spanrl sql`` and trainers when
``SPANRL_COLLECTOR_READ_TOKEN`` is."""

SPANRL_COLLECTOR_INGEST_TOKEN = "SPANRL_COLLECTOR_INGEST_TOKEN"
"""Collector token granting OTLP export only: what agents are given (their SDK sends it)."""

SPANRL_COLLECTOR_POLICY_TOKEN = "SPANRL_COLLECTOR_POLICY_TOKEN"
"""Collector token of the policy server: OTLP export whose token ids and log-probs are kept (others' are
dropped at ingest once this or ``SPANRL_COLLECTOR_TOKEN`` is set). ``spanrl serve`` sends it."""

SPANRL_COLLECTOR_READ_TOKEN = "SPANRL_COLLECTOR_READ_TOKEN"
"""Collector token granting ``POST /v1/sql`` (the viewer, ``spanrl sql``, trainers reading the store)."""

SPANRL_COLLECTOR_ADMIN_TOKEN = "SPANRL_COLLECTOR_ADMIN_TOKEN"
"""Collector token granting ``POST /v1/prune`` and ``POST /v1/materialize``."""

TOKEN_FILE_SUFFIX = "_FILE"
"""Each ``SPANRL_*_TOKEN`` variable may be given instead as ``SPANRL_*_TOKEN_FILE``, the path of a file holding
the token (Docker's convention for secrets; a file every user can read is refused, as ssh refuses such a key)."""

SPANRL_TASK_FROM = "SPANRL_TASK_FROM"
"""How the store names the task of a rollout that names none (a production conversation), read when the
store is opened (the collector's): ``first_user_message`` (default; a hash of the first user message the
policy server was sent), ``input_messages`` (a hash of all of them) or ``none``."""

TASK_FROM_CHOICES = ("first_user_message", "input_messages", "none")

SPANRL_MESSAGE_REFS = "SPANRL_MESSAGE_REFS"
"""Comma-separated URI prefixes (``gs://bucket/genai/``, ``file:///data/prompts/``) under which the
decomposer reads message content a span keeps elsewhere (``gen_ai.input.messages_ref`` ..., through fsspec).
Unset: none is read (span data names the URI, so reading is opt-in); each unread call is noted per rollout."""

SPANRL_COLLECTOR_HOST = "SPANRL_COLLECTOR_HOST"
"""Address the collector binds. Default ``127.0.0.1``."""

SPANRL_COLLECTOR_GRPC_PORT = "SPANRL_COLLECTOR_GRPC_PORT"
"""OTLP/gRPC port of the collector. Default 4317."""

SPANRL_COLLECTOR_HTTP_PORT = "SPANRL_COLLECTOR_HTTP_PORT"
"""OTLP/HTTP port of the collector (also serves read-only SQL). Default 4318."""

SPANRL_DUCKDB_MEMORY_LIMIT = "SPANRL_DUCKDB_MEMORY_LIMIT"
"""DuckDB buffer memory cap of the collector's store, e.g. ``2GB``. Default ``1GB``. A restart whose WAL
replay needs more opens once without the cap, checkpoints, then applies it."""

SPANRL_DUCKDB_CHECKPOINT_THRESHOLD = "SPANRL_DUCKDB_CHECKPOINT_THRESHOLD"
"""WAL size that triggers a DuckDB checkpoint in the collector, e.g. ``64MB``. Default ``512MB``."""

SPANRL_COLLECTOR_MAX_INFLIGHT_BYTES = "SPANRL_COLLECTOR_MAX_INFLIGHT_BYTES"
"""Bytes of received-but-not-yet-queued request data (bodies and their decoded form) the collector
holds at once; beyond it requests get a retryable 503 / UNAVAILABLE. Default 268435456 (256 MiB)."""

SPANRL_COLLECTOR_SQL_TIMEOUT_S = "SPANRL_COLLECTOR_SQL_TIMEOUT_S"
"""Seconds one ``POST /v1/sql`` query may run before it is interrupted (answered 400). Default 30."""

SPANRL_COLLECTOR_SQL_MAX_ROWS = "SPANRL_COLLECTOR_SQL_MAX_ROWS"
"""Rows one ``POST /v1/sql`` result may have; past it the query stops, answered 400. Default 1000000."""

SPANRL_COLLECTOR_SQL_MAX_BYTES = "SPANRL_COLLECTOR_SQL_MAX_BYTES"
"""Bytes one ``POST /v1/sql`` result may take; past it the query stops, answered 400. Default 268435456 (256 MiB)."""

SPANRL_COLLECTOR_MATERIALIZE_INTERVAL_S = "SPANRL_COLLECTOR_MATERIALIZE_INTERVAL_S"
"""Shortest wait between the collector's background runs keeping finished rollouts decomposed
(store/kept_rollouts.py); ``0``: off. Default 2."""

SPANRL_COLLECTOR_DECODER = "SPANRL_COLLECTOR_DECODER"
"""``python`` makes the collector decode OTLP protobuf bodies with its Python decoder only, not the
compiled fast path (``spanrl.collector._wire``), e.g. to compare the two in ``bench/ingest.py``.
Default ``auto``: the fast path when it is built, the Python decoder for whatever it does not accept."""

SPANRL_SQL_URL = "SPANRL_SQL_URL"
"""Base URL where ``spanrl sql`` (and ``spanrl train --online`` without ``store_url``) looks for a running
collector. Default ``http://127.0.0.1:4318``."""

# --- Policy server ---------------------------------------------------------------------------------
SPANRL_POLICY_URL = "SPANRL_POLICY_URL"
"""Base URL of the policy server (without ``/v1``), e.g. for ``spanrl train --online`` without ``server_url``.
Default ``http://127.0.0.1:8000``."""

SPANRL_POLICY_MAX_BODY_BYTES = "SPANRL_POLICY_MAX_BODY_BYTES"
"""Largest request body the policy server reads; larger ones get 413 before the body is read.
Default 4194304 (4 MiB)."""

SPANRL_POLICY_ADMIN_TOKEN = "SPANRL_POLICY_ADMIN_TOKEN"
"""Token the policy server requires on ``POST /v1/weights/reload`` (the route is off without one); trainers
that reload a running server send it."""

SPANRL_POLICY_API_KEY = "SPANRL_POLICY_API_KEY"
"""The API key the Trainer's agents send its policy servers (``Authorization: Bearer``, as ``OPENAI_API_KEY``)
and its embedded server takes; default: a new key per run, in memory. Set it (or ``SPANRL_POLICY_API_KEY_FILE``)
when ``serving.urls`` lists servers started with ``--api-key-file``: they must know the key the agents send."""

SPANRL_POLICY_CHECKPOINT_ROOT = "SPANRL_POLICY_CHECKPOINT_ROOT"
"""Folder under which the policy server's reload route may load weights (local files only); the route is
off without one."""

SPANRL_PARENT_PID = "SPANRL_PARENT_PID"
"""Set by a Trainer for the ``spanrl serve`` processes it starts: the Trainer's pid. The server stops (as on
SIGTERM) once that process is gone, so a Trainer killed outright leaves no server behind
(``spanrl/parent_watch.py``)."""

SPANRL_CACHE_DIR = "SPANRL_CACHE_DIR"
"""Folder for converted models (GGUF -> Hugging Face) and other caches. Default ``~/.cache/spanrl``."""

# --- Benchmarks ------------------------------------------------------------------------------------
SPANRL_BENCH_RESULTS = "SPANRL_BENCH_RESULTS"
"""Folder where each ``bench/*.py`` script writes its figures as ``<bench>.json`` (``bench/_results.py``),
for ``bench/report.py`` to build the README's comparison table. Unset: the benches write nothing."""

DEFAULT_DB_PATH = "spanrl.duckdb"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_GRPC_PORT = 4317
DEFAULT_HTTP_PORT = 4318
DEFAULT_POLICY_PORT = 8000


def get_str(name: str, default: str | None = None) -> str | None:
    """The variable's value, or ``default`` when it is unset or empty."""
    value = os.environ.get(name, "").strip()
    return value if value else default


def get_int(name: str, default: int) -> int:
    """The variable as an int; a bad value is logged and ``default`` used."""
    raw = get_str(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        _logger.warning("%s=%r is not an integer; using the default %d", name, raw, default)
        return default


def get_float(name: str, default: float) -> float:
    """The variable as a float; a bad value is logged and ``default`` used."""
    raw = get_str(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        _logger.warning("%s=%r is not a number; using the default %s", name, raw, default)
        return default


def get_json(name: str, default: Any = None) -> Any:
    """The variable parsed as JSON; a bad value is logged and ``default`` used."""
    raw = get_str(name)
    if raw is None:
        return default
    try:
        return json.loads(raw)
    except ValueError:
        _logger.warning("%s is not valid JSON; using the default %r", name, default)
        return default


def agent_model_var(agent: str) -> str:
    """The variable naming agent ``agent``'s model: ``SPANRL_MODEL_`` + the name upper-cased, each character
    other than an ASCII letter or digit an ``_`` (``sql-writer`` -> ``SPANRL_MODEL_SQL_WRITER``)."""
    return SPANRL_MODEL_PREFIX + "".join(c if c.isascii() and c.isalnum() else "_" for c in agent.upper())


def agent_model(agent: str, default: str | None = None) -> str | None:
    """The model agent ``agent`` should pass to the OpenAI API: ``SPANRL_MODEL_<AGENT>`` (per-agent policies),
    else ``SPANRL_MODEL``, else ``default``."""
    return get_str(agent_model_var(agent)) or get_str(SPANRL_MODEL, default)
