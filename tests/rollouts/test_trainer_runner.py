"""The rollout runner against a real collector: command agents (per process and as jsonl workers),
crash / hang / reward-less rollouts recorded and retried, never raised."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spanrl.rollouts.runner import RolloutJob, RolloutRunner, RunnerConfig
from spanrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

# A plain agent (no opentelemetry-instrument: it configures spanrl itself, which starts faster). Its
# behaviour comes from the task: ok, crash on the first attempt, hang, or finish without a reward.
_FLAKY_AGENT = textwrap.dedent(
    """
    import json, os, sys, time
    from spanrl.instrumentation import configure, emit_reward
    task = json.loads(os.environ["SPANRL_TASK"])
    provider = configure()
    kind = task["kind"]
    if kind == "crash_first" and os.environ["SPANRL_ATTEMPT"] == "1":
        print("boom: first attempt", file=sys.stderr)
        sys.exit(3)
    if kind == "hang":
        time.sleep(120)
    if kind != "no_reward":
        emit_reward(1.0)
    provider.force_flush()
    """
)


def _ready_fn(store: Any):
    def ready(ids: list[str], since_ns: int) -> set[str]:
        table = store.sql("SELECT DISTINCT rollout_id FROM rewards WHERE list_contains(?, rollout_id)", [list(ids)])
        return set(table.column("rollout_id").to_pylist())

    return ready


def _otel_env(collector: Any) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.grpc_endpoint}"}


def _calc_reply(body: dict[str, Any]) -> str:
    a, op, b = body["messages"][-1]["content"].split()
    return f"<call> {op} {a} {b} </call>"  # always right


def test_worker_agent_rollouts_reach_the_store(collector: Any) -> None:
    from spanrl.store.rollouts import record_ends

    tasks = calculator.make_tasks(12, seed=1)
    commits: list[int] = []
    runner = RolloutRunner(
        [sys.executable, str(REPO / "examples" / "calculator" / "agent.py")],
        config=RunnerConfig(workers=2, max_concurrency=4, require_token_spans=False, rollout_timeout_s=60),
        ready=_ready_fn(collector.store),
        otel_env=_otel_env(collector),
        on_end=lambda ends: (commits.append(len(ends)), record_ends(collector.store, ends)),
    )
    # A fake in place of spanrl's policy server, for what only a fake can do: answer every question right,
    # so every rollout's final reward must be exactly 1.0 (a real tiny policy scores ~0, and then a lost
    # reward would look like a wrong answer). The runner with the real server: tests/trainer/test_trainer*.py.
    with FakeOpenAI(reply=_calc_reply, record=False) as llm:
        try:
            results = runner.run(
                [RolloutJob(t["id"], t) for t in tasks], id_prefix="w-", llm_url=llm.url, model="m",
                sampling={"temperature": 1.0}
            )
        finally:
            runner.close()
    assert sorted(r.status for r in results) == ["ok"] * 12
    rows = collector.store.sql(
        "SELECT rollout_id, task_id, final_reward FROM rollouts WHERE rollout_id LIKE 'w-%'"
    ).to_pylist()
    assert len(rows) == 12
    assert {r["final_reward"] for r in rows} == {1.0}
    assert {r["task_id"] for r in rows} == {t["id"] for t in tasks}
    # the agent's OpenAI call went to the rollout's own URL and was traced under its rollout id
    chats = collector.store.sql("SELECT count(*) AS n FROM llm_calls WHERE rollout_id LIKE 'w-%'").to_pylist()
    assert chats[0]["n"] == 12
    # every worker's "done" stored as the rollout's end, once, in as many commits as the poller took them in
    ends = collector.store.sql("SELECT rollout_id, attributes ->> '$.\"spanrl.rollout.end.reason\"' AS reason "
                               "FROM spans WHERE name = 'spanrl.rollout.end' AND rollout_id LIKE 'w-%'").to_pylist()
    assert sorted(e["rollout_id"] for e in ends) == sorted(r.rollout_id for r in results)
    assert {e["reason"] for e in ends} == {"agent_done"} and sum(commits) == 12


def test_ends_that_come_together_are_stored_in_one_commit_and_its_error_reaches_each() -> None:
    """The runner's poller stores the ends that came in since its last round in one call of ``on_end`` (a DuckDB
    commit costs ~3 ms of CPU whatever it holds); a failed commit fails every rollout whose end it held."""
    import asyncio

    from spanrl.rollouts.runner import _SpanWaiter

    async def scenario(fail: bool) -> tuple[list[list[str]], list[Any]]:
        batches: list[list[str]] = []

        def store(ends: list[dict[str, Any]]) -> None:
            batches.append([e["rollout_id"] for e in ends])
            if fail:
                raise OSError("disk full")

        waiter = _SpanWaiter(lambda ids, since: set(ids), None, since_ns=0, store_ends=store)
        poller = asyncio.ensure_future(waiter.poll())
        outcomes = await asyncio.gather(*(waiter.end({"rollout_id": f"r{i}", "reason": "agent_done"})
                                          for i in range(5)), return_exceptions=True)
        later = await asyncio.gather(waiter.end({"rollout_id": "r5", "reason": "timeout"}), return_exceptions=True)
        poller.cancel()
        return batches, [*outcomes, *later]

    batches, outcomes = asyncio.run(scenario(fail=False))
    assert batches == [["r0", "r1", "r2", "r3", "r4"], ["r5"]] and outcomes == [None] * 6
    batches, outcomes = asyncio.run(scenario(fail=True))
    assert len(batches) == 2 and all(isinstance(o, OSError) and str(o) == "disk full" for o in outcomes)


def test_a_finished_rollout_is_stored_and_checked_in_one_poll_round() -> None:
    """While other rollouts are pending (the poller then sleeps between rounds), a rollout's end is committed in the
    round that also checks it: not one round for the end and a later one for the check (the last rollout of every
    step waited that extra round); a failed commit raises."""
    import asyncio

    from spanrl.rollouts.runner import _SpanWaiter

    async def scenario(fail: bool) -> tuple[list[str], Any]:
        log: list[str] = []

        def store(ends: list[dict[str, Any]]) -> None:
            log.append("store " + ",".join(e["rollout_id"] for e in ends))
            if fail:
                raise OSError("disk full")

        def ready(ids: Any, since: int) -> set[str]:
            log.append("check " + ",".join(sorted(ids)))
            return {i for i in ids if i != "slow"}

        waiter = _SpanWaiter(ready, None, since_ns=0, store_ends=store)
        poller = asyncio.ensure_future(waiter.poll())
        slow = asyncio.ensure_future(waiter.wait("slow", 5.0))  # never ready: keeps the poller going round by round
        while not log:
            await asyncio.sleep(0.01)
        outcome = await asyncio.gather(waiter.wait("r0", 5.0, end={"rollout_id": "r0", "reason": "agent_done"}),
                                       return_exceptions=True)
        poller.cancel()
        slow.cancel()
        return log, outcome[0]

    log, ok = asyncio.run(scenario(fail=False))
    assert ok is True
    assert log[log.index("store r0") + 1] == "check r0,slow"
    log, error = asyncio.run(scenario(fail=True))
    assert isinstance(error, OSError) and str(error) == "disk full" and "store r0" in log


def test_rounds_are_spaced_while_agents_run_and_the_last_answer_is_checked_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While an agent of the batch still runs, the poller pauses ``_BUSY_POLL_INTERVAL_S`` between rounds (the batch
    waits for that agent anyway, and a round costs the trainer's process ~15 ms of CPU); when the last agent answers
    its rollout is checked at once, and rounds then come every ``_POLL_INTERVAL_S`` until all are stored."""
    import asyncio

    from spanrl.rollouts import runner
    from spanrl.rollouts.runner import _SpanWaiter

    # the pause never ends by itself: only the last agent's answer can start the round that checks r0
    monkeypatch.setattr(runner, "_BUSY_POLL_INTERVAL_S", 1e9)

    async def until(predicate: Any) -> None:  # a hang guard, not a verdict
        async def poll() -> None:
            while not predicate():
                await asyncio.sleep(0.01)
        await asyncio.wait_for(poll(), 120)

    async def scenario() -> tuple[int, int]:
        checks: list[list[str]] = []

        def ready(ids: Any, since: int) -> set[str]:
            checks.append(sorted(ids))
            return {i for i in ids if i != "slow"}

        waiter = _SpanWaiter(ready, None, since_ns=0)
        waiter.running = 1  # an agent has not answered yet
        poller = asyncio.ensure_future(waiter.poll())
        slow = asyncio.ensure_future(waiter.wait("slow", 600.0))  # never ready: the poller keeps going
        await until(lambda: len(checks) == 1)  # one round (the wait asked for it), then the pause
        await asyncio.sleep(0.3)
        while_running = len(checks)  # still 1: no round while the agent runs (a sleep can only miss a bug)
        waiter.answered()
        assert await waiter.wait("r0", 120.0)  # checked at once: the pause would never have ended
        before = len(checks)
        await until(lambda: len(checks) >= before + 2)  # then rounds every _POLL_INTERVAL_S until all are stored
        poller.cancel()
        slow.cancel()
        return while_running, len(checks) - before

    while_running, after = asyncio.run(scenario())
    assert while_running == 1
    assert after >= 2


