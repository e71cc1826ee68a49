"""The calculator task (tasks, vocabulary, the tool, the reward). The code ships inside spanrl, so that
``spanrl demo`` runs from a wheel: ``spanrl/trainer/calculator/tasks.py`` (``trainer/calculator/tasks.py``
in this checkout). This module re-exports it for scripts next to it."""

from spanrl.trainer.calculator.tasks import *  # noqa: F401,F403
from spanrl.trainer.calculator.tasks import __all__  # noqa: F401
