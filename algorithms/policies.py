"""One policy per agent: one base model, one LoRA adapter per named agent, trained together.

    trainer = Trainer(model="tiny/", agent=..., tasks=..., algorithm=GRPO(learning_rate=5e-4),
                      policies={"writer": AgentPolicy(lora=LoRAConfig(r=8)), "checker": AgentPolicy(),
                                "default": AgentPolicy()})

Each call goes to the policy of its agent (the decomposer's nearest ``invoke_agent`` / ``gen_ai.agent.name``);
a call of an agent with no policy of its own, or of no agent, goes to ``default`` (added when not named).
Each policy is a PEFT LoRA adapter on the one base model (PEFT's multi-adapter model: the base is held
once), with its own AdamW optimizer and learning rate, and its own credit (the rollout's reward, or the
reward named ``reward_name`` when the agent emits one). An update trains each adapter on its agent's calls
only, with only that adapter active, so one agent's calls never change another's adapter. The loss is
GRPO's clipped surrogate (token mean over each adapter's calls, no KL term, one pass).

The policy server serves every adapter beside the base under the adapter's name (``ServerConfig.lora_modules``);
rollouts get each agent's model name as ``SPANRL_MODEL_<AGENT>`` (``spanrl.env.agent_model``). A checkpoint
holds each adapter as a PEFT adapter folder, ``adapters/<name>/``, loadable with
``PeftModel.from_pretrained(base, folder)`` or served with ``spanrl serve --lora-modules name=folder``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import torch

from spanrl.algorithms.base import Algorithm
from spanrl.algorithms.batching import padded_logprobs
from spanrl.algorithms.checkpoints import (CONFIG_FILE, STATE_FILE, config_dict, load_policy, load_state_file,
                                           rng_state, seed_everything, set_rng_state)
from spanrl.algorithms.lora import LoRAConfig
from spanrl.algorithms.tables import (PaddedBatch, check_transitions, fill_missing_logprobs, pad_transitions,
                                      transition_table)
from spanrl.errors import ConfigError, TrainingError, positive_int, positive_number

__all__ = ["AgentPolicy", "MultiLoRA", "MultiLoRAConfig", "per_agent"]

ADAPTERS_DIR = "adapters"
"""Where a checkpoint holds its adapters: ``<checkpoint>/adapters/<name>/`` (PEFT adapter folders)."""
_SERVED_DIR = "served-adapters"


@dataclasses.dataclass
class AgentPolicy:
    """One agent's policy: its adapter and what trains it."""

    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)
    """The agent's LoRA adapter (its ``adapter_name`` is ignored: the adapter is named after the agent)."""
    reward_name: str | None = None
    """Train on the reward of this name (``spanrl.reward.name``) when the agent emits one; None: the credit's."""
    learning_rate: float | None = None
    """This adapter's learning rate; None: the algorithm's."""

    @classmethod
    def of(cls, value: Any, name: str) -> AgentPolicy:
        """An AgentPolicy from itself, None (every default) or a mapping of its fields (the YAML)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"policies.{name} must be a mapping of policy settings, got {type(value).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ConfigError(f"policies.{name}.{unknown[0]} is not a policy setting "
                              f"(valid: {', '.join(sorted(fields))})")
        lora = value.get("lora")
        if isinstance(lora, Mapping):
            lora_fields = {f.name for f in dataclasses.fields(LoRAConfig)}
            bad = sorted(set(lora) - lora_fields)
            if bad:
                raise ConfigError(f"policies.{name}.lora.{bad[0]} is not a LoRA setting "
                                  f"(valid: {', '.join(sorted(lora_fields))})")
            lora = LoRAConfig(**lora)
        return cls(**{**value, "lora": lora or LoRAConfig()})


@dataclasses.dataclass
class MultiLoRAConfig:
    """Per-agent LoRA policies on one base, and the update every adapter shares."""

    policies: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Agent name -> :class:`AgentPolicy` (or a mapping of its fields)."""
    default: str = "default"
    """The policy of calls whose agent has no policy of its own (and of calls of no agent); added if missing."""
    learning_rate: float = 5e-4
    weight_decay: float = 0.0
    epsilon: float = 0.2
    """Clip range of the probability ratio."""
    max_grad_norm: float = 1.0
    """Clip each adapter's gradient norm to this (0: no clipping)."""
    temperature: float = 1.0
    """What the log-probs divide the logits by (the rollouts' sampling temperature)."""
    micro_batch_size: int | None = None
    """Rows per forward/backward pass (gradients accumulate); None: all of an adapter's rows at once."""
    use_old_logprobs: bool = True
    """Use the policy server's log-probs as the old policy's (else the current adapter's, detached)."""

    def validate(self) -> MultiLoRAConfig:
        """Raise ConfigError naming the first bad field; return self (policies as AgentPolicy, default added)."""
        if not isinstance(self.policies, Mapping):
            raise ConfigError(f"policies must map agent names to policy settings, got {type(self.policies).__name__}")
        policies = {str(k): AgentPolicy.of(v, str(k)) for k, v in self.policies.items()}
        if not isinstance(self.default, str) or not self.default:
            raise ConfigError(f"default must name a policy, got {self.default!r}")
        policies.setdefault(self.default, AgentPolicy())
        for name, policy in policies.items():
            if not name or not name.replace("-", "_").replace(".", "_").isidentifier():
                raise ConfigError(f"policies: {name!r} is not an agent name an adapter can take (letters, digits, "
                                  "'_', '-', '.')")
            policy.lora.validate()
            if policy.learning_rate is not None:  # None: the shared learning_rate
                positive_number(f"policies.{name}.learning_rate", policy.learning_rate)
        self.policies = policies
        for field in ("learning_rate", "temperature"):
            positive_number(field, getattr(self, field))
        if not 0 < self.epsilon < 1:
            raise ConfigError(f"epsilon must be in (0, 1), got {self.epsilon!r}")
        positive_int("micro_batch_size", self.micro_batch_size, optional=True)
        return self


