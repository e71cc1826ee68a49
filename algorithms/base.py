"""What every training algorithm shares: the :class:`Algorithm` interface and its checkpoint format.

The Trainer owns the rollout loop; an algorithm owns the model update::

    algo = GRPO(GRPOConfig(...))
    algo.setup(model_path=Path("tiny"), output_dir=Path("run"), seed=0)
    metrics = algo.update(batch)          # one policy update from a TransitionBatch
    algo.save(Path("run/checkpoint-1"))   # HF folder + optimizer/scheduler/RNG/step + config.json
    algo.load_state(Path("run/checkpoint-1"))

A checkpoint folder is a plain Hugging Face model folder (``from_pretrained`` and the policy server load
it) plus ``spanrl_state.pt`` (optimizer, scheduler, RNG and step) and ``spanrl_config.json`` (the
resolved algorithm config). Helpers here pad transitions into the tensors TRL's losses expect.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import pickle
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from spanrl.algorithms.padding import (fill_rows, flat_values, list_lengths, mask_tensor, new_tensor, real_positions,
                                       values_within)
from spanrl.algorithms.reporters import check_report_to
from spanrl.errors import ConfigError, TrainingError

if TYPE_CHECKING:  # pragma: no cover
    import transformers

    from spanrl.algorithms.lora import LoRAConfig
    from spanrl.algorithms.transitions import Transition, TransitionBatch

__all__ = [
    "Algorithm",
    "CONFIG_FILE",
    "STATE_FILE",
    "PaddedBatch",
    "check_transitions",
    "fill_missing_logprobs",
    "load_policy_weights",
    "pad_transitions",
    "save_policy",
    "transition_table",
    "transitions_of",
]

CONFIG_FILE = "spanrl_config.json"
STATE_FILE = "spanrl_state.pt"


def transitions_of(batch: TransitionBatch | Sequence[Transition]) -> list[Transition]:
    """The transitions of a ``TransitionBatch`` (or of a plain sequence of transitions) as dataclasses."""
    transitions = getattr(batch, "transitions", batch)
    return list(transitions)


def transition_table(batch: TransitionBatch | pa.Table | Sequence[Transition]) -> pa.Table:
    """The transitions as an Arrow table with ``TRANSITIONS_SCHEMA``: the training path's input.

    A ``TransitionBatch`` gives its table without building a dataclass per row, unless its dataclass view
    (``batch.transitions``) was built: a caller may have edited those objects, so they are the truth then.
    A plain sequence of transitions (a sampled mini-batch, a distributed shard) is converted once."""
    if isinstance(batch, pa.Table):
        return batch
    if hasattr(batch, "to_arrow"):
        if "transitions" not in vars(batch):
            return batch.to_arrow()
        batch = batch.transitions
    from spanrl.algorithms.transitions import TRANSITIONS_SCHEMA

    names = TRANSITIONS_SCHEMA.names
    return pa.Table.from_pylist([{n: getattr(t, n) for n in names} for t in batch], schema=TRANSITIONS_SCHEMA)


def _row_problem(row: dict[str, Any], vocab_size: int | None) -> str | None:
    """What is wrong with one transition row (the first problem), or None."""
    prompt, completion = row["prompt_ids"] or [], row["completion_ids"] or []
    mask, logprobs = row["completion_mask"] or [], row["old_logprobs"] or []
    if not prompt:
        return "prompt_ids is empty"
    if not completion:
        return "completion_ids is empty"
    n = len(completion)
    if len(mask) != n:
        return f"completion_mask has {len(mask)} entries, completion_ids {n}"
    if logprobs and len(logprobs) != n:
        return f"old_logprobs has {len(logprobs)} entries, completion_ids {n}"
    advantage = row["advantage"]
    if advantage is None or not np.isfinite(advantage):
        return f"advantage must be finite, got {advantage!r}"
    if vocab_size is not None:
        bad = [x for x in (*prompt, *completion) if not 0 <= x < vocab_size]
        if bad:
            return f"token id {bad[0]} is outside the vocabulary (size {vocab_size})"
    return None


def _out_of_vocab_rows(column: pa.ChunkedArray, lengths: np.ndarray, vocab_size: int) -> np.ndarray:
    """Rows with a token id outside ``[0, vocab_size)``."""
    rows = np.zeros(len(lengths), dtype=bool)
    if values_within(column, 0, vocab_size):  # the common case, without a copy of the values
        return rows
    values = flat_values(column)
    if len(values) and (values.min() < 0 or values.max() >= vocab_size):
        bad_at = np.flatnonzero((values < 0) | (values >= vocab_size))
        rows[np.searchsorted(np.cumsum(lengths), bad_at, side="right")] = True
    return rows


def check_transitions(transitions: TransitionBatch | pa.Table | Sequence[Transition], *,
                      vocab_size: int | None = None) -> None:
    """Raise :class:`ConfigError` naming the first malformed transition and field; loses nothing.
    Columnar: the rows are checked with Arrow/NumPy; only the first bad row is read in Python."""
    table = transition_table(transitions)
    if not table.num_rows:
        raise ConfigError("batch has no transitions; an update needs at least one")
    n_p, n_c = list_lengths(table.column("prompt_ids")), list_lengths(table.column("completion_ids"))
    n_m, n_lp = list_lengths(table.column("completion_mask")), list_lengths(table.column("old_logprobs"))
    advantage = np.asarray(table.column("advantage").to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = (n_p == 0) | (n_c == 0) | (n_m != n_c) | ((n_lp != 0) & (n_lp != n_c)) | ~np.isfinite(advantage)
    if vocab_size is not None:
        bad |= _out_of_vocab_rows(table.column("prompt_ids"), n_p, vocab_size)
        bad |= _out_of_vocab_rows(table.column("completion_ids"), n_c, vocab_size)
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    row = table.slice(i, 1).to_pylist()[0]
    problem = _row_problem(row, vocab_size)
    raise ConfigError(f"transition {i} (rollout_id={row['rollout_id']!r}, step={row['step']}): {problem}")


@dataclasses.dataclass
class PaddedBatch:
    """Transitions as tensors: prompts left-padded, completions right-padded (TRL's layout)."""

    prompt_ids: torch.Tensor  # (B, P) long
    prompt_mask: torch.Tensor  # (B, P) bool, True = real token
    completion_ids: torch.Tensor  # (B, C) long
    completion_mask: torch.Tensor  # (B, C) bool, True = real token (attention)
    loss_mask: torch.Tensor  # (B, C) bool, True = policy-generated token that the loss counts
    old_logprobs: torch.Tensor | None  # (B, C) float32, sampling log-probs, NaN = unknown; None = none given
    advantages: torch.Tensor  # (B,) float32
    rewards: torch.Tensor  # (B,) float32

    def select(self, index: torch.Tensor | slice) -> PaddedBatch:
        """The rows ``index`` of every tensor."""
        return PaddedBatch(
            **{
                f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[index])
                for f in dataclasses.fields(self)
            }
        )


