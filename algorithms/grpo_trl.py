"""TRL's ``GRPOTrainer`` fed transitions that are already scored: what :class:`~spanrl.algorithms.grpo.GRPO`
builds in ``setup`` and hands each micro-batch to (TRL 1.16's ``training_step``: its loss, clipping, KL term and
metrics). TRL's trainer samples and scores its own completions; spanrl's Trainer owns the loop, so this subclass
never generates, takes the batch as given and projects the LM head at completion positions only
(``batching.completion_logprobs``)."""

from __future__ import annotations

from typing import Any

import torch

from spanrl.algorithms.batching import completion_logprobs, plain_lm_head
from spanrl.errors import TrainingError

__all__ = ["scored_grpo_trainer_class"]


def scored_grpo_trainer_class() -> type:
    """Our ``GRPOTrainer`` subclass (built lazily: importing spanrl must not import TRL)."""
    from trl import GRPOTrainer

    class _ExternalRolloutGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose batches are handed in already scored: no generation, no reward functions."""

        def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
            # TRL's version generates and buffers; ours receives the output of _generate_and_score_completions.
            return generation_batch

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:  # pragma: no cover
            raise TrainingError("spanrl's GRPO trainer is fed scored transitions; it never generates")

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
            size, entropy = kwargs.pop("batch_size", None) or input_ids.size(0), kwargs.pop("compute_entropy", False)
            # multimodal, MoE, scaled logits, FSDP
            if any(v is not None and v is not False for v in kwargs.values()) or not plain_lm_head(model):
                logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=size, compute_entropy=entropy, **kwargs
                )
            else:  # TRL's fused head projects every position off CUDA; ours only the completion tokens
                parts = [
                    completion_logprobs(model, input_ids[i : i + size], attention_mask[i : i + size], logits_to_keep,
                                        temperature=self.temperature, fp32_head=self.args.cast_lm_head_to_fp32,
                                        entropy=entropy, share_prefix=self.spanrl_share_prefix)
                    for i in range(0, input_ids.size(0), size)
                ]
                logps = torch.cat([p[0] for p in parts])
                entropies, aux = (torch.cat([p[1] for p in parts]) if entropy else None), None
            if torch.is_grad_enabled():  # the training forward: keep the new log-probs for approx_kl
                self._spanrl_last_logps = logps.detach()
            return logps, entropies, aux

    return _ExternalRolloutGRPOTrainer