def test_failed_rollouts_are_recorded_and_retried(collector: Any, tmp_path: Path) -> None:
    script = tmp_path / "flaky_agent.py"
    script.write_text(_FLAKY_AGENT)

    def run(kinds: tuple[str, ...], prefix: str, rollout_timeout_s: float, span_timeout_s: float) -> list[Any]:
        config = RunnerConfig(max_concurrency=4, rollout_timeout_s=rollout_timeout_s, span_timeout_s=span_timeout_s,
                              max_attempts=2, instrument=False, require_token_spans=False)
        runner = RolloutRunner([sys.executable, str(script)], config=config, ready=_ready_fn(collector.store),
                               otel_env=_otel_env(collector))
        try:
            return runner.run([RolloutJob(kind, {"kind": kind}) for kind in kinds], id_prefix=prefix,
                              llm_url="http://127.0.0.1:9", model="m", sampling={})
        finally:
            runner.close()

    # the agents that must finish get limits no loaded machine reaches (an agent's start is seconds at load 30);
    # each limit that is a verdict is short, and only there: "timeout" for the hanging one, "no_reward" (the
    # span limit) for the one that never sends a reward
    results = run(("ok", "crash_first"), "f-", rollout_timeout_s=300.0, span_timeout_s=60.0)
    results += run(("hang",), "g-", rollout_timeout_s=8.0, span_timeout_s=60.0)
    results += run(("no_reward",), "h-", rollout_timeout_s=300.0, span_timeout_s=3.0)
    by_task: dict[str, list[str]] = {}
    for r in sorted(results, key=lambda r: r.attempt):
        by_task.setdefault(r.task_id, []).append(r.status)
    assert by_task == {
        "ok": ["ok"],
        "crash_first": ["crashed", "ok"],
        "hang": ["timeout", "timeout"],
        "no_reward": ["no_reward", "no_reward"],
    }
    crash = next(r for r in results if r.status == "crashed")
    assert "exited with code 3" in (crash.error or "") and "boom: first attempt" in (crash.error or "")
    # fresh id per attempt
    assert sorted(r.rollout_id for r in results if r.task_id == "crash_first") == ["f-1-a1", "f-1-a2"]
    # the hung agent's "timeout" twice is the verdict: waited for, it would have slept its 120 s and reported "ok"


