"""The contract every training algorithm keeps: :class:`Algorithm`.

The Trainer owns the rollout loop; an algorithm owns the model update::

    algo = GRPO(GRPOConfig(...))
    algo.setup(model_path=Path("tiny"), output_dir=Path("run"), seed=0)
    metrics = algo.update(batch)          # one policy update from a TransitionBatch
    algo.save(Path("run/checkpoint-1"))   # HF folder + optimizer/scheduler/RNG/step + config.json
    algo.load_state(Path("run/checkpoint-1"))

The loop also calls ``load_batch`` (the step's transitions) and ``push_weights`` (serve the updated policy):
their defaults here serve every algorithm that loads and serves one policy; per-agent policies override them.

An algorithm returns its metrics and never reports them itself: the caller (the Trainer's reporting
callbacks, ``spanrl.trainer.reporting``) writes each key once. What the algorithms share besides lives
beside this module: the transition table, its checks and its padding into tensors (``tables``), the
checkpoint format and policy loading (``checkpoints``).
"""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from spanrl.errors import ConfigError, TrainingError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import transformers

    from spanrl.algorithms.baseline import RunningBaseline
    from spanrl.algorithms.transitions import TransitionBatch

__all__ = ["Algorithm"]


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

    seed: int
    """The run seed ``setup`` was given (saved in each checkpoint's ``spanrl_config.json``)."""

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
        self.seed = 0

    @abc.abstractmethod
    def setup(self, *, model_path: Path, output_dir: Path, seed: int = 0) -> None:
        """Load the model and tokenizer from a Hugging Face folder and build the optimizer."""

    @abc.abstractmethod
    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One policy update; returns metrics under stable keys (``losses/policy_loss``, ...), writing none."""

    @abc.abstractmethod
    def save(self, checkpoint_dir: Path) -> None:
        """Write an HF folder (model + tokenizer), the optimizer/scheduler/RNG/step state and the config."""

    @abc.abstractmethod
    def load_state(self, checkpoint_dir: Path) -> None:
        """Resume exactly from what :meth:`save` wrote (call after :meth:`setup`)."""

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights with the plain model's keys, as the policy server loads them (LoRA merged)."""
        self.require_setup()
        if hasattr(self.model, "merge_and_unload"):  # a PEFT model: merge a copy, leave training untouched
            import copy

            return copy.deepcopy(self.model).merge_and_unload().state_dict()
        return self.model.state_dict()

    def load_batch(self, store: Any, credit: Any, rollout_ids: list[str], *, agents: list[str] | None = None,
                   running: RunningBaseline | None = None) -> TransitionBatch:
        """The step's transitions, credit assigned once (``load_training_batch``): ``agents`` only, when given;
        with ``running`` (a running baseline's state, updated) credit sees the rollouts in the order given.
        Override to load otherwise (per-agent policies: each agent's rows with its own credit)."""
        from spanrl.algorithms.transitions import load_training_batch

        online = {} if running is None else {"running": running, "order": list(rollout_ids)}
        return load_training_batch(store, self, credit=credit, rollout_ids=list(rollout_ids), agents=agents,
                                   **online)

    def push_weights(self, server: Any, *, in_place: bool = True) -> dict[str, Any]:
        """Serve this policy on ``server`` (``trainer.training_step.Servers``); returns the history row's policy
        version(s). A LoRA model in this process (``in_place``) reloads as its adapter (``reload_lora``), else
        the plain-keyed weights (:meth:`policy_weights`) reload. Override to serve otherwise (per-agent adapters)."""
        if in_place and hasattr(self.model, "peft_config"):  # algorithm.lora
            return {"policy_version": server.reload_lora(self.model, self.policy_weights)}
        return {"policy_version": server.reload(self.policy_weights())}

    def values(self, batch: TransitionBatch) -> list[float]:
        """Critic value of each transition's state (the prompt); only when ``needs_values``."""
        raise TrainingError(f"{type(self).__name__} has no critic: needs_values is False")

    def require_setup(self) -> None:
        """Raise :meth:`_not_set_up` before :meth:`setup` (public: ``checkpoints`` checks the algorithm it
        saves or loads). The updates check ``self.model`` inline (they run every step, and ``bench/span_path.py``
        counts the files a step runs)."""
        if getattr(self, "model", None) is None:
            raise self._not_set_up()

    def _not_set_up(self) -> TrainingError:
        """The error for a call before :meth:`setup`."""
        return TrainingError(f"{type(self).__name__} is not set up: call setup() first")
