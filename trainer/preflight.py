"""What the Trainer checks before its first rollout, and what it says when no rollout succeeds.

The output folder must not hold another run unless asked to resume or overwrite it (``run_folder.py``).

A misspelt agent file, an interpreter not on PATH: refused before any rollout runs (each rollout
would crash and be retried ``runner.max_attempts`` times). A crash, a hang or a missing reward of
*some* rollouts is tolerated (recorded in ``rollouts.jsonl``, left out of the update); a step or an
evaluation in which *none* succeeded stops the run with the commonest reason and what to do about it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError, TrainingError
from spanrl.rollouts.rollouts import STATUS_CRASHED, STATUS_NO_REWARD, STATUS_TIMEOUT, RolloutResult
from spanrl.trainer.run_folder import claim_output_dir

__all__ = ["check_agent_command", "check_before_start", "no_rollout_succeeded"]

# Interpreters whose first plain argument is a script file; `-m` / `-c` / `-e` run no file.
_INTERPRETER = re.compile(r"(python[\d.]*|pypy[\d.]*|node|bash|sh|zsh|ruby|perl|tsx|ts-node)")
_NO_FILE_FLAGS = ("-m", "-c", "-e", "--eval")
_SCRIPT_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts", ".sh", ".rb", ".pl")
_WRAPPER = "opentelemetry-instrument"
_REASON_CHARS = 240  # the one line's share for the agent's own words

_FIX = {
    STATUS_CRASHED: "Run the agent command yourself to see the whole error (the stderr tail of each attempt is in "
                    "rollouts.jsonl in the output folder).",
    STATUS_TIMEOUT: "Make the agent finish sooner, or raise runner.rollout_timeout_s.",
    STATUS_NO_REWARD: "The agent must emit a reward before it ends: spanrl.emit_reward(value) inside the rollout (a "
                      "callable agent may return the number); if it does, its spans did not reach the collector: "
                      "leave OTEL_EXPORTER_OTLP_ENDPOINT to the Trainer (it sets it for the agent).",
}


def check_before_start(output_dir: Path, agent: Any, config: Any) -> None:
    """What a Trainer checks before it writes anything or runs a rollout: the run folder is its own
    (:func:`claim_output_dir`) and a local command agent can start."""
    claim_output_dir(output_dir, resume=config.resume, overwrite=config.overwrite)
    if config.rollouts.backend == "local":  # a Ray node has its own files and PATH
        check_agent_command(agent)


def check_agent_command(agent: Any) -> None:
    """Refuse a command agent whose program is not found, or whose script file does not exist (looked up as
    the agent will be: relative to the current folder). A callable agent is not checked."""
    if callable(agent):
        return
    words = shlex.split(agent) if isinstance(agent, str) else [str(w) for w in agent]
    if not words:
        raise ConfigError("agent must be a command line, got an empty one")
    shown = shlex.join(words)
    if Path(words[0]).name == _WRAPPER and len(words) > 1 and not words[1].startswith("-"):
        _check_program(words[0], shown)
        words = words[1:]
    _check_program(words[0], shown)
    script = _script_of(words)
    if script is not None and not Path(script).is_file():
        raise ConfigError(f"agent: no such file {script!r} (agent: {shown}; a relative path is looked up next to the "
                          f"config, then in the current folder {os.getcwd()}): fix the file name in agent")


def _check_program(program: str, shown: str) -> None:
    if os.sep in program:
        if not (Path(program).is_file() and os.access(program, os.X_OK)):
            raise ConfigError(f"agent: {program!r} is not an executable file (agent: {shown}): fix the path in agent")
    elif shutil.which(program) is None:
        raise ConfigError(f"agent: {program!r} is not found on PATH (agent: {shown}): install it, or give its full "
                          "path in agent")


def _script_of(words: Sequence[str]) -> str | None:
    """The script an interpreter command runs (``python agent.py`` -> ``agent.py``), else None."""
    if not _INTERPRETER.fullmatch(Path(words[0]).name):
        return None
    for word in words[1:]:
        if word in _NO_FILE_FLAGS:
            return None
        if not word.startswith("-"):
            return word if word.endswith(_SCRIPT_SUFFIXES) else None
    return None


def no_rollout_succeeded(what: str, results: Sequence[RolloutResult]) -> TrainingError:
    """The one-line error for ``what`` (``step 3``, ``evaluation``) when none of ``results`` succeeded:
    the commonest reason among the attempts, how many ended so, and what to do."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return TrainingError(f"{what}: no rollout ran")
    reasons = Counter((r.status, _last_line(r.error)) for r in failed)
    (status, reason), count = reasons.most_common(1)[0]
    rollouts = len({(r.task_id, r.rollout_id.rsplit("-a", 1)[0]) for r in results})
    return TrainingError(
        f"{what}: none of {rollouts} rollouts succeeded ({len(failed)} attempts); {count} ended {status}: {reason}. "
        f"{_FIX.get(status, '')}".rstrip()
    )


def _last_line(error: str | None) -> str:
    """The last non-empty line of an error (a crash's is its stderr tail), cut to one line's length."""
    lines = [line.strip() for line in (error or "no reason given").splitlines() if line.strip()]
    text = lines[-1] if lines else "no reason given"
    exited = re.match(r"((?:agent|worker \d+) exited with code -?\d+):", lines[0]) if len(lines) > 1 else None
    if exited:
        text = f"{exited.group(1)}: {text}"
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."
