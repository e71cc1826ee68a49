"""GRPO on TRL's own loss, fed external rollouts (Shao et al. 2024, arXiv 2402.03300; DAPO arXiv 2503.14476).

TRL's ``GRPOTrainer`` normally owns the loop: it samples completions, scores them with reward functions
and normalises rewards per group into advantages. Here the spanrl Trainer owns the loop and the
advantages come from credit assignment (per transition). So :class:`GRPO` builds one ``GRPOTrainer``
subclass in :meth:`GRPO.setup` (with a placeholder dataset it never iterates) and :meth:`GRPO.update`
converts the transitions into exactly the dict that ``GRPOTrainer._generate_and_score_completions``
returns in TRL 1.16, then runs TRL's ``training_step`` (its ``compute_loss``: every ``loss_type``, the
clipping, the KL term, its metrics) per micro-batch, and clips gradients and steps the optimizer itself.

What TRL sees per micro-batch (B rows, P prompt and C completion positions)::

    prompt_ids, prompt_mask           (B, P) left-padded
    completion_ids, completion_mask   (B, C) right-padded (attention)
    tool_mask                         (B, C) 0 on tool output / template glue (masks: long, from bool)
    advantages                        (B,)   from spanrl's credit assignment; (B, C) for merged calls of their own
    old_per_token_logps               (B, C) the policy server's sampling log-probs: a real ratio
    ref_per_token_logps               (B, C) only when beta > 0
    num_items_in_batch                 token count that the dapo/cispo losses normalise by
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from spanrl.algorithms.batching import bf16_supported, length_sorted_micro_batches, update_autocast
from spanrl.algorithms.distributed import all_reduce_sum, average_gradients, refuse_sharding, world
from spanrl.algorithms.sharding import Sharding, fsdp_requested
from spanrl.algorithms.base import Algorithm
from spanrl.algorithms.grpo_trl import scored_grpo_trainer_class
from spanrl.algorithms.checkpoints import load_checkpoint, load_policy, save_checkpoint, seed_everything
from spanrl.algorithms.tables import (PaddedBatch, check_transitions, fill_missing_logprobs, pad_transitions,
                                      transition_table)
from spanrl.algorithms.lora import LoRAConfig
from spanrl.algorithms.presets import apply_preset, check_loss_fields, unset
from spanrl.hf_compat import checkpoint_activations, checkpointing_args
from spanrl.errors import ConfigError, TrainingError, positive_int, positive_number

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.transitions import TransitionBatch

__all__ = ["GRPO", "GRPOConfig"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
"""TRL 1.16's ``loss_type`` choices, passed through unchanged."""
_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")
_PLACEHOLDER_ROWS = 8


