"""Online training on a simulated production stream, through real processes only.

A `spanrl collector` and a `spanrl serve` (tiny model) run as subprocesses; two production agents
(`examples/production/agent.py` under `opentelemetry-instrument`), started by the test and not by any
trainer, send requests at a steady rate; a separate feedback process judges each answer seconds later
by rollout id, response id or trace id, never for some, twice for others. `spanrl train --online`
follows the store, is SIGKILLed mid-stream and restarted. Success rises; no rollout is trained twice;
the SQL store shows the policy version over time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from spanrl.demo.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = REPO / "examples" / "production"
sys.path.insert(0, str(PRODUCTION))

from colors import TASKS, VOCABULARY, is_right  # noqa: E402

_TASKS = {t["id"]: t for t in TASKS}
_UPDATES_BEFORE_KILL = 4
_UPDATES_TOTAL = 16
_STREAM_LIMIT_S = 900.0  # a hang guard for the first updates (serve start, streams, 4 updates): 147-392 s whole
# runs were measured at load 8-25; 420 s left a run at load 30 too little
# The online tests wait on a run's progress, not on a clock: a trainer fails only when no update lands for
# _STALL_S (a hang). A fixed 300 s for test_online_plain_agent's whole run timed out at nice 19 beside load 26
# (2026-12-07); that run takes 70-100 s on a quiet machine (docs/measurements.md, "Learning tests over
# repeated runs").
_STALL_S = 300.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _wait_until(predicate: Any, timeout_s: float, what: str, procs: list[subprocess.Popen[Any]] = ()) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{what}: {proc.args!r} exited with {proc.returncode}")
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_while_updating(trainer: subprocess.Popen[Any], history: Path) -> None:
    """Until ``trainer`` exits; fails when no new row reaches ``history`` for ``_STALL_S``."""
    rows, since = -1, time.monotonic()
    while trainer.poll() is None:
        if (now := len(_read_jsonl(history))) != rows:
            rows, since = now, time.monotonic()
        assert time.monotonic() - since < _STALL_S, f"no online update for {_STALL_S:.0f} s after {rows} rows"
        time.sleep(0.5)


class _Stream:
    """Everything the test starts, stopped in reverse order."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []

    def start(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        with open(log, "a") as handle:
            proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                    cwd=REPO, start_new_session=True)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _config(tmp_path: Path, model: Path, server_url: str, store_url: str) -> Path:
    path = tmp_path / "online.yaml"
    path.write_text(
        f"model: {model}\n"
        f"server_url: {server_url}\n"
        f"store_url: {store_url}\n"
        f"output_dir: {tmp_path / 'online'}\n"
        "algorithm: {name: grpo, learning_rate: 5.0e-2}\n"
        "poll_interval_s: 0.5\nsettle_s: 2.5\nmax_age_s: 8\nquiet_s: 30\n"
        "min_rollouts: 16\nmax_rollouts: 128\nmax_policy_lag: 3\n"
        f"max_updates: {_UPDATES_TOTAL}\n"
    )
    return path


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a limit for a hang only: _wait_while_updating fails sooner
def test_online_trainer_learns_from_a_production_stream(tmp_path: Path, collector_proc: Any) -> None:
    model = build_tiny_model(tmp_path / "tiny", words=VOCABULARY, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    stream = _Stream()
    try:
        port = _free_port()
        server_url = f"http://127.0.0.1:{port}"
        (tmp_path / "admin.token").write_text("online-admin\n")  # the reload route needs it (issue 28)
        serve = stream.start([sys.executable, "-m", "spanrl", "serve", "--model", str(model), "--port", str(port),
                              "--served-model-name", "policy", "--threads", "1", "--checkpoint-root", str(tmp_path),
                              "--admin-token-file", str(tmp_path / "admin.token"),
                              "--otlp-endpoint", collector_proc.grpc_endpoint], tmp_path / "serve.log")
        _wait_until(lambda: _get_json(f"{server_url}/health")["status"] == "ok", 120, "spanrl serve", [serve])
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector_proc.grpc_endpoint}",
                "OTEL_SERVICE_NAME": "prod-agent"}
        logs = [tmp_path / f"requests-{name}.jsonl" for name in ("a", "b")]
        for name, log in zip(("a", "b"), logs):
            stream.start([str(Path(sys.executable).parent / "opentelemetry-instrument"), sys.executable,
                          str(PRODUCTION / "agent.py"), "--server", server_url,
                          "--name", f"agent-{name}", "--rate", "4", "--request-log", str(log)],
                         tmp_path / f"agent-{name}.log", otel)
        feedback_args = [sys.executable, str(PRODUCTION / "feedback.py"), "--delay", "2", "--never", "0.15",
                         "--twice", "0.15", "--sent-log", str(tmp_path / "feedback.jsonl")]
        for log in logs:
            feedback_args += ["--log", str(log)]
        stream.start(feedback_args, tmp_path / "feedback.log", otel)

        config = _config(tmp_path, model, server_url, collector_proc.http_endpoint)
        online_cmd = [sys.executable, "-m", "spanrl", "train", "--online", str(config)]
        admin = {"SPANRL_POLICY_ADMIN_TOKEN": "online-admin"}
        history_path = tmp_path / "online" / "history.jsonl"
        trainer = stream.start(online_cmd, tmp_path / "online-1.log", admin)
        _wait_until(lambda: len(_read_jsonl(history_path)) >= _UPDATES_BEFORE_KILL, _STREAM_LIMIT_S,
                    "the first online updates", [trainer])
        os.killpg(trainer.pid, signal.SIGKILL)  # mid-stream, no clean shutdown
        trainer.wait(10)
        killed_at = len(_read_jsonl(history_path))
        trainer = stream.start(online_cmd, tmp_path / "online-2.log", admin)
        _wait_while_updating(trainer, history_path)
        assert trainer.returncode == 0, (tmp_path / "online-2.log").read_text()[-3000:]
    finally:
        stream.close()

    out = tmp_path / "online"
    history = _read_jsonl(history_path)
    ledger = _read_jsonl(out / "ledger.jsonl")
    state = json.loads((out / "online_state.json").read_text())
    requests = {r["rollout_id"]: r for log in logs for r in _read_jsonl(log)}
    sent = _read_jsonl(tmp_path / "feedback.jsonl")

    # Resumed, not restarted: the steps continue and the run ended at max_updates.
    assert state["step"] == _UPDATES_TOTAL and [row["step"] for row in history][-1] == _UPDATES_TOTAL
    assert killed_at >= _UPDATES_BEFORE_KILL
    resumed_at = int(re.search(r"spanrl online ready step=(\d+)", (tmp_path / "online-2.log").read_text()).group(1))
    assert killed_at <= resumed_at <= killed_at + 1  # +1: killed after a commit, before its history row

    # No rollout is handled (let alone trained) twice, across the crash.
    ids = [e["rollout_id"] for e in ledger]
    assert len(ids) == len(set(ids)), "a rollout appears twice in the ledger"
    trained = [e for e in ledger if e["status"] == "trained"]
    assert sum(row["rollouts"] for row in history) >= len(trained) > 0
    assert state["counters"].get("already_handled", 0) == 0  # the watermark alone kept them apart

    # Only rollouts with feedback train; their reward is the user's LAST verdict.
    last_verdict: dict[str, float] = {}
    for verdict in sent:
        last_verdict[verdict["rollout_id"]] = verdict["value"]
    for entry in trained:
        assert entry["rollout_id"] in last_verdict, entry
        assert entry["reward"] == last_verdict[entry["rollout_id"]], entry
        request = requests[entry["rollout_id"]]
        assert entry["reward"] == float(is_right(_TASKS[request["task_id"]], request["answer"]))
    judged_twice = [e for e in trained if e["rewards"] == 2]
    assert judged_twice, "no rollout judged twice was trained"
    keys = {v["key"] for v in sent if v["rollout_id"] in {e["rollout_id"] for e in trained}}
    assert keys == {"rollout_id", "response_id", "trace_id"}

    # Never-judged rollouts age out, counted; none of them trains.
    assert state["counters"].get("aged_out", 0) > 0
    never = set(requests) - set(last_verdict)
    assert never and not never & {e["rollout_id"] for e in trained}

    # Every response carried its policy version; the store shows the version rising over time.
    rows = collector_proc.sql(
        "SELECT policy_version, count(*) AS n, min(start_ns) AS first_ns, max(start_ns) AS last_ns "
        "FROM llm_calls WHERE kind = 'SERVER' AND rollout_id LIKE 'agent-%' GROUP BY 1 ORDER BY 1"
    )
    versions = [r["policy_version"] for r in rows]
    assert versions[0] == 0 and versions[-1] >= _UPDATES_TOTAL, versions
    firsts = [r["first_ns"] for r in rows]
    assert firsts == sorted(firsts)
    assert all(isinstance(r["policy_version"], int) for r in requests.values())

    # Success rises: users were satisfied more often with the later policies than with the first one.
    def success(selected: list[dict[str, Any]]) -> float:
        return sum(is_right(_TASKS[r["task_id"]], r["answer"]) for r in selected) / max(len(selected), 1)

    early = [r for r in requests.values() if r["policy_version"] == 0]
    late = [r for r in requests.values() if r["policy_version"] >= _UPDATES_TOTAL - 3]
    from training_checks import report_figures

    report_figures("online_stream", early=success(early), late=success(late), n_early=len(early), n_late=len(late))
    assert len(early) >= 50 and len(late) >= 50, (len(early), len(late))
    # A live stream: not pinned, seeded (OnlineConfig.seed 0). 2026-12-07, 20 runs at load 8.6-25 on 2 shared
    # cores (docs/measurements.md, "Learning tests over repeated runs"): rise 0.16-0.60, median 0.39 (0.28-0.39 in
    # the 6 runs at load 16-24). The bound sits 0.06 below the worst run (about 1.3 standard errors of one run's
    # rise, ~0.045); a policy that does not learn passes it about 1 time in 70. (0.12 until then: 0.04 below
    # that worst run. The CI run once noted here at 0.11 was the plain-agent test's, 2026-12-02, 10 updates.)
    assert success(late) >= success(early) + 0.1, (success(early), success(late), versions)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": ""}, "model must be the HF folder the policy server started from, got ''"),
        ({"server_url": "localhost:8000"}, "server_url must be an http(s) URL, got 'localhost:8000'"),
        ({"settle_s": -1}, "settle_s must be a number >= 0, got -1"),
        ({"min_rollouts": 0}, "min_rollouts must be a positive integer, got 0"),
        ({"min_rollouts": 8, "max_rollouts": 4}, "max_rollouts must be >= min_rollouts (8), got 4"),
        ({"max_policy_lag": -1}, "max_policy_lag must be an integer >= 0, got -1"),
        ({"max_updates": 0}, "max_updates must be a positive integer or None, got 0"),
    ],
)
def test_online_config_bad_value_fails_with_its_message(fields, message):
    from spanrl.errors import ConfigError
    from spanrl.online import OnlineConfig

    with pytest.raises(ConfigError) as info:
        OnlineConfig(**{"model": "m", **fields}).validate()
    assert str(info.value) == message


