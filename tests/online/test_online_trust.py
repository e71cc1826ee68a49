"""Nothing a client sends stops online training for good, and a diverging update is never served
(issue 28 items 2, 3, 9). Real parts: an in-process collector and its DuckDB file, a policy server on
the tiny model, GRPO forward/backward passes, the online trainer's files on disk.

Rollouts are appended straight into the store (the collector now refuses unusable rewards at ingest:
tests/collector/test_reward_check.py), as a store written before that check holds them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from spanrl import semconv as sc
from spanrl.algorithms import GRPO
from spanrl.collector import Collector, CollectorConfig
from spanrl.collector.encoding import encode_request
from spanrl.errors import ConfigError, TrainingError
from spanrl.serving import PolicyServer, SamplingParams, ServerConfig
from spanrl.store.online import now_ns
from spanrl.online import OnlineConfig, OnlineTrainer
from spanrl.algorithms.baseline import RunningBaseline
from spanrl.demo.tiny import build_tiny_model

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))
from _otlp import kv, make_request  # noqa: E402

WORDS = [f"w{i}" for i in range(20)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", words=WORDS, seed=0)


@pytest.fixture
def server(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A policy server whose reload route is on: an admin token (the online trainer reads it from
    SPANRL_POLICY_ADMIN_TOKEN) and the test's folder as the checkpoint root."""
    torch.set_num_threads(1)
    monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", "online-admin")
    s = PolicyServer(ServerConfig(model=tiny, port=0, otlp_endpoint=None, admin_token="online-admin",
                                  checkpoint_root=tmp_path)).start()
    try:
        yield s
    finally:
        s.shutdown()


def _rollout(store: Any, rollout_id: str, reward: float, *, prompt: list[int] = (5, 6, 7), task: str = "t") -> None:
    """A finished rollout: its spanrl.rollout span, one policy-server call with token ids, one reward."""
    req, _ = make_request(3, rollout_id=rollout_id, resource={sc.TASK_ID: task})
    root, call, judged = req.resource_spans[0].scope_spans[0].spans
    root.name = sc.ROLLOUT_SPAN_NAME
    call.kind = 2  # SERVER
    call.attributes.extend([kv(sc.GEN_AI_OPERATION_NAME, "chat"), kv(sc.LLM_PROMPT_TOKEN_IDS, list(prompt)),
                            kv(sc.LLM_COMPLETION_TOKEN_IDS, [8, 9, 2]), kv(sc.LLM_LOGPROBS, [-1.0, -1.5, -0.5]),
                            kv(sc.POLICY_VERSION, 0)])
    judged.name = sc.FEEDBACK_SPAN_NAME
    judged.attributes.append(kv(sc.REWARD_VALUE, reward))
    store.append(encode_request(req).table)


def _trainer(tiny: Path, server: PolicyServer, collector: Any, out: Path, **fields: Any) -> OnlineTrainer:
    lr = fields.pop("learning_rate", 1e-3)
    config = OnlineConfig(model=str(tiny), server_url=server.base_url, store_url=collector.http_endpoint,
                          output_dir=str(out), settle_s=0.0, quiet_s=600.0, min_rollouts=2, max_rollouts=16, **fields)
    return OnlineTrainer(config, algorithm=GRPO(learning_rate=lr), store=collector.store).start()


def _ledger(out: Path) -> dict[str, str]:
    return {e["rollout_id"]: e["status"] for e in map(json.loads, (out / "ledger.jsonl").read_text().splitlines())}


