"""Policy servers in processes of their own (``serving: {placement: process}``): real ``spanrl serve``
subprocesses take the rollouts, are reloaded every update, export their spans to the Trainer's collector, and
none is left after the run, nor after a run that failed because one of them died, nor after the Trainer's process
was killed outright."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from spanrl.algorithms import GRPO, LightningRL
from spanrl.errors import ConfigError, ServingError, TrainingError
from spanrl.rollouts.policy_pool import ServingConfig
from spanrl.rollouts.rollouts import RolloutsConfig
from spanrl.serving.client import PolicyClient
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_command_log_file() -> Iterator[None]:
    """The servers write to the process's ``spanrl.log`` when a command set one, else the run's: a CLI test run
    in process before these (same pytest worker) leaves its file handler on the root logger, so lift it here."""
    root = logging.getLogger()
    lifted = [h for h in root.handlers if isinstance(h, logging.FileHandler) and h.baseFilename != os.devnull]
    for handler in lifted:
        root.removeHandler(handler)
    yield
    for handler in lifted:
        root.addHandler(handler)


def agent(task: dict, llm: LLMEndpoint) -> float:
    """One chat call; the reward depends on the answer's length, so a group's rewards differ."""
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8,
        temperature=llm.sampling["temperature"],
    )
    return 1.0 - 0.1 * len((reply.choices[0].message.content or "").split())


def _trainer(model: Path, out: Path, *, replicas: int, steps: int, deterministic: bool = False,
             prefix_caching: bool = False) -> Trainer:
    return Trainer(
        model=model, agent=agent, tasks=calculator.make_tasks(8, seed=3), algorithm=GRPO(learning_rate=5e-3),
        credit=LightningRL(mode="identical", baseline="grpo"),
        config=TrainerConfig(
            output_dir=str(out), n_rollouts=4, tasks_per_step=2, max_steps=steps, max_tokens=8,
            eval_at_start=False, progress=False, torch_threads=1, deterministic=deterministic,
            serving=ServingConfig(placement="process", replicas=replicas, prefix_caching=prefix_caching),
            runner=RunnerConfig(max_concurrency=4, span_timeout_s=30.0),
        ),
    )


def test_a_server_process_takes_the_rollouts_and_is_reloaded_every_step(tmp_path: Path, tiny_model: Path) -> None:
    trainer = _trainer(tiny_model, tmp_path / "run", replicas=1, steps=2)
    with trainer:
        roots, embedded = trainer.server.roots, trainer.server.base_url
        procs = list(trainer.server.started.procs)
        history = trainer.train()
        version = PolicyClient(roots[0]).version()
        looked_up = _prefix_cache_queries(roots[0])
        rows = trainer.collector.store.sql(
            "SELECT rollout_id, policy_version FROM spans WHERE completion_token_ids IS NOT NULL"
        ).to_pylist()
    assert roots != [embedded] and roots[0].startswith("http://127.0.0.1:")
    assert version == 2  # the subprocess reloaded after each update
    assert looked_up is None  # the Trainer's servers run without the prefix cache
    assert [row["policy_version"] for row in history] == [1, 2]
    assert len(rows) == 16  # 16 rollouts, one call each, all from the subprocess (the embedded one serves none)
    step_of = {r["rollout_id"]: int(r["rollout_id"].split("-s")[-1].split("-")[0]) for r in rows}
    assert all(r["policy_version"] == step_of[r["rollout_id"]] - 1 for r in rows)  # step n rolled out on version n-1
    assert [p.returncode for p in procs] == [0]  # stopped (SIGTERM, clean shutdown) and reaped
    log = (tmp_path / "run" / "spanrl.log").read_text()
    assert "Uvicorn running on http://127.0.0.1" in log
    assert '"POST /rollouts/' not in log  # no access-log line per call (--disable-uvicorn-access-log)
    with pytest.raises(ServingError, match="no spanrl policy server answers"):
        PolicyClient(roots[0]).version()


def _prefix_cache_queries(root: str) -> float | None:
    """The server's ``spanrl:prefix_cache_queries_total`` (prompt tokens looked up in its prefix cache); None where
    it runs no prefix cache (then /metrics has no such counter)."""
    found = re.search(r"^spanrl:prefix_cache_queries_total (\S+)$", httpx.get(f"{root}/metrics", timeout=10).text,
                      re.MULTILINE)
    return float(found.group(1)) if found else None


@pytest.mark.parametrize(("deterministic", "cached"), [(False, True), (True, False)])
def test_serving_prefix_caching_reaches_the_server_processes_unless_deterministic(
        tmp_path: Path, tiny_model: Path, deterministic: bool, cached: bool) -> None:
    with _trainer(tiny_model, tmp_path / "run", replicas=1, steps=1, deterministic=deterministic,
                  prefix_caching=True) as trainer:
        trainer.train()
        looked_up = _prefix_cache_queries(trainer.server.roots[0])
    assert (looked_up is not None and looked_up > 0) if cached else looked_up is None


def test_a_server_that_dies_mid_run_stops_the_run_with_its_exit_code(tmp_path: Path, tiny_model: Path) -> None:
    trainer = _trainer(tiny_model, tmp_path / "run", replicas=2, steps=2)
    with pytest.raises(TrainingError) as caught:
        with trainer:
            procs = list(trainer.server.started.procs)
            os.kill(procs[1].pid, signal.SIGKILL)
            procs[1].wait()
            trainer.train()
    message = str(caught.value)
    assert f"(pid {procs[1].pid}) exited with code -9 during the run" in message
    assert str(tmp_path / "run" / "spanrl.log") in message
    assert all(p.returncode is not None for p in procs)  # the other one stopped and reaped after the failure


_PARENT = """
import sys, time
from pathlib import Path
from spanrl.rollouts.policy_pool import ServingConfig
from spanrl.rollouts.process_serving import ProcessServers

