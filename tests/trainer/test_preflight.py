"""A newcomer's broken agent fails loud, early and in one line: a misspelt agent file or a program not on PATH is
refused before any rollout; a step in which no rollout succeeded (a crashing agent, an agent that never emits a
reward) stops the run with the commonest reason and what to do, exit code 1. Real ``spanrl train`` processes on a
tiny model; a run where only SOME rollouts fail goes on (tests/trainer/test_trainer.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spanrl.errors import ConfigError
from spanrl.trainer.preflight import check_agent_command


def _train(tmp_path: Path, agent_source: str | None, agent: str, **settings: object) -> subprocess.CompletedProcess:
    if agent_source is not None:
        (tmp_path / "agent.py").write_text(agent_source)
    extra = "".join(f"{key}: {value}\n" for key, value in {"max_steps": 3, **settings}.items())
    (tmp_path / "train.yaml").write_text(f"""
model: {{tiny: {{words: [add, sub, one, two], hidden_size: 16, num_layers: 1, num_heads: 2, intermediate_size: 32}}}}
agent: {agent}
tasks: [{{id: a, question: one add two}}, {{id: b, question: two sub one}}]
val_tasks: [{{id: v, question: two add two}}]
output_dir: {tmp_path / 'run'}
n_rollouts: 2
tasks_per_step: 2
torch_threads: 1
runner: {{max_attempts: 2, span_timeout_s: 1.0, max_concurrency: 4}}
{extra}""")
    cmd = [sys.executable, "-m", "spanrl", "train", str(tmp_path / "train.yaml"), "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def _error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr  # one line: what is wrong, what to do
    return lines[0]


def test_misspelt_agent_file_refused_before_any_rollout(tmp_path: Path) -> None:
    done = _train(tmp_path, "", "[python, agnet.py]")
    assert done.returncode == 2  # bad input: exit status 2
    assert _error_line(done) == (
        f"spanrl: error: agent: no such file 'agnet.py' (agent: {sys.executable} agnet.py; a relative path is "
        f"looked up next to the config, then in the current folder {tmp_path}): fix the file name in agent")
    assert not (tmp_path / "run" / "rollouts.jsonl").exists()  # not one rollout ran


def test_program_not_on_path_refused() -> None:
    with pytest.raises(ConfigError, match=r"^agent: 'pyhton3' is not found on PATH \(agent: pyhton3 agent.py\): "
                                          r"install it, or give its full path in agent$"):
        check_agent_command("pyhton3 agent.py")
    with pytest.raises(ConfigError, match=r"^agent: '/no/such/node' is not an executable file"):
        check_agent_command(["/no/such/node", "agent.js"])
    check_agent_command([sys.executable, "-m", "json.tool"])  # a module, no file to look for
    check_agent_command(lambda task, llm: 1.0)  # a callable agent is not a command


@pytest.mark.slow
def test_crashing_agent_stops_the_first_step_with_its_reason(tmp_path: Path) -> None:
    done = _train(tmp_path, "import sys\nsys.exit('boom: KeyError: question')\n", "[python, agent.py]",
                  eval_at_start="false")
    assert done.returncode == 1
    assert _error_line(done) == (
        "spanrl: error: step 1: none of 4 rollouts succeeded (8 attempts); 8 ended crashed: agent exited with code "
        "1: boom: KeyError: question. Run the agent command yourself to see the whole error (the stderr tail of each "
        "attempt is in rollouts.jsonl in the output folder).")
    assert not list((tmp_path / "run").glob("checkpoint-*"))  # stopped at step 1 of 3


@pytest.mark.slow
def test_agent_without_reward_stops_the_held_out_evaluation(tmp_path: Path) -> None:
    done = _train(tmp_path, "print('answered, but no reward emitted')\n", "[python, agent.py]")
    assert done.returncode == 1
    line = _error_line(done)
    assert line.startswith(
        "spanrl: error: evaluation at step 0: none of 1 rollouts succeeded (2 attempts); 2 ended no_reward: the agent "
        "ended without a reward: none was stored within 1 s. The agent must emit a reward before it ends: "
        "spanrl.emit_reward(value)"), line


_ZERO_AGENT = """import json, os, openai, spanrl
task = json.loads(os.environ["SPANRL_TASK"])
openai.OpenAI().chat.completions.create(  # OPENAI_API_KEY: the run's key
    model=os.environ["SPANRL_MODEL"], messages=[{"role": "user", "content": task["question"]}], max_tokens=1)
spanrl.emit_reward(0.0)
"""


@pytest.mark.slow
def test_a_tiny_model_that_never_earns_a_reward_is_told_what_to_do(tmp_path: Path) -> None:
    from spanrl.trainer._cli import _NEVER_REWARDED

    done = _train(tmp_path, _ZERO_AGENT, "[python, agent.py]", max_steps=1, eval_at_start="false")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-2].startswith("done: 1 steps, reward 0.00, held-out success 0.00; output in")
    assert lines[-1] == _NEVER_REWARDED