def per_agent(algorithm: Any, policies: Mapping[str, Any]) -> MultiLoRA:
    """The :class:`MultiLoRA` that trains ``policies`` with ``algorithm``'s update settings (GRPO's learning
    rate, clip range, temperature ...); ``algorithm`` may be None (every default) or a MultiLoRA already."""
    shared = {f.name for f in dataclasses.fields(MultiLoRAConfig)} - {"policies", "default"}
    if isinstance(algorithm, MultiLoRA):
        return MultiLoRA(dataclasses.replace(algorithm.config, policies=dict(policies)))
    if algorithm is not None and type(algorithm).__name__ != "GRPO":
        raise ConfigError(f"policies: per-agent adapters train with GRPO's loss; the algorithm is "
                          f"{type(algorithm).__name__} (use GRPO, or no policies)")
    config = getattr(algorithm, "config", None)
    if ignored := _set_beyond(config, shared):  # silently trained without them otherwise (a loss, a preset, ...)
        named = ", ".join(f"{k}={v!r}" for k, v in ignored.items())
        raise ConfigError(f"policies: per-agent adapters train with their own GRPO loss, which takes "
                          f"{', '.join(sorted(shared))} from the algorithm; it would ignore {named}: remove them, "
                          f"or train without policies")
    fields = {k: getattr(config, k) for k in shared if hasattr(config, k)}
    return MultiLoRA(MultiLoRAConfig(policies=dict(policies), **fields))


def _set_beyond(config: Any, shared: set[str]) -> dict[str, Any]:
    """The fields of the algorithm's ``config`` (a dataclass, or None) outside ``shared`` set away from their
    defaults."""
    if not dataclasses.is_dataclass(config):
        return {}
    out = {}
    for f in dataclasses.fields(config):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name not in shared and getattr(config, f.name) != default:
            out[f.name] = getattr(config, f.name)
    return out


