"""Rollouts on a real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: each node its own
raylet and workers): command agents as Ray tasks and jsonl workers as Ray actors, spread over both nodes
(asserted from the node id recorded per rollout), with the local runner's environment, retries and end
records; a node killed mid-step: its rollouts fail as ``crashed``, are retried on the other nodes under fresh
ids, never hang and never reach the store twice; the calculator demo's quick GRPO steps through the backend.
Skips without Ray (``pip install 'spanrl[ray]'``, part of ``[all]``)."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'spanrl[ray]'")
from ray.cluster_utils import Cluster  # noqa: E402

from spanrl.errors import ConfigError  # noqa: E402
from spanrl.rollouts import ray_task  # noqa: E402
from spanrl.rollouts.rollouts import STATUS_CRASHED, STATUS_OK, STATUS_TIMEOUT, RolloutsConfig  # noqa: E402
from spanrl.rollouts.runner import RolloutJob, RolloutRunner, RunnerConfig  # noqa: E402
from spanrl.store import rollouts as store_rollouts  # noqa: E402

_NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}

# Records what it was given (cwd, URL, resource attributes) in OUT/<rollout_id>.json, sleeps (so rollouts
# in flight at once need both nodes), then emits its reward. Its task can ask it to crash on attempt 1 or
# to sleep long on attempt 1 (the node-kill test), or (jsonl) to answer rollouts from one long-lived process.
_AGENT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from spanrl.instrumentation import configure, emit_reward, rollout
    provider = configure()
    out = Path(sys.argv[1])

    def one(rollout_id, task, attempt, base_url):
        seen = {"cwd": os.getcwd(), "base_url": base_url, "pid": os.getpid(),
                "resource": os.environ.get("OTEL_RESOURCE_ATTRIBUTES"), "attempt": attempt}
        (out / f"{rollout_id}.started").write_text(json.dumps(seen))
        if task.get("crash_first") and attempt == 1:
            sys.exit(3)
        time.sleep(task.get("slow_first", 0) if attempt == 1 else 0.0)
        time.sleep(task.get("sleep", 0.0))
        emit_reward(1.0)
        provider.force_flush()
        (out / f"{rollout_id}.done").write_text("")

    if os.environ.get("SPANRL_AGENT_PROTOCOL") == "jsonl":
        for line in sys.stdin:
            msg = json.loads(line)
            with rollout(rollout_id=msg["rollout_id"], task_id=msg["task_id"], attempt=msg["attempt"],
                         mode=msg["mode"]):
                one(msg["rollout_id"], msg["task"], msg["attempt"], msg["base_url"])
            print(json.dumps({"spanrl_done": msg["rollout_id"]}), flush=True)
    else:
        one(os.environ["SPANRL_ROLLOUT_ID"], json.loads(os.environ["SPANRL_TASK"]), int(os.environ["SPANRL_ATTEMPT"]),
            os.environ["OPENAI_BASE_URL"])
    """
)


pytestmark = pytest.mark.usefixtures("one_ray_at_a_time")  # tests/conftest.py


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head and one worker node, one CPU each, no dashboard; torn down whatever happens."""
    made = Cluster(initialize_head=True, head_node_args={**_NODE, "include_dashboard": False})
    try:
        made.add_node(**_NODE)
        made.wait_for_nodes()
        yield made
    finally:
        if ray.is_initialized():
            ray.shutdown()
        made.shutdown()


def _node_ids(cluster: Cluster) -> set[str]:
    return {cluster.head_node.node_id, *(node.node_id for node in cluster.worker_nodes)}


def _runner(cluster: Cluster, collector: Any, agent: Path, out: Path, **runner: Any) -> RolloutRunner:
    store = collector.store
    config = RunnerConfig(**{"instrument": False, "require_token_spans": False, "max_concurrency": 4,
                             "rollout_timeout_s": 30.0, **runner})
    return RolloutRunner(
        [sys.executable, str(agent), str(out)], config=config,
        ready=lambda ids, since: store_rollouts.ready(store, ids, since, need_token_ids=False),
        otel_env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.grpc_endpoint}"},
        on_end=lambda ends: store_rollouts.record_ends(store, ends),
        backend=RolloutsConfig(backend="ray", address=cluster.address),
    )


def _write_agent(tmp_path: Path) -> tuple[Path, Path]:
    agent, out = tmp_path / "agent.py", tmp_path / "out"
    agent.write_text(_AGENT)
    out.mkdir()
    return agent, out


def _rewarded(store: Any, ids: list[str]) -> set[str]:
    table = store.sql("SELECT DISTINCT rollout_id FROM rewards WHERE list_contains(?, rollout_id)", [ids])
    return set(table.column("rollout_id").to_pylist())


def test_the_remote_module_ships_by_value_and_shares_the_statuses() -> None:
    # what runs on the nodes imports nothing of spanrl at module level (it is pickled by value)
    source = Path(ray_task.__file__).read_text().split('"""', 2)[2]
    assert "\nfrom spanrl" not in source and "\nimport spanrl" not in source
    assert (ray_task.OK, ray_task.CRASHED, ray_task.TIMEOUT) == (STATUS_OK, STATUS_CRASHED, STATUS_TIMEOUT)


def test_nodes_get_urls_on_the_advertised_host() -> None:
    from spanrl.rollouts.ray_backend import advertised

    assert advertised("http://127.0.0.1:4317", "10.0.0.5") == "http://10.0.0.5:4317"
    assert advertised("http://0.0.0.0:8000/rollouts/r-1-a1/v1", "trainer") == "http://trainer:8000/rollouts/r-1-a1/v1"
    assert advertised("http://policy-2:8000", "10.0.0.5") == "http://policy-2:8000"  # a server the user named
    assert advertised("http://127.0.0.1:4317", None) == "http://127.0.0.1:4317"