@dataclasses.dataclass
class GRPOConfig:
    """GRPO hyperparameters (TRL's names where TRL has the field)."""

    learning_rate: float = 5e-4
    """AdamW learning rate (5e-4 suits a ~1M-parameter model; 1e-6..1e-5 for real LLMs)."""
    beta: float = unset(0.0)
    """KL coefficient against the initial policy (0 = no reference model, TRL's default)."""
    epsilon: float = unset(0.2)
    """Lower clip range of the importance ratio."""
    epsilon_high: float | None = None
    """Upper clip range (DAPO's clip-higher); None = ``epsilon``."""
    loss_type: str = unset("dapo")
    """TRL's loss aggregation: grpo, bnpo, dr_grpo, dapo, cispo, sapo, luspo, vespo."""
    importance_sampling_level: str = unset("token")
    """``token`` (GRPO) or ``sequence`` (GSPO) importance ratios."""
    preset: str | None = None
    """``gspo`` or ``dr_grpo``: sets every coupled field (``algorithms/presets.py``); None: the fields as given."""
    num_iterations: int = 1
    """Passes over each batch (the ratio moves away from 1 after the first)."""
    mini_batch_size: int | None = None
    """Transitions per optimizer step; None = the whole batch in one step."""
    micro_batch_size: int | None = None
    """Transitions per forward/backward (gradient accumulation); None = the mini-batch."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    temperature: float = 1.0
    """Sampling temperature the old log-probs came from; logits are divided by it."""
    max_completion_length: int = 256
    """Longest completion in tokens (the dr_grpo loss normalises by it)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_scheduler_type: str = "constant"
    """constant, constant_with_warmup, linear or cosine."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up."""
    max_steps: int | None = None
    """Total optimizer steps (needed by the linear and cosine schedules)."""
    use_old_logprobs: bool = True
    """Use the server's log-probs as the old policy; False recomputes them with the current model."""
    lora: LoRAConfig | None = None
    """Train a LoRA adapter (PEFT) instead of all weights."""
    # --- speed (spanrl.algorithms.batching) ---
    bf16: bool | None = None
    """bf16 autocast for the update's forwards and backwards (weights and optimizer stay fp32); None = on
    where bf16 is fast (a CPU with AVX512-BF16 or AMX, a CUDA device with bf16), else off."""
    fp32_lm_head: bool = True
    """Under bf16, project the LM head (the log-probs) in fp32, so the ratio to the server's log-probs
    is not bf16 rounding noise (not with ``lora``: TRL 1.16 cannot cast a PEFT model's head)."""
    length_bucketing: bool = True
    """Sort each mini-batch's rows by length before cutting micro-batches: less compute on padding."""
    skip_zero_advantage: bool = True
    """No forward or backward for rows of advantage 0 (a group whose rewards agree): with dapo, cispo or vespo
    and ``beta`` 0 their losses are 0 and the divisor counts them anyway: the same gradient. One process only."""
    share_prefix: bool = True
    """Run the tokens a micro-batch's rows open with alike (system prompt, question, earlier turns) once, not
    once per row: the same log-probs and gradients, less compute (``algorithms/batching.py``)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them: activation memory from layers
    x tokens down to about one layer's, for ~30% more update compute (turns ``share_prefix`` off)."""

    def __post_init__(self) -> None:
        apply_preset(self)

    def validate(self) -> GRPOConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        positive_number("learning_rate", self.learning_rate)
        positive_number("beta", self.beta, allow_zero=True)
        if not 0 < self.epsilon < 1:
            raise ConfigError(f"epsilon must be in (0, 1), got {self.epsilon!r}")
        positive_number("epsilon_high", self.epsilon_high, optional=True)
        check_loss_fields(self, LOSS_TYPES)  # loss_type, importance_sampling_level, preset and their coupling
        for name in ("num_iterations", "max_completion_length"):
            positive_int(name, getattr(self, name))
        for name in ("bf16", "fp32_lm_head", "length_bucketing", "skip_zero_advantage", "gradient_checkpointing"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "bf16" and value is None):
                allowed = "True, False or None" if name == "bf16" else "True or False"
                raise ConfigError(f"{name} must be {allowed}, got {value!r}")
        for name in ("mini_batch_size", "micro_batch_size", "max_steps"):
            positive_int(name, getattr(self, name), optional=True)
        positive_number("max_grad_norm", self.max_grad_norm, allow_zero=True)
        positive_number("temperature", self.temperature)
        if self.lr_scheduler_type not in _SCHEDULERS:
            raise ConfigError(f"lr_scheduler_type must be one of {_SCHEDULERS}, got {self.lr_scheduler_type!r}")
        if self.lr_scheduler_type in ("linear", "cosine") and self.max_steps is None:
            raise ConfigError(f"lr_scheduler_type={self.lr_scheduler_type!r} needs max_steps")
        if self.lora is not None:
            self.lora.validate()
        return self


