"""The vLLM backend (GPU, optional extra): the same interface as the transformers backend.

Status: written against vLLM's offline ``LLM`` API but NOT yet run (no GPU machine was lent to the task
that wrote it); the transformers backend is the checked one. vLLM does its own continuous batching
inside ``LLM.generate``; logprobs are requested as ``processed_logprobs`` (after temperature, and, unlike
the transformers backend, after top-p / top-k masking). Tokens reach ``on_token`` only after the batch.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

from spanrl.errors import ServingError
from spanrl.serving.backend import Completion, GenerationRequest

__all__ = ["VLLMBackend"]

_GPU_MEMORY_UTILIZATION = 0.85


class VLLMBackend:
    """A vLLM ``LLM`` behind the ``Backend`` interface."""

    def __init__(self, model_dir: str | pathlib.Path, *, dtype: str = "auto", max_context_tokens: int | None = None, seed: int = 0) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ServingError("backend 'vllm' needs the vllm package on a GPU machine (pip install vllm)") from exc
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=str(model_dir),
            dtype=dtype,
            max_model_len=max_context_tokens,
            seed=seed,
            gpu_memory_utilization=_GPU_MEMORY_UTILIZATION,
            logprobs_mode="processed_logprobs",
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.max_context_tokens = int(self.llm.llm_engine.model_config.max_model_len)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Generate every request in one ``LLM.generate`` call."""
        params = [
            self._vllm.SamplingParams(
                n=req.n,
                temperature=req.params.temperature,
                top_p=req.params.top_p,
                max_tokens=req.params.max_tokens,
                seed=req.params.seed,
                stop=list(req.params.stop) or None,
                logprobs=max(req.params.top_logprobs, 0),
            )
            for req in requests
        ]
        prompts = [{"prompt_token_ids": list(req.prompt_ids)} for req in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        result: list[list[Completion]] = []
        for req, out in zip(requests, outputs):
            choices = []
            for i, o in enumerate(out.outputs):
                ids = list(o.token_ids)
                steps = o.logprobs or [{} for _ in ids]
                lps = [float(step[t].logprob) if t in step else float("nan") for step, t in zip(steps, ids)]
                top = [
                    sorted(((int(k), float(v.logprob)) for k, v in step.items()), key=lambda kv: -kv[1])[: req.params.top_logprobs]
                    for step in steps
                ] if req.params.top_logprobs else []
                if req.on_token is not None:
                    for t, lp in zip(ids, lps):
                        req.on_token(i, t, lp)
                reason = "stop" if o.finish_reason == "stop" else "length"
                choices.append(Completion(ids, lps, o.text, reason, top))
            result.append(choices)
        return result

    def load_weights(self, source: Any) -> None:
        """Load new weights into the running engine (path, state_dict or module)."""
        import torch

        if isinstance(source, (str, pathlib.Path)):
            from transformers import AutoModelForCausalLM

            state = AutoModelForCausalLM.from_pretrained(str(source)).state_dict()
        elif isinstance(source, torch.nn.Module):
            state = source.state_dict()
        elif isinstance(source, dict):
            state = source
        else:
            raise ServingError(f"weights must be a path, a state_dict or a torch.nn.Module, got {type(source).__name__}")
        items = list(state.items())
        self.llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(weights=items))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Drop the engine."""
        self.llm = None  # type: ignore[assignment]