class MultiLoRA(Algorithm):
    """Per-agent LoRA adapters on one base model; see the module docstring."""

    needs_values: ClassVar[bool] = False
    config_class: ClassVar[type] = MultiLoRAConfig

    def __init__(self, config: MultiLoRAConfig | None = None, **fields: Any) -> None:
        super().__init__(config, **fields)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.serving_adapters: dict[str, Path] = {}
        """Adapter name -> PEFT folder the policy server starts with (written by setup, a resume's after load)."""
        self._base_path = Path()

    @property
    def names(self) -> list[str]:
        """The adapters, one per policy."""
        return list(self.config.policies)

    def policy_of(self, agent: str | None) -> str:
        """The policy that trains (and serves) the calls of ``agent``."""
        return agent if agent in self.config.policies else self.config.default

    def rollout_models(self) -> tuple[str, dict[str, str]]:
        """The model an agent's calls must ask for: (the default policy's, {agent: its adapter's name})."""
        return self.config.default, {name: name for name in self.names if name != self.config.default}

    # --- setup ------------------------------------------------------------------------------------
    def setup(self, *, model_path: Path, output_dir: Path, seed: int = 0) -> None:
        """Load the base once, add one adapter per policy, one optimizer each; save the adapters to serve."""
        from peft import get_peft_model

        seed_everything(seed)
        self._base_path = Path(model_path).resolve()
        base, self.tokenizer = load_policy(Path(model_path))
        first, *rest = self.names
        self.model = get_peft_model(base, self._peft_config(first), adapter_name=first)
        for name in rest:
            self.model.add_adapter(name, self._peft_config(name))
        for name in self.names:
            params = self._params(name)
            for p in params:
                p.requires_grad_(True)
            lr = self.config.policies[name].learning_rate or self.config.learning_rate
            self.optimizers[name] = torch.optim.AdamW(params, lr=lr, weight_decay=self.config.weight_decay)
        self.seed = seed
        self.serving_adapters = {n: self.save_adapter(n, Path(output_dir) / _SERVED_DIR / n) for n in self.names}

    def _peft_config(self, name: str) -> Any:
        return self.config.policies[name].lora.to_peft()

    def _params(self, name: str) -> list[torch.nn.Parameter]:
        """Adapter ``name``'s own parameters (PEFT names them ``...lora_A.<name>.weight``)."""
        return [p for n, p in self.model.named_parameters() if ".lora_" in n and f".{name}." in n]

    def save_adapter(self, name: str, folder: Path) -> Path:
        """Adapter ``name`` as a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        config = dataclasses.replace(self.model.peft_config[name], base_model_name_or_path=str(self._base_path))
        config.save_pretrained(str(folder))  # the base it adapts, as PEFT records it
        state = {k: v.detach().cpu().contiguous() for k, v in self.adapter_state(name).items()}
        save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        return folder

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name``'s weights as PEFT saves them (what the policy server reloads)."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.model, adapter_name=name)

    # --- update -----------------------------------------------------------------------------------
    def update(self, batch: Any) -> dict[str, float]:
        """One clipped policy-gradient step per adapter, each on its own agents' calls only."""
        if self.model is None:
            raise self._not_set_up()
        table = transition_table(batch)
        check_transitions(table, vocab_size=self.model.config.vocab_size)
        started = time.perf_counter()
        routes = np.array([self.policy_of(a) for a in table.column("agent").to_pylist()], dtype=object)
        metrics: dict[str, float] = {}
        losses: list[float] = []
        for name in self.names:
            rows = np.flatnonzero(routes == name)
            if not len(rows):
                continue
            data = pad_transitions(table.take(pa.array(rows)), pad_token_id=self.tokenizer.pad_token_id)
            stats = self._update_adapter(name, data)
            losses.append(stats["policy_loss"])
            metrics.update({f"agents/{name}/{k}": v for k, v in stats.items()})
        self.step += 1
        metrics.update({"losses/policy_loss": sum(losses) / len(losses) if losses else 0.0,
                        "charts/transitions": float(table.num_rows),
                        "charts/update_seconds": time.perf_counter() - started, "charts/step": float(self.step)})
        return metrics

    def _update_adapter(self, name: str, data: PaddedBatch) -> dict[str, float]:
        cfg, optimizer = self.config, self.optimizers[name]
        self.model.set_adapter(name)  # only this adapter in the forward pass: the others get no gradient
        self.model.train()
        if not cfg.use_old_logprobs:
            data.old_logprobs = None
        with torch.no_grad():
            old = fill_missing_logprobs(data, lambda part: self._logprobs(part)[0])
        n, micro = data.advantages.shape[0], cfg.micro_batch_size or data.advantages.shape[0]
        tokens = max(float(data.loss_mask.sum()), 1.0)
        loss_sum = clipped = 0.0
        for start in range(0, n, micro):
            part = data.select(slice(start, start + micro))
            logps, mask = self._logprobs(part)
            ratio = torch.exp(logps - old[start : start + micro])
            adv = part.loss_advantages(part.completion_ids.shape[1])
            adv = adv[:, None] if adv.dim() == 1 else adv  # (B, 1) or (B, C)
            surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.epsilon, 1 + cfg.epsilon) * adv)
            loss = -(surrogate * mask).sum() / tokens  # the token mean over all of the adapter's rows
            loss.backward()
            loss_sum += float(loss.detach())
            clipped += float((((ratio - 1).abs() > cfg.epsilon) & mask).sum())
        params = self._params(name)
        if cfg.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None])))
        if math.isfinite(norm):  # a NaN / inf gradient: skip the step, the adapter stays
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        real = data.loss_mask.sum(1) > 0
        mean = lambda x: float(x[real].mean()) if real.any() else 0.0  # noqa: E731
        return {"policy_loss": loss_sum, "grad_norm": norm, "clipfrac": clipped / tokens,
                "transitions": float(real.sum()), "reward_mean": mean(data.rewards),
                "advantage_mean": mean(data.advantages)}

    def _logprobs(self, data: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (B, C) of the completions under the active adapter, and the loss mask."""
        logps, _ = padded_logprobs(self.model, data, temperature=self.config.temperature, fp32_head=False,
                                   entropy=False)
        return logps, data.loss_mask

    def load_batch(self, store: Any, credit: Any, rollout_ids: list[str], *, agents: list[str] | None = None,
                   running: Any = None) -> Any:
        """The step's transitions, each agent's with its own credit: the credit as given, or with its policy's
        ``reward_name`` (a rollout without that reward is treated as the credit's ``missing_reward`` says).
        Every agent's rows (``agents`` must be None: the Trainer refuses ``agent_name`` with policies); no
        ``running`` baseline (the online trainer trains GRPO only)."""
        if agents is not None or running is not None:
            raise TrainingError("per-agent policies load every agent's rows, without a running baseline")
        from spanrl.algorithms.transitions import TransitionBatch, load_training_batch

        by_reward: dict[str | None, set[str]] = {}
        for name, policy in self.config.policies.items():
            by_reward.setdefault(policy.reward_name, set()).add(name)
        if list(by_reward) == [None]:
            return load_training_batch(store, self, credit=credit, rollout_ids=rollout_ids)
        tables, first = [], None
        for reward_name, names in by_reward.items():
            own = credit if reward_name is None else dataclasses.replace(credit, reward_name=reward_name)
            batch = load_training_batch(store, self, credit=own, rollout_ids=rollout_ids)
            first = first if first is not None and reward_name is not None else batch  # the rollout reward's report
            table = batch.to_arrow()
            keep = [self.policy_of(agent) in names for agent in table.column("agent").to_pylist()]
            tables.append(table.filter(pa.array(keep, pa.bool_())))
        return TransitionBatch(pa.concat_tables(tables), first.report, first.rewards_by_rollout)

    # --- serving ----------------------------------------------------------------------------------
    def push_weights(self, server: Any, *, in_place: bool = True) -> dict[str, Any]:
        """Reload every adapter into ``server`` (a PolicyPool or PolicyServer), by its state whether or not
        ``in_place``; the history row's versions."""
        versions = {name: server.reload(self.adapter_state(name), adapter=name) for name in self.names}
        row: dict[str, Any] = {f"agents/{name}/policy_version": v for name, v in versions.items()}
        row["policy_version"] = versions[self.config.default]
        return row

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """Refused: per-agent policies are served as adapters (``push_weights``), not as one merged model."""
        raise TrainingError("per-agent policies have no single set of weights; each adapter reloads on its own")

    # --- checkpoints ------------------------------------------------------------------------------
    def save(self, checkpoint_dir: Path) -> None:
        """``adapters/<name>/`` PEFT folders, the optimizers, RNG and step, and the resolved config."""
        self.require_setup()
        checkpoint_dir = Path(checkpoint_dir)
        for name in self.names:
            bad = [k for k, t in self.adapter_state(name).items() if not bool(torch.isfinite(t).all())]
            if bad:  # never NaN weights on disk: the last good checkpoint stays the newest
                raise TrainingError(f"not saving {checkpoint_dir}: adapter {name!r} weight {bad[0]} is not finite")
        for name in self.names:
            self.save_adapter(name, checkpoint_dir / ADAPTERS_DIR / name)
        self.tokenizer.save_pretrained(checkpoint_dir)
        state = {"optimizers": {n: o.state_dict() for n, o in self.optimizers.items()}, "rng": rng_state(),
                 "step": self.step}
        torch.save(state, checkpoint_dir / STATE_FILE)
        config = {"algorithm": "multi_lora", "seed": self.seed, "config": config_dict(self.config)}
        (checkpoint_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str))

    def load_state(self, checkpoint_dir: Path) -> None:
        """Restore every adapter, optimizer, the RNGs and the step from :meth:`save`'s folder."""
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        self.require_setup()
        checkpoint_dir = Path(checkpoint_dir)
        if not (checkpoint_dir / STATE_FILE).exists():
            raise TrainingError(f"{checkpoint_dir} has no {STATE_FILE}: not a spanrl checkpoint")
        state = load_state_file(checkpoint_dir / STATE_FILE)
        saved = set(state.get("optimizers", {}))
        if saved != set(self.names):
            raise TrainingError(f"{checkpoint_dir} holds the policies {sorted(saved)}, this run has {self.names}")
        for name in self.names:
            folder = checkpoint_dir / ADAPTERS_DIR / name
            set_peft_model_state_dict(self.model, load_peft_weights(str(folder), device="cpu"), adapter_name=name)
            self.optimizers[name].load_state_dict(state["optimizers"][name])
            self.serving_adapters[name] = folder
        set_rng_state(state["rng"])
        self.step = state["step"]