def test_a_runner_refused_after_connecting_leaves_no_ray_connection(cluster: Cluster) -> None:
    # a callable agent with no collector to send its spans to is refused after ray.init; the next
    # runner (or the user's own ray.init) must not find this one's connection still open
    with pytest.raises(ConfigError, match="needs the collector's OTLP endpoint"):
        RolloutRunner(lambda task: None, config=RunnerConfig(instrument=False), ready=lambda ids, since: set(ids),
                      backend=RolloutsConfig(backend="ray", address=cluster.address))
    assert not ray.is_initialized()


@pytest.mark.parametrize("workers", [0, 2], ids=["task-per-rollout", "jsonl-actors"])
def test_rollouts_spread_over_both_nodes_with_the_local_environment(
    cluster: Cluster, collector: Any, tmp_path: Path, workers: int
) -> None:
    agent, out = _write_agent(tmp_path)
    tasks = [{"id": f"t{i}", "sleep": 0.5, "crash_first": i == 0 and not workers} for i in range(8)]
    runner = _runner(cluster, collector, agent, out, workers=workers)
    try:
        results = runner.run([RolloutJob(t["id"], t) for t in tasks], id_prefix="r-", llm_url="http://127.0.0.1:9",
                             model="m", sampling={"temperature": 1.0})
    finally:
        runner.close()
    ok = [r for r in results if r.ok]
    assert sorted(r.task_id for r in ok) == sorted(t["id"] for t in tasks), results
    assert {r.node for r in ok} == _node_ids(cluster)  # both nodes ran rollouts
    assert _rewarded(collector.store, [r.rollout_id for r in ok]) == {r.rollout_id for r in ok}
    for r in ok:
        seen = json.loads((out / f"{r.rollout_id}.started").read_text())
        assert seen["base_url"] == f"http://127.0.0.1:9/rollouts/{r.rollout_id}/v1"
        assert Path(seen["cwd"]).name.startswith("spanrl-worker-" if workers else "spanrl-rollout-")
        if not workers:  # one process, one fresh working directory, removed after, per rollout
            assert f"spanrl.rollout.id={r.rollout_id}" in seen["resource"] and not Path(seen["cwd"]).exists()
    if workers:  # two long-lived processes answered every rollout
        assert len({json.loads(p.read_text())["pid"] for p in out.glob("*.started")}) == 2
    else:  # the crash is recorded with the agent's exit code and retried under a fresh id
        crashed = [r for r in results if not r.ok]
        assert [(r.rollout_id, r.status) for r in crashed] == [("r-0-a1", STATUS_CRASHED)]
        assert "agent exited with code 3" in crashed[0].error


def test_a_node_killed_mid_step_is_retried_elsewhere_never_hung_never_twice(
    cluster: Cluster, collector: Any, tmp_path: Path
) -> None:
    doomed = cluster.add_node(**_NODE)
    cluster.wait_for_nodes()
    agent, out = _write_agent(tmp_path)
    tasks = [{"id": f"k{i}", "slow_first": 6.0} for i in range(3)]  # first attempts still running at the kill
    runner = _runner(cluster, collector, agent, out, max_concurrency=3)
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(results=runner.run(
        [RolloutJob(t["id"], t) for t in tasks], id_prefix="k-", llm_url="http://127.0.0.1:9", model="m",
        sampling={})))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(list(out.glob("*-a1.started"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(out.glob("*-a1.started"))) == 3, "the first attempts did not start"
        cluster.remove_node(doomed, allow_graceful=False)
        thread.join(timeout=90)
        assert not thread.is_alive(), "the runner hung after a node was lost"
    finally:
        thread.join()
        runner.close()
    results = got["results"]
    ok = [r for r in results if r.ok]
    # lost attempts end "crashed" (Ray's error), not at the 30 s rollout timeout: that is the prompt handling
    assert sorted(r.task_id for r in ok) == ["k0", "k1", "k2"]
    lost = [r for r in results if not r.ok]
    assert lost and all(r.status == STATUS_CRASHED and "Ray task failed" in r.error for r in lost), results
    assert all(r.node != doomed.node_id for r in ok)
    # the lost attempts' agents died with their node: none finished, none left a reward to train on
    time.sleep(1.0)
    assert not any((out / f"{r.rollout_id}.done").exists() for r in lost)
    assert _rewarded(collector.store, [r.rollout_id for r in results]) == {r.rollout_id for r in ok}


def test_the_calculator_demo_quick_trains_through_ray(cluster: Cluster, tmp_path: Path) -> None:
    """The demo's quick setting (SFT warm start, then GRPO steps) with every rollout on the cluster: the
    same stages and figures as on this machine (the SFT start does not depend on where rollouts ran)."""
    from spanrl.demo.demo import DemoConfig, run_demo

    result = run_demo(DemoConfig.quick(output_dir=str(tmp_path / "demo"), progress=False,
                                       rollouts={"backend": "ray", "address": cluster.address}), echo=print)
    rows = [json.loads(line) for line in (tmp_path / "demo" / "grpo" / "rollouts.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["mode"] == "train"]
    assert len([r for r in train if r["status"] == STATUS_OK]) == 2 * 2 * 4  # steps x tasks x group size
    assert {r["node"] for r in rows} == _node_ids(cluster)
    assert [row["policy_version"] for row in result.history if "policy_version" in row][-1] == 2
    assert 0.0 <= result.sft_success <= 1.0 and 0.0 <= result.grpo_success <= 1.0
    print(f"ray quick demo: after SFT {result.sft_success:.2f} -> after GRPO {result.grpo_success:.2f} "
          f"in {result.seconds:.0f} s")