def test_hung_worker_is_killed_and_replaced(collector: Any, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, time
            from spanrl.instrumentation import configure, emit_reward, rollout
            provider = configure()
            for line in sys.stdin:
                job = json.loads(line)
                if job["task"]["kind"] == "hang" and job["attempt"] == 1:
                    time.sleep(120)
                with rollout(job["rollout_id"], task_id=job["task_id"]):
                    emit_reward(0.5)
                provider.force_flush()
                print(json.dumps({"spanrl_done": job["rollout_id"]}), flush=True)
            """
        )
    )
    config = RunnerConfig(workers=1, rollout_timeout_s=8.0, span_timeout_s=5.0, max_attempts=2, instrument=False,
                          require_token_spans=False)
    runner = RolloutRunner([sys.executable, str(script)], config=config, ready=_ready_fn(collector.store),
                           otel_env=_otel_env(collector))
    try:
        results = runner.run(
            [RolloutJob("a", {"kind": "hang"}), RolloutJob("b", {"kind": "ok"})], id_prefix="h-", llm_url="http://x",
            model="m", sampling={}
        )
    finally:
        runner.close()
    statuses = sorted((r.task_id, r.attempt, r.status) for r in results)
    assert statuses == [("a", 1, "timeout"), ("a", 2, "ok"), ("b", 1, "ok")]


def test_runner_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="max_attempts must be a positive integer, got 0"):
        RunnerConfig(max_attempts=0).validate()
    with pytest.raises(ConfigError, match="rollout_timeout_s must be a positive number of seconds, got -1"):
        RunnerConfig(rollout_timeout_s=-1).validate()
    with pytest.raises(ConfigError, match="workers must be a non-negative integer"):
        RunnerConfig(workers=-2).validate()
    with pytest.raises(ConfigError, match="agent must be a callable or a command line, got int"):
        RolloutRunner(3, config=RunnerConfig(), ready=lambda ids, since_ns: set())  # type: ignore[arg-type]


def test_sync_agents_past_asyncio_s_thread_pool_all_run_and_their_ends_are_seen() -> None:
    # asyncio's default pool has min(32, cpu_count + 4) threads. With more sync agents than that, the span
    # waiter's store poll queued behind agents and rollouts whose rewards were already stored ran out of
    # span_timeout_s (16 text-to-SQL agents on 2 cores: every first attempt "no reward stored within 60 s").
    # Queued so, the first wave's poll waits out the second wave (6 s), twice its span_timeout_s; a correct
    # poll needs a thread within those 3 s, even at load 30.
    pool = min(32, (os.cpu_count() or 1) + 4)
    n = 2 * pool + 4
    lock, running, peak = threading.Lock(), [0], [0]

    def agent(task: Any, llm: Any) -> float:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(6.0)
        with lock:
            running[0] -= 1
        return 1.0

    runner = RolloutRunner(agent, config=RunnerConfig(max_concurrency=n, span_timeout_s=3.0, max_attempts=1),
                           ready=lambda ids, since_ns: set(ids))  # every finished rollout's spans are there
    try:
        results = runner.run([RolloutJob(f"t{i}", {}) for i in range(n)], id_prefix="sync-", llm_url="http://x",
                             model="m", sampling={})
    finally:
        runner.close()
    assert [r.status for r in results] == ["ok"] * n, [r.error for r in results if not r.ok][:3]
    assert peak[0] == n  # all at once, as max_concurrency allows


def test_agent_that_cannot_start_is_recorded_not_raised(collector: Any, tmp_path: Path) -> None:
    config = RunnerConfig(max_attempts=2, instrument=False, require_token_spans=False)
    runner = RolloutRunner([str(tmp_path / "no-such-agent")], config=config, ready=_ready_fn(collector.store))
    try:
        results = runner.run([RolloutJob("t", {})], id_prefix="n-", llm_url="http://x", model="m", sampling={})
    finally:
        runner.close()
    assert [(r.attempt, r.status) for r in results] == [(1, "crashed"), (2, "crashed")]
    assert "could not run the agent: FileNotFoundError" in (results[0].error or "")


# Scores the prompt template it was given: 1.0 when it is "Be exact: {question}", 0.5 when another one
# came, 0.0 without one. Per process it reads SPANRL_PROMPT_TEMPLATE; as a jsonl worker, the request key.
_TEMPLATE_AGENT = textwrap.dedent(
    """
    import json, os, sys
    from spanrl.instrumentation import configure, emit_reward, rollout

    def score(template):
        return 0.0 if template is None else 1.0 if template == "Be exact: {question}" else 0.5

    provider = configure()
    if os.environ.get("SPANRL_AGENT_PROTOCOL") == "jsonl":
        for line in sys.stdin:
            job = json.loads(line)
            with rollout(job["rollout_id"], task_id=job["task_id"]):
                emit_reward(score(job["prompt_template"]))
            provider.force_flush()
            print(json.dumps({"spanrl_done": job["rollout_id"]}), flush=True)
    else:
        emit_reward(score(os.environ.get("SPANRL_PROMPT_TEMPLATE")))
        provider.force_flush()
    """
)


@pytest.mark.parametrize("workers", [0, 1])
def test_prompt_template_reaches_command_agents(collector: Any, tmp_path: Path, workers: int) -> None:
    script = tmp_path / "template_agent.py"
    script.write_text(_TEMPLATE_AGENT)
    config = RunnerConfig(workers=workers, rollout_timeout_s=30.0, instrument=False, require_token_spans=False)
    runner = RolloutRunner([sys.executable, str(script)], config=config, ready=_ready_fn(collector.store),
                           otel_env=_otel_env(collector))
    try:
        for prefix, template in ((f"pt{workers}-", "Be exact: {question}"), (f"pn{workers}-", None)):
            results = runner.run(
                [RolloutJob("t", {"question": "1 add 2"})], id_prefix=prefix, llm_url="http://x", model="m",
                sampling={}, prompt_template=template,
            )
            assert [r.status for r in results] == ["ok"]
    finally:
        runner.close()
    rows = collector.store.sql(
        "SELECT rollout_id, final_reward FROM rollouts WHERE rollout_id LIKE ? OR rollout_id LIKE ?",
        [f"pt{workers}-%", f"pn{workers}-%"]
    ).to_pylist()
    assert ({r["rollout_id"].split("-")[0]: r["final_reward"] for r in rows}
            == {f"pt{workers}": 1.0, f"pn{workers}": 0.0})


# Writes which tokens it was given, then reports a reward through its SDK (which sends the ingest token).
_TOKEN_AGENT = textwrap.dedent(
    """
    import json, os
    from spanrl.instrumentation import configure, emit_reward
    provider = configure()
    names = [k for k in os.environ if "TOKEN" in k and k.startswith("SPANRL_")]
    with open(os.environ["TOKENS_OUT"], "w") as out:
        json.dump({k: os.environ[k] for k in names}, out)
    emit_reward(1.0)
    provider.force_flush()
    """
)


def test_agents_get_the_ingest_token_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, finding 4: the token an agent is given must not read other tenants' spans or prune."""
    from spanrl.collector import Collector, CollectorConfig

    tokens = {"SPANRL_COLLECTOR_INGEST_TOKEN": "agent-t", "SPANRL_COLLECTOR_TOKEN": "all-t",
              "SPANRL_COLLECTOR_READ_TOKEN": "read-t", "SPANRL_COLLECTOR_ADMIN_TOKEN": "admin-t",
              "SPANRL_COLLECTOR_POLICY_TOKEN": "policy-t", "SPANRL_POLICY_ADMIN_TOKEN": "reload-t"}
    for name, value in tokens.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "agent.py").write_text(_TOKEN_AGENT)
    config = CollectorConfig(db_path=str(tmp_path / "t.duckdb"), grpc_port=0, http_port=-1, token="all-t",
                             ingest_token="agent-t", materialize_interval_s=None)
    with Collector(config) as collector:
        runner = RolloutRunner([sys.executable, str(tmp_path / "agent.py")], otel_env=_otel_env(collector),
                               config=RunnerConfig(instrument=False, require_token_spans=False,
                                                   env={"TOKENS_OUT": str(tmp_path / "tokens.json")}),
                               ready=_ready_fn(collector.store))
        try:
            (result,) = runner.run([RolloutJob("t", {})], id_prefix="k-", llm_url="http://x", model="m", sampling={})
        finally:
            runner.close()
        assert result.status == "ok", result.error
    import json

    assert json.loads((tmp_path / "tokens.json").read_text()) == {"SPANRL_COLLECTOR_INGEST_TOKEN": "agent-t"}


