"""CPU time of one Trainer step on the tiny model, for comparing two checkouts of the loop (``training_step.py``).

This process's user+sys CPU seconds between consecutive history rows: the Trainer, its embedded collector and policy
server, and an in-process agent (one chat call a rollout); GRPO, 4 tasks x 4 rollouts a step, 7 steps, the first a
warm-up, one torch thread. CPU time, not wall, so that a loaded machine still compares. Prints the mean of steps
2..7 and each step's. Alternate two checkouts (each with its own venv) in one run and compare the means:

    for i in 1 2 3; do A/.venv/bin/python bench/trainer_step_cpu.py A; B/.venv/bin/python bench/trainer_step_cpu.py B
    done
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from spanrl.algorithms import GRPO, LightningRL  # noqa: E402
from spanrl.demo.calculator.tasks import make_tasks, vocabulary  # noqa: E402
from spanrl.demo.tiny import build_tiny_model  # noqa: E402
from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig  # noqa: E402
from spanrl.trainer.reporting import Callback  # noqa: E402


def _agent(task: dict[str, Any], llm: Any) -> float:
    reply = llm.client().chat.completions.create(model=llm.model, max_tokens=6, temperature=llm.sampling["temperature"],
                                                 messages=[{"role": "user", "content": task["question"]}])
    return len(reply.choices[0].message.content or "") / 10  # varies between samples: a gradient to follow


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Marks(Callback):
    def __init__(self) -> None:
        self.cpu_s: list[float] = []

    def on_row(self, row: Any) -> None:
        self.cpu_s.append(_cpu_s())


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this"
    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_model(tmp / "tiny", words=vocabulary(), hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    config = TrainerConfig(output_dir=str(tmp / "run"), n_rollouts=4, tasks_per_step=4, max_steps=7,
                           eval_at_start=False, progress=False, torch_threads=1, runner=RunnerConfig(max_concurrency=4))
    trainer = Trainer(model=model, agent=_agent, tasks=make_tasks(40, seed=3), algorithm=GRPO(learning_rate=1e-3),
                      credit=LightningRL(baseline="grpo"), config=config)
    marks = _Marks()
    with trainer:
        trainer._callbacks.append(marks)  # the Trainer takes no callbacks of its own: after its reporting ones
        trainer.train()
    steps = [b - a for a, b in zip(marks.cpu_s, marks.cpu_s[1:])]
    print(f"{label} mean_step_cpu_s {sum(steps) / len(steps):.3f} steps {' '.join(f'{s:.3f}' for s in steps)}")


if __name__ == "__main__":
    main()