out = Path(sys.argv[2])
servers = ProcessServers(ServingConfig(placement="process", replicas=2), model=Path(sys.argv[1]),
                         weights_dir=out / "weights", otlp_endpoint=None, served_model_name="policy",
                         max_batch_size=4, seed=0, log_path=out / "spanrl.log", threads=1)
servers.wait_ready()
print(" ".join(str(p.pid) for p in servers.procs), flush=True)
time.sleep(600)  # killed before it closes anything
"""


def _running(pid: int) -> bool:
    try:  # a zombie (exited, not reaped by its new parent) is not running
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to see a process end")
def test_a_trainer_killed_outright_leaves_no_server_running(tmp_path: Path, tiny_model: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tiny_model), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]  # both servers up
        assert len(pids) == 2 and all(_running(p) for p in pids)
    finally:
        parent.kill()  # SIGKILL: no close(), no atexit
        parent.wait()
    deadline = time.monotonic() + 60  # a hang guard: each server checks its parent once a second
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _running(p)], (tmp_path / "spanrl.log").read_text()[-2000:]
    assert "is gone: stopping" in (tmp_path / "spanrl.log").read_text()


def test_process_servers_are_refused_where_rollouts_run_on_other_machines(tmp_path: Path, tiny_model: Path) -> None:
    trainer = _trainer(tiny_model, tmp_path / "run", replicas=1, steps=1)
    trainer.config.rollouts = RolloutsConfig(advertise_host="10.0.0.5")
    with pytest.raises(ConfigError, match=r"placement process binds 127.0.0.1, which rollouts on other machines"):
        trainer.start()
    trainer.close()


@pytest.mark.parametrize(("fields", "message"), [
    ({"placement": "process", "backend": "vllm"}, "serving.placement process starts transformers-backend servers"),
    ({"placement": "process", "replicas": 0}, "serving.replicas must be a positive integer"),
    ({"placement": "thread"}, "serving.placement must be one of local, process, ray; got 'thread'"),
])
def test_bad_process_serving_settings_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServingConfig.of(fields)
