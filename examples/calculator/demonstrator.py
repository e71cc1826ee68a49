"""The careless demonstrator server; the code ships inside spanrl (``trainer/calculator/demonstrator.py``)."""

from spanrl.trainer.calculator.demonstrator import DemonstratorServer

__all__ = ["DemonstratorServer"]