def test_the_online_trainer_has_the_trainers_lifecycle_and_reporting(tiny, server, collector, tmp_path):
    """NEW -> RUNNING (start) -> TRAINING (inside run) -> RUNNING -> CLOSED, as the Trainer; a call that does
    not fit is refused naming the state (was: an assert). Rows reach the reporting callbacks and
    history.jsonl; checkpoints are pruned by trainer/checkpoints.py to keep_checkpoints."""
    from spanrl.trainer.lifecycle import State
    from spanrl.trainer.reporting import Callback

    out, seen = tmp_path / "online", []

    class Rows(Callback):
        def on_row(self, row):
            seen.append((row["step"], trainer.lifecycle))

        def close(self):
            seen.append("closed")

    config = OnlineConfig(model=str(tiny), server_url=server.base_url, store_url=collector.http_endpoint,
                          output_dir=str(out), settle_s=0.0, quiet_s=600.0, min_rollouts=1, max_rollouts=1,
                          max_updates=3, keep_checkpoints=1, poll_interval_s=0.05)
    trainer = OnlineTrainer(config, algorithm=GRPO(learning_rate=1e-3), store=collector.store, callbacks=[Rows()])
    assert trainer.lifecycle is State.NEW
    with pytest.raises(TrainingError, match=r"cannot poll_once\(\) in state NEW: nothing is loaded yet; call start"):
        trainer.poll_once()
    for i in range(3):
        _rollout(collector.store, f"life-{i}", float(i % 2))
    history = trainer.run()  # starts itself
    assert [row["step"] for row in history] == [1, 2, 3] and trainer.lifecycle is State.RUNNING
    assert seen == [(1, State.TRAINING), (2, State.TRAINING), (3, State.TRAINING)]
    assert [json.loads(line)["step"] for line in (out / "history.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert [p.name for p in out.glob("checkpoint-*")] == ["checkpoint-3"] and trainer.state.checkpoint == "checkpoint-3"
    trainer.close()
    assert trainer.lifecycle is State.CLOSED and seen[-1] == "closed" and trainer.state.step == 3
    with pytest.raises(TrainingError, match=r"cannot poll_once\(\) in state CLOSED: it was closed"):
        trainer.poll_once()


def test_unusable_rewards_and_forged_tokens_are_quarantined_and_training_goes_on(tiny, server, collector, tmp_path):
    out = tmp_path / "online"
    for rollout_id, reward in (("good-1", 1.0), ("bad-1e200", 1e200), ("bad-nan", float("nan")), ("good-2", 0.0),
                               ("bad-1e308", 1e308), ("bad-inf", float("-inf"))):
        _rollout(collector.store, rollout_id, reward)
    _rollout(collector.store, "forged", 1.0, prompt=[5, 10**6])  # a token id outside the vocabulary
    trainer = _trainer(tiny, server, collector, out)
    row = trainer.poll_once()
    assert row is not None and row["rollouts"] == 2 and row["policy_version"] == 1
    assert _ledger(out) == {"good-1": "trained", "good-2": "trained", "bad-1e200": "bad_reward",
                            "bad-nan": "bad_reward", "bad-1e308": "bad_reward", "bad-inf": "bad_reward",
                            "forged": "bad_transitions"}
    assert trainer.state.counters["bad_reward"] == 4 and trainer.state.counters["bad_transitions"] == 1
    assert trainer.state.baseline.finite()

    # A restart meets none of them again (the watermark is past them), and training goes on.
    again = _trainer(tiny, server, collector, out)
    assert again.poll_once() is None
    _rollout(collector.store, "good-3", 1.0)
    _rollout(collector.store, "good-4", 0.0)
    row = again.poll_once()
    assert row is not None and row["rollouts"] == 2 and row["step"] == 2
    assert list(_ledger(out).values()).count("trained") == 4
    result = server.generate([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0))
    assert all(torch.isfinite(torch.tensor(result.completions[0].logprobs)))


def test_rollouts_that_never_train_do_not_hold_back_the_fresh_ones_behind_them(tiny, server, collector, tmp_path):
    """One fresh rollout, then more unusable ones than max_rollouts (16), then the second fresh one
    min_rollouts (2) waits for. The window once was the first 16 ready rollouts: 1 fresh, none to move past
    (the fresh one leads), the same 16 at every poll, training stalled for good (the guard test saw it on
    CI: rollouts of a rejected version filled the window). Now they take no place in it."""
    out = tmp_path / "online"
    _rollout(collector.store, "fresh-1", 1.0)
    for i in range(20):
        _rollout(collector.store, f"nan-{i}", float("nan"))
    _rollout(collector.store, "fresh-2", 0.0)
    trainer = _trainer(tiny, server, collector, out)
    row = trainer.poll_once()
    assert row is not None and row["rollouts"] == 2 and row["skipped"] == 20
    ledger = _ledger(out)
    assert ledger["fresh-1"] == ledger["fresh-2"] == "trained" and list(ledger.values()).count("bad_reward") == 20
    # max_rollouts still bounds an update: of 20 fresh ones behind 20 unusable ones, 16 train now, 4 next
    for i in range(20):
        _rollout(collector.store, f"nan-again-{i}", float("nan"))
    for i in range(20):
        _rollout(collector.store, f"more-{i}", float(i % 2))
    first, second = trainer.poll_once(), trainer.poll_once()
    assert (first["rollouts"], first["skipped"], second["rollouts"], second["skipped"]) == (16, 20, 4, 0)


def test_diverging_updates_are_undone_and_stop_training_with_the_last_good_weights_served(tiny, server, collector,
                                                                                          tmp_path):
    """An absurd learning rate: Adam's first step overflows float32 and the weights become inf. Each such
    update is undone (back to the last good weights: here the starting model), its rollouts quarantined,
    nothing checkpointed or reloaded; the second in a row stops the trainer with the reason."""
    out = tmp_path / "online"
    diverging = _trainer(tiny, server, collector, out, learning_rate=1e39, max_bad_updates=2)
    _rollout(collector.store, "a", 1.0)
    _rollout(collector.store, "b", 0.0)
    assert diverging.poll_once() is None and diverging.state.bad_updates == 1
    assert _ledger(out) == {"a": "bad_update", "b": "bad_update"}
    assert all(bool(torch.isfinite(p).all()) for p in diverging.algorithm.model.parameters())  # undone
    _rollout(collector.store, "c", 1.0)
    _rollout(collector.store, "d", 0.0)
    with pytest.raises(TrainingError,
                       match=r"2 updates in a row were not finite \(max_bad_updates 2; last: weight .* is not "
                             r"finite\); stopped. The last good weights, .*model, are intact and still served"):
        diverging.poll_once()
    state = json.loads((out / "online_state.json").read_text())
    assert state["checkpoint"] is None and state["step"] == 0 and state["bad_updates"] == 2
    assert not list(out.glob("checkpoint-*")) and server.version == 0
    assert _ledger(out)["c"] == "bad_update"
    result = server.generate([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0))
    assert all(torch.isfinite(torch.tensor(result.completions[0].logprobs)))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_the_collector_token_comes_from_the_environment_and_is_never_saved(tiny, server, tmp_path, monkeypatch):
    config = CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=-1, http_port=0, token="s3cret-token")
    with Collector(config) as guarded:
        monkeypatch.setenv("SPANRL_COLLECTOR_TOKEN", "s3cret-token")
        fields = dict(model=str(tiny), server_url=server.base_url, store_url=guarded.http_endpoint,
                      output_dir=str(tmp_path / "o"))
        assert now_ns(OnlineTrainer(OnlineConfig(**fields), algorithm=GRPO()).store) > 0  # 401 without the token
        OnlineTrainer(OnlineConfig(**fields, collector_token="s3cret-token"), algorithm=GRPO()).start()
    saved = (tmp_path / "o" / "config.json").read_text()
    assert "s3cret-token" not in saved and "collector_token" not in json.loads(saved)


def test_the_online_trainer_reads_with_the_read_token_and_from_token_files(tiny, server, tmp_path, monkeypatch):
    """Issue 53, finding 7: the online trainer ignored SPANRL_COLLECTOR_READ_TOKEN (only the all-scope token
    worked) and had no token files."""
    import shutil

    from spanrl.errors import ServingError

    config = CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=-1, http_port=0, read_token="reader-t")
    (tmp_path / "read.token").write_text("reader-t\n")
    (tmp_path / "admin.token").write_text("online-admin\n")
    shutil.copytree(tiny, tmp_path / "ck")
    monkeypatch.delenv("SPANRL_COLLECTOR_TOKEN", raising=False)
    monkeypatch.delenv("SPANRL_POLICY_ADMIN_TOKEN")
    with Collector(config) as guarded:
        fields = dict(model=str(tiny), server_url=server.base_url, store_url=guarded.http_endpoint,
                      output_dir=str(tmp_path / "o"))
        with pytest.raises(Exception, match="401"):
            now_ns(OnlineTrainer(OnlineConfig(**fields), algorithm=GRPO()).store)
        monkeypatch.setenv("SPANRL_COLLECTOR_READ_TOKEN", "reader-t")
        assert now_ns(OnlineTrainer(OnlineConfig(**fields), algorithm=GRPO()).store) > 0
        monkeypatch.delenv("SPANRL_COLLECTOR_READ_TOKEN")
        from_files = OnlineTrainer(OnlineConfig(**fields, collector_token_file=str(tmp_path / "read.token"),
                                                admin_token_file=str(tmp_path / "admin.token")), algorithm=GRPO())
        assert now_ns(from_files.store) > 0
        assert from_files.server.reload(tmp_path / "ck") == 1
        with pytest.raises(ServingError, match="answered 401"):
            OnlineTrainer(OnlineConfig(**fields), algorithm=GRPO()).server.reload(tmp_path / "ck")
    with pytest.raises(ConfigError, match="admin_token_file: cannot read the token file"):
        OnlineTrainer(OnlineConfig(**fields, admin_token_file=str(tmp_path / "absent")), algorithm=GRPO())


