"""The Ray rollout backend: each rollout of a command or callable agent runs as a Ray task, and jsonl
workers as a pool of Ray actors, anywhere on the cluster (``RolloutsConfig(backend="ray")``).

These agents have the surface ``runner.RolloutRunner`` drives (``run(spec, timeout_s)``, ``close()``,
``end_reason``), so retries, readiness in the store, the rollout's end and ``rollouts.jsonl`` are the
local runner's. A task gets the environment a local rollout gets, minus this machine's own variables (the
node's are used, plus ``OTEL_*`` and ``SPANRL_*``); what runs there is ``ray_task.py``, shipped by value.
Ray never retries a task itself (``max_retries=0``): a lost node's rollout fails as ``crashed`` and the
runner retries it under a fresh rollout id, so no rollout is trained twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any

from spanrl import env
from spanrl.errors import ConfigError
from spanrl.rollouts import ray_task
from spanrl.rollouts.ray_start import init_ray
from spanrl.rollouts.agent_env import otel_rollout_env, otlp_headers
from spanrl.rollouts.rollouts import STATUS_CRASHED, STATUS_TIMEOUT, RolloutsConfig, RolloutSpec

__all__ = ["RayCallableAgent", "RayCommandAgent", "RayWorkerPool", "advertised", "connect", "node_environment"]

_logger = logging.getLogger(__name__)
_CLOSE_TIMEOUT_S = 10.0
_OWN_PREFIXES = ("OTEL_", "SPANRL_")
_LOCAL_HOSTS = ("127.0.0.1", "0.0.0.0", "localhost", "::1", "::")


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("rollouts.backend 'ray' needs Ray: pip install 'spanrl[ray]'") from None
    return ray


class Cluster:
    """The driver's connection (``ray.init``, unless one is already up) and the options of every task."""

    def __init__(self, cfg: RolloutsConfig) -> None:
        ray = _ray()
        ray.cloudpickle.register_pickle_by_value(ray_task)  # nothing spanrl-specific needed on the nodes
        self.owned = not ray.is_initialized()
        if self.owned:
            init_ray(cfg.address, namespace=cfg.namespace, runtime_env=cfg.runtime_env or None,
                     include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        resources = dict(cfg.resources)
        self.options: dict[str, Any] = {
            "num_cpus": resources.pop("CPU", 0), "num_gpus": resources.pop("GPU", 0),
            "scheduling_strategy": cfg.scheduling_strategy,
            **({"memory": resources.pop("memory")} if "memory" in resources else {}),
            **({"resources": resources} if resources else {}),
        }
        self.start_timeout_s = cfg.start_timeout_s
        self.advertise_host = cfg.advertise_host

    def url(self, url: str) -> str:
        return advertised(url, self.advertise_host)

    def reachable(self, spec: RolloutSpec) -> RolloutSpec:
        return dataclasses.replace(spec, base_url=self.url(spec.base_url))

    def task(self, fn: Any) -> Any:
        return _ray().remote(fn).options(**self.options, max_retries=0)

    async def result(self, ref: Any, timeout_s: float) -> tuple[str, str | None, str | None]:
        """A task's ``(status, error, node)``: a Ray failure (a node lost, a worker killed) is ``crashed``;
        no answer within ``timeout_s`` plus the wait for a place on the cluster is ``timeout`` (cancelled)."""
        ray = _ray()
        try:
            return tuple(await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s + self.start_timeout_s))
        except asyncio.TimeoutError:
            ray.cancel(ref, force=True)
            return STATUS_TIMEOUT, f"no answer from the Ray task within {timeout_s + self.start_timeout_s:g} s", None
        except ray.exceptions.RayError as exc:
            return STATUS_CRASHED, f"the Ray task failed: {_described(ray, exc)}", None

    def close(self) -> None:
        if self.owned:
            _ray().shutdown()


def advertised(url: str, host: str | None) -> str:
    """``url`` as the nodes reach it: a loopback or wildcard host replaced by ``host`` (None: unchanged)."""
    parts = urllib.parse.urlsplit(url)
    if not host or parts.hostname not in _LOCAL_HOSTS:
        return url
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _described(ray: Any, exc: BaseException) -> str:
    """One line: the task's own exception when it raised, else Ray's reason (a node or worker lost)."""
    cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
    if cause is not None:
        exc = cause
    lines = [line for line in str(exc).splitlines() if line.strip() and "\x1b[" not in line]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def connect(cfg: RolloutsConfig) -> Cluster:
    """Join the cluster ``cfg`` names (or start a local Ray); refuses a config that is not ``backend: ray``."""
    if cfg.backend != "ray":
        raise ConfigError(f"rollouts.backend must be 'ray' here, got {cfg.backend!r}")
    return Cluster(cfg)