def test_online_cli_config_rejects_unknown_setting_and_other_algorithms(tmp_path):
    from spanrl.errors import ConfigError
    from spanrl.online._cli import build_online_trainer

    with pytest.raises(ConfigError, match="'max_age' is not an online trainer setting; did you mean 'max_age_s'\\? "
                                          "\\(valid: .*; see docs/online-config.md\\)$"):
        build_online_trainer({"model": "m", "max_age": 600})
    with pytest.raises(ConfigError, match="see docs/online-config.md\\)$"):  # the online keys' doc, not train-config.md
        build_online_trainer({"model": "m", "algorithm": {"name": "grpo", "learning_rat": 1e-3}})
    with pytest.raises(ConfigError,
                       match="algorithm.learning_rat is not an algorithm setting; did you mean 'learning_rate'"):
        build_online_trainer({"model": "m", "algorithm": {"name": "grpo", "learning_rat": 1e-3}})
    with pytest.raises(ConfigError, match="algorithm.name must be 'grpo' for online training, got 'ppo'"):
        build_online_trainer({"model": "m", "algorithm": {"name": "ppo"}})
    trainer = build_online_trainer({"model": "m", "output_dir": "out", "algorithm": {"learning_rate": 1e-3}},
                                   base=tmp_path)
    # the model beside the config, the output where the command runs (as `spanrl train` does)
    assert trainer.config.model == str(tmp_path / "m") and trainer.output_dir == Path("out")
    assert trainer.algorithm.config.learning_rate == 1e-3


