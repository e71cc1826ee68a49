"""The calculator agent that ``spanrl demo`` trains, shipped in the package so the demo runs from a wheel.

``tasks`` (tasks, vocabulary, the tool, the reward; standard library only), ``demonstrator`` (a careless
scripted teacher as an OpenAI-compatible server) and ``agent`` (a plain OpenAI-client program, started
as ``python -m spanrl.demo.calculator.agent`` under ``opentelemetry-instrument``).
``examples/calculator/`` in the source checkout runs these same modules.
"""
