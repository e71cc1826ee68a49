"""Online training on production traffic that carries no spanrl id, through real processes only.

Two `examples/production/plain_agent.py` processes (a plain OpenAI client under `opentelemetry-instrument`,
the standard OpenAI instrumentor, no `import spanrl`) name each request's conversation in OpenAI's
`metadata`; `examples/production/plain_feedback.py` (plain OTel API) judges answers a second later with
`gen_ai.evaluation.result` events keyed by `gen_ai.response.id`, never for some, twice for others. A
`spanrl collector`, `spanrl serve` (tiny model) and `spanrl train --online` complete the loop. Each
conversation is one rollout; trained rewards are the users' last verdicts; success rises.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from test_online import (PRODUCTION, _STALL_S, _free_port, _get_json, _read_jsonl, _Stream, _wait_until,
                         _wait_while_updating)

from spanrl.demo.tiny import build_tiny_model
from training_checks import report_figures

sys.path.insert(0, str(PRODUCTION))
from colors import TASKS, VOCABULARY, is_right  # noqa: E402

_TASKS = {t["id"]: t for t in TASKS}
_UPDATES = 20  # with learning rate 3e-2: see the assertion below
_LATE_REQUESTS = 80  # answers served by the final policy, after training stopped


def _config(tmp_path: Path, model: Path, server_url: str, store_url: str) -> Path:
    path = tmp_path / "online.yaml"
    path.write_text(
        f"model: {model}\nserver_url: {server_url}\nstore_url: {store_url}\noutput_dir: {tmp_path / 'online'}\n"
        "algorithm: {name: grpo, learning_rate: 3.0e-2}\n"  # 5e-2 and more collapse (the assertion below)
        "poll_interval_s: 0.5\nsettle_s: 1.0\nmax_age_s: 8\nquiet_s: 1.0\n"  # conversations end by quiet time
        f"min_rollouts: 32\nmax_rollouts: 64\nmax_policy_lag: 3\nmax_updates: {_UPDATES}\n"
    )
    return path


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a limit for a hang only: _wait_while_updating fails sooner
def test_online_trainer_learns_from_agents_without_spanrl_ids(tmp_path: Path, collector_proc: Any) -> None:
    model = build_tiny_model(tmp_path / "tiny", words=VOCABULARY, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    for script in ("plain_agent.py", "plain_feedback.py"):
        code = (PRODUCTION / script).read_text()
        assert "import spanrl" not in code and "from spanrl" not in code
    stream = _Stream()
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    logs = [tmp_path / f"requests-{name}.jsonl" for name in ("a", "b")]
    try:
        port = _free_port()
        server_url = f"http://127.0.0.1:{port}"
        (tmp_path / "admin.token").write_text("online-admin\n")
        serve = stream.start([sys.executable, "-m", "spanrl", "serve", "--model", str(model), "--port", str(port),
                              "--served-model-name", "policy", "--threads", "1", "--checkpoint-root", str(tmp_path),
                              "--admin-token-file", str(tmp_path / "admin.token"),
                              "--otlp-endpoint", collector_proc.grpc_endpoint], tmp_path / "serve.log")
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector_proc.grpc_endpoint}"}
        # started beside the server (it retries until the server answers): the two start-ups overlap
        trainer = stream.start([sys.executable, "-m", "spanrl", "train", "--online",
                                str(_config(tmp_path, model, server_url, collector_proc.http_endpoint))],
                               tmp_path / "online.log", {"SPANRL_POLICY_ADMIN_TOKEN": "online-admin"})
        _wait_until(lambda: _get_json(f"{server_url}/health")["status"] == "ok", 120, "spanrl serve", [serve])
        for name, log in zip(("a", "b"), logs):
            stream.start([instrument, sys.executable, str(PRODUCTION / "plain_agent.py"), "--server", server_url,
                          "--name", f"agent-{name}", "--rate", "6", "--request-log", str(log)],
                         tmp_path / f"agent-{name}.log", {**otel, "OTEL_SERVICE_NAME": f"plain-agent-{name}"})
        feedback = [instrument, sys.executable, str(PRODUCTION / "plain_feedback.py"), "--delay", "1",
                    "--second-after", "0.5", "--sent-log", str(tmp_path / "feedback.jsonl")]
        stream.start(feedback + [arg for log in logs for arg in ("--request-log", str(log))], tmp_path / "feedback.log",
                     {**otel, "OTEL_SERVICE_NAME": "users"})
        _wait_while_updating(trainer, tmp_path / "online" / "history.jsonl")
        assert trainer.returncode == 0, (tmp_path / "online.log").read_text()[-3000:]
        final = _get_json(f"{server_url}/health")["policy_version"]
        _wait_until(lambda: sum(r["policy_version"] == final for log in logs for r in _read_jsonl(log))
                    >= _LATE_REQUESTS, _STALL_S, "answers of the final policy")
    finally:
        stream.close()

    ledger = _read_jsonl(tmp_path / "online" / "ledger.jsonl")
    requests = {f"conversation:{r['conversation_id']}": r for log in logs for r in _read_jsonl(log)}
    sent = _read_jsonl(tmp_path / "feedback.jsonl")
    last_verdict = {f"conversation:{v['conversation_id']}": v["value"] for v in sent}
    trained = [e for e in ledger if e["status"] == "trained"]

    # Each conversation is one rollout, named by it; only judged ones train, on the user's last verdict.
    assert final == _UPDATES and len(trained) >= 32 * _UPDATES
    for entry in trained:
        request = requests[entry["rollout_id"]]
        assert entry["reward"] == last_verdict[entry["rollout_id"]]
        assert entry["reward"] == float(is_right(_TASKS[request["task_id"]], request["answer"]))
    assert any(e["rewards"] == 2 for e in trained), "no conversation judged twice was trained"
    # Its task is the question's (a hash of the first user message): one per question, three baseline groups.
    # Over the conversations the agents got an answer for: a conversation cut off when the agents were stopped
    # has only the server's error span, without its question, so no task (test_production_rollouts.py).
    rows = collector_proc.sql("SELECT rollout_id, task_id FROM rollouts WHERE rollout_id LIKE 'conversation:%'")
    task_of = {r["rollout_id"]: r["task_id"] for r in rows}
    by_question = {(requests[r]["task_id"], task) for r, task in task_of.items() if r in requests}
    assert len(by_question) == len({q for q, _ in by_question}) == len({t for _, t in by_question}) == len(TASKS)
    assert all(str(task).startswith("user:") for _, task in by_question), by_question
    assert all(task_of[e["rollout_id"]] in {t for _, t in by_question} for e in trained)

    # Success rises: users are satisfied more often by the final policy than by the first one.
    def success(version: int) -> tuple[float, int]:
        chosen = [r for r in requests.values() if r["policy_version"] == version]
        return sum(is_right(_TASKS[r["task_id"]], r["answer"]) for r in chosen) / max(len(chosen), 1), len(chosen)

    (early, n_early), (late, n_late) = success(0), success(final)
    report_figures("online_plain_agent", early=early, late=late, n_early=n_early, n_late=n_late)
    assert n_early >= 32 and n_late >= _LATE_REQUESTS, (n_early, n_late)
    # Past 1/3, what one colour said to every question scores ("red blue blue" for all: no sample of the other
    # two colours is left, so their groups' rewards are all 0 and give no gradient). At 5e-2 one run in 7 and one
    # CI run collapsed so; at 3e-2 and 20 updates 16 runs ended at 0.58-0.99, none collapsed, the smallest rise
    # 0.36 (docs/measurements.md, "Without spanrl ids", has every run). One standard error is about 0.05.
    # A live stream cannot be pinned (which version answers which request is the agents' timing); seeded
    # (OnlineConfig.seed 0). 9 more runs at load 10-28 (2026-12-07, "Learning tests over repeated runs"): late
    # 0.63-1.0, rise 0.42-0.82. Over all 25 the bounds sit 0.13 (late) and 0.16 (rise) below the worst run.
    assert late >= 0.45 and late >= early + 0.2, (early, late)