def test_online_dr_grpo_preset_sets_scale_std_false_where_the_config_is_silent(tmp_path):
    from spanrl.errors import ConfigError
    from spanrl.online._cli import build_online_trainer

    dr_grpo = {"model": "m", "output_dir": str(tmp_path / "out"), "algorithm": {"preset": "dr_grpo"}}
    assert build_online_trainer(dr_grpo, base=tmp_path).training.credit.scale_std is False
    assert build_online_trainer({**dr_grpo, "algorithm": {}}, base=tmp_path).training.credit.scale_std is True
    # said against the preset: refused when the trainer is built, naming the online config's own key
    with pytest.raises(ConfigError, match=r"^scale_std must be false with preset 'dr_grpo' \(Dr. GRPO does not "
                                          r"divide advantages by a std; with baseline 'running' scale_std divides "
                                          r"by the running std\), got true$"):
        build_online_trainer({**dr_grpo, "scale_std": True}, base=tmp_path)


def test_state_and_ledger_resume_at_the_commit_point(tmp_path):
    from spanrl.store.online import Watermark
    from spanrl.online.state import Ledger, OnlineState

    state = OnlineState.load(tmp_path, window=20, prior=2.0)
    ledger = Ledger(tmp_path, state.ledger_lines)
    ledger.append([{"rollout_id": "r1", "status": "trained"}, {"rollout_id": "r2", "status": "stale"}])
    state.step, state.watermark, state.ledger_lines = 1, Watermark(5, "r2"), ledger.lines
    state.baseline.advantages([("sky", 1.0), ("sky", 0.0), ("snow", 0.0)], scale_std=True)
    state.save(tmp_path)
    ledger.append([{"rollout_id": "r3", "status": "trained"}])  # then a crash, before the next commit

    resumed = OnlineState.load(tmp_path, window=20, prior=2.0)
    again = Ledger(tmp_path, resumed.ledger_lines)
    assert (resumed.step, resumed.watermark) == (1, Watermark(5, "r2"))
    assert again.seen == {"r1", "r2"} and again.trained == {"r1"}
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 2
    assert resumed.baseline.tasks == state.baseline.tasks and resumed.baseline.mean == state.baseline.mean