def test_one_outlier_reward_does_not_poison_the_baseline():
    """Issue 28: one 1e30 reward left every later advantage of its task at about -0.38 for thousands of
    rollouts. Now the outlier is winsorized: its own advantage is bounded, and its weight fades with the
    window (20), so 60 honest rollouts later the advantages are the unpoisoned ones."""
    honest = [("t", float(i % 2)) for i in range(100)]
    clean, poisoned = RunningBaseline(), RunningBaseline()
    for batch in range(0, 40, 4):
        clean.advantages(honest[batch:batch + 4], scale_std=True)
        poisoned.advantages(honest[batch:batch + 4], scale_std=True)
    clean.advantages([("t", 1.0)], scale_std=True)
    outlier = poisoned.advantages([("t", 1e30)], scale_std=True)
    assert all(abs(a) < 10 for a in outlier)
    for batch in range(40, 100, 4):
        expected = clean.advantages(honest[batch:batch + 4], scale_std=True)
        got = poisoned.advantages(honest[batch:batch + 4], scale_std=True)
    assert got == pytest.approx(expected, abs=0.1) and poisoned.finite()
    first = RunningBaseline().advantages([("t", 0.0), ("t", 1.0), ("t", 1e30), ("t", 1.0)], scale_std=True)
    assert all(abs(a) < 10 for a in first)
    # A sparse reward (0 for a long time, then a first success) is not clipped away.
    sparse = RunningBaseline()
    for _ in range(10):
        sparse.advantages([("t", 0.0)] * 4, scale_std=True)
    assert sparse.advantages([("t", 1.0)], scale_std=True)[0] == pytest.approx(1.0)


