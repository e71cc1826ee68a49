"""The calculator agent, run from a checkout: ``opentelemetry-instrument python examples/calculator/agent.py``.

Its code ships inside spanrl, so that ``spanrl demo`` runs from a wheel: read
``trainer/calculator/agent.py`` (``python -m spanrl.trainer.calculator.agent`` runs the same program).
"""

from spanrl.trainer.calculator.agent import *  # noqa: F401,F403
from spanrl.trainer.calculator.agent import __all__, main  # noqa: F401

if __name__ == "__main__":
    main()
