"""Policy servers as Ray actors (``serving: {placement: ray, replicas: 2}``) on a real two-node local Ray
cluster: rollouts spread over both replicas, each replica reloaded after every update, and nothing of
them (actors, servers, the Ray connection) left after the run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from ray.cluster_utils import Cluster  # noqa: E402

from spanrl.algorithms import GRPO, LightningRL  # noqa: E402
from spanrl.errors import ConfigError, ServingError  # noqa: E402
from spanrl.rollouts.policy_pool import ServingConfig  # noqa: E402
from spanrl.rollouts.rollouts import RolloutsConfig  # noqa: E402
from spanrl.serving.client import PolicyClient  # noqa: E402
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402

_NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


def agent(task: dict, llm: LLMEndpoint) -> float:
    """One chat call; the reward depends on the answer's length, so a group's rewards differ."""
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8,
        temperature=llm.sampling["temperature"],
    )
    return 1.0 - 0.1 * len((reply.choices[0].message.content or "").split())


pytestmark = pytest.mark.usefixtures("one_ray_at_a_time")  # tests/conftest.py


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two nodes of one CPU each: one replica a node."""
    made = Cluster(initialize_head=True, head_node_args={**_NODE, "include_dashboard": False})
    try:
        made.add_node(**_NODE)
        made.wait_for_nodes(timeout=180)
        yield made
    finally:
        if ray.is_initialized():
            ray.shutdown()
        made.shutdown()


@pytest.mark.slow
def test_two_replicas_on_ray_take_the_rollouts_and_are_reloaded_every_step(cluster: Cluster, tmp_path: Path,
                                                                          tiny_model: Path) -> None:
    model = tiny_model
    serving = ServingConfig(placement="ray", replicas=2, balance="round_robin")
    trainer = Trainer(
        model=model, agent=agent, tasks=calculator.make_tasks(8, seed=3), algorithm=GRPO(learning_rate=5e-3),
        credit=LightningRL(mode="identical", baseline="grpo"),
        config=TrainerConfig(
            output_dir=str(tmp_path / "run"), n_rollouts=4, tasks_per_step=2, max_steps=2, max_tokens=8,
            eval_at_start=False, progress=False, torch_threads=1, serving=serving,
            rollouts=RolloutsConfig(address=cluster.address),
            runner=RunnerConfig(max_concurrency=4, span_timeout_s=30.0),
        ),
    )
    with trainer:
        roots = trainer.server.roots
        history = trainer.train()
        versions = [PolicyClient(root).version() for root in roots]
        rows = trainer.collector.store.sql(
            "SELECT service_name, rollout_id, policy_version FROM spans WHERE completion_token_ids IS NOT NULL"
        ).to_pylist()
    assert len(set(roots)) == 2
    assert versions == [2, 2]  # both replicas reloaded after each update
    assert [row["policy_version"] for row in history] == [1, 2]
    by_service = {f"spanrl-policy-ray-{i}": [r for r in rows if r["service_name"] == f"spanrl-policy-ray-{i}"]
                  for i in range(2)}
    assert [len(spans) for spans in by_service.values()] == [8, 8]  # 16 rollouts, one call each, round robin
    assert len(rows) == 16  # the embedded server generated none of them
    step_of = {r["rollout_id"]: int(r["rollout_id"].split("-s")[-1].split("-")[0]) for r in rows}
    assert all(r["policy_version"] == step_of[r["rollout_id"]] - 1 for r in rows)  # step n rolled out on version n-1
    assert not ray.is_initialized()  # the run's Ray connection and its servers are gone
    with pytest.raises(ServingError, match="no spanrl policy server answers"):
        PolicyClient(roots[0]).version()


@pytest.mark.parametrize(("fields", "message"), [
    ({"placement": "k8s"}, "serving.placement must be one of"),
    ({"placement": "ray", "replicas": 0}, "serving.replicas must be a positive integer"),
    ({"placement": "ray", "backend": "vllm"}, "serving.placement ray starts transformers-backend servers"),
    ({"ray_resources": {"CPU": -1}}, "serving.ray_resources must map"),
])
def test_bad_ray_serving_settings_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServingConfig.of(fields)
