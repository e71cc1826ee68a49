"""The careless demonstrator server; the code ships inside spanrl (``demo/calculator/demonstrator.py``)."""

from spanrl.demo.calculator.demonstrator import DemonstratorServer

__all__ = ["DemonstratorServer"]