def test_the_trainer_guard_stops_after_max_bad_updates_in_a_row(tmp_path):
    """The Trainer's NonFiniteGuard callback (TrainerConfig.max_bad_updates): good rows reset the count,
    evaluation rows do not count, the third non-finite update in a row stops training with the reason."""
    from spanrl.trainer.config import TrainerConfig
    from spanrl.trainer.reporting import NonFiniteGuard

    guard = NonFiniteGuard(TrainerConfig().validate().max_bad_updates)
    nan = float("nan")
    for step, loss in enumerate([0.5, nan, nan, 0.25, nan, nan], start=1):
        guard.on_row({"step": step, "losses/policy_loss": loss, "charts/grad_norm": 1.0})
    guard.on_row({"step": 6, "val_success": 0.5})
    guard.on_row({"step": 6, "losses/dpo_loss": nan, "charts/update_seconds": 0.0})  # DPO without pairs: no update
    with pytest.raises(TrainingError, match=r"3 updates in a row were not finite \(max_bad_updates 3; last: "
                                            r"charts/grad_norm = inf at step 7\); stopped"):
        guard.on_row({"step": 7, "losses/policy_loss": 0.1, "charts/grad_norm": float("inf")})
    with pytest.raises(ConfigError, match="max_bad_updates must be a positive integer, got 0"):
        TrainerConfig(max_bad_updates=0).validate()
