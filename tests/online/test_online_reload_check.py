"""The online trainer checks at start that the server will load its updates (a dry run of the reload route),
and stops with the server's reason and the fix when it will not; an update the server does not load is an
error naming it, never ``now serving vNone`` (issue 58). Real parts: an in-process collector, policy servers
on the tiny model, ``spanrl train --online`` as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from spanrl import semconv as sc
from spanrl.algorithms import GRPO
from spanrl.collector.encoding import encode_request
from spanrl.demo.tiny import build_tiny_model
from spanrl.errors import ServingError, TrainingError
from spanrl.serving import PolicyServer, ServerConfig
from spanrl.online import OnlineConfig, OnlineTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))
from _otlp import kv, make_request  # noqa: E402

OFF = ("policy server {url}/v1/weights/reload answered 403: weight reloads over HTTP are off: start the server with "
       "--admin-token-file and --checkpoint-root; to fix: start `spanrl serve` with --admin-token-file FILE and "
       "--checkpoint-root DIR, DIR holding the trainer's output_dir")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", words=[f"w{i}" for i in range(20)], seed=0)


def _server(tiny: Path, **fields: Any) -> PolicyServer:
    torch.set_num_threads(1)
    return PolicyServer(ServerConfig(model=tiny, port=0, otlp_endpoint=None, **fields)).start()


def _config(tiny: Path, server: PolicyServer, collector: Any, out: Path) -> OnlineConfig:
    return OnlineConfig(model=str(tiny), server_url=server.base_url, store_url=collector.http_endpoint,
                        output_dir=str(out), settle_s=0.0, quiet_s=600.0, min_rollouts=2, max_rollouts=16)


def test_reloads_off_stops_spanrl_train_online_at_start(tiny: Path, collector: Any, tmp_path: Path) -> None:
    server = _server(tiny)  # started without --admin-token-file / --checkpoint-root
    url = server.base_url
    try:
        config = _config(tiny, server, collector, tmp_path / "online")
        (tmp_path / "online.yaml").write_text(json.dumps({k: v for k, v in vars(config).items()
                                                          if k in ("model", "server_url", "store_url", "output_dir")}))
        done = subprocess.run([sys.executable, "-m", "spanrl", "train", "--online", str(tmp_path / "online.yaml")],
                              capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"spanrl: error: {OFF.format(url=url)}"]
    assert "now serving" not in done.stdout and not (tmp_path / "online" / "history.jsonl").exists()


def test_a_wrong_token_or_a_folder_outside_the_root_is_named_at_start(tiny: Path, collector: Any, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "root").mkdir()
    server = _server(tiny, admin_token="online-admin", checkpoint_root=tmp_path / "root")
    try:
        monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", "not-the-token")
        with pytest.raises(ServingError, match=r"answered 401: missing or wrong admin token .*; to fix: give the "
                                               r"trainer the server's admin token: SPANRL_POLICY_ADMIN_TOKEN="):
            OnlineTrainer(_config(tiny, server, collector, tmp_path / "root" / "a")).start()
        monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", "online-admin")
        with pytest.raises(ServingError, match=r"answered 400: path must name a model folder under the server's "
                                               r"checkpoint root; to fix: the trainer's output_dir must lie under"):
            OnlineTrainer(_config(tiny, server, collector, tmp_path / "elsewhere")).start()
        trainer = OnlineTrainer(_config(tiny, server, collector, tmp_path / "root" / "b")).start()  # allowed
        assert server.version == 0  # the dry run loaded nothing
        trainer.close()
    finally:
        server.shutdown()


def _rollout(store: Any, rollout_id: str, reward: float) -> None:
    """A finished rollout: its spanrl.rollout span, one policy-server call with token ids, one reward."""
    req, _ = make_request(3, rollout_id=rollout_id, resource={sc.TASK_ID: "t"})
    root, call, judged = req.resource_spans[0].scope_spans[0].spans
    root.name = sc.ROLLOUT_SPAN_NAME
    call.kind = 2  # SERVER
    call.attributes.extend([kv(sc.GEN_AI_OPERATION_NAME, "chat"), kv(sc.LLM_PROMPT_TOKEN_IDS, [5, 6, 7]),
                            kv(sc.LLM_COMPLETION_TOKEN_IDS, [8, 9, 2]), kv(sc.LLM_LOGPROBS, [-1.0, -1.5, -0.5]),
                            kv(sc.POLICY_VERSION, 0)])
    judged.name = sc.FEEDBACK_SPAN_NAME
    judged.attributes.append(kv(sc.REWARD_VALUE, reward))
    store.append(encode_request(req).table)


def test_an_update_the_server_does_not_load_is_an_error_not_vnone(tiny: Path, collector: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tiny, admin_token="online-admin", checkpoint_root=tmp_path)
    try:
        monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", "online-admin")
        trainer = OnlineTrainer(_config(tiny, server, collector, tmp_path / "online"),
                                algorithm=GRPO(learning_rate=1e-3), store=collector.store).start()
        _rollout(collector.store, "r-1", 1.0)
        _rollout(collector.store, "r-2", 0.0)
        monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", "rotated")  # the server's token changed since start
        with pytest.raises(TrainingError, match=r"^update 1 is saved \(checkpoint-1\) but the server did not load it: "
                                                r"policy server .* answered 401: .*Run again once it can: the rerun "
                                                r"resumes here and loads it$"):
            trainer.poll_once()
        assert server.version == 0
        monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", "online-admin")
        again = OnlineTrainer(_config(tiny, server, collector, tmp_path / "online"), store=collector.store).start()
        assert again.state.step == 1 and server.version == 1  # the rerun loaded the committed update
    finally:
        server.shutdown()
