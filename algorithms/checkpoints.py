"""An algorithm's checkpoint format, and loading the policy it starts from.

A checkpoint folder is a plain Hugging Face model folder (``from_pretrained`` and the policy server load
it) plus ``spanrl_state.pt`` (optimizer, RNG and step, plus what an algorithm adds: a scheduler) and
``spanrl_config.json`` (the resolved algorithm config), and ``value_head.pt`` when the credit's learned
critic has a head (``algorithms/value_head.py``). Non-finite weights are never saved or loaded
(issue 28). The RNG helpers also let SFT and DPO keep the caller's random sequence across an HF Trainer.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from spanrl.errors import TrainingError

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.base import Algorithm
    from spanrl.algorithms.lora import LoRAConfig

__all__ = [
    "CONFIG_FILE", "STATE_FILE", "VALUE_HEAD_FILE", "config_dict", "load_checkpoint", "load_policy",
    "load_policy_weights", "load_state_file", "nonfinite_tensors", "rng_state", "save_checkpoint", "save_policy",
    "seed_everything",
    "set_rng_state",
]

CONFIG_FILE = "spanrl_config.json"
STATE_FILE = "spanrl_state.pt"
VALUE_HEAD_FILE = "value_head.pt"
"""The learned critic's value head (``algorithms/value_head.py``), when the algorithm has one."""


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The Python, NumPy and torch RNG states (to resume exactly); tensors and plain values only, so
    ``torch.load(..., weights_only=True)`` reads them back."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])


def load_state_file(path: Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``: tensors and plain values only, never arbitrary pickled code.
    A state written before (its NumPy RNG state a pickled array) is read with only NumPy's array
    reconstructors allowed besides."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        from numpy._core.multiarray import _reconstruct  # type: ignore[attr-defined]

        with torch.serialization.safe_globals([_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]):
            return torch.load(path, weights_only=True)


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as JSON-ready data (nested dataclasses included)."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def load_policy(model_path: Path, *, lora: LoRAConfig | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a Hugging Face folder, as every algorithm loads them: the tokenizer
    with a pad token (EOS when it has none), the causal LM in float32, wrapped in a LoRA adapter when
    ``lora`` is given."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if lora is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora.to_peft())
    return model, tokenizer


def save_policy(model: Any, tokenizer: Any, checkpoint_dir: Path, *, lora: LoRAConfig | None = None) -> None:
    """Write a loadable HF folder; with LoRA, the merged weights plus the adapter in ``adapters/<name>``."""
    if lora is not None:
        import copy

        model.save_pretrained(checkpoint_dir / "adapters" / lora.adapter_name)
        copy.deepcopy(model).merge_and_unload().save_pretrained(checkpoint_dir)
    else:
        model.save_pretrained(checkpoint_dir)
    tokenizer.save_pretrained(checkpoint_dir)


def load_policy_weights(model: Any, checkpoint_dir: Path, *, lora: LoRAConfig | None = None) -> None:
    """Load weights saved by :func:`save_policy` into ``model`` in place."""
    if lora is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        adapter = checkpoint_dir / "adapters" / lora.adapter_name / "adapter_model.safetensors"
        if not adapter.exists():
            raise TrainingError(f"{checkpoint_dir} has no adapter {lora.adapter_name!r} (looked for {adapter})")
        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32)
    model.load_state_dict(saved.state_dict())


def nonfinite_tensors(weights: Mapping[str, Any]) -> list[str]:
    """The names of the floating-point tensors of ``weights`` (a state dict) holding a NaN or an inf."""
    return [n for n, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def _nonfinite_weights(model: Any) -> str | None:
    """``"weight NAME is not finite (NaN or inf)"`` for the first such tensor of ``model`` (and how many
    more), or None."""
    bad = nonfinite_tensors(model.state_dict())
    if not bad:
        return None
    return f"weight {bad[0]} is not finite (NaN or inf)" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")


def save_checkpoint(algorithm: Algorithm, checkpoint_dir: Path, *, model: Any, optimizer: Any, name: str,
                    extra: dict[str, Any] | None = None) -> Path:
    """What every algorithm's :meth:`Algorithm.save` writes: the policy as a loadable HF folder,
    ``STATE_FILE`` (optimizer, RNG, step, plus ``extra``) and ``CONFIG_FILE`` (the resolved config)."""
    algorithm.require_setup()
    checkpoint_dir = Path(checkpoint_dir)
    bad = _nonfinite_weights(model)
    if bad:  # never a step of NaN weights on disk (issue 28): the last good checkpoint stays the newest
        raise TrainingError(f"not saving {checkpoint_dir}: {bad}; the update that made it diverged")
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    save_policy(model, algorithm.tokenizer, checkpoint_dir, lora=algorithm.config.lora)
    state = {"optimizer": optimizer.state_dict(), "rng": rng_state(), "step": algorithm.step, **(extra or {})}
    torch.save(state, checkpoint_dir / STATE_FILE)
    config = {"algorithm": name, "seed": algorithm.seed, "config": config_dict(algorithm.config)}
    (checkpoint_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    head = getattr(algorithm, "value_head", None)
    if head is not None:
        torch.save(head.state_dict(), checkpoint_dir / VALUE_HEAD_FILE)
    return checkpoint_dir


def load_checkpoint(algorithm: Algorithm, checkpoint_dir: Path, *, model: Any, optimizer: Any) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote into ``model``, ``optimizer``, the RNGs and
    ``algorithm.step``; returns the saved state so a caller can restore its ``extra`` entries."""
    algorithm.require_setup()
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / STATE_FILE).exists():
        raise TrainingError(f"{checkpoint_dir} has no {STATE_FILE}: not a spanrl checkpoint")
    load_policy_weights(model, checkpoint_dir, lora=algorithm.config.lora)
    bad = _nonfinite_weights(model)
    if bad:  # written before save checked (issue 28): training on from it would only diverge
        raise TrainingError(f"not loading {checkpoint_dir}: {bad}; resume from an older checkpoint")
    state = load_state_file(checkpoint_dir / STATE_FILE)
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    algorithm.step = state["step"]
    if (checkpoint_dir / VALUE_HEAD_FILE).exists():
        from spanrl.algorithms.value_head import ValueHead

        algorithm.value_head = ValueHead.from_state(load_state_file(checkpoint_dir / VALUE_HEAD_FILE))
    return state