def pad_transitions(transitions: TransitionBatch | pa.Table | Sequence[Transition], *, pad_token_id: int) -> PaddedBatch:
    """Pad transitions into a :class:`PaddedBatch`. ``old_logprobs``: the server's log-probs where a
    transition has them, NaN on the completion tokens of one that has none (retokenized: recompute
    those rows only, :func:`fill_missing_logprobs`); None when no transition has any.

    Columnar: each (B, T) tensor is allocated once and filled from the Arrow list column's flattened
    values through a boolean mask of the padded layout (row-major order is the order of the values; one
    reshaped copy per block of rows of an Arrow chunk when every row is full; blocks of rows on a few
    threads; ``spanrl.algorithms.padding``), no Python
    per row. The masks are bool (the attention masks are those layouts themselves): where a consumer
    wants numbers (TRL's inputs, a model's ``attention_mask``) it converts its slice."""
    table = transition_table(transitions)
    n_p, n_c = list_lengths(table.column("prompt_ids")), list_lengths(table.column("completion_ids"))
    bsz, max_p, max_c = len(n_p), int(n_p.max(initial=0)), int(n_c.max(initial=0))
    p_real = real_positions(n_p, max_p, left=True)  # left-padded prompts; None: every row full
    c_real = real_positions(n_c, max_c, left=False)  # right-padded completions
    prompt_mask, completion_mask = mask_tensor(p_real, (bsz, max_p)), mask_tensor(c_real, (bsz, max_c))
    prompt_ids, p_ids = new_tensor((bsz, max_p), torch.long)
    fill_rows(p_ids, p_real, table.column("prompt_ids"), pad_token_id)
    completion_ids, c_ids = new_tensor((bsz, max_c), torch.long)
    fill_rows(c_ids, c_real, table.column("completion_ids"), pad_token_id)
    loss_mask, loss = new_tensor((bsz, max_c), torch.bool)
    fill_rows(loss, c_real, table.column("completion_mask"), False)  # int8 0/1 -> bool (nonzero: True)
    n_lp = list_lengths(table.column("old_logprobs"))
    known = (n_lp > 0) & (n_lp == n_c)
    old_logprobs = None
    if known.all() and len(known):
        old_logprobs, old = new_tensor((bsz, max_c), torch.float32)
        fill_rows(old, c_real, table.column("old_logprobs"), 0.0)
    elif known.any():
        old_logprobs, old = new_tensor((bsz, max_c), torch.float32)
        real = c_real if c_real is not None else np.ones(old.shape, dtype=bool)
        old.fill(0.0)
        old[real & known[:, None]] = flat_values(table.column("old_logprobs").filter(pa.array(known)))
        old[real & ~known[:, None]] = np.nan
    column = lambda name: np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float32)  # noqa: E731
    return PaddedBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        advantages=torch.from_numpy(column("advantage")),
        rewards=torch.from_numpy(column("reward")),
    )


