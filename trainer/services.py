"""The three services a training run needs, started and stopped together: the collector (span store),
the policy server and the rollout runner (plus in-process tracing for callable agents).

One :class:`contextlib.ExitStack` holds them, so a failure half-way through :meth:`Services.start`
stops what already started, and :meth:`Services.close` stops everything in reverse order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spanrl import env
from spanrl.rollouts.agent_env import ingest_token_env, otlp_headers
from spanrl.store import rollouts as store_rollouts
from spanrl.trust import env_token
from spanrl.trainer.config import LOG_FILE, SERVED_MODEL_NAME, TrainerConfig
from spanrl.rollouts.policy_pool import PolicyPool, ServingConfig
from spanrl.errors import ConfigError
from spanrl.rollouts.runner import RolloutRunner
from spanrl.rollouts.tracing import InProcessTracing

__all__ = ["Services", "start_policy_server"]

_logger = logging.getLogger(__name__)

ReadyFn = Callable[[Sequence[str], int], set]


def start_policy_server(model: Path, *, otlp_endpoint: str | None, max_batch_size: int = 32, seed: int = 0,
                        serving: Any = None, host: str = "127.0.0.1", adapters: dict[str, Path] | None = None,
                        otlp_headers: dict[str, str] | None = None, api_key: str | None = None,
                        prefix_caching: bool = False) -> Any:
    """A started :class:`~spanrl.serving.PolicyServer` for ``model`` on a free local port (backend, device
    and dtype from ``serving``, a :class:`~spanrl.rollouts.policy_pool.ServingConfig`), serving the LoRA
    ``adapters`` (name -> PEFT folder) beside it; with ``api_key``, the only key it takes (tenant ``trainer``);
    ``prefix_caching``: the transformers backend's prefix cache (off: see ``ServerConfig.enable_prefix_caching``)."""
    from spanrl.serving import PolicyServer, ServerConfig

    serving = serving if serving is not None else ServingConfig()
    server = PolicyServer(
        ServerConfig(
            model=str(model),
            served_model_name=SERVED_MODEL_NAME,
            host=host,
            port=0,
            otlp_endpoint=otlp_endpoint,
            otlp_headers=dict(otlp_headers or {}),
            max_batch_size=max_batch_size,
            enable_prefix_caching=prefix_caching,
            seed=seed,
            backend=serving.backend,
            device=serving.device,
            dtype=serving.dtype,
            gpu_memory_utilization=serving.gpu_memory_utilization,
            enable_sleep_mode=serving.enable_sleep_mode,
            lora_modules={name: str(folder) for name, folder in (adapters or {}).items()},
            api_keys={api_key: "trainer"} if api_key else {},
        )
    )
    server.start()
    return server


def _prefix_caching(config: TrainerConfig) -> bool:
    """``serving.prefix_caching`` for the servers the Trainer starts; never in a ``deterministic`` run (a hit
    changes logits' last bits, and which prompt hits is timing)."""
    return config.serving.prefix_caching and not config.deterministic


def _run_log(output_dir: Path) -> Path:
    """The file this process logs to (``spanrl train``'s and ``spanrl demo``'s ``spanrl.log``), else the run's."""
    files = [h.baseFilename for h in logging.getLogger().handlers
             if isinstance(h, logging.FileHandler) and h.baseFilename != os.devnull]  # pytest's is /dev/null
    return Path(files[0]) if files else output_dir / LOG_FILE


_SCOPED = {"ingest_token": env.SPANRL_COLLECTOR_INGEST_TOKEN, "policy_token": env.SPANRL_COLLECTOR_POLICY_TOKEN,
           "read_token": env.SPANRL_COLLECTOR_READ_TOKEN, "admin_token": env.SPANRL_COLLECTOR_ADMIN_TOKEN}


def collector_tokens() -> dict[str, str | None]:
    """The Trainer's collector's tokens (`CollectorConfig` fields): the operator's ``SPANRL_COLLECTOR_*TOKEN``
    (or ``*_TOKEN_FILE``) where set, else one made for this run, in memory only. Every scope is guarded, so
    the collector may bind beyond loopback (``rollouts.advertise_host``); agents get the ingest token, the
    policy servers the policy one; the Trainer reads the store in process."""
    made = {name: env_token(var) or secrets.token_urlsafe(24) for name, var in _SCOPED.items()}
    return {"token": env_token(env.SPANRL_COLLECTOR_TOKEN), **made}


