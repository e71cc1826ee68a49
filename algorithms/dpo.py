"""DPO on best-vs-worst completions of the same prompt, with TRL's ``DPOTrainer``
(Rafailov et al. 2023, arXiv 2305.18290).

Pairs: transitions are grouped by ``(task_id, agent, prompt_ids)`` (DPO compares two answers to the
same prompt; the first call of every rollout of a task shares it). In each group whose rewards differ
by at least ``min_reward_gap``, the highest-reward completion is ``chosen`` and the lowest
``rejected``. Rows are pre-tokenized (``prompt_ids``, ``chosen_ids``, ``rejected_ids``), which TRL's
DPO collator takes as is. The reference policy is the model as loaded in :meth:`DPO.setup`, frozen,
and stays the same across updates; with LoRA it is the base model (adapter disabled).

Known limit: TRL's DPO scores every completion token, so tool output inside an aggregated multi-turn
sample (``completion_mask`` 0) counts in the log-ratio; train DPO on unaggregated transitions.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from spanrl.algorithms.base import Algorithm
from spanrl.algorithms.checkpoints import (load_checkpoint, load_policy, rng_state, save_checkpoint, seed_everything,
                                          set_rng_state)
from spanrl.algorithms.hf_trainer import without_train_start_gc
from spanrl.algorithms.tables import check_transitions, transitions_of
from spanrl.algorithms.lora import LoRAConfig
from spanrl.errors import one_of, positive_int, positive_number
from spanrl.hf_compat import checkpointing_args

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.transitions import Transition, TransitionBatch

__all__ = ["DPO", "DPOConfig", "preference_pairs"]

_logger = logging.getLogger(__name__)
LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard",
    "aot", "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)
"""TRL's DPO ``loss_type`` choices accepted here (passed through)."""


@dataclasses.dataclass
class DPOConfig:
    """DPO hyperparameters (TRL's names)."""

    beta: float = 0.1
    """Strength of the implicit KL constraint to the reference policy."""
    learning_rate: float = 5e-4
    """AdamW learning rate (5e-4 suits a ~1M-parameter model; ~5e-7 for real LLMs)."""
    loss_type: str = "sigmoid"
    """TRL's DPO loss: sigmoid (the paper), hinge, ipo, robust, ..."""
    epochs: int = 1
    """Passes over the pairs per update."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    min_reward_gap: float = 1e-6
    """Smallest reward difference between chosen and rejected that makes a pair."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    lora: LoRAConfig | None = None
    """Train a LoRA adapter instead of all weights (the reference is then the base model)."""

    def validate(self) -> DPOConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        for name in ("beta", "learning_rate", "min_reward_gap"):
            positive_number(name, getattr(self, name))
        one_of("loss_type", self.loss_type, LOSS_TYPES)
        for name in ("epochs", "batch_size"):
            positive_int(name, getattr(self, name))
        positive_number("max_grad_norm", self.max_grad_norm, allow_zero=True)
        if self.lora is not None:
            self.lora.validate()
        return self


def preference_pairs(transitions: Sequence[Transition], min_reward_gap: float) -> list[tuple[Transition, Transition]]:
    """(chosen, rejected): best and worst reward per ``(task_id, agent, prompt_ids)``, gap >= ``min_reward_gap``."""
    groups: dict[tuple[Any, ...], list[Transition]] = {}
    for t in transitions:
        groups.setdefault((t.task_id, t.agent, tuple(t.prompt_ids)), []).append(t)
    pairs = []
    for members in groups.values():
        best = max(members, key=lambda t: t.reward)
        worst = min(members, key=lambda t: t.reward)
        if best.reward - worst.reward >= min_reward_gap:
            pairs.append((best, worst))
    return pairs


def _pretokenized_dpo_trainer_class() -> type:
    """TRL's DPOTrainer, minus its dataset preparation: TRL 1.16 always re-tokenizes text columns, while our
    rows are already ``prompt_ids`` / ``chosen_ids`` / ``rejected_ids``, the exact input of its collator."""
    from trl import DPOTrainer

    class _PretokenizedDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            return dataset

    return _PretokenizedDPOTrainer


