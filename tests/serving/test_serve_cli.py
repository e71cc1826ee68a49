"""`spanrl serve` as a subprocess: ready on /health, answers, stops on SIGTERM."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_spanrl_serve_answers_and_stops_on_sigterm(tiny_model_dir, tmp_path) -> None:
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    cmd = [sys.executable, "-m", "spanrl", "serve", "--model", str(tiny_model_dir), "--port", str(port),
           "--otlp-endpoint", "none", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "spanrl serve did not become ready"
                time.sleep(0.3)
        assert health.json()["model"] == tiny_model_dir.name
        reply = httpx.post(
            f"http://127.0.0.1:{port}/rollouts/r9/v1/completions",
            json={"model": tiny_model_dir.name, "prompt": "3 add 4", "max_tokens": 3},
            timeout=60,
        )
        assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) == 3
    finally:
        proc.terminate()
        code = proc.wait(60)
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()


def test_spanrl_serve_bad_flag_says_which(tmp_path) -> None:
    cmd = [sys.executable, "-m", "spanrl", "serve", "--model", str(tmp_path / "nothing"), "--otlp-endpoint", "none"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]  # after the log lines: the one error line
    assert last.startswith("spanrl: error: model: ") and "is not a Hugging Face model folder" in last
    assert "Traceback" not in done.stderr