class Services:
    """Collector, policy server and rollout runner of one Trainer; ``close()`` is safe twice."""

    def __init__(self) -> None:
        self.collector: Any = None
        self.collector_tokens: dict[str, str | None] = {}
        self.server: Any = None
        self.runner: RolloutRunner | None = None
        self.api_key = env_token(env.SPANRL_POLICY_API_KEY) or secrets.token_urlsafe(24)
        """The policy servers' API key for this run: the operator's ``SPANRL_POLICY_API_KEY`` (servers in
        ``serving.urls`` take it too), else a new one in memory only. Handed to the agents (``OPENAI_API_KEY``,
        ``llm.api_key``), so no other client can name (or join) this run's rollouts."""
        self._stack = contextlib.ExitStack()

    def start_collector(self, db_path: Path, serving: ServingConfig, *, reachable: bool = False) -> None:
        """The collector first: the algorithm's setup may take a while, spans may already arrive.
        ``reachable``: bind every interface (rollouts on other machines export here)."""
        from spanrl.collector import Collector, CollectorConfig

        host = "0.0.0.0" if reachable else serving.collector_host
        self.collector_tokens = collector_tokens()
        self.collector = Collector(CollectorConfig(db_path=str(db_path), host=host, grpc_port=serving.collector_port,
                                                   http_port=0, **self.collector_tokens))
        self.collector.start()
        self._stack.callback(self._stop, "collector", self.collector.shutdown)

    def start_rest(
        self, *, agent: Any, serve_from: Path, config: TrainerConfig, ready: ReadyFn, output_dir: Path,
        adapters: dict[str, Path] | None = None,
    ) -> None:
        """The policy server on ``serve_from`` (in a pool with the servers the Trainer did not start), the
        runner, and tracing of a callable agent."""
        if config.serving.placement == "process" and config.rollouts.advertise_host:
            raise ConfigError("serving.placement process binds 127.0.0.1, which rollouts on other machines "
                              "(rollouts.advertise_host) cannot reach: use placement ray or serving.urls")
        embedded = start_policy_server(
            serve_from, otlp_endpoint=self.collector.grpc_endpoint,
            max_batch_size=1 if config.deterministic else config.server_max_batch_size,  # batch-invariant logits
            seed=config.seed, serving=config.serving, adapters=adapters,
            host="0.0.0.0" if config.rollouts.advertise_host else "127.0.0.1", otlp_headers=self.policy_headers(),
            api_key=self.api_key, prefix_caching=_prefix_caching(config),
        )
        if adapters and config.serving.placement != "local":
            embedded.shutdown()
            raise ConfigError(f"serving.placement {config.serving.placement}: per-agent adapters are served by the "
                              "Trainer's own server and serving.urls only")
        self._stack.callback(self._stop, "server", embedded.shutdown)
        if config.serving.urls and env_token(env.SPANRL_COLLECTOR_POLICY_TOKEN) is None:
            _logger.warning("serving.urls: this run's collector takes spans only with a token, and its policy token "
                            "was made for this run; servers it did not start need %s set before the run and given "
                            "to them (spanrl serve --collector-token-file)", env.SPANRL_COLLECTOR_POLICY_TOKEN)
        serving, token, started = config.serving, None, None
        if serving.placement == "ray":
            serving, token = self._start_ray_servers(serve_from, config, output_dir / "served-weights")
        elif serving.placement == "process":
            serving, token, started = self._start_process_servers(serve_from, config, output_dir)
        otel_env = self.agent_otel_env()
        if callable(agent):
            InProcessTracing.point_at(otel_env["OTEL_EXPORTER_OTLP_ENDPOINT"], otlp_headers(otel_env))
            self._stack.callback(self._stop, "tracing", lambda: InProcessTracing.point_at(None))
        self.runner = RolloutRunner(agent, config=config.runner, ready=ready, otel_env=otel_env,
                                    flush=self._flush_policy, backend=config.rollouts, api_key=self.api_key,
                                    on_end=functools.partial(store_rollouts.record_ends, self.collector.store))
        self._stack.callback(self._stop, "runner", self.runner.close)
        # Command workers start while the server processes load: their imports (~2 CPU-s each under
        # opentelemetry-instrument) take the core a loading server leaves idle, not the first step's time.
        self.runner.start_agents()
        if started is not None:
            started.wait_ready()
        # The pool last: it asks each of its servers for its version (so the runner's flush reaches it through
        # _flush_policy, bound before the pool exists).
        self.server = PolicyPool(serving, embedded=embedded, weights_dir=output_dir / "served-weights",
                                 model_dir=Path(serve_from), token=token, adapters=adapters,
                                 started=started)

    def _flush_policy(self) -> None:
        """The policy servers' spans out to the collector (the runner's flush before each readiness check)."""
        self.server.force_flush()

    def _start_ray_servers(self, model: Path, config: TrainerConfig, weights_dir: Path) -> tuple[ServingConfig, str]:
        """``serving.replicas`` policy servers as Ray actors (stopped after the runner); the serving config
        with their roots added to ``urls``, and their reload token."""
        from spanrl.rollouts.ray_serving import RayServers

        servers = RayServers(config.serving, config.rollouts, model=Path(model), weights_dir=weights_dir,
                             otlp_endpoint=self.collector.grpc_endpoint, served_model_name=SERVED_MODEL_NAME,
                             max_batch_size=1 if config.deterministic else config.server_max_batch_size,
                             seed=config.seed, prefix_caching=_prefix_caching(config),
                             otlp_headers=self.policy_headers(), api_key=self.api_key)
        self._stack.callback(self._stop, "Ray policy servers", servers.close)
        return dataclasses.replace(config.serving, urls=(*config.serving.urls, *servers.roots)), servers.token

    def _start_process_servers(self, model: Path, config: TrainerConfig, output_dir: Path) -> tuple[Any, ...]:
        """``serving.replicas`` ``spanrl serve`` subprocesses, started (stopped after the runner, output to the
        run's log); the serving config with their roots added to ``urls``, their reload token, and the servers,
        whose ``wait_ready`` the caller calls."""
        from spanrl.rollouts.process_serving import ProcessServers

        servers = ProcessServers(config.serving, model=Path(model), weights_dir=output_dir / "served-weights",
                                 otlp_endpoint=self.collector.grpc_endpoint, served_model_name=SERVED_MODEL_NAME,
                                 max_batch_size=1 if config.deterministic else config.server_max_batch_size,
                                 seed=config.seed, log_path=_run_log(output_dir), threads=config.torch_threads,
                                 api_key=self.api_key, prefix_caching=_prefix_caching(config),
                                 collector_token=self.collector_tokens["policy_token"])
        self._stack.callback(self._stop, "policy server processes", servers.close)
        serving = dataclasses.replace(config.serving, urls=(*config.serving.urls, *servers.roots))
        return serving, servers.token, servers

    def serve_only(self, model: Path, serving: ServingConfig) -> None:
        """Just a policy server (``Trainer.deploy`` after the run closed); a checkpoint of per-agent adapters
        (``adapters/<name>/``, no model of its own) is served as its base plus each adapter."""
        adapters = None
        if not (Path(model) / "config.json").is_file() and (Path(model) / "adapters").is_dir():
            import json

            adapters = {d.name: d for d in sorted((Path(model) / "adapters").iterdir()) if d.is_dir()}
            config = json.loads((next(iter(adapters.values())) / "adapter_config.json").read_text())
            model = Path(config["base_model_name_or_path"])
        self.server = start_policy_server(model, otlp_endpoint=None, serving=serving, adapters=adapters)
        self._stack.callback(self._stop, "server", self.server.shutdown)

    def agent_otel_env(self) -> dict[str, str]:
        """Where agent processes export their spans (the collector's OTLP/gRPC endpoint) and the ingest token
        they send (the only collector token an agent gets)."""
        endpoint = self.collector.grpc_endpoint
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint if "://" in endpoint else f"http://{endpoint}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            **ingest_token_env(self.collector_tokens["ingest_token"], os.environ),
        }

    def policy_headers(self) -> dict[str, str]:
        """The OTLP headers of the policy servers the Trainer starts: the collector's policy token."""
        return {"authorization": f"Bearer {self.collector_tokens['policy_token']}"}

    def close(self) -> None:
        """Stop the runner, tracing, server and collector, in that order (the DuckDB file stays)."""
        try:
            self._stack.close()
        finally:
            self._stack = contextlib.ExitStack()
            self.collector = self.server = self.runner = None

    @staticmethod
    def _stop(name: str, stop: Callable[[], Any]) -> None:
        try:
            stop()
        except Exception:  # closing must go on
            _logger.exception("could not stop the %s", name)