class GRPO(Algorithm):
    """Group-relative policy optimisation with TRL's GRPO loss on spanrl transitions.

    ``GRPO(GRPOConfig(...))`` or, equivalently, ``GRPO(learning_rate=..., beta=...)`` with
    :class:`GRPOConfig` field names.
    """

    needs_values: ClassVar[bool] = False
    config_class: ClassVar[type] = GRPOConfig
    supports_distributed: ClassVar[bool] = True
    """Under many processes each rank updates on its shard; gradients are averaged before each step, or
    reduce-scattered by FSDP2 under an FSDP launch (``sharding``)."""

    def __init__(self, config: GRPOConfig | None = None, **fields: Any) -> None:
        super().__init__(config, **fields)
        self.trainer: Any = None
        self.bf16 = False
        """Whether updates run under bf16 autocast: ``config.bf16`` resolved for this machine by setup()."""
        self.sharding: Sharding | None = None
        """FSDP2 over every rank (an FSDP launch with several processes), else None."""
        self.world = 1
        """Training processes, read once by setup() (the process group exists by then): an update calls the
        collectives of ``distributed`` only when there are several, and never re-reads the launch."""

    # --- setup ------------------------------------------------------------------------------------
    def setup(self, *, model_path: Path, output_dir: Path, seed: int = 0) -> None:
        """Load the HF folder ``model_path`` and build the GRPOTrainer, optimizer and scheduler."""
        from datasets import Dataset
        from trl import GRPOConfig as TRLGRPOConfig

        cfg = self.config
        refuse_sharding("GRPO", fsdp=True, lora=cfg.lora is not None)  # before any model is loaded or rollout run
        seed_everything(seed)
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        model, tokenizer = load_policy(model_path)  # TRL wraps it in the LoRA adapter (peft_config below)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.bf16 = cfg.bf16 if cfg.bf16 is not None else bf16_supported(device)
        args = TRLGRPOConfig(
            output_dir=str(output_dir),
            use_cpu=not torch.cuda.is_available(),
            bf16=False,  # autocast is ours (update_autocast): TRL's would also cast generation-time paths
            # TRL 1.16 cannot cast a PEFT model's head (it looks for embed_tokens on the wrong module)
            cast_lm_head_to_fp32=self.bf16 and cfg.fp32_lm_head and cfg.lora is None,
            seed=seed,
            report_to="none",  # metrics are returned; the caller reports them (each key once)
            learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay,
            lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps,
            max_grad_norm=cfg.max_grad_norm,
            beta=cfg.beta, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
            loss_type=cfg.loss_type,
            importance_sampling_level=cfg.importance_sampling_level,
            num_iterations=cfg.num_iterations,
            temperature=cfg.temperature,
            max_completion_length=cfg.max_completion_length,
            per_device_train_batch_size=_PLACEHOLDER_ROWS,
            num_generations=_PLACEHOLDER_ROWS,
            log_completions=False, save_strategy="no", disable_tqdm=True,
            # TRL's default is on; ours is applied below (checkpoint_activations): the args say the same
            **checkpointing_args(TRLGRPOConfig, cfg.gradient_checkpointing),
        )
        placeholder = Dataset.from_dict({"prompt": ["<placeholder>"] * _PLACEHOLDER_ROWS})
        trainer_cls = scored_grpo_trainer_class()
        self.trainer = trainer_cls(
            model=model,
            reward_funcs=_unused_reward,
            args=args,
            train_dataset=placeholder,
            processing_class=tokenizer,
            peft_config=cfg.lora.to_peft() if cfg.lora is not None else None,
        )
        if cfg.gradient_checkpointing:
            checkpoint_activations(self.trainer.model)
        # FSDP2 replaces the parameters with DTensors: shard before the optimizer is built on them.
        self.sharding = Sharding(self.trainer.model) if fsdp_requested() else None
        self.trainer.create_optimizer_and_scheduler(num_training_steps=cfg.max_steps or 1)
        if self.sharding is not None:
            self.sharding.optimizer = self.trainer.optimizer
            self.sharding.gather()  # rank 0 can reload / save before the first update too
        self.trainer.current_gradient_accumulation_steps = 1
        self.trainer.spanrl_share_prefix = cfg.share_prefix
        self.world = world()  # after the trainer: its accelerator initialised the process group
        self.model = self.trainer.model
        self.tokenizer = tokenizer
        self._output_dir = output_dir
        self.seed = seed

    # --- update -----------------------------------------------------------------------------------
    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One policy update: ``num_iterations`` passes of clipped GRPO steps over the batch."""
        if self.model is None:
            raise self._not_set_up()
        cfg, trainer = self.config, self.trainer
        table = transition_table(batch)
        check_transitions(table, vocab_size=self.model.config.vocab_size)
        started = time.perf_counter()
        data = pad_transitions(table, pad_token_id=self.tokenizer.pad_token_id)
        if not cfg.use_old_logprobs:
            data.old_logprobs = None
        data.old_logprobs = self._old_logprobs(data)
        ref_logprobs = self._logprobs(trainer.ref_model or trainer.model, data, ref=True) if cfg.beta else None

        n = table.num_rows
        mini = cfg.mini_batch_size or n
        micro = min(cfg.micro_batch_size or mini, mini)
        prompt_lengths, completion_lengths = data.prompt_mask.sum(1), data.completion_mask.sum(1)
        device = trainer.accelerator.device
        stats: dict[str, list[float]] = {"policy_loss": [], "grad_norm": [], "kl": [0.0, 0.0], "skipped": [0.0]}
        inert = self._zero_advantage_inert()
        for _ in range(cfg.num_iterations):
            order = torch.randperm(n)
            for start in range(0, n, mini):
                rows = order[start : start + mini]
                # Many processes: the divisor is the loss-token count of every rank's mini-batch together.
                (tokens,) = self._sum_over_ranks([float(data.loss_mask[rows].sum())])
                if inert:  # the divisor above still counts them: the gradient is unchanged
                    kept = rows[data.rows_with_advantage()[rows]]
                    stats["skipped"][0] += len(rows) - len(kept)
                    rows = kept
                n_micro = max(1, math.ceil(len(rows) / micro))
                trainer.current_gradient_accumulation_steps = n_micro
                step_loss = 0.0
                parts = length_sorted_micro_batches(rows, prompt_lengths, completion_lengths, micro,
                                                    sort=cfg.length_bucketing)
                # One autocast region per optimizer step: its cache casts each weight to bf16 once, not per micro-batch.
                with update_autocast(self.bf16, device):
                    for part in parts:
                        inputs = self._trl_inputs(data.select(part), ref_logprobs, part, max(tokens, 1.0), n_micro)
                        # TRL's compute_loss already scales for accumulation: the micro losses sum to the step's.
                        step_loss += float(trainer.training_step(trainer.model, inputs, None))
                        kl_sum, kl_tokens = _approx_kl(trainer._spanrl_last_logps, inputs)
                        stats["kl"][0] += kl_sum
                        stats["kl"][1] += kl_tokens
                # Each rank's loss is world x its share of the global loss (TRL's convention, undone by the
                # gradient mean): the mean over ranks is the one-process loss.
                stats["policy_loss"].append(self._sum_over_ranks([step_loss])[0] / self.world)
                stats["grad_norm"].append(self._optimizer_step(zero_grads=not len(rows)))
        if self.sharding is not None:
            self.sharding.gather()  # every rank: full weights (reload, checkpoint) onto rank 0
        self.step += 1
        return self._metrics(stats, data, time.perf_counter() - started)

    def _old_logprobs(self, data: PaddedBatch) -> torch.Tensor:
        """The server's log-probs; unknown rows (retokenized calls) from the current policy, for those rows
        only. Sharded, every rank's forwards are collectives: all rows on every rank when any rank needs some."""
        model = self.trainer.model
        if self.sharding is not None and data.old_logprobs is not None:
            (missing,) = self._sum_over_ranks([float(torch.isnan(data.old_logprobs).any(dim=1).sum())])
            if missing:
                current = self._logprobs(model, data)
                return torch.where(torch.isnan(data.old_logprobs), current, data.old_logprobs)
        return fill_missing_logprobs(data, lambda part: self._logprobs(model, part))

    def _trl_inputs(
        self, part: PaddedBatch, ref_logprobs: torch.Tensor | None, rows: torch.Tensor, tokens: float, n_micro: int
    ) -> dict[str, Any]:
        """Exactly what TRL 1.16's ``_generate_and_score_completions`` returns, for one micro-batch."""
        # Trim the padding columns this micro-batch does not use.
        p_keep = int(part.prompt_mask.sum(0).nonzero().min()) if part.prompt_mask.any() else 0
        c_keep = int(part.completion_mask.sum(0).nonzero().max()) + 1
        device = self.trainer.accelerator.device
        long = lambda mask: mask.to(device=device, dtype=torch.long)  # noqa: E731  TRL 1.16's masks are long
        inputs: dict[str, Any] = {
            "prompt_ids": part.prompt_ids[:, p_keep:].to(device),
            "prompt_mask": long(part.prompt_mask[:, p_keep:]),
            "completion_ids": part.completion_ids[:, :c_keep].to(device),
            # TRL's completion_mask is both the attention mask and the loss mask; tool output and template
            # glue inside an aggregated sample must stay attended, so they go in tool_mask (TRL multiplies).
            "completion_mask": long(part.completion_mask[:, :c_keep]),
            "tool_mask": long(part.loss_mask[:, :c_keep]),
            "advantages": part.loss_advantages(c_keep).to(device),
            "old_per_token_logps": part.old_logprobs[:, :c_keep].to(device),
            # dapo/cispo/vespo divide by num_items_in_batch / num_processes * accumulation_steps /
            # steps_per_generation(=1): this makes each rank's divisor (global mini-batch tokens) / world, and
            # the gradient mean over ranks then gives sum(token losses) / global tokens, as in one process.
            "num_items_in_batch": torch.tensor(tokens / n_micro * self._processes_per_rank(), device=device),
        }
        if ref_logprobs is not None:
            inputs["ref_per_token_logps"] = ref_logprobs[rows][:, :c_keep].to(device)
        return inputs

    def _processes_per_rank(self) -> float:
        """TRL divides the token count by ``accelerator.num_processes``; our ranks are ``self.world``."""
        return self.trainer.accelerator.num_processes / self.world

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        """``values`` summed element-wise over ranks (every rank calls it); alone, ``values`` as they are."""
        return all_reduce_sum(values) if self.world > 1 else values

    @torch.no_grad()
    def _logprobs(self, model: Any, data: PaddedBatch, *, ref: bool = False) -> torch.Tensor:
        """Per-token log-probs (B, C) of the completions under ``model`` (reference: adapters off)."""
        trainer = self.trainer
        device = trainer.accelerator.device
        input_ids = torch.cat([data.prompt_ids, data.completion_ids], dim=1).to(device)
        attention = torch.cat([data.prompt_mask, data.completion_mask], dim=1).to(device=device, dtype=torch.long)
        context = _adapters_off(trainer.model) if ref and trainer.ref_model is None else contextlib.nullcontext()
        with context, update_autocast(self.bf16, device):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                model, input_ids, attention, data.completion_ids.size(1), batch_size=self.config.micro_batch_size
            )
        return logps.float().cpu()

    def _zero_advantage_inert(self) -> bool:
        """Whether rows with advantage 0 add nothing to the gradient (``GRPOConfig.skip_zero_advantage``)."""
        cfg = self.config
        return (cfg.skip_zero_advantage and cfg.beta == 0 and cfg.loss_type in ("dapo", "cispo", "vespo")
                and self.world == 1 and self.sharding is None and not self.trainer._entropy_bonus_enabled
                and self.trainer.top_entropy_quantile == 1.0)

    def _optimizer_step(self, *, zero_grads: bool = False) -> float:
        """Clip, step the optimizer and scheduler, zero the gradients; returns the pre-clip grad norm.
        ``zero_grads``: no row ran (every advantage 0), the step is taken on zero gradients, as it would
        have been (AdamW still moves the weights by its momentum)."""
        trainer = self.trainer
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        if zero_grads:
            for p in params:
                p.grad = torch.zeros_like(p)
        if self.sharding is not None:  # FSDP already reduce-scattered the mean gradient onto each shard
            norm = self.sharding.grad_norm_and_clip(params, self.config.max_grad_norm)
        else:
            if self.world > 1:  # the mean over ranks' shards
                average_gradients(params)
            if self.config.max_grad_norm > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
            else:
                norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        if not math.isfinite(float(norm)):  # a NaN / inf gradient: skip the step, the weights stay (GradScaler's rule)
            trainer.optimizer.zero_grad(set_to_none=True)
            return float(norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.state.global_step += 1
        return float(norm)

    def _metrics(self, stats: dict[str, list[float]], data: PaddedBatch, seconds: float) -> dict[str, float]:
        trl_metrics = {k: sum(v) / len(v) for k, v in self.trainer._metrics["train"].items() if v}
        self.trainer._metrics["train"].clear()
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        # Over every rank's rows that carry loss tokens (shards are padded with inert rows that carry none).
        real = data.loss_mask.sum(1) > 0
        kl_sum, kl_tokens, rows, reward_sum, adv_sum, adv_sq = self._sum_over_ranks(
            [*stats["kl"], float(real.sum()), float(data.rewards[real].sum()),
             float(data.advantages[real].sum()), float(data.advantages[real].square().sum())]
        )
        adv_var = (adv_sq - adv_sum**2 / rows) / (rows - 1) if rows > 1 else 0.0
        metrics = {
            "losses/policy_loss": mean(stats["policy_loss"]),
            "losses/approx_kl": kl_sum / max(kl_tokens, 1.0),
            "losses/clipfrac": trl_metrics.get("clip_ratio/region_mean", 0.0),
            "losses/entropy": trl_metrics.get("entropy", 0.0),
            "charts/learning_rate": float(self.trainer.lr_scheduler.get_last_lr()[0]),
            "charts/grad_norm": mean(stats["grad_norm"]),
            "charts/reward_mean": reward_sum / max(rows, 1.0),
            "charts/advantage_std": math.sqrt(max(adv_var, 0.0)),
            "charts/transitions": rows,
            "charts/skipped_rows": stats["skipped"][0] / self.config.num_iterations,  # per pass
            "charts/update_seconds": seconds,
            "charts/step": float(self.step),
        }
        if self.config.beta:
            metrics["losses/kl_ref"] = trl_metrics.get("kl", 0.0)
        return metrics

    # --- checkpoints ------------------------------------------------------------------------------
    def save(self, checkpoint_dir: Path) -> None:
        """HF folder (merged weights when LoRA, plus the adapter in ``adapter/``) and training state."""
        self.require_setup()
        extra = {"scheduler": self.trainer.lr_scheduler.state_dict(), "global_step": self.trainer.state.global_step}
        model, optimizer = self.trainer.model, self.trainer.optimizer
        if self.sharding is not None:  # rank 0's full copies from the last update's gather
            model, optimizer = self.sharding.saved_model(), self.sharding.saved_optimizer()
        save_checkpoint(self, checkpoint_dir, model=model, optimizer=optimizer, name="grpo", extra=extra)

    def load_state(self, checkpoint_dir: Path) -> None:
        """Restore weights, optimizer, scheduler, RNG and step from :meth:`save`'s folder."""
        self.require_setup()
        model, optimizer = self.trainer.model, self.trainer.optimizer
        if self.sharding is not None:  # every rank reads the full checkpoint and keeps its shard
            model, optimizer = self.sharding.loaded_model(), self.sharding.saved_optimizer()
        state = load_checkpoint(self, checkpoint_dir, model=model, optimizer=optimizer)
        self.trainer.lr_scheduler.load_state_dict(state["scheduler"])
        self.trainer.state.global_step = state["global_step"]

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The plain weights the policy server reloads; sharded, rank 0's full copy from the last update."""
        if self.sharding is not None:
            return self.sharding.weights
        return super().policy_weights()


def _unused_reward(completions: Any, **kwargs: Any) -> list[float]:  # pragma: no cover - never called
    raise TrainingError("spanrl's GRPO takes rewards from transitions, not reward functions")


def _approx_kl(new_logps: torch.Tensor, inputs: dict[str, Any]) -> tuple[float, float]:
    """Schulman's k3 estimator of KL(old || new), ratio - 1 - log ratio, summed over loss tokens; and
    their count (the update reports the token-weighted mean over all micro-batches and ranks)."""
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).float()  # (B, C)
    log_ratio = new_logps - inputs["old_per_token_logps"]  # (B, C)
    kl = (log_ratio.exp() - 1) - log_ratio
    return float((kl * mask).sum()), float(mask.sum())


def _adapters_off(model: Any) -> Any:
    """Context in which a PEFT model acts as its base model (the reference policy)."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
