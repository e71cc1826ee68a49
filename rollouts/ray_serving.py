"""Policy servers as Ray actors (``serving: {placement: ray, replicas: N}``): N transformers-backend
:class:`~spanrl.serving.PolicyServer` s, one per actor, spread over the cluster the rollouts use
(``rollouts.address``); their roots join the Trainer's :class:`~spanrl.rollouts.policy_pool.PolicyPool` as
``serving.urls`` do, so rollouts spread over them and every update reloads each one.

Each replica exports its spans to the Trainer's collector, reloads only from the pool's weights folder
(its ``checkpoint_root``; the nodes must read it: one machine or a shared file system) with a token made for
the run, and samples with its own seed (``seed + 1 + i``: a group's rollouts on two replicas must not draw
the same samples). :meth:`RayServers.close` stops them and the Ray this started.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

from spanrl.errors import ServingError
from spanrl.rollouts import ray_backend
from spanrl.rollouts.rollouts import RolloutsConfig

__all__ = ["RayServers"]

_logger = logging.getLogger(__name__)
_START_TIMEOUT_S = 300.0
_CLOSE_TIMEOUT_S = 30.0


class ServerActor:
    """One policy server in a Ray actor's process; ``root()`` is its URL as the cluster reaches it."""

    def __init__(self, fields: dict[str, Any], reachable: bool) -> None:
        from spanrl.serving import PolicyServer, ServerConfig

        self.reachable = reachable
        self.server = PolicyServer(ServerConfig(**fields, host="0.0.0.0" if reachable else "127.0.0.1", port=0))
        self.server.start()

    def root(self) -> str:
        if not self.reachable:
            return self.server.base_url
        import ray

        return f"http://{ray.util.get_node_ip_address()}:{self.server.port}"

    def shutdown(self) -> None:
        self.server.shutdown()


class RayServers:
    """``serving.replicas`` policy servers of ``model`` as Ray actors; ``roots`` are their URLs."""

    def __init__(self, serving: Any, rollouts: RolloutsConfig, *, model: Path, weights_dir: Path,
                 otlp_endpoint: str | None, served_model_name: str, max_batch_size: int, seed: int,
                 otlp_headers: dict[str, str] | None = None, api_key: str | None = None,
                 prefix_caching: bool = False) -> None:
        self.prefix_caching = prefix_caching  # the transformers backend's prefix cache (off unless asked)
        self.otlp_headers = dict(otlp_headers or {})  # the collector's policy token, when it has one
        self.cluster = ray_backend.Cluster(rollouts)
        self.token = secrets.token_urlsafe(24)
        self.api_keys = {api_key: "trainer"} if api_key else {}  # the Trainer's per-run key (serving/tenants.py)
        self.actors: list[Any] = []
        try:
            self._start(serving, model, weights_dir, otlp_endpoint, served_model_name, max_batch_size, seed)
        except BaseException:
            self.close()
            raise

    def _start(self, serving: Any, model: Path, weights_dir: Path, otlp_endpoint: str | None,
               served_model_name: str, max_batch_size: int, seed: int) -> None:
        import ray

        Path(weights_dir).mkdir(parents=True, exist_ok=True)
        resources = dict(serving.ray_resources)
        options: dict[str, Any] = {
            "num_cpus": resources.pop("CPU", 0), "num_gpus": resources.pop("GPU", 0),
            "scheduling_strategy": "SPREAD", "max_restarts": 0,
            **({"resources": resources} if resources else {}),
        }
        actor_class = ray.remote(ServerActor).options(**options)
        reachable = bool(self.cluster.advertise_host)
        endpoint = self.cluster.url(f"http://{otlp_endpoint}") if otlp_endpoint else None
        for replica in range(serving.replicas):
            fields = {
                "model": str(model), "served_model_name": served_model_name, "otlp_endpoint": endpoint,
                "service_name": f"spanrl-policy-ray-{replica}", "max_batch_size": max_batch_size,
                "enable_prefix_caching": self.prefix_caching,
                "seed": seed + 1 + replica, "backend": serving.backend, "device": serving.device,
                "dtype": serving.dtype, "admin_token": self.token, "checkpoint_root": str(weights_dir),
                "otlp_headers": self.otlp_headers,
                "api_keys": self.api_keys,
            }
            self.actors.append(actor_class.remote(fields, reachable))
        try:
            self.roots: list[str] = ray.get([actor.root.remote() for actor in self.actors], timeout=_START_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise ServingError(f"serving.placement ray: the {serving.replicas} policy servers did not start on "
                               f"the cluster within {_START_TIMEOUT_S:g} s: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        """Stop the servers and their actors, then the Ray this started; safe twice."""
        import ray

        actors, self.actors = self.actors, []
        try:
            if actors:
                ray.wait([a.shutdown.remote() for a in actors], num_returns=len(actors), timeout=_CLOSE_TIMEOUT_S)
        finally:
            for actor in actors:
                ray.kill(actor)
            self.cluster.close()
