"""The calculator agent, run from a checkout: ``opentelemetry-instrument python examples/calculator/agent.py``.

Its code ships inside spanrl, so that ``spanrl demo`` runs from a wheel: read
``demo/calculator/agent.py`` (``python -m spanrl.demo.calculator.agent`` runs the same program).
"""

from spanrl.demo.calculator.agent import *  # noqa: F401,F403
from spanrl.demo.calculator.agent import __all__, main  # noqa: F401

if __name__ == "__main__":
    main()
