"""Supervised fine-tuning on selected transitions with TRL's ``SFTTrainer``.

Two uses: rejection-sampling fine-tuning (RFT / "expert iteration", Zelikman et al. 2022 STaR,
arXiv 2203.14465; Dong et al. 2023 RAFT, arXiv 2304.06767): keep the transitions whose reward reaches
``reward_threshold`` and imitate them; and demonstrations (``reward_threshold=None``: every transition).

Each transition becomes one pre-tokenized row: ``input_ids = prompt_ids + completion_ids`` and
``completion_mask = [0]*len(prompt) + transition.completion_mask``, with TRL's ``completion_only_loss``,
so the loss covers exactly the policy-generated tokens (not the prompt, not tool output). Each update
runs a fresh ``SFTTrainer`` over the selection for ``epochs`` epochs with one AdamW kept across updates
(and checkpoints).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from spanrl.algorithms.base import Algorithm
from spanrl.algorithms.checkpoints import (load_checkpoint, load_policy, rng_state, save_checkpoint, seed_everything,
                                          set_rng_state)
from spanrl.algorithms.hf_trainer import without_train_start_gc
from spanrl.algorithms.tables import check_transitions, transitions_of
from spanrl.algorithms.lora import LoRAConfig
from spanrl.errors import ConfigError, positive_int, positive_number
from spanrl.hf_compat import checkpointing_args

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.transitions import Transition, TransitionBatch

__all__ = ["SFT", "SFTConfig", "select_transitions"]

_logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SFTConfig:
    """SFT hyperparameters."""

    learning_rate: float = 5e-4
    """AdamW learning rate."""
    epochs: int = 1
    """Passes over the selected transitions per update."""
    batch_size: int = 16
    """Transitions per optimizer step."""
    reward_threshold: float | None = 0.5
    """Keep transitions with reward >= this (rejection sampling); None = all (demonstrations)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lora: LoRAConfig | None = None
    """Train a LoRA adapter instead of all weights."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them: activation memory from layers
    x tokens down to about one layer's, for ~30% more update compute (TRL's SFTConfig turns it on by default)."""

    def validate(self) -> SFTConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        positive_number("learning_rate", self.learning_rate)
        for name in ("epochs", "batch_size"):
            positive_int(name, getattr(self, name))
        for name in ("max_grad_norm", "weight_decay"):
            positive_number(name, getattr(self, name), allow_zero=True)
        if not isinstance(self.gradient_checkpointing, bool):
            raise ConfigError(f"gradient_checkpointing must be True or False, got {self.gradient_checkpointing!r}")
        if self.lora is not None:
            self.lora.validate()
        return self


def select_transitions(transitions: Sequence[Transition], reward_threshold: float | None) -> list[Transition]:
    """The transitions SFT imitates: reward >= ``reward_threshold`` (all when it is None)."""
    if reward_threshold is None:
        return list(transitions)
    return [t for t in transitions if t.reward >= reward_threshold]


class SFT(Algorithm):
    """Rejection-sampling fine-tuning / demonstrations on TRL's SFTTrainer (completion-only loss).

    ``SFT(SFTConfig(...))`` or ``SFT(learning_rate=..., reward_threshold=...)`` with :class:`SFTConfig` fields.
    """

    needs_values: ClassVar[bool] = False
    config_class: ClassVar[type] = SFTConfig

    def setup(self, *, model_path: Path, output_dir: Path, seed: int = 0) -> None:
        """Load the HF folder ``model_path``; build the AdamW kept across updates."""
        cfg = self.config
        seed_everything(seed)
        model, self.tokenizer = load_policy(model_path, lora=cfg.lora)
        self.model = model
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        self.seed = seed
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """Fine-tune on the selected transitions of ``batch`` for ``epochs`` epochs."""
        from datasets import Dataset
        from transformers.trainer_callback import PrinterCallback
        from transformers.trainer_utils import set_seed
        from trl import SFTConfig as TRLSFTConfig
        from trl import SFTTrainer

        if self.model is None:
            raise self._not_set_up()
        cfg = self.config
        check_transitions(batch, vocab_size=self.model.config.vocab_size)  # columnar, before any dataclass
        transitions = transitions_of(batch)
        chosen = select_transitions(transitions, cfg.reward_threshold)
        started = time.perf_counter()
        metrics = {
            "charts/selected": float(len(chosen)),
            "charts/selected_fraction": len(chosen) / len(transitions),
            "charts/reward_mean": sum(t.reward for t in transitions) / len(transitions),
            "charts/learning_rate": cfg.learning_rate,
        }
        if not chosen:
            _logger.info("SFT update %d: no transition has reward >= %s; nothing to learn", self.step,
                         cfg.reward_threshold)
            self.step += 1
            return {**metrics, "losses/sft_loss": float("nan"), "charts/grad_norm": 0.0, "charts/update_seconds": 0.0}
        rows = {
            "input_ids": [list(t.prompt_ids) + list(t.completion_ids) for t in chosen],
            "completion_mask": [[0] * len(t.prompt_ids) + list(t.completion_mask) for t in chosen],
        }
        args = TRLSFTConfig(
            output_dir=str(self.output_dir),
            use_cpu=not torch.cuda.is_available(),
            bf16=False,
            seed=self.seed + self.step,
            report_to="none",  # metrics are returned; the caller reports them (each key once)
            learning_rate=cfg.learning_rate,
            max_grad_norm=cfg.max_grad_norm,
            **checkpointing_args(TRLSFTConfig, cfg.gradient_checkpointing),  # TRL defaults to on: each forward twice
            num_train_epochs=cfg.epochs,
            per_device_train_batch_size=cfg.batch_size,
            completion_only_loss=True,
            max_length=None,
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            dataset_num_proc=None,
        )
        rng = rng_state()  # SFTTrainer reseeds the global RNGs; keep the caller's sequence intact
        set_seed(args.seed)
        trainer = SFTTrainer(
            model=self.model,
            args=args,
            train_dataset=Dataset.from_dict(rows),
            processing_class=self.tokenizer,
            optimizers=(self.optimizer, torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)),
        )
        trainer.remove_callback(PrinterCallback)  # metrics go to the caller, not stdout
        without_train_start_gc(trainer)
        result = trainer.train()
        set_rng_state(rng)
        norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
        self.step += 1
        return {
            **metrics,
            "losses/sft_loss": float(result.training_loss),
            "charts/grad_norm": float(sum(norms) / len(norms)) if norms else 0.0,
            "charts/update_seconds": time.perf_counter() - started,
        }

    def save(self, checkpoint_dir: Path) -> None:
        """HF folder + optimizer/RNG/step state + the config."""
        save_checkpoint(self, checkpoint_dir, model=self.model, optimizer=self.optimizer, name="sft")

    def load_state(self, checkpoint_dir: Path) -> None:
        """Restore weights, optimizer, RNG and step from :meth:`save`'s folder."""
        load_checkpoint(self, checkpoint_dir, model=self.model, optimizer=self.optimizer)
