"""What a rollout is, for the runner and the Trainer: how rollouts run (:class:`RunnerConfig`), a task to
run (:class:`RolloutJob`), one attempt as the agent sees it (:class:`RolloutSpec`, :class:`LLMEndpoint`)
and its outcome (:class:`RolloutResult` with a ``STATUS_*``). The runner itself: ``runner.py``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spanrl import env, semconv
from spanrl.errors import ConfigError, non_negative_int, one_of, positive_int

__all__ = [
    "BACKENDS", "STATUS_CRASHED", "STATUS_NO_REWARD", "STATUS_OK", "STATUS_TIMEOUT", "AgentFn", "LLMEndpoint",
    "RolloutJob", "RolloutResult", "RolloutSpec", "RolloutsConfig", "RunnerConfig", "jobs_of",
]

STATUS_OK = "ok"
STATUS_CRASHED = "crashed"  # the agent raised or its process exited non-zero
STATUS_TIMEOUT = "timeout"  # the agent ran past rollout_timeout_s
STATUS_NO_REWARD = "no_reward"  # the agent finished but no reward reached the store in span_timeout_s

AgentFn = Callable[[Any, "LLMEndpoint"], Any]

BACKENDS = ("local", "ray")
_STRATEGIES = ("SPREAD", "DEFAULT")


@dataclasses.dataclass
class RunnerConfig:
    """How rollouts are run."""

    max_concurrency: int = 8
    """Rollouts in flight at once."""
    rollout_timeout_s: float = 60.0
    """Wall-clock limit of one rollout's agent run; past it the rollout is ``timeout`` (its process killed)."""
    span_timeout_s: float = 10.0
    """After the agent finishes, how long to wait for its reward to be committed in the store."""
    max_attempts: int = 3
    """Attempts per rollout (1 = no retry)."""
    workers: int = 0
    """Command agents: 0 starts one process per rollout; N keeps N workers on the jsonl protocol."""
    instrument: bool = True
    """Prefix a command with ``opentelemetry-instrument`` (unless it already starts with it)."""
    require_token_spans: bool = True
    """A rollout is only ok once a span with completion token ids (from the policy server) is stored."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Extra environment for command agents."""

    def validate(self) -> None:
        positive_int("max_concurrency", self.max_concurrency)
        for name in ("rollout_timeout_s", "span_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        positive_int("max_attempts", self.max_attempts)
        non_negative_int("workers", self.workers)


def settings_of(cls: Any, value: Any, section: str) -> Any:
    """A validated ``cls`` (a settings dataclass with ``validate()``) from itself, a mapping of its fields (the
    YAML's ``section:``) or None; an unknown key or another type is a `ConfigError` naming ``section``."""
    if value is None:
        return cls()
    if isinstance(value, dict):
        fields = {f.name for f in dataclasses.fields(cls)}
        for key in value:
            if key not in fields:
                raise ConfigError(f"{section}.{key} is not a {section} setting; expected one of {sorted(fields)}")
        value = cls(**value)
    if not isinstance(value, cls):
        raise ConfigError(f"{section} must be a mapping of {section} settings, got {type(value).__name__}")
    return value.validate()


@dataclasses.dataclass
class RolloutsConfig:
    """Where rollouts run: on this machine, or as Ray tasks and actors anywhere on a Ray cluster."""

    backend: str = "local"
    """``local`` (processes and threads of the Trainer's machine) or ``ray`` (needs ``spanrl[ray]``)."""
    address: str | None = None
    """Ray: the cluster, as ``ray.init`` takes it (``auto``, ``HEAD_IP:6379``, ``ray://HEAD_IP:10001``);
    None: ``RAY_ADDRESS``, else a Ray started on this machine for the run."""
    resources: dict[str, float] = dataclasses.field(default_factory=lambda: {"CPU": 1})
    """Ray: what one rollout (or one jsonl worker) reserves on its node: ``CPU``, ``GPU``, ``memory``
    (bytes) and custom resources by name (e.g. ``{CPU: 1, sandbox: 1}``)."""
    runtime_env: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Ray: the job's ``runtime_env`` for the agent's own needs (``pip``, ``env_vars``, ``working_dir``,
    ``py_modules``); a callable agent must be importable on the nodes through it (or their image)."""
    namespace: str | None = None
    """Ray: the namespace the driver joins (None: an anonymous one)."""
    scheduling_strategy: str = "SPREAD"
    """Ray: ``SPREAD`` (rollouts spread over the nodes) or ``DEFAULT`` (Ray packs them)."""
    advertise_host: str | None = None
    """Ray: this machine's address as the nodes reach it (its IP or name). With it the Trainer's
    collector and embedded policy server bind ``0.0.0.0``, and rollouts on the nodes get their URLs with
    this host in place of a loopback or wildcard one. None: the nodes share this machine's loopback
    (a cluster on one machine)."""
    start_timeout_s: float = 120.0
    """Ray: how long a rollout may wait for a place on the cluster, on top of ``rollout_timeout_s``;
    past both it is ``timeout`` (its task cancelled)."""

    @classmethod
    def of(cls, value: RolloutsConfig | dict[str, Any] | None) -> RolloutsConfig:
        """A validated RolloutsConfig from itself, a mapping of its fields (the YAML's ``rollouts:``) or None."""
        return settings_of(cls, value, "rollouts")

    def validate(self) -> RolloutsConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        one_of("rollouts.backend", self.backend, BACKENDS)
        if self.scheduling_strategy not in _STRATEGIES:
            raise ConfigError(f"rollouts.scheduling_strategy must be one of {_STRATEGIES}, "
                              f"got {self.scheduling_strategy!r}")
        if not isinstance(self.resources, dict) or any(
            not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 for v in self.resources.values()
        ):
            raise ConfigError(f"rollouts.resources must map resource names to amounts >= 0, got {self.resources!r}")
        if not isinstance(self.runtime_env, dict):
            raise ConfigError(f"rollouts.runtime_env must be a mapping (Ray's runtime_env), got {self.runtime_env!r}")
        if not isinstance(self.start_timeout_s, (int, float)) or self.start_timeout_s <= 0:
            raise ConfigError(f"rollouts.start_timeout_s must be a positive number of seconds, "
                              f"got {self.start_timeout_s!r}")
        return self


@dataclasses.dataclass(frozen=True)
class LLMEndpoint:
    """The LLM a rollout talks to, as given to a callable agent (``agent(task, llm)``)."""

    base_url: str
    """OpenAI base URL for this rollout (``.../rollouts/<rollout_id>/v1``)."""
    model: str
    api_key: str = "spanrl"
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Sampling parameters the trainer asks for, e.g. ``{"temperature": 1.0, "max_tokens": 8}``."""
    prompt_template: str | None = None
    """The prompt template the agent should use (``str.format`` fields filled from the task), or None
    for its own; set by the Trainer (``prompt_template=``, and each candidate APO scores)."""
    agent_models: dict[str, str] = dataclasses.field(default_factory=dict)
    """Per-agent policies: agent name -> the model (adapter) its calls ask for; see :meth:`model_for`."""
    seed: int | None = None
    """The rollout's sampling seed (the policy server already applies it through ``base_url``; an agent may
    seed its own randomness with it); None when the run gives none."""

    def model_for(self, agent: str | None) -> str:
        """The model the calls of ``agent`` ask for: its own adapter with per-agent policies, else ``model``."""
        return self.agent_models.get(agent, self.model) if agent is not None else self.model

    def client(self) -> Any:
        """An ``openai.OpenAI`` client for this endpoint."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)

    def async_client(self) -> Any:
        """An ``openai.AsyncOpenAI`` client for this endpoint."""
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)


