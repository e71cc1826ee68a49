"""PPO for LLM agents, CleanRL style (Schulman et al. 2017, arXiv 1707.06347; Huang et al. 2022,
"The 37 implementation details of PPO"; Ouyang et al. 2022 for the LLM setting).

TRL 1.16 no longer ships ``PPOTrainer``. This file is the same clipped objective with a critic, on one
screen, from transformers models and the log-prob head GRPO uses (``batching.completion_logprobs``: the LM
head projects completion positions only, so no (rows x positions x vocabulary) logits are materialised):

- the policy is the causal LM; the critic is ``AutoModelForTokenClassification(num_labels=1)`` loaded
  from the same folder (its backbone, a fresh scalar head), read at the last prompt token: ``V(s)``
  of the state each transition acts from; with ``lora`` it trains a LoRA adapter of its own and its head, so
  its frozen backbone costs one copy of the weights and no AdamW state;
- the Trainer calls :meth:`PPO.values` and the credit module's ``"gae"`` (with this config's ``gamma``
  and ``lam``) turns rewards and values into ``advantages``; then :meth:`PPO.update` uses
  ``returns = advantages + V_old(s)`` as the value target;
- each action is a whole completion; its tokens share the transition's advantage, and tokens with
  ``completion_mask`` 0 (tool output) are excluded from the policy loss.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from spanrl.algorithms import batching
from spanrl.algorithms.base import Algorithm
from spanrl.algorithms.checkpoints import load_checkpoint, load_policy, save_checkpoint, seed_everything
from spanrl.algorithms.tables import (PaddedBatch, check_transitions, fill_missing_logprobs, pad_transitions,
                                      transition_table)
from spanrl.algorithms.lora import LoRAConfig
from spanrl.hf_compat import checkpoint_activations
from spanrl.errors import ConfigError, positive_int, positive_number

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.transitions import TransitionBatch

__all__ = ["PPO", "PPOConfig"]

_CRITIC_DIR = "critic"


@dataclasses.dataclass
class PPOConfig:
    """PPO hyperparameters (CleanRL's names where it has them)."""

    learning_rate: float = 5e-4
    """AdamW learning rate of the policy."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critic; None = ``learning_rate``."""
    epsilon: float = 0.2
    """Clip range of the probability ratio (CleanRL ``clip_coef``)."""
    value_clip: float | None = 0.2
    """Clip range of the value update around the old value; None = unclipped value loss."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    gamma: float = 1.0
    """Discount across the steps of a rollout (read by the credit module's gae)."""
    lam: float = 0.95
    """GAE lambda (read by the credit module's gae)."""
    num_iterations: int = 1
    """Epochs over each batch (CleanRL ``update_epochs``)."""
    mini_batch_size: int | None = None
    """Transitions per optimizer step; None = the whole batch."""
    normalize_advantages: bool = True
    """Whiten advantages per mini-batch."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    target_kl: float | None = None
    """Stop the epochs early once approx_kl exceeds this; None = never."""
    temperature: float = 1.0
    """Sampling temperature the old log-probs came from; logits are divided by it."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lora: LoRAConfig | None = None
    """Train a LoRA adapter on the policy instead of all its weights."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them (policy and critic):
    activation memory from layers x tokens down to about one layer's, for ~30% more update compute."""

    def validate(self) -> PPOConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        for name in ("learning_rate", "temperature"):
            positive_number(name, getattr(self, name))
        positive_number("critic_learning_rate", self.critic_learning_rate, optional=True)
        if not 0 < self.epsilon < 1:
            raise ConfigError(f"epsilon must be in (0, 1), got {self.epsilon!r}")
        positive_number("value_clip", self.value_clip, optional=True)
        for name in ("vf_coef", "ent_coef", "max_grad_norm", "weight_decay"):
            positive_number(name, getattr(self, name), allow_zero=True)
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        positive_int("num_iterations", self.num_iterations)
        positive_int("mini_batch_size", self.mini_batch_size, optional=True)
        if not isinstance(self.gradient_checkpointing, bool):
            raise ConfigError(f"gradient_checkpointing must be True or False, got {self.gradient_checkpointing!r}")
        positive_number("target_kl", self.target_kl, optional=True)
        if self.lora is not None:
            self.lora.validate()
        return self


# --- the objective, as plain tensor functions -----------------------------------------------------
def state_values(critic: Any, data: PaddedBatch) -> torch.Tensor:
    """V(s) (B,): the critic's scalar at the last prompt token (prompts are left-padded)."""
    out = critic(input_ids=data.prompt_ids, attention_mask=data.prompt_mask.long()).logits  # (B, P, 1)
    return out[:, -1, 0].float()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def ppo_loss(
    new_logprobs: torch.Tensor,  # (B, C)
    old_logprobs: torch.Tensor,  # (B, C)
    entropy: torch.Tensor,  # (B, C)
    mask: torch.Tensor,  # (B, C) float, 1 = policy token
    advantages: torch.Tensor,  # (B,)
    new_values: torch.Tensor,  # (B,)
    old_values: torch.Tensor,  # (B,)
    returns: torch.Tensor,  # (B,)
    cfg: PPOConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO objective: clipped policy loss + clipped value loss - entropy bonus."""
    log_ratio = new_logprobs - old_logprobs  # (B, C)
    ratio = log_ratio.exp()
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - log_ratio, mask)  # Schulman's k3 estimator
        clipfrac = masked_mean(((ratio - 1).abs() > cfg.epsilon).float(), mask)
    adv = advantages[:, None]  # (B, 1): every token of a completion shares its transition's advantage
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon)
    pg_loss = masked_mean(torch.max(pg_loss1, pg_loss2), mask)

    v_loss_unclipped = (new_values - returns) ** 2
    if cfg.value_clip is not None:
        v_clipped = old_values + torch.clamp(new_values - old_values, -cfg.value_clip, cfg.value_clip)
        v_loss = 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * v_loss_unclipped.mean()
    entropy_loss = masked_mean(entropy, mask)
    loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
    return loss, {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


# --- the algorithm --------------------------------------------------------------------------------
class PPO(Algorithm):
    """PPO with a critic; advantages come from the credit module's GAE over :meth:`values`.

    ``PPO(PPOConfig(...))`` or ``PPO(learning_rate=..., vf_coef=...)`` with :class:`PPOConfig` fields.
    """

    needs_values: ClassVar[bool] = True
    config_class: ClassVar[type] = PPOConfig

    def __init__(self, config: PPOConfig | None = None, **fields: Any) -> None:
        super().__init__(config, **fields)
        self.critic: Any = None

    def setup(self, *, model_path: Path, output_dir: Path, seed: int = 0) -> None:
        """Load the policy and a critic with the same backbone from ``model_path``; build AdamW."""
        from transformers import AutoModelForTokenClassification
        from transformers.utils import logging as hf_logging

        cfg = self.config
        seed_everything(seed)
        policy, self.tokenizer = load_policy(model_path, lora=cfg.lora)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "score head newly initialized" is expected for the critic
        try:
            self.critic = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
        finally:
            hf_logging.set_verbosity(verbosity)
        torch.nn.init.zeros_(self.critic.score.weight)  # V(s) starts at 0 for every state
        if cfg.lora is not None:  # the critic trains adapters too (and its fresh head): no second full AdamW state
            from peft import get_peft_model

            self.critic = get_peft_model(self.critic, _critic_lora(cfg.lora))
        if cfg.gradient_checkpointing:
            for model in (policy, self.critic):
                checkpoint_activations(model)
        self.model = policy
        self.optimizer = torch.optim.AdamW(
            [
                {"params": [p for p in policy.parameters() if p.requires_grad], "lr": cfg.learning_rate},
                {"params": list(self.critic.parameters()), "lr": cfg.critic_learning_rate or cfg.learning_rate},
            ],
            weight_decay=cfg.weight_decay,
        )
        self.seed = seed
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)

    @torch.no_grad()
    def values(self, batch: TransitionBatch) -> list[float]:
        """The critic's V(s) of each transition's prompt, in batch order (each step, before :meth:`update`)."""
        if self.model is None:
            raise self._not_set_up()
        table = transition_table(batch)
        check_transitions(table, vocab_size=self.model.config.vocab_size)
        self.critic.eval()
        data = pad_transitions(table, pad_token_id=self.tokenizer.pad_token_id)
        return state_values(self.critic, data).tolist()

    def value_map(self, batch: TransitionBatch) -> dict[tuple[str, int], float]:
        """:meth:`values` keyed ``(rollout_id, step)``, as ``load_transitions(values=...)`` takes them for gae."""
        table = transition_table(batch)
        keys = zip(table.column("rollout_id").to_pylist(), table.column("step").to_pylist())
        return dict(zip(keys, self.values(table)))

    def _logprobs(self, data: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (B, C) of each completion token under the policy, 0 on padding (fp32 head)."""
        return batching.padded_logprobs(self.model, data, temperature=self.config.temperature, fp32_head=True,
                                        entropy=True)

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """``num_iterations`` epochs of clipped PPO steps over shuffled mini-batches."""
        if self.model is None:
            raise self._not_set_up()
        cfg = self.config
        table = transition_table(batch)
        check_transitions(table, vocab_size=self.model.config.vocab_size)
        started = time.perf_counter()
        data = pad_transitions(table, pad_token_id=self.tokenizer.pad_token_id)
        with torch.no_grad():
            self.model.eval(), self.critic.eval()
            old_values = state_values(self.critic, data)  # (B,)
            # unknown sampling log-probs (retokenized calls): the current policy's stand in, for those rows only
            data.old_logprobs = fill_missing_logprobs(data, lambda part: self._logprobs(part)[0])
        returns = data.advantages + old_values  # (B,) the GAE value target
        self.model.train(), self.critic.train()

        n = table.num_rows
        mini = cfg.mini_batch_size or n
        logs: dict[str, list[float]] = {}
        for _ in range(cfg.num_iterations):
            order = torch.randperm(n)
            for start in range(0, n, mini):
                rows = order[start : start + mini]
                mb = data.select(rows)
                advantages = mb.advantages
                if cfg.normalize_advantages and len(rows) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                new_logprobs, entropy = self._logprobs(mb)
                new_values = state_values(self.critic, mb)
                loss, info = ppo_loss(
                    new_logprobs, mb.old_logprobs, entropy, mb.loss_mask.float(), advantages,
                    new_values, old_values[rows], returns[rows], cfg,
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                params = [p for group in self.optimizer.param_groups for p in group["params"]]
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or float("inf"))
                # a NaN / inf gradient: the step is skipped, the weights stay (GradScaler's rule)
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                info["grad_norm"] = grad_norm
                for key, value in info.items():
                    logs.setdefault(key, []).append(float(value))
            if cfg.target_kl is not None and logs["approx_kl"][-1] > cfg.target_kl:
                break
        self.step += 1
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        with torch.no_grad():
            explained = 1 - torch.var(returns - old_values) / torch.var(returns) if n > 1 else torch.tensor(0.0)
        metrics = {
            "losses/policy_loss": mean(logs["policy_loss"]),
            "losses/value_loss": mean(logs["value_loss"]),
            "losses/entropy": mean(logs["entropy"]),
            "losses/approx_kl": mean(logs["approx_kl"]),
            "losses/clipfrac": mean(logs["clipfrac"]),
            "losses/explained_variance": float(torch.nan_to_num(explained)),
            "charts/learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            "charts/grad_norm": mean(logs["grad_norm"]),
            "charts/reward_mean": float(data.rewards.mean()),
            "charts/value_mean": float(old_values.mean()),
            "charts/transitions": float(n),
            "charts/update_seconds": time.perf_counter() - started,
            "charts/step": float(self.step),
        }
        return metrics

    def save(self, checkpoint_dir: Path) -> None:
        """Policy as the HF folder, the critic in ``critic/`` (its adapter and head with ``lora``),
        optimizer/RNG/step and the config."""
        checkpoint_dir = save_checkpoint(self, checkpoint_dir, model=self.model, optimizer=self.optimizer, name="ppo")
        self.critic.save_pretrained(checkpoint_dir / _CRITIC_DIR)

    def load_state(self, checkpoint_dir: Path) -> None:
        """Restore policy, critic, optimizer, RNG and step from :meth:`save`'s folder."""
        from transformers import AutoModelForTokenClassification

        load_checkpoint(self, checkpoint_dir, model=self.model, optimizer=self.optimizer)
        folder = Path(checkpoint_dir) / _CRITIC_DIR
        if self.config.lora is not None:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.critic, load_file(str(folder / "adapter_model.safetensors")))
            return
        critic = AutoModelForTokenClassification.from_pretrained(folder, dtype=torch.float32)
        self.critic.load_state_dict(critic.state_dict())


def _critic_lora(lora: LoRAConfig) -> Any:
    """The policy's LoRA settings for the critic, its fresh value head (``score``) trained whole."""
    peft = lora.to_peft()
    peft.task_type, peft.modules_to_save = "TOKEN_CLS", ["score"]
    return peft