def node_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Of this machine's environment, what a node's rollouts get on top of the node's own: ``OTEL_*`` and
    ``SPANRL_*`` (not this machine's PATH, HOME or virtual environment)."""
    return {k: v for k, v in environ.items() if k.startswith(_OWN_PREFIXES)}


class RayCommandAgent:
    """One Ray task per rollout, running the command in a fresh working directory on its node."""

    end_reason = "agent_exit"

    def __init__(self, cluster: Cluster, argv: list[str], instrument: bool, node_env: dict[str, str]) -> None:
        self.cluster, self.argv, self.instrument, self.node_env = cluster, argv, instrument, node_env
        self._task = cluster.task(ray_task.run_command)

    async def run(self, spec: RolloutSpec, timeout_s: float) -> tuple[str, str | None, str | None]:
        spec = self.cluster.reachable(spec)
        rollout_env = {**self.node_env, **spec.environ(), **otel_rollout_env(self.node_env, spec.ids())}
        return await self.cluster.result(self._task.remote(self.argv, self.instrument, rollout_env, timeout_s),
                                         timeout_s)

    async def close(self) -> None:
        self.cluster.close()


class RayCallableAgent:
    """One Ray task per rollout of a callable agent (importable on the nodes), its spans to ``endpoint``."""

    end_reason = None  # its spanrl.rollout span is its end

    def __init__(self, cluster: Cluster, fn: Any, endpoint: str, headers: dict[str, str] | None = None) -> None:
        self.cluster, self.endpoint, self.headers = cluster, endpoint, headers
        self._fn = _ray().put(fn)
        self._task = cluster.task(ray_task.run_callable)

    async def run(self, spec: RolloutSpec, timeout_s: float) -> tuple[str, str | None, str | None]:
        ref = self._task.remote(self._fn, self.cluster.reachable(spec).message(), self.endpoint, timeout_s,
                                self.headers)
        return await self.cluster.result(ref, timeout_s)

    async def close(self) -> None:
        self.cluster.close()


class RayWorkerPool:
    """N Ray actors, each holding one long-lived jsonl worker; an actor lost with its node is replaced."""

    end_reason = "agent_done"

    def __init__(self, cluster: Cluster, argv: list[str], instrument: bool, node_env: dict[str, str],
                 workers: int) -> None:
        self.cluster = cluster
        self._args = (argv, instrument, {**node_env, env.SPANRL_AGENT_PROTOCOL: "jsonl"})
        self._actor_class = _ray().remote(ray_task.JsonlWorker).options(**cluster.options, max_restarts=0)
        self.actors: list[Any] = [None] * workers
        self.idle: asyncio.Queue[int] | None = None

    async def run(self, spec: RolloutSpec, timeout_s: float) -> tuple[str, str | None, str | None]:
        if self.idle is None:
            self.idle = asyncio.Queue()
            for slot in range(len(self.actors)):
                self.idle.put_nowait(slot)
        slot = await self.idle.get()
        try:
            if self.actors[slot] is None:
                self.actors[slot] = self._actor_class.remote(*self._args)
            message = self.cluster.reachable(spec).message()
            status, error, node = await self.cluster.result(self.actors[slot].run.remote(message, timeout_s), timeout_s)
            if node is None:  # the actor is lost or stuck: the next rollout on this slot gets a new one
                _ray().kill(self.actors[slot])
                self.actors[slot] = None
            return status, error, node
        finally:
            self.idle.put_nowait(slot)

    async def close(self) -> None:
        ray = _ray()
        live = [actor for actor in self.actors if actor is not None]
        try:
            ray.wait([actor.close.remote() for actor in live], num_returns=len(live), timeout=_CLOSE_TIMEOUT_S)
        finally:
            for actor in live:
                ray.kill(actor)
            self.actors = [None] * len(self.actors)
            self.idle = None
            self.cluster.close()


def ray_agent(agent: Any, *, cluster_config: RolloutsConfig, argv: list[str] | None, instrument: bool,
              node_env: dict[str, str], workers: int, otlp_endpoint: str | None) -> Any:
    """The Ray agent for ``agent``: a callable's tasks, or a command's tasks (``workers`` 0) or actors."""
    cluster = connect(cluster_config)
    try:
        return _agent_on(cluster, agent, argv, instrument, node_env, workers, otlp_endpoint)
    except BaseException:  # a bad agent must not leave the Ray this call started running
        cluster.close()
        raise


def _agent_on(cluster: Cluster, agent: Any, argv: list[str] | None, instrument: bool, node_env: dict[str, str],
              workers: int, otlp_endpoint: str | None) -> Any:
    endpoint_key = "OTEL_EXPORTER_OTLP_ENDPOINT"
    if otlp_endpoint and node_env.get(endpoint_key) == otlp_endpoint:  # the Trainer's collector, not runner.env's
        node_env = {**node_env, endpoint_key: cluster.url(otlp_endpoint)}
    if callable(agent):
        if not otlp_endpoint:
            raise ConfigError("a callable agent on Ray needs the collector's OTLP endpoint "
                              "(OTEL_EXPORTER_OTLP_ENDPOINT in otel_env)")
        return RayCallableAgent(cluster, agent, cluster.url(otlp_endpoint), otlp_headers(node_env))
    assert argv is not None
    if workers:
        return RayWorkerPool(cluster, argv, instrument, node_env, workers)
    return RayCommandAgent(cluster, argv, instrument, node_env)