class DPO(Algorithm):
    """Direct preference optimisation on TRL's DPOTrainer, pairs built from rewards.

    ``DPO(DPOConfig(...))`` or ``DPO(beta=..., learning_rate=...)`` with :class:`DPOConfig` fields.
    """

    needs_values: ClassVar[bool] = False
    config_class: ClassVar[type] = DPOConfig

    def __init__(self, config: DPOConfig | None = None, **fields: Any) -> None:
        super().__init__(config, **fields)
        self.ref_model: Any = None

    def setup(self, *, model_path: Path, output_dir: Path, seed: int = 0) -> None:
        """Load the policy (and a frozen copy as the reference) from ``model_path``; build AdamW."""
        cfg = self.config
        seed_everything(seed)
        model, self.tokenizer = load_policy(model_path, lora=cfg.lora)  # with LoRA, reference = adapter disabled
        if cfg.lora is None:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = model
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate)
        self.seed = seed
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """Build best-vs-worst pairs from ``batch`` and run ``epochs`` of DPO over them."""
        from datasets import Dataset
        from transformers.trainer_callback import PrinterCallback
        from transformers.trainer_utils import set_seed
        from trl import DPOConfig as TRLDPOConfig

        if self.model is None:
            raise self._not_set_up()
        cfg = self.config
        check_transitions(batch, vocab_size=self.model.config.vocab_size)  # columnar, before any dataclass
        transitions = transitions_of(batch)
        pairs = preference_pairs(transitions, cfg.min_reward_gap)
        started = time.perf_counter()
        metrics = {
            "charts/pairs": float(len(pairs)),
            "charts/reward_mean": sum(t.reward for t in transitions) / len(transitions),
            "charts/learning_rate": cfg.learning_rate,
        }
        if not pairs:
            _logger.info("DPO update %d: no prompt has two completions with different rewards", self.step)
            self.step += 1
            return {**metrics, "losses/dpo_loss": float("nan"), "charts/update_seconds": 0.0}
        rows = {
            "prompt_ids": [list(c.prompt_ids) for c, _ in pairs],
            "chosen_ids": [list(c.completion_ids) for c, _ in pairs],
            "rejected_ids": [list(r.completion_ids) for _, r in pairs],
        }
        args = TRLDPOConfig(
            output_dir=str(self.output_dir),
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            seed=self.seed + self.step,
            report_to="none",  # metrics are returned; the caller reports them (each key once)
            **checkpointing_args(TRLDPOConfig, False),  # TRL's default (on) recomputed every forward
            beta=cfg.beta,
            loss_type=[cfg.loss_type],
            learning_rate=cfg.learning_rate,
            max_grad_norm=cfg.max_grad_norm,
            num_train_epochs=cfg.epochs,
            per_device_train_batch_size=cfg.batch_size,
            max_length=None,
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
        )
        rng = rng_state()  # the HF Trainer reseeds the global RNGs; keep the caller's sequence intact
        set_seed(args.seed)
        trainer = _pretokenized_dpo_trainer_class()(
            model=self.model,
            ref_model=self.ref_model,
            args=args,
            train_dataset=Dataset.from_dict(rows),
            processing_class=self.tokenizer,
            optimizers=(self.optimizer, torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)),
        )
        trainer.remove_callback(PrinterCallback)
        without_train_start_gc(trainer)
        result = trainer.train()
        set_rng_state(rng)
        logs = [h for h in trainer.state.log_history if "loss" in h]
        mean = lambda key: sum(h.get(key, 0.0) for h in logs) / max(len(logs), 1)  # noqa: E731
        self.step += 1
        return {
            **metrics,
            "losses/dpo_loss": float(result.training_loss),
            "charts/reward_accuracy": mean("rewards/accuracies"),
            "charts/reward_margin": mean("rewards/margins"),
            "charts/grad_norm": mean("grad_norm"),
            "charts/update_seconds": time.perf_counter() - started,
        }

    def save(self, checkpoint_dir: Path) -> None:
        """HF folder + optimizer/RNG/step state + the config (the reference is the setup model)."""
        save_checkpoint(self, checkpoint_dir, model=self.model, optimizer=self.optimizer, name="dpo")

    def load_state(self, checkpoint_dir: Path) -> None:
        """Restore weights, optimizer, RNG and step from :meth:`save`'s folder."""
        load_checkpoint(self, checkpoint_dir, model=self.model, optimizer=self.optimizer)
