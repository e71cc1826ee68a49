"""The calculator task (tasks, vocabulary, the tool, the reward). The code ships inside spanrl, so that
``spanrl demo`` runs from a wheel: ``spanrl/demo/calculator/tasks.py`` (``demo/calculator/tasks.py``
in this checkout). This module re-exports it for scripts next to it."""

from spanrl.demo.calculator.tasks import *  # noqa: F401,F403
from spanrl.demo.calculator.tasks import __all__  # noqa: F401