def fill_missing_logprobs(data: PaddedBatch, logprobs_of: Callable[[PaddedBatch], torch.Tensor]) -> torch.Tensor:
    """``data.old_logprobs`` (B, C) with its unknown rows (a NaN, or every row when None) computed by
    ``logprobs_of`` (the current policy) on those rows only; the server's log-probs are kept."""
    known = data.old_logprobs
    if known is None:
        return logprobs_of(data)
    rows = torch.isnan(known).any(dim=1).nonzero().squeeze(1)  # (b,)
    if not len(rows):
        return known
    filled = known.clone()
    filled[rows] = logprobs_of(data.select(rows)).to(filled.dtype)
    return filled


def without_train_start_gc(trainer: Any) -> None:
    """Skip the full ``gc.collect()`` an HF Trainer runs at the start of ``train()``.

    ``Trainer.train`` calls ``accelerator.free_memory()``, which drops the accelerator's references and
    runs the garbage collector: ~0.17 s of a 0.21 s SFT update on the tiny model here. SFT and DPO build
    a fresh trainer (and so a fresh accelerator holding nothing) per update, so only the reset is kept.
    """
    accelerator = trainer.accelerator

    def free_memory(*objects: Any) -> Any:
        accelerator._schedulers, accelerator._optimizers, accelerator._models, accelerator._dataloaders = [], [], [], []
        accelerator.step = 0
        return objects[0] if len(objects) == 1 else objects

    accelerator.free_memory = free_memory


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


def _nonfinite_weights(model: Any) -> str | None:
    """``"weight NAME is not finite (NaN or inf)"`` for the first such tensor of ``model`` (and how many more), or None."""
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if not bad:
        return None
    return f"weight {bad[0]} is not finite (NaN or inf)" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")


