"""Who may swap the served model (issue 28, finding 1), and no cross-site or DNS-rebinding requests (finding 5)."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from spanrl.errors import ConfigError
from spanrl.serving import PolicyServer, ServerConfig

_ADMIN = "adm-t0ken"
_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "1 add 2"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir_other: pathlib.Path) -> pathlib.Path:
    """A checkpoint root holding one good checkpoint."""
    folder = tmp_path_factory.mktemp("ckpts")
    shutil.copytree(tiny_model_dir_other, folder / "checkpoint-1")
    return folder


@pytest.fixture(scope="module")
def server(tiny_model_dir: pathlib.Path, root: pathlib.Path) -> Iterator[PolicyServer]:
    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                          admin_token=_ADMIN, checkpoint_root=root)
    with PolicyServer(config) as srv:
        srv.start()
        yield srv


def _reload(server: PolicyServer, path: str, *, token: str | None = _ADMIN, **headers: str) -> httpx.Response:
    h = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{server.base_url}/v1/weights/reload", json={"path": path}, headers={**h, **headers}, timeout=60)


@pytest.mark.parametrize("token", [None, "wrong"])
def test_reload_needs_the_admin_token(server, root, token):
    before = server.version
    reply = _reload(server, str(root / "checkpoint-1"), token=token)
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"]["type"] == "authentication_error"
    assert server.version == before


def test_reload_with_the_admin_token_under_the_root(server, root):
    before = server.version
    reply = _reload(server, str(root / "checkpoint-1"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["policy_version"] == before + 1
    assert _reload(server, "checkpoint-1").json()["policy_version"] == before + 2  # relative to the root


def test_reload_outside_the_root_says_nothing_about_the_path(server, root, tiny_model_dir, tmp_path):
    """Finding 1: any folder on the server's disk loaded, and the error told which paths exist."""
    (root / "escape").symlink_to(tiny_model_dir, target_is_directory=True)
    messages = set()
    for path in (str(tiny_model_dir), "/etc", str(tmp_path / "nothing-here"), "../", "escape", str(root / "escape")):
        reply = _reload(server, path)
        assert reply.status_code == 400, (path, reply.text)
        messages.add(reply.json()["error"]["message"])
    assert messages == {"path must name a model folder under the server's checkpoint root"}


def test_a_checkpoint_whose_files_link_out_of_the_root_is_refused(server, root, tiny_model_dir_other):
    """Issue 53, finding 7: the folder was checked, not its files: a checkpoint under the root whose weights file
    was a symlink to a file elsewhere on the disk loaded (200, a new version)."""
    linked = root / "linked"
    linked.mkdir(exist_ok=True)
    for item in tiny_model_dir_other.iterdir():
        if item.suffix == ".safetensors":
            (linked / item.name).unlink(missing_ok=True)
            (linked / item.name).symlink_to(item)
        elif item.is_file():
            shutil.copy(item, linked / item.name)
    before = server.version
    reply = _reload(server, "linked")
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == ("path: model.safetensors in the checkpoint folder links out of the "
                                                "server's checkpoint root: refused")
    assert server.version == before
    inside = root / "inside"
    inside.mkdir(exist_ok=True)
    shutil.copytree(tiny_model_dir_other, inside / "real", dirs_exist_ok=True)
    (linked / "model.safetensors").unlink()
    (linked / "model.safetensors").symlink_to(inside / "real" / "model.safetensors")  # a link within the root: fine
    assert _reload(server, "linked").status_code == 200


def test_reload_never_tries_the_hub(server, root, monkeypatch):
    """Finding 1: a path that is not a local folder was tried as a Hub repo id and stalled generation 45 s.
    Told by what the server looks up, not by a clock: no host name but this machine's is ever resolved."""
    looked_up = []
    real_getaddrinfo = socket.getaddrinfo

    def recording_getaddrinfo(host, *args, **kwargs):
        looked_up.append(host)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording_getaddrinfo)
    (root / "gpt2").mkdir(exist_ok=True)  # a folder under the root with no weights: loaded local only, fails fast
    for path in ("gpt2", "openai-community/gpt2", "hf://gpt2"):
        assert _reload(server, path).status_code == 400
    assert looked_up and set(looked_up) <= {"127.0.0.1", "localhost"}, looked_up  # the test's own requests only
    assert httpx.post(f"{server.base_url}/v1/chat/completions", json=_CHAT, timeout=30).status_code == 200