def test_start_agents_starts_every_worker_before_the_first_rollout(tmp_path: Path) -> None:
    """The Trainer starts its command workers while its server subprocesses load (trainer/services.py): each
    worker is up, reading its stdin, before any rollout is asked for."""
    started = tmp_path / "started"
    script = tmp_path / "worker.py"
    script.write_text(f"import os, sys\nwith open({str(started)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n"
                      "for _ in sys.stdin:\n    pass\n")
    runner = RolloutRunner([sys.executable, str(script)], config=RunnerConfig(workers=3, instrument=False),
                           ready=lambda ids, since: set(), otel_env={})
    try:
        runner.start_agents()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(started.read_text().split() if started.exists() else []) < 3:
            time.sleep(0.05)
        assert len(set(started.read_text().split())) == 3  # three processes, no rollout run
    finally:
        runner.close()


def test_workers_are_ended_together(tmp_path: Path) -> None:
    """Closing the pool ends its workers at once, not one after the other: a worker's interpreter takes a while to
    exit (the demo's agent ~0.5 s of CPU before it skipped its teardown), and four in turn held the trainer's close.
    Told by order, not by a clock: each worker, at the end of its stdin, waits until all three have seen theirs
    (at most 10 s), which they can only if close() ended every stdin before waiting for any worker."""
    import asyncio

    from spanrl.rollouts.agent_processes import WorkerPool

    up, ended, verdicts = tmp_path / "up", tmp_path / "ended", tmp_path / "verdicts"
    script = tmp_path / "waits_for_the_others.py"
    script.write_text(textwrap.dedent(f"""\
        import os, sys, time
        with open({str(up)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        for _ in sys.stdin:
            pass
        with open({str(ended)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        deadline = time.monotonic() + 10
        while len(open({str(ended)!r}).read().split()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        with open({str(verdicts)!r}, "a") as f:
            f.write("together\\n" if len(open({str(ended)!r}).read().split()) == 3 else "alone\\n")
        """))
    pool = WorkerPool([sys.executable, str(script)], dict(os.environ), workers=3)

    async def scenario() -> None:
        await pool.start()
        try:
            async with asyncio.timeout(120):  # every worker up before the close (a slow start is not the close's)
                while not up.exists() or len(up.read_text().split()) < 3:
                    await asyncio.sleep(0.05)
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert all(w.proc is not None and w.proc.returncode == 0 for w in pool.workers)
    assert verdicts.read_text().split() == ["together"] * 3  # one after the other: "alone" (after 10 s) each