def save_checkpoint(
    algorithm: Algorithm, checkpoint_dir: Path, *, model: Any, optimizer: Any, name: str, extra: dict[str, Any] | None = None
) -> Path:
    """What every algorithm's :meth:`Algorithm.save` writes: the policy as a loadable HF folder,
    ``STATE_FILE`` (optimizer, RNG, step, plus ``extra``) and ``CONFIG_FILE`` (the resolved config)."""
    algorithm._require_setup()
    checkpoint_dir = Path(checkpoint_dir)
    bad = _nonfinite_weights(model)
    if bad:  # never a step of NaN weights on disk (issue 28): the last good checkpoint stays the newest
        raise TrainingError(f"not saving {checkpoint_dir}: {bad}; the update that made it diverged")
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    save_policy(model, algorithm.tokenizer, checkpoint_dir, lora=algorithm.config.lora)
    state = {"optimizer": optimizer.state_dict(), "rng": rng_state(), "step": algorithm.step, **(extra or {})}
    torch.save(state, checkpoint_dir / STATE_FILE)
    config = {"algorithm": name, "seed": algorithm._seed, "config": config_dict(algorithm.config)}
    (checkpoint_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return checkpoint_dir


def load_checkpoint(algorithm: Algorithm, checkpoint_dir: Path, *, model: Any, optimizer: Any) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote into ``model``, ``optimizer``, the RNGs and
    ``algorithm.step``; returns the saved state so a caller can restore its ``extra`` entries."""
    algorithm._require_setup()
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
    return state


class Algorithm(abc.ABC):
    """One training algorithm. The Trainer owns the rollout loop; the algorithm owns the model update."""

    needs_values: ClassVar[bool] = False
    """True when the credit assignment needs critic values (``values(batch)``), e.g. PPO with GAE."""

    model: transformers.PreTrainedModel
    """The current policy; the policy server reloads from it in-process."""

    tokenizer: transformers.PreTrainedTokenizerBase
    """The policy's tokenizer (pad token set)."""

    config_class: ClassVar[type]
    """The algorithm's config dataclass (with ``validate()``)."""

    def __init__(self, config: Any = None, **fields: Any) -> None:
        """``Algo(AlgoConfig(...))`` or, equivalently, ``Algo(field=value, ...)`` with the config's field names."""
        config = config or self.config_class()
        try:
            config = dataclasses.replace(config, **fields)
        except TypeError as exc:
            raise ConfigError(f"{type(self).__name__} got an unknown config field: {exc}") from None
        self.config = config.validate()
        self.model = None  # type: ignore[assignment]
        self.tokenizer = None  # type: ignore[assignment]
        self.step = 0

    @abc.abstractmethod
    def setup(
        self, *, model_path: Path, output_dir: Path, seed: int = 0, report_to: Sequence[str] = ()
    ) -> None:
        """Load the model and tokenizer from a Hugging Face folder and build the optimizer."""

    @abc.abstractmethod
    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One policy update; returns metrics under stable keys (``losses/policy_loss``, ...)."""

    @abc.abstractmethod
    def save(self, checkpoint_dir: Path) -> None:
        """Write an HF folder (model + tokenizer), the optimizer/scheduler/RNG/step state and the config."""

    @abc.abstractmethod
    def load_state(self, checkpoint_dir: Path) -> None:
        """Resume exactly from what :meth:`save` wrote (call after :meth:`setup`)."""

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights with the plain model's keys, as the policy server loads them (LoRA merged)."""
        self._require_setup()
        if hasattr(self.model, "merge_and_unload"):  # a PEFT model: merge a copy, leave training untouched
            import copy

            return copy.deepcopy(self.model).merge_and_unload().state_dict()
        return self.model.state_dict()

    def values(self, batch: TransitionBatch) -> list[float]:
        """Critic value of each transition's state (the prompt); only when ``needs_values``."""
        raise TrainingError(f"{type(self).__name__} has no critic: needs_values is False")

    def _require_setup(self) -> None:
        if getattr(self, "model", None) is None:
            raise TrainingError(f"{type(self).__name__} is not set up: call setup() first")


class Reporter:
    """Scalars to TensorBoard (``<output_dir>/runs``) and/or Weights & Biases, for loops TRL does not own."""

    def __init__(self, report_to: Sequence[str], output_dir: Path, *, config: dict[str, Any]) -> None:
        self._writers: list[Any] = []
        for name in check_report_to(report_to):
            if name == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(log_dir=str(Path(output_dir) / "runs"))
                writer.add_text("config", json.dumps(config, indent=2))
                self._writers.append(writer)
            elif name == "wandb":
                try:
                    import wandb
                except ImportError:
                    raise ConfigError("report_to='wandb' needs the wandb package: pip install wandb") from None
                run = wandb.run or wandb.init(project="spanrl", config=config, dir=str(output_dir))
                self._writers.append(run)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Write ``metrics`` at ``step`` to every backend."""
        for writer in self._writers:
            if hasattr(writer, "add_scalar"):
                for key, value in metrics.items():
                    writer.add_scalar(key, value, step)
                writer.flush()
            else:
                writer.log(metrics, step=step)

    def close(self) -> None:
        """Close the TensorBoard writers and finish the W&B run; safe twice."""
        for writer in self._writers:
            if hasattr(writer, "add_scalar"):
                writer.close()
            else:
                writer.finish()
        self._writers = []
