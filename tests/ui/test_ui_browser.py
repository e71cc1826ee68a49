"""`spanrl ui` in a real headless Chromium against a store the demo's pipeline filled: what a person
sees on each page. Screenshots are kept under pytest's tmp dir (the path is printed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spanrl.algorithms.credit import LightningRL
from spanrl.algorithms.transitions import load_transitions
from spanrl.store import SpanStore

pytestmark = pytest.mark.slow
_NOBODY = "http://127.0.0.1:9"  # no collector: read the file


def _store_facts(db: Path) -> dict:
    """What the pages must show, computed here from the store with the library, not through the viewer."""
    with SpanStore.open(db, read_only=True) as store:
        counts = {r["status"]: r["n"]
                  for r in store.sql("SELECT status, count(*) AS n FROM rollouts GROUP BY status").to_pylist()}
        newest = store.sql(
            "SELECT rollout_id FROM rollouts ORDER BY start_ns DESC, rollout_id LIMIT 5"
        ).column(0).to_pylist()
        # a GRPO rollout (exact token ids, a policy version) whose task group had mixed rewards
        groups = store.sql("""
            SELECT any_value(task_id) AS task_id, any_value(mode) AS mode, max(policy_version) AS v, rollout_id
            FROM spans WHERE rollout_id IS NOT NULL GROUP BY rollout_id""").to_pylist()
        by_group: dict = {}
        for g in groups:
            if g["v"] is not None and g["mode"] == "train":
                by_group.setdefault((g["task_id"], g["v"]), []).append(g["rollout_id"])
        for ids in sorted(by_group.values()):
            batch = load_transitions(store, credit=LightningRL(mode="identical", baseline="grpo"), rollout_ids=ids)
            moving = [t for t in batch.transitions if abs(t.advantage) > 1e-6]
            if moving:
                pick = moving[0]
                break
        else:
            raise AssertionError("the demo store has no GRPO group with mixed rewards")
        calls = store.sql(
            "SELECT completion_token_ids FROM spans WHERE completion_token_ids IS NOT NULL AND trace_id IN "
            "(SELECT trace_id FROM spans WHERE rollout_id = ?) ORDER BY start_ns",
            [pick.rollout_id]).column(0).to_pylist()
        demo = store.sql(
            "SELECT rollout_id FROM rollouts WHERE rollout_id NOT IN (SELECT DISTINCT rollout_id FROM spans "
            "WHERE policy_version IS NOT NULL AND rollout_id IS NOT NULL) AND mode = 'train' LIMIT 1"
        ).column(0).to_pylist()
        total = store.sql("SELECT count(*) AS n FROM rollouts").column(0)[0].as_py()
    return {"counts": counts, "newest": newest, "pick": pick, "calls": calls, "demonstration": demo[0], "total": total}


@pytest.fixture(scope="module")
def facts(demo_store: Path) -> dict:
    return _store_facts(demo_store / "spans.duckdb")


def test_rollout_list_shows_the_demo_rollouts(demo_store, facts, ui_factory, browser, shots):
    ui = ui_factory("--db", str(demo_store / "spans.duckdb"), "--url", _NOBODY)
    browser.goto(ui.url + "#/rollouts")
    browser.wait("document.querySelectorAll('#rollouts tbody tr').length > 0")
    shown = browser.eval("[...document.querySelectorAll('#rollouts tbody tr')].map(r => r.dataset.rollout)")
    assert shown[:5] == facts["newest"]  # newest first, as sorted by start
    assert len(shown) == min(200, facts["total"])
    buttons = browser.eval(
        "Object.fromEntries([...document.querySelectorAll('#status-counts button')].map(b => [b.dataset.status, "
        "b.textContent]))"
    )
    assert buttons["all"] == f"all {facts['total']}"
    for status, n in facts["counts"].items():
        assert buttons[status] == f"{status} {n}"
    browser.screenshot(shots / "rollouts.png")
    assert facts["total"] > 200  # the demo's store has more than one page
    browser.eval("document.getElementById('more').click()")
    browser.wait(f"document.querySelectorAll('#rollouts tbody tr').length == {min(400, facts['total'])}")

    # filter by the picked rollout's task: only that task's rollouts remain
    task = facts["pick"].task_id
    browser.eval(
        f"(() => {{ const f = document.getElementById('filter'); f.value = {json.dumps(task)}; f.dispatchEvent(new "
        f"Event('input')); }})()"
    )
    browser.wait(
        "[...document.querySelectorAll('#rollouts tbody tr td:nth-child(2)')].every(td => "
        f"td.textContent.includes({json.dumps(task)})) "
                 f"&& document.querySelectorAll('#rollouts tbody tr').length > 0")
    # sort by reward, ascending after a second click
    browser.eval(
        "[...document.querySelectorAll('#rollouts th')].find(th => th.textContent.startsWith('reward')).click()"
    )
    browser.wait(
        "[...document.querySelectorAll('#rollouts th')].find(th => "
        "th.textContent.startsWith('reward')).textContent.endsWith('▾')"
    )
    rewards = browser.eval(
        "[...document.querySelectorAll('#rollouts tbody tr td:nth-child(5)')].map(td => "
        "td.textContent).filter(Boolean).map(Number)"
    )
    assert rewards == sorted(rewards, reverse=True)
    assert not browser.console_errors


def test_rollout_page_shows_calls_tokens_and_advantages(demo_store, facts, ui_factory, browser, shots):
    ui = ui_factory("--db", str(demo_store / "spans.duckdb"), "--url", _NOBODY)
    pick, calls = facts["pick"], facts["calls"]
    browser.goto(ui.url + "#/rollout/" + pick.rollout_id)
    browser.wait("document.querySelector('#transitions')")
    assert browser.eval("document.querySelectorAll('#calls .call').length") == len(calls)
    chips = browser.eval(f"document.querySelectorAll('#calls .call[data-step=\"{pick.step}\"] .tok').length")
    assert chips == len(calls[pick.step])
    titles = browser.eval(
        f"[...document.querySelectorAll('#calls .call[data-step=\"{pick.step}\"] .tok')].map(t => t.title)"
    )
    assert all("logprob" in t and "mask 1" in t for t in titles)
    # the tiny model's word tokenizer turns ids into words
    words = browser.eval(
        f"[...document.querySelectorAll('#calls .call[data-step=\"{pick.step}\"] .tok')].map(t => t.textContent)"
    )
    assert any(not w.isdigit() for w in words)
    advantage = browser.eval(
        f"document.querySelector('#transitions tr[data-step=\"{pick.step}\"] .advantage').textContent"
    )
    assert advantage == f"{pick.advantage:.3f}"
    # the label column beside the advantage: empty, since the demo's agent labels no call (spanrl.label.good)
    heads = browser.eval("[...document.querySelectorAll('#transitions th')].map(t => t.textContent)")
    assert heads[3:5] == ["advantage", "label"]
    label = f"document.querySelector('#transitions tr[data-step=\"{pick.step}\"] .label').textContent"
    assert browser.eval(label) == ""
    assert browser.eval("document.querySelectorAll('#waterfall .wf-bar.llm').length") >= len(calls)
    assert "reward" in browser.eval("document.querySelector('#calls').innerText")
    browser.eval("document.querySelector('#waterfall .wf-bar.llm').closest('.wf-row').click()")
    assert "gen_ai" in browser.eval("document.querySelector('#waterfall').parentElement.innerText")
    browser.screenshot(shots / "rollout.png")

    # a demonstration (teacher API, messages only): its call is shown with the reason it is not trained here
    browser.goto(ui.url + "#/rollout/" + facts["demonstration"])
    browser.wait("document.querySelector('#credit .skip')")
    assert "no token ids" in browser.eval("document.querySelector('#credit').innerText")
    assert browser.eval("document.querySelectorAll('#calls .call .msg').length") >= 2  # input and output messages
    browser.screenshot(shots / "demonstration.png")
    assert not browser.console_errors


def test_run_page_shows_the_reward_curve(demo_store, ui_factory, browser, shots):
    ui = ui_factory("--db", str(demo_store / "spans.duckdb"), "--url", _NOBODY)
    history = [json.loads(line) for line in (demo_store / "grpo" / "history.jsonl").read_text().splitlines()]
    rewards = [r for r in history if r.get("reward_mean") is not None]
    browser.goto(ui.url + "#/runs?a=grpo&b=sft")
    browser.wait("document.querySelectorAll('.run').length == 2")
    chart = "document.querySelector('.run[data-run=\"grpo\"] .chart[data-title=\"reward (training rollouts)\"]')"
    assert browser.eval(f"{chart}.querySelectorAll('circle').length") == len(rewards)
    assert browser.eval(f"{chart}.querySelectorAll('path').length") == 1
    kl = "document.querySelector('.run[data-run=\"grpo\"] .chart[data-title=\"KL\"]')"
    assert browser.eval(f"{kl}.querySelectorAll('circle').length") == len(rewards)
    versions = browser.eval("document.querySelectorAll('.chart[data-title=\"policy version\"] path').length")
    assert versions >= 2  # by step in the run, and over time from the store
    browser.screenshot(shots / "runs.png")
    assert not browser.console_errors


def test_sql_box_shows_a_table_refuses_writes_and_downloads(demo_store, facts, ui_factory, browser, shots):
    import io

    import pyarrow.parquet as pq

    ui = ui_factory("--db", str(demo_store / "spans.duckdb"), "--url", _NOBODY)
    browser.goto(ui.url + "#/sql")
    browser.wait("document.querySelector('#sql-result table')")
    browser.eval(
        "document.getElementById('sql').value = 'SELECT count(*) AS n FROM rollouts'; "
        "document.getElementById('run-sql').click()"
    )
    browser.wait(
        "document.querySelector('#sql-result td') && document.querySelector('#sql-result td').textContent == "
        f"'{facts['total']}'"
    )
    browser.screenshot(shots / "sql.png")
    browser.eval(
        "document.getElementById('sql').value = 'DROP TABLE spans'; document.getElementById('run-sql').click()"
    )
    assert "only read statements" in browser.wait(
        "document.querySelector('#sql-result .error') && document.querySelector('#sql-result .error').textContent"
    )

    query = "SELECT rollout_id, status FROM rollouts ORDER BY rollout_id LIMIT 3"
    status, body = ui.post("/api/sql", {"sql": query, "format": "csv"})
    assert (status == 200 and body.decode().splitlines()[0] == '"rollout_id","status"'
            and len(body.decode().splitlines()) == 4)
    status, body = ui.post("/api/sql", {"sql": query, "format": "parquet"})
    assert status == 200 and pq.read_table(io.BytesIO(body)).num_rows == 3
    status, body = ui.post("/api/sql", {"sql": query, "format": "xlsx"})
    assert status == 400 and b"format must be one of json, csv, parquet; got 'xlsx'" in body


def test_through_a_collector_with_its_token_the_list_updates_live(demo_store, ui_factory, browser,
                                                                  collector_proc_factory, tmp_path, shots):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    shutil.copy(demo_store / "spans.duckdb", tmp_path / "spans.duckdb")
    collector = collector_proc_factory(token="s3cret", name="spans")
    ui = ui_factory("--url", collector.http_endpoint, "--token", "s3cret", "--run", str(demo_store))
    assert "reading collector" in ui.first_line
    assert ui.get("/api/rollouts")[0] == 401
    assert ui.get("/api/rollouts", token="wrong")[0] == 401
    assert ui.get("/api/rollouts", token="s3cret")[0] == 200
    assert ui.get("/api/rollout?id=", token="s3cret") == (400, b'{"error":"the query parameter \'id\' is required"}')
    assert ui.get("/api/rollout?id=nope", token="s3cret")[0] == 404

    browser.goto(ui.url + "#/rollouts")
    browser.wait("document.getElementById('token')")  # the page asks for the token
    browser.eval("document.getElementById('token').value = 's3cret'; document.querySelector('main button').click()")
    browser.wait("document.querySelectorAll('#rollouts tbody tr').length > 0")

    provider = TracerProvider(resource=Resource.create({"service.name": "live-agent", "spanrl.rollout.id": "live-ui-1",
                                                        "spanrl.task.id": "t-live", "spanrl.rollout.mode": "train"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector.http_endpoint}/v1/traces",
                                                                     headers={"authorization": "Bearer s3cret"})))
    with provider.get_tracer("test").start_as_current_span("spanrl.rollout"):
        pass
    provider.shutdown()
    browser.wait("document.querySelector('#rollouts tr[data-rollout=\"live-ui-1\"]')", timeout_s=30)  # no reload
    assert browser.eval("document.querySelector('#rollouts tbody tr').dataset.rollout") == "live-ui-1"
    browser.screenshot(shots / "live.png")


def test_run_page_shows_a_curve_per_agent(demo_store, ui_factory, browser, tmp_path):
    run = tmp_path / "agents"  # a per-agent run's history: agents/<name>/<key> per step
    run.mkdir()
    rows = [{"step": s, "reward_mean": 0.1 * s, "agents/writer/reward_mean": 0.2 * s,
             "agents/checker/reward_mean": 0.05 * s, "agents/writer/advantage_mean": 0.0,
             "agents/checker/advantage_mean": 0.01, "agents/writer/policy_version": s,
             "agents/checker/policy_version": s} for s in (1, 2, 3)]
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ui = ui_factory("--db", str(demo_store / "spans.duckdb"), "--url", _NOBODY, "--run", str(run))
    browser.goto(ui.url + "#/runs?a=agents")
    chart = "document.querySelector('.run[data-run=\"agents\"] .chart[data-title=\"reward per agent\"]')"
    browser.wait(chart)
    assert browser.eval(f"{chart}.querySelectorAll('path').length") == 2  # one line per agent
    assert browser.eval(f"{chart}.querySelectorAll('circle').length") == 6
    assert "checker" in browser.eval(f"{chart}.textContent") and "writer" in browser.eval(f"{chart}.textContent")
    advantage = "document.querySelector('.run[data-run=\"agents\"] .chart[data-title=\"advantage per agent\"]')"
    assert browser.eval(f"{advantage} !== null")
    assert browser.eval("document.querySelector('.chart[data-title=\"calls per agent\"]') === null")  # no such keys
    assert not browser.console_errors