def test_baseline_is_per_task_and_excludes_the_rollouts_own_reward():
    from spanrl.algorithms.baseline import RunningBaseline

    baseline = RunningBaseline(window=20, prior=2.0)
    first = baseline.advantages([("easy", 1.0), ("easy", 1.0), ("hard", 0.0), ("hard", 0.0)], scale_std=False)
    assert first == [0.5, 0.5, -0.5, -0.5]  # nothing seen before: the batch mean
    # After it, "easy" expects more than "hard": the same reward is worth less on the easy task.
    easy, hard = baseline.advantages([("easy", 1.0), ("hard", 1.0)], scale_std=False)
    assert 0 < easy < hard
    assert baseline.value("new task") == baseline.mean


def test_the_urls_default_to_the_variables_spanrl_sql_reads(monkeypatch, tmp_path):
    from spanrl.online._cli import build_online_trainer

    monkeypatch.setenv("SPANRL_POLICY_URL", "http://127.0.0.1:18000")
    monkeypatch.setenv("SPANRL_SQL_URL", "http://127.0.0.1:14318")
    trainer = build_online_trainer({"model": "m"}, base=tmp_path)
    assert (trainer.config.server_url, trainer.config.store_url) == ("http://127.0.0.1:18000", "http://127.0.0.1:14318")
    given = build_online_trainer({"model": "m", "server_url": "http://h:1", "store_url": "http://h:2"}, base=tmp_path)
    assert (given.config.server_url, given.config.store_url) == ("http://h:1", "http://h:2")  # the config wins
