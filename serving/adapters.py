"""LoRA adapters on the transformers backend's one base model: loaded, reloaded and switched per batch.

PEFT injects each adapter's LoRA layers into the base model's linear modules in place, so the base stays
one copy and the backend keeps calling the same module; which adapter a forward pass uses is set before
the batch (``use``): one adapter active, or none (the base). The batcher never mixes adapters in a batch,
so a request is never computed with another request's adapter. Names and folders follow vLLM's
``--lora-modules name=path``: each folder is a PEFT adapter folder (``adapter_config.json`` +
``adapter_model.safetensors``) saved from the served base.
"""

from __future__ import annotations

import pathlib
from typing import Any

import torch

from spanrl.errors import ServingError
from spanrl.serving.backend import check_finite_weights

__all__ = ["AdapterSet", "base_key"]


def base_key(key: str) -> str:
    """A base weight's plain key: PEFT moves an adapted linear's weight under ``base_layer``."""
    return key.replace(".base_layer.", ".")


class AdapterSet:
    """The adapters served on ``model`` (a plain causal LM, adapted in place on the first load)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.peft: Any = None  # the PeftModel around ``model``, from the first adapter on
        self.sources: dict[str, str] = {}
        """Adapter name -> where it was last loaded from (a folder, or ``in-process``)."""

    @property
    def names(self) -> list[str]:
        """Adapter names, in load order."""
        return list(self.sources)

    def use(self, name: str | None) -> None:
        """Make the next forward passes use adapter ``name`` (None: the base model alone)."""
        if self.peft is None:
            if name is not None:
                raise ServingError(f"adapter {name!r} is not loaded; this server serves no adapters")
            return
        if name is None:
            self.peft.base_model.disable_adapter_layers()
            return
        if name not in self.sources:
            raise ServingError(f"adapter {name!r} is not loaded (loaded: {', '.join(self.sources)})")
        self.peft.base_model.enable_adapter_layers()
        self.peft.base_model.set_adapter(name)

    def load(self, name: str, source: Any) -> None:
        """Add adapter ``name`` or replace its weights: a PEFT adapter folder, a PEFT model (its active
        adapter), or an adapter ``state_dict`` as ``peft.get_peft_model_state_dict`` gives it. A new adapter
        needs a folder or a PEFT model (its config); a reload must keep the adapter's shapes."""
        if name in self.sources:
            self._replace(name, source)
            return
        folder = _folder(source)
        if folder is None and not hasattr(source, "peft_config"):
            raise ServingError(f"adapter {name!r} is new: give a PEFT adapter folder, not {type(source).__name__}")
        if folder is not None:
            self._add_folder(name, folder)
        else:
            self._add_model(name, source)
        self.sources[name] = str(folder) if folder is not None else "in-process"
        self.use(None)

    def _add_folder(self, name: str, folder: pathlib.Path) -> None:
        from peft import PeftConfig, PeftModel

        if not (folder / "adapter_config.json").is_file():  # checked here: PEFT would look on the Hub next
            raise ServingError(f"adapter {name!r}: {str(folder)!r} is not a PEFT adapter folder "
                               "(no adapter_config.json)")
        try:
            config = PeftConfig.from_pretrained(str(folder))
        except (OSError, ValueError) as exc:
            raise ServingError(f"adapter {name!r}: {str(folder)!r} is not a PEFT adapter folder: {exc}") from exc
        if getattr(config, "peft_type", None) != "LORA" and str(getattr(config, "peft_type", "")) != "PeftType.LORA":
            raise ServingError(f"adapter {name!r}: only LoRA adapters are served, {folder} holds {config.peft_type}")
        weights = _read_weights(name, folder)
        check_finite_weights(weights)
        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.model, str(folder), adapter_name=name)
            else:
                self.peft.load_adapter(str(folder), adapter_name=name)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise ServingError(f"adapter {name!r}: cannot load {str(folder)!r} on this base model: {exc}") from exc
        self.peft.eval()

    def _add_model(self, name: str, source: Any) -> None:
        from peft import get_peft_model, get_peft_model_state_dict

        active = source.active_adapter
        config = source.peft_config[active]
        state = get_peft_model_state_dict(source, adapter_name=active)
        check_finite_weights(state)
        if self.peft is None:
            self.peft = get_peft_model(self.model, config, adapter_name=name)
        else:
            self.peft.add_adapter(name, config)
        self.sources[name] = "in-process"
        self._replace(name, state)
        self.peft.eval()

    def _replace(self, name: str, source: Any) -> None:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        folder = _folder(source)
        if folder is not None:
            state = _read_weights(name, folder)
        elif hasattr(source, "peft_config"):
            state = get_peft_model_state_dict(source, adapter_name=source.active_adapter)
        elif isinstance(source, dict):
            state = source
        else:
            raise ServingError(f"adapter {name!r}: weights must be a folder, a PEFT model or a state_dict, "
                               f"got {type(source).__name__}")
        own = get_peft_model_state_dict(self.peft, adapter_name=name)
        wrong = [k for k in state if k not in own or tuple(own[k].shape) != tuple(state[k].shape)]
        missing = [k for k in own if k not in state]
        if wrong or missing:
            raise ServingError(f"adapter {name!r}: the new weights do not fit the loaded adapter (rank and target "
                               f"modules must stay): unexpected or reshaped {wrong[:3]}, missing {missing[:3]}")
        check_finite_weights(state)  # checked first, so refused weights leave the served adapter whole
        set_peft_model_state_dict(self.peft, {k: v.detach() for k, v in state.items()}, adapter_name=name)
        if folder is not None:
            self.sources[name] = str(folder)


def _folder(source: Any) -> pathlib.Path | None:
    return pathlib.Path(source) if isinstance(source, (str, pathlib.Path)) else None


def _read_weights(name: str, folder: pathlib.Path) -> dict[str, torch.Tensor]:
    from peft.utils import load_peft_weights

    if not any((folder / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        # local files only: PEFT would try the Hub for a folder without them
        raise ServingError(f"adapter {name!r}: {str(folder)!r} holds no adapter_model.safetensors")
    try:
        return load_peft_weights(str(folder), device="cpu")
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise ServingError(f"adapter {name!r}: cannot read adapter weights in {str(folder)!r}: {exc}") from exc
