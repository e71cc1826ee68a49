"""Named GRPO variants whose fields come in sets: a preset sets every coupled field, and combinations that
are no named variant's and contradict one are refused.

- ``gspo`` (Group Sequence Policy Optimization, Zheng et al. 2025, arXiv 2507.18071): one importance
  ratio per sequence (``importance_sampling_level='sequence'``), the length-normalised sequence loss
  (``loss_type='grpo'``), no KL term, and the paper's clip range (``epsilon`` 3e-4, ``epsilon_high``
  4e-4), as TRL's paper index sets it. A sequence ratio with a loss that sums per-token terms
  (bnpo, dr_grpo, dapo, cispo) weighs each sequence by its length: not GSPO (TRL warns), refused here.
- ``dr_grpo`` (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783): no length normalisation (``loss_type='dr_grpo'``,
  token ratios) and no division of advantages by a std (the group's, the batch's or the running one): the credit's
  ``scale_std`` must be false, whatever its baseline: a Trainer given no credit config builds its default so
  (`coupled_credit`), and refuses one with ``scale_std`` true when it is built (`check_credit`, which
  ``load_training_batch`` calls again before each update).

A preset fills the coupled fields left unset; a coupled field set to another value is refused, also when it is
set to its default (``GRPOConfig(preset="gspo", epsilon=0.2)``: the defaults are `unset` values, which tell
"left as it is" from "asked for"; an ``epsilon_high`` of None counts as unset).
"""

from __future__ import annotations

from typing import Any

from spanrl.errors import ConfigError

__all__ = ["PRESETS", "apply_preset", "check_credit", "check_loss_fields", "coupled_credit", "unset"]

PRESETS: dict[str, dict[str, Any]] = {
    "gspo": {"importance_sampling_level": "sequence", "loss_type": "grpo", "beta": 0.0, "epsilon": 3e-4,
             "epsilon_high": 4e-4},
    "dr_grpo": {"importance_sampling_level": "token", "loss_type": "dr_grpo"},
}
"""Each preset's coupled ``GRPOConfig`` fields."""
_SUMMED_LOSSES = ("bnpo", "dr_grpo", "dapo", "cispo")  # losses that sum per-token terms (TRL's list)
_STD_DIVIDED = {"grpo": "the group std", "rloo": "the group std", "none": "the batch std (it whitens the batch)",
                "running": "the running std"}
"""What each baseline's ``scale_std`` divides advantages by (docs/credit.md)."""


class _UnsetStr(str):
    """A string field's default, left as it is: a preset may fill it."""


class _UnsetFloat(float):
    """A number field's default, left as it is: a preset may fill it."""


def unset(value: Any) -> Any:
    """``value`` marked as a default nobody asked for (it equals, hashes and prints as ``value``): the default of a
    field a preset couples, so that `apply_preset` fills it but refuses the same value given explicitly."""
    return _UnsetStr(value) if isinstance(value, str) else _UnsetFloat(value)


def _is_unset(value: Any) -> bool:
    return value is None or isinstance(value, (_UnsetStr, _UnsetFloat))


def apply_preset(config: Any) -> None:
    """Set ``config.preset``'s coupled fields that are still unset (others: `check_loss_fields`)."""
    fields = PRESETS.get(config.preset) if isinstance(config.preset, str) else None
    for name, value in (fields or {}).items():
        if _is_unset(getattr(config, name)):
            setattr(config, name, value)


def check_loss_fields(config: Any, loss_types: tuple[str, ...]) -> None:
    """Raise `ConfigError` for a bad ``preset``, ``loss_type`` or ``importance_sampling_level``, a coupled field
    that contradicts the preset, or a sequence ratio with a summed loss."""
    if config.preset is not None and config.preset not in PRESETS:
        raise ConfigError(f"preset must be one of {', '.join(PRESETS)} or None, got {config.preset!r}")
    if config.loss_type not in loss_types:
        raise ConfigError(f"loss_type must be one of {loss_types}, got {config.loss_type!r}")
    if config.importance_sampling_level not in ("token", "sequence"):
        raise ConfigError(
            f"importance_sampling_level must be 'token' or 'sequence', got {config.importance_sampling_level!r}")
    for name, value in PRESETS.get(config.preset, {}).items():
        if getattr(config, name) != value:
            raise ConfigError(f"{name} must be {value!r} with preset {config.preset!r}, got {getattr(config, name)!r}")
    if config.importance_sampling_level == "sequence" and config.loss_type in _SUMMED_LOSSES:
        raise ConfigError(
            f"importance_sampling_level 'sequence' with loss_type {config.loss_type!r} is not GSPO: that loss sums "
            f"per-token terms, so each sequence weighs by its length; use preset 'gspo' (loss_type 'grpo') or "
            f"importance_sampling_level 'token'")


def coupled_credit(config: Any) -> dict[str, Any]:
    """The credit fields the algorithm's config (any, or None) couples, for a Trainer given no credit config to
    build its default with: Dr. GRPO's ``scale_std`` false; nothing for others."""
    return {"scale_std": False} if getattr(config, "loss_type", None) == "dr_grpo" else {}


def check_credit(config: Any, credit: Any) -> None:
    """Raise `ConfigError` when the algorithm's config (any, or None) contradicts the credit's: Dr. GRPO's
    loss with advantages divided by a std, whichever the baseline (`_STD_DIVIDED`). The Trainer calls it when
    it is built, ``load_training_batch`` before each step's update."""
    if getattr(config, "loss_type", None) != "dr_grpo" or credit is None:
        return
    if getattr(credit, "scale_std", False):
        preset = f"preset {config.preset!r}" if getattr(config, "preset", None) else "loss_type 'dr_grpo'"
        divided = _STD_DIVIDED.get(getattr(credit, "baseline", None), "a std")
        raise ConfigError(f"credit scale_std must be false with {preset} (Dr. GRPO does not divide advantages by "
                          f"a std; with baseline {credit.baseline!r} scale_std divides by {divided}), got true")
