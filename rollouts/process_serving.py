"""Policy servers in processes of their own (``serving: {placement: process, replicas: N}``): N ``spanrl serve``
subprocesses of the transformers backend on 127.0.0.1, so generation and its HTTP stack run beside the
Trainer's process, not on its interpreter lock. Their roots join the Trainer's
:class:`~spanrl.rollouts.policy_pool.PolicyPool` as ``serving.urls`` do, so rollouts spread over them and every
update reloads each one.

Each server exports its spans to the Trainer's collector with the policy token, reloads only from the pool's
weights folder (its ``--checkpoint-root``) with a token made for the run, takes only the run's API key (tenant
``trainer``), samples with its own seed (``seed + 1 + i``, as ``placement: ray``), and runs the Trainer's
``torch_threads`` (torch's default, a thread per core, spin-waits against the Trainer's own threads: rollouts
took 3x as long on two loaded cores). Tokens and the key travel
in the environment and a file only this user reads, removed once the server is up: never on a command line.
Their output goes to the run's log. :meth:`ProcessServers.check` raises :class:`TrainingError` once one of them
has exited; :meth:`ProcessServers.close` stops and reaps them all; a Trainer killed before it could close them
leaves none running either: each stops once its parent is gone (``SPANRL_PARENT_PID``, ``spanrl/parent_watch.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spanrl import env
from spanrl.errors import ServingError, TrainingError
from spanrl.serving.client import PolicyClient

__all__ = ["ProcessServers"]

_logger = logging.getLogger(__name__)
_START_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 15.0
_POLL_S = 0.1


class ProcessServers:
    """``serving.replicas`` ``spanrl serve`` subprocesses of ``model``; ``roots`` are their URLs."""

    def __init__(self, serving: Any, *, model: Path, weights_dir: Path, otlp_endpoint: str | None,
                 served_model_name: str, max_batch_size: int, seed: int, log_path: Path, threads: int | None = None,
                 collector_token: str | None = None, api_key: str | None = None, prefix_caching: bool = False) -> None:
        self.token = secrets.token_urlsafe(24)
        self.log_path = Path(log_path)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.roots: list[str] = []
        self._log: Any = None
        self._keys = contextlib.ExitStack()  # the API key's file: read by each server as it starts
        # SPANRL_PARENT_PID: each server stops once this process is gone, even killed outright (parent_watch.py)
        self.env = {**os.environ, env.SPANRL_POLICY_ADMIN_TOKEN: self.token, env.SPANRL_PARENT_PID: str(os.getpid())}
        if collector_token:
            self.env[env.SPANRL_COLLECTOR_POLICY_TOKEN] = collector_token
        try:
            Path(weights_dir).mkdir(parents=True, exist_ok=True)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - held until close(); the servers write to it
            key_file = self._keys.enter_context(_key_file(api_key))
            for replica in range(serving.replicas):
                port = _free_port()
                argv = [sys.executable, "-m", "spanrl", "serve", "--model", str(model),
                        "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(port),
                        "--backend", serving.backend, "--device", serving.device, "--dtype", serving.dtype,
                        "--max-batch-size", str(max_batch_size), "--seed", str(seed + 1 + replica),
                        "--otlp-endpoint", otlp_endpoint or "none", "--checkpoint-root", str(weights_dir),
                        "--disable-uvicorn-access-log",  # a line per rollout's call in the run's log otherwise
                        *(["--threads", str(threads)] if threads else []),
                        *(["--enable-prefix-caching"] if prefix_caching else []),
                        *(["--api-key-file", key_file] if key_file else [])]
                self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                                   stderr=subprocess.STDOUT, env=self.env))
                self.roots.append(f"http://127.0.0.1:{port}")
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        """Return once every server answers its health route; raise `ServingError` (with the log's path) for
        one that exited or did not answer in time. Starting returns before: the caller starts other work."""
        for proc, root in zip(self.procs, self.roots):
            self._wait_ready(proc, root)
        self._keys.close()  # every server has read it

    def _wait_ready(self, proc: subprocess.Popen[bytes], root: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        client = PolicyClient(root, token=self.token)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServingError(f"serving.placement process: the policy server for {root} exited with code "
                                   f"{proc.returncode} while starting; its output is in {self.log_path}")
            with contextlib.suppress(ServingError, OSError):
                client.health()
                return
            time.sleep(_POLL_S)
        raise ServingError(f"serving.placement process: the policy server at {root} did not answer its health "
                           f"route within {_START_TIMEOUT_S:g} s; its output is in {self.log_path}")

    def check(self) -> None:
        """Raise :class:`TrainingError` if one of the servers has exited (rollouts and reloads need them all)."""
        for proc, root in zip(self.procs, self.roots):
            if proc.poll() is not None:
                raise TrainingError(f"serving.placement process: the policy server at {root} (pid {proc.pid}) "
                                    f"exited with code {proc.returncode} during the run; its output is in "
                                    f"{self.log_path}")

    def close(self) -> None:
        """Stop every server (SIGTERM: spans flushed; SIGKILL after a while) and reap it; safe twice."""
        self._keys.close()
        procs, self.procs = self.procs, []
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _logger.warning("policy server pid %d ignored SIGTERM for %g s: killed", proc.pid, _STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def _free_port() -> int:
    """A port free on 127.0.0.1 now (``spanrl serve`` prints no port it chose, so it is given one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _key_file(api_key: str | None) -> Any:
    """The run's API key as a ``KEY trainer`` file only this user reads, removed when the block ends."""
    if not api_key:
        yield None
        return
    fd, path = tempfile.mkstemp(prefix="spanrl-key-")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{api_key} trainer\n")
        yield path
    finally:
        os.unlink(path)