def test_reload_is_off_without_a_token_or_a_root(tiny_model_dir, root):
    for admin, ckpt in ((None, root), (_ADMIN, None)):
        config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                              admin_token=admin, checkpoint_root=ckpt)
        with PolicyServer(config) as srv:
            srv.start()
            reply = _reload(srv, str(root / "checkpoint-1"))
            assert reply.status_code == 403 and "--checkpoint-root" in reply.json()["error"]["message"]
            assert srv.version == 0
            assert srv.reload(str(root / "checkpoint-1")) == 1  # in-process reloads need no token


def test_checkpoint_root_must_exist(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="checkpoint_root must be an existing folder"):
        ServerConfig(model=tiny_model_dir, checkpoint_root=tmp_path / "absent").validate()


def test_simple_text_plain_reload_from_a_web_page_is_refused(server, root):
    """Finding 1: a browser's simple POST (text/plain, foreign Origin) swapped the model."""
    before = server.version
    body = f'{{"path": "{root / "checkpoint-1"}"}}'
    plain = httpx.post(f"{server.base_url}/v1/weights/reload", content=body, timeout=30,
                       headers={"content-type": "text/plain", "authorization": f"Bearer {_ADMIN}"})
    assert plain.status_code == 415
    foreign = _reload(server, str(root / "checkpoint-1"), origin="http://evil.example")
    assert foreign.status_code == 403 and "cross-site" in foreign.json()["error"]["message"]
    assert server.version == before


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/health"])
def test_foreign_origin_and_rebinding_host_are_refused(server, path):
    port = server.port
    call = (lambda **h: httpx.post(f"{server.base_url}{path}", json=_CHAT, headers=h, timeout=30)) \
        if path != "/health" else (lambda **h: httpx.get(f"{server.base_url}{path}", headers=h, timeout=30))
    assert call(origin="http://evil.example").status_code == 403
    assert call(host=f"evil.example:{port}").status_code == 403
    assert call(host=f"localhost:{port}").status_code == 200
    assert call(origin=server.base_url).status_code == 200


def test_completion_post_needs_json(server):
    reply = httpx.post(f"{server.base_url}/v1/completions", content=b'{"prompt": "1"}',
                       headers={"content-type": "application/x-www-form-urlencoded"}, timeout=30)
    assert reply.status_code == 415


def test_admin_token_from_a_file_in_the_cli(tmp_path, tiny_model_dir, root):
    """``--admin-token-file``: a token on a command line is visible to every user of the machine."""
    import subprocess
    import socket
    import sys

    token_file = tmp_path / "admin.token"
    token_file.write_text(_ADMIN + "\n")
    os.chmod(token_file, 0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "serve", "--model", str(tiny_model_dir),
                             "--port", str(port),
                             "--served-model-name", "tiny", "--threads", "1", "--otlp-endpoint", "none",
                             "--admin-token-file", str(token_file), "--checkpoint-root", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert (proc.poll() is None
                    and time.monotonic() < deadline), proc.stdout.read().decode() if proc.stdout else ""
            time.sleep(0.3)
        url = f"{base}/v1/weights/reload"
        assert httpx.post(url, json={"path": "checkpoint-1"}, timeout=60).status_code == 401
        ok = httpx.post(url, json={"path": "checkpoint-1"}, headers={"authorization": f"Bearer {_ADMIN}"}, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        proc.terminate()
        proc.wait(30)


def test_served_spans_keep_token_ids_through_a_scoped_collector(tmp_path, tiny_model_dir):
    """Finding 7, end to end: ``spanrl serve --collector-token-file`` sends the collector's policy token, so its
    spans keep their token ids; the same span from the agents' ingest token would not."""
    import socket
    import subprocess
    import sys

    from spanrl.collector import Collector, CollectorConfig

    (tmp_path / "policy.token").write_text("policy-t\n")
    config = CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=0, http_port=-1, ingest_token="agent-t",
                             policy_token="policy-t", materialize_interval_s=None)
    with Collector(config) as collector, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        proc = subprocess.Popen([sys.executable, "-m", "spanrl", "serve", "--model", str(tiny_model_dir),
                                 "--port", str(port),
                                 "--served-model-name", "tiny", "--threads", "1",
                                 "--otlp-endpoint", collector.grpc_endpoint,
                                 "--collector-token-file", str(tmp_path / "policy.token")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.3)
            reply = httpx.post(f"{base}/rollouts/served-1/v1/chat/completions", json=_CHAT, timeout=60)
            assert reply.status_code == 200
        finally:
            proc.terminate()  # flushes its spans on the way out
            proc.wait(30)
        rows = collector.store.sql(
            "SELECT completion_token_ids, response_id FROM spans WHERE rollout_id = 'served-1'"
        ).to_pylist()
    assert len(rows) == 1 and rows[0]["completion_token_ids"] and rows[0]["response_id"].startswith("chatcmpl-")
