"""Rollouts over several policy servers the Trainer did not start: spread, attributed, reloaded together."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest

from spanrl.algorithms import GRPO, LightningRL
from spanrl.errors import ConfigError, ServingError
from spanrl.serving import PolicyServer, ServerConfig
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig
from spanrl.rollouts.policy_pool import ServingConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agent(task: dict, llm: LLMEndpoint) -> float:
    """One chat call; the reward depends on the answer's length, so a group's rewards differ."""
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8,
        temperature=llm.sampling["temperature"],
    )
    return 1.0 - 0.1 * len((reply.choices[0].message.content or "").split())


def _trainer(model: Path, out: Path, serving: ServingConfig, steps: int = 2) -> Trainer:
    return Trainer(
        model=model, agent=agent, tasks=calculator.make_tasks(8, seed=3), algorithm=GRPO(learning_rate=5e-3),
        credit=LightningRL(mode="identical", baseline="grpo"),
        config=TrainerConfig(
            output_dir=str(out), n_rollouts=4, tasks_per_step=2, max_steps=steps, max_tokens=8, eval_at_start=False,
            progress=False, torch_threads=1, serving=serving,
            runner=RunnerConfig(max_concurrency=4, span_timeout_s=30.0),
        ),
    )


@pytest.mark.slow
def test_rollouts_spread_over_two_servers_and_both_are_reloaded_every_step(tiny_model: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", "pool-admin")  # what the Trainer sends to the reload route
    # the Trainer's collector guards every scope: servers it did not start export with the operator's policy token
    monkeypatch.setenv("SPANRL_COLLECTOR_POLICY_TOKEN", "pool-policy")
    servers = [
        PolicyServer(
            ServerConfig(model=tiny_model, port=0, served_model_name="policy", otlp_endpoint=f"127.0.0.1:{port}",
                         otlp_headers={"authorization": "Bearer pool-policy"},
                         service_name=f"policy-{name}", torch_threads=1, checkpoint_root=tmp_path)
        ).start()
        for name in ("a", "b")
    ]
    try:
        # round robin: an even split whatever the timing (least_loaded's split depends on when rollouts end)
        serving = ServingConfig(urls=tuple(s.base_url for s in servers), collector_port=port, balance="round_robin")
        trainer = _trainer(tiny_model, tmp_path / "run", serving)
        with trainer:
            history = trainer.train()
            trainer.evaluate(calculator.make_tasks(4, seed=11))  # greedy, through the same servers
            rows = trainer.collector.store.sql(
                "SELECT service_name, rollout_id, policy_version FROM spans WHERE completion_token_ids IS NOT NULL"
            ).to_pylist()
        versions = [s.version for s in servers]
        val = [r for r in rows if re.search(r"-v\d+-\d+-a\d+$", r["rollout_id"])]  # <run>-v<step>-<i>-a<attempt>
        rows = [r for r in rows if r not in val]
    finally:
        for s in servers:
            s.shutdown()
    assert [row["step"] for row in history] == [1, 2]
    assert versions == [2, 2]  # both reloaded after each update
    assert [row["policy_version"] for row in history] == [1, 2]
    by_service = {name: [r for r in rows if r["service_name"] == name] for name in ("policy-a", "policy-b")}
    assert len(by_service["policy-a"]) == len(by_service["policy-b"]) == 8  # 16 rollouts, one call each, spread evenly
    assert not [r for r in rows if r["service_name"] not in by_service]  # the embedded server generated nothing
    assert all(r["rollout_id"] for r in rows)  # every span attributed to its rollout
    step_of = {r["rollout_id"]: int(r["rollout_id"].split("-s")[-1].split("-")[0]) for r in rows}
    assert all(r["policy_version"] == step_of[r["rollout_id"]] - 1 for r in rows)  # step n rolled out on version n-1
    # evaluation ran on the servers the rollouts ran on (with vLLM there: the fast path), not the embedded server
    assert len(val) == 4 and {r["service_name"] for r in val} <= {"policy-a", "policy-b"}
    assert {r["policy_version"] for r in val} == {2}


def test_servers_at_another_version_are_refused_before_any_rollout(tiny_model: Path, tmp_path: Path) -> None:
    server = PolicyServer(ServerConfig(model=tiny_model, port=0, otlp_endpoint=None, torch_threads=1)).start()
    try:
        server.reload(tiny_model)
        trainer = _trainer(tiny_model, tmp_path / "run", ServingConfig(urls=(server.base_url,)))
        with pytest.raises(ServingError, match=r"versions \[1\], the Trainer's policy at 0"):
            trainer.start()
        assert not (tmp_path / "run" / "rollouts.jsonl").exists()
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        ({"backend": "tgi"}, "serving.backend must be one of"),
        ({"urls": ["localhost:8000"]}, "serving.urls entries must be http"),
        ({"balance": "random"}, "serving.balance must be one of"),
        ({"gpu_memory_utilization": 0}, r"serving.gpu_memory_utilization must be in \(0, 1\], got 0"),
        ({"gpus": 2}, "serving.gpus is not a serving setting"),
    ],
)
def test_bad_serving_settings_name_the_field(serving: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainerConfig(output_dir=str(tmp_path), serving=serving).validate()


def test_train_yaml_serving_section_reaches_the_trainer(tiny_model: Path, tmp_path: Path) -> None:
    from spanrl.trainer._cli import build_trainer

    raw = {
        "model": str(tiny_model), "agent": "python agent.py", "tasks": [{"id": "a"}], "tasks_per_step": 1,
        "output_dir": str(tmp_path),
        "serving": {"backend": "vllm", "dtype": "bfloat16", "urls": ["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
                    "balance": "round_robin", "collector_port": 4399},
    }
    serving = build_trainer(raw).config.serving
    assert isinstance(serving, ServingConfig)
    assert (serving.backend, serving.dtype, serving.urls, serving.balance, serving.collector_port) == (
        "vllm", "bfloat16", ("http://127.0.0.1:8001", "http://127.0.0.1:8002"), "round_robin", 4399
    )
