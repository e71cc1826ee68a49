"""Named GRPO variants whose fields come in sets: a preset sets every coupled field, and combinations that
are no named variant's and contradict one are refused.

- ``gspo`` (Group Sequence Policy Optimization, Zheng et al. 2025, arXiv 2507.18071): one importance
  ratio per sequence (``importance_sampling_level='sequence'``), the length-normalised sequence loss
  (``loss_type='grpo'``), no KL term, and the paper's clip range (``epsilon`` 3e-4, ``epsilon_high``
  4e-4), as TRL's paper index sets it. A sequence ratio with a loss that sums per-token terms
  (bnpo, dr_grpo, dapo, cispo) weighs each sequence by its length: not GSPO (TRL warns), refused here.
- ``dr_grpo`` (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783): no length normalisation (``loss_type='dr_grpo'``,
  token ratios) and no division of advantages by a std (the group's, the batch's or the running one): the credit's
  ``scale_std`` must be false, whatever its baseline: a trainer given no credit config, or a credit section
  that does not say it, gets it so (`trainer_credit`, `coupled_credit`), and one with ``scale_std`` true is
  refused when the trainer is built (`check_credit`, which ``load_training_batch`` calls again before each
  update).

A preset fills the coupled fields left unset; a coupled field set to another value is refused, also when it is
set to its default (``GRPOConfig(preset="gspo", epsilon=0.2)``: the defaults are `unset` values, which tell
"left as it is" from "asked for"; an ``epsilon_high`` of None counts as unset).
"""

from __future__ import annotations

from typing import Any

from spanrl.errors import ConfigError

__all__ = ["PRESETS", "apply_preset", "check_credit", "check_loss_fields", "coupled_credit", "trainer_credit", "unset"]

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


def unset(value: str | float) -> str | float:
    """``value`` marked as a default nobody asked for (it equals, hashes, prints and serialises as ``value``, in
    JSON, pickle and YAML): the default of a field a preset couples, so that `apply_preset` fills it but refuses
    the same value given explicitly."""
    if isinstance(value, str):
        return _UnsetStr(value)
    if isinstance(value, float):
        return _UnsetFloat(value)
    raise TypeError(f"unset() marks a str or float default, got {type(value).__name__}")


def _yaml_writes_unset_as_plain() -> None:
    """``yaml.safe_dump(dataclasses.asdict(GRPOConfig()))`` works: PyYAML's safe dumper takes exact types only."""
    try:
        import yaml
    except ImportError:  # the agent-only install: nothing to teach
        return
    for dumper in (yaml.SafeDumper, yaml.Dumper):
        dumper.add_representer(_UnsetStr, yaml.representer.SafeRepresenter.represent_str)
        dumper.add_representer(_UnsetFloat, yaml.representer.SafeRepresenter.represent_float)


_yaml_writes_unset_as_plain()


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


_COUPLED_CREDIT: dict[str, dict[str, Any]] = {"dr_grpo": {"scale_std": False}}
"""Per ``loss_type``, the credit fields it couples: Dr. GRPO divides advantages by no std."""


def coupled_credit(config: Any) -> dict[str, Any]:
    """The credit fields the algorithm's config (any, or None) couples (`_COUPLED_CREDIT`), for a trainer to build
    its default credit with where its config does not say them."""
    return dict(_COUPLED_CREDIT.get(getattr(config, "loss_type", None), {}))


def trainer_credit(config: Any, credit: Any = None) -> Any:
    """The credit a trainer of the algorithm's ``config`` (any, or None) trains with: ``credit`` as given (a
    ``CreditConfig``), or built from a mapping of its fields (a YAML ``credit`` section) or from nothing, with the
    fields the config couples (`coupled_credit`) where the mapping does not say them; checked (`check_credit`)."""
    from spanrl.algorithms.credit_config import LightningRL

    if credit is None or isinstance(credit, dict):
        credit = LightningRL(**{**coupled_credit(config), **(credit or {})})
    check_credit(config, credit)
    return credit


def check_credit(config: Any, credit: Any, *, field: str = "credit scale_std") -> None:
    """Raise `ConfigError` when the algorithm's config (any, or None) contradicts the credit's: Dr. GRPO's
    loss with advantages divided by a std, whichever the baseline (`_STD_DIVIDED`); ``field``: the setting's
    name in the caller's config. The trainers call it when they are built, ``load_training_batch`` before each
    step's update."""
    wanted = coupled_credit(config).get("scale_std")
    if credit is None or wanted is None or getattr(credit, "scale_std", wanted) == wanted:
        return
    preset = f"preset {config.preset!r}" if getattr(config, "preset", None) else f"loss_type {config.loss_type!r}"
    baseline = getattr(credit, "baseline", None)
    divided = _STD_DIVIDED.get(baseline, "a std")
    raise ConfigError(f"{field} must be false with {preset} (Dr. GRPO does not divide advantages by a std; with "
                      f"baseline {baseline!r} scale_std divides by {divided}), got true")
