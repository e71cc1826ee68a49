"""A scripted teacher as an OpenAI-compatible chat server, for SFT warm starts: the package's
:class:`~spanrl.demo.calculator.demonstrator.ScriptedChatServer` under the name the examples use
(with ``seed_by_rollout=True`` a seeded run's SFT data is the same whatever order its agents ask in).

    with TeacherServer(lambda messages, rng: "SELECT 1", seed=0) as teacher:
        base_url = teacher.url + "/v1"
"""

from __future__ import annotations

from spanrl.demo.calculator.demonstrator import AnswerFn, ScriptedChatServer as TeacherServer

__all__ = ["AnswerFn", "TeacherServer"]
