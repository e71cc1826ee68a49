"""One run seed pins a synchronous run: the seeds everything else draws from, derived by a stable hash.

From the Trainer's ``seed`` (``docs/train-config.md``, "Reproducible runs"):

- step ``s`` samples its tasks, and later its minibatches, from ``random.Random(seed * 1_000_003 + s)``
  (:func:`step_jobs`: a resumed run samples what a fresh one would, with no RNG state to save);
- rollout ``g`` (0 .. n_rollouts-1) of task ``t`` at step ``s`` gets the rollout seed
  ``derive_seed("rollout", seed, s, t, g)``, and its attempt ``a`` the sampling seed ``derive_seed(that, a)``.
  It reaches the policy server in the rollout's base URL (``/rollouts/<id>/seeds/<seed>/v1``: the agent's
  OpenAI client needs no change) and the agent as ``SPANRL_SEED`` / ``llm.seed`` (for its own randomness);
- the server samples each call of such a rollout that names no ``seed`` with :meth:`CallSeeds.seed`: derived
  from the rollout's seed, the call's prompt tokens and how often the rollout sent that prompt before, so it
  does not depend on the order in which concurrent calls arrive. A call's own OpenAI ``seed`` always wins.

:func:`derive_seed` is BLAKE2b over the parts' text, never Python's ``hash()`` (salted per process).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CallSeeds", "derive_seed", "pin_torch", "start_run", "step_jobs"]

_logger = logging.getLogger(__name__)

_STEP_SEED_STRIDE = 1_000_003  # per-step sampler seed = seed * stride + step (resumable, no RNG state)
_SEEN_PROMPTS = 65_536  # (rollout, prompt) pairs a server remembers for call seeds; the oldest go first


def derive_seed(*parts: object) -> int:
    """A seed in [0, 2**63) from ``parts`` (their ``str``), the same on every machine and Python version."""
    text = "\x1f".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def step_jobs(task_jobs: Sequence[Any], config: Any, step: int) -> tuple[random.Random, list[Any]]:
    """Step ``step``'s rollout jobs (``n_rollouts`` of each of ``tasks_per_step`` tasks sampled, each with its
    rollout seed) and the step's sampler, which later picks minibatches; ``config``: a ``TrainerConfig``.
    Rollouts to a teacher (``llm_url``) carry no seed: it may not serve the seeded route."""
    seed = config.seed
    sampler = random.Random(seed * _STEP_SEED_STRIDE + step)
    jobs = [job if config.llm_url else dataclasses.replace(job, seed=derive_seed("rollout", seed, step, job.task_id, g))
            for job in sampler.sample(list(task_jobs), config.tasks_per_step) for g in range(config.n_rollouts)]
    return sampler, jobs


def start_run(config: Any, *, shown: bool) -> Callable[[], None]:
    """At a run's start: log (and, ``shown``, print) its seed, and pin torch as ``config.deterministic`` asks
    (:func:`pin_torch`); returns what restores torch's settings."""
    line = f"spanrl: seed {config.seed}" + (" (deterministic)" if config.deterministic else "")
    _logger.info(line)
    if shown:
        print(line, flush=True)
    return pin_torch(config.deterministic)


def pin_torch(deterministic: bool) -> Callable[[], None]:
    """With ``deterministic``, torch's deterministic algorithms (an op that has none raises), cuDNN's
    deterministic kernels and cuBLAS's fixed workspace, for this process; returns what restores the settings
    found (the Trainer's ``close()``). Without it, nothing (``cudnn.benchmark`` is off by default)."""
    import torch

    if not deterministic:
        return lambda: None
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: set before CUDA work
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False

    def restore() -> None:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]

    return restore


class CallSeeds:
    """The policy server's seeds for the calls of seeded rollouts (``/rollouts/<id>/seeds/<seed>/v1``)."""

    def __init__(self, capacity: int = _SEEN_PROMPTS) -> None:
        self._seen: collections.OrderedDict[tuple[str, int, str], int] = collections.OrderedDict()
        self._capacity = capacity

    def seed(self, rollout_id: str, rollout_seed: int, prompt_ids: Sequence[int]) -> int:
        """The seed of a call of rollout ``rollout_id`` on ``prompt_ids``: the k-th call with the same prompt
        in the same rollout gets the k-th seed (an agent asking twice gets two samples). Called on the
        server's event loop only (no lock)."""
        prompt = hashlib.blake2b(",".join(map(str, prompt_ids)).encode(), digest_size=16).hexdigest()
        key = (rollout_id, rollout_seed, prompt)
        count = self._seen.pop(key, 0)
        self._seen[key] = count + 1
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return derive_seed("call", rollout_seed, prompt, count)