@dataclasses.dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: a task (JSON-serialisable) and its id."""

    task_id: str
    task: Any
    seed: int | None = None
    """The rollout's seed (``spanrl.seeding``); each attempt samples with ``derive_seed(seed, attempt)``.
    None: the policy server's own sampler (unseeded)."""


def _task_id(task: Any, index: int) -> str:
    if isinstance(task, Mapping) and task.get("id") is not None:
        return str(task["id"])
    return f"task-{index}"


def jobs_of(tasks: Sequence[Any]) -> list[RolloutJob]:
    """One job per task, ids from ``task["id"]`` or the position; an id seen twice is an error."""
    jobs = [RolloutJob(_task_id(task, i), task) for i, task in enumerate(tasks)]
    seen: set[str] = set()
    for job in jobs:
        if job.task_id in seen:
            raise ConfigError(f"tasks: task id {job.task_id!r} appears twice; ids must be unique")
        seen.add(job.task_id)
    return jobs


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """One attempt of one rollout, as the agent sees it."""

    rollout_id: str
    task_id: str
    task: Any
    attempt: int
    mode: str
    base_url: str
    model: str
    sampling: dict[str, Any]
    prompt_template: str | None = None
    agent_models: dict[str, str] = dataclasses.field(default_factory=dict)
    """Agent name -> model name (per-agent policies); ``SPANRL_MODEL_<AGENT>`` each."""
    api_key: str = "spanrl"
    """The policy server's API key (``OPENAI_API_KEY``; the Trainer's server makes one per run)."""
    seed: int | None = None
    """This attempt's sampling seed, also in ``base_url``; ``SPANRL_SEED`` (None: an unseeded rollout)."""

    def ids(self) -> dict[str, str | int]:
        """The rollout's ids under their span attribute names (``semconv.ROLLOUT_ID`` ...)."""
        return {semconv.ROLLOUT_ID: self.rollout_id, semconv.TASK_ID: self.task_id,
                semconv.ATTEMPT: self.attempt, semconv.MODE: self.mode}

    def message(self) -> dict[str, Any]:
        """The jsonl worker protocol's request line."""
        return dataclasses.asdict(self)

    def environ(self) -> dict[str, str]:
        """The ``SPANRL_*``, ``OPENAI_*`` and ``ANTHROPIC_*`` variables of this rollout (Anthropic's client adds
        ``/v1/messages`` to its base URL itself)."""
        return {
            env.SPANRL_ROLLOUT_ID: self.rollout_id,
            env.SPANRL_TASK_ID: self.task_id,
            env.SPANRL_TASK: json.dumps(self.task),
            env.SPANRL_ATTEMPT: str(self.attempt),
            env.SPANRL_MODE: self.mode,
            env.SPANRL_MODEL: self.model,
            env.SPANRL_SAMPLING: json.dumps(self.sampling),
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": self.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": self.api_key,
            **({env.SPANRL_PROMPT_TEMPLATE: self.prompt_template} if self.prompt_template is not None else {}),
            **{env.agent_model_var(agent): model for agent, model in self.agent_models.items()},
            **({env.SPANRL_SEED: str(self.seed)} if self.seed is not None else {}),
        }


@dataclasses.dataclass
class RolloutResult:
    """What happened to one attempt."""

    rollout_id: str
    task_id: str
    attempt: int
    mode: str
    status: str
    """``ok``, ``crashed``, ``timeout`` or ``no_reward``."""
    duration_s: float
    error: str | None = None
    node: str | None = None
    """The Ray node id the attempt ran on (None: this machine)."""

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK
