"""Fixtures for the viewer's tests: a store the demo's pipeline filled, `spanrl ui` as a subprocess,
and a real headless Chromium driven over the DevTools protocol.

    demo_store   a short real `spanrl demo` run (tiny model: SFT demonstrations, GRPO steps, evaluations)
    ui_factory   start(*args) -> UiProcess: `python -m spanrl ui --port 0 ...`, stopped at teardown
    browser      a Browser on a fresh headless Chromium (new empty profile), closed at teardown
    shots        the folder screenshots are kept in (printed; under pytest's tmp dir)
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = (os.environ.get("CHROME_BIN") or shutil.which("chromium") or shutil.which("chromium-browser")
            or "/usr/bin/chromium")
_CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,900")
_START_TIMEOUT_S = 60.0
_WAIT_TIMEOUT_S = 60.0


class Browser:
    """One Chromium page over CDP: `goto`, `wait` for a JS condition, `eval`, `screenshot`."""

    def __init__(self, profile: Path) -> None:
        from websockets.sync.client import connect

        if not os.path.exists(CHROMIUM):
            pytest.fail(
                f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install -y chromium); make test does"
            )
        self.proc = subprocess.Popen([CHROMIUM, *_CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                      "--remote-debugging-port=0",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.proc.kill()
                pytest.fail(f"Chromium did not start (exit {self.proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = []
        while not pages:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
                pages = [t for t in json.loads(resp.read()) if t["type"] == "page"]
            time.sleep(0.1)
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self._ids = itertools.count(1)
        self.console_errors: list[str] = []
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=_WAIT_TIMEOUT_S))
            if msg.get("method") == "Runtime.exceptionThrown":
                self.console_errors.append(json.dumps(msg["params"]["exceptionDetails"])[:500])
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def eval(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error in {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout_s: float = _WAIT_TIMEOUT_S) -> Any:
        """Poll until ``expression`` is truthy; return its value. Fails with the page's text."""
        deadline = time.monotonic() + timeout_s
        probe = f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()"  # a node is not JSON
        while time.monotonic() < deadline:
            value = self.eval(probe)
            if value:
                return value
            time.sleep(0.1)
        text = self.eval("document.body.innerText.slice(0, 2000)")
        raise AssertionError(f"timed out waiting for {expression!r}; the page shows:\n{text}")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.write_bytes(base64.b64decode(data))
        print(f"screenshot: {path}")
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class UiProcess:
    """`python -m spanrl ui` as a subprocess on a free port."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "spanrl", "ui", "--port", "0", *args],
                                         stdout=subprocess.PIPE,
                                         stderr=err, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(_START_TIMEOUT_S)
        if not line or " open http" not in line[0]:
            self.stop()
            raise RuntimeError(f"spanrl ui did not start: {line!r}; log:\n{log.read_text()[-3000:]}")
        self.first_line = line[0].strip()
        self.url = self.first_line.rsplit(" open ", 1)[1]

    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url.rstrip("/") + path)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post(self, path: str, doc: dict[str, Any], token: str | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url.rstrip("/") + path, data=json.dumps(doc).encode(), method="POST",
                                         headers={"content-type": "application/json"})
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of a short real demo: spans.duckdb, model/, sft/ and grpo/ runs."""
    from spanrl.demo.demo import DemoConfig, run_demo

    out = tmp_path_factory.mktemp("ui-demo")
    # additions only, and enough SFT (100 optimizer steps) that GRPO groups get mixed rewards, so advantages
    # are not all zero: about 3 minutes on two loaded cores
    run_demo(DemoConfig(output_dir=str(out), ops=("add",), n_train_tasks=600, n_val_tasks=8, demonstrations=400,
                        sft_epochs=4,
                        sft_batch_size=16, grpo_steps=3, grpo_tasks_per_step=2, grpo_group_size=4, eval_every=1,
                        workers=4, progress=False),
             echo=lambda line: None)
    return out


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ui-screenshots")
    print(f"screenshots go to {folder}")
    return folder


@pytest.fixture
def ui_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[UiProcess] = []

    def start(*args: str) -> UiProcess:
        proc = UiProcess(list(args), tmp_path / f"ui-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def browser() -> Iterator[Browser]:
    profile = Path(tempfile.mkdtemp(prefix="spanrl-chromium-"))
    b = Browser(profile)
    try:
        yield b
    finally:
        b.close()
        shutil.rmtree(profile, ignore_errors=True)
