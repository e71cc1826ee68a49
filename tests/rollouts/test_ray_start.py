"""``init_ray``: a ``ray_current_cluster`` record left by a ``ray start`` that was killed no longer stalls
``ray.init`` (a sweep in a clean-clone CI sat 500 s that way); a record whose address answers is still joined.
Real Ray, started in a subprocess with its own ``RAY_TMPDIR``, so the machine's /tmp/ray is never touched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'spanrl[ray]'")

from spanrl.errors import ConfigError  # noqa: E402
from spanrl.rollouts import ray_start  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_ray_at_a_time")  # tests/conftest.py

_DRIVER = textwrap.dedent("""
    import logging, sys
    from spanrl.rollouts.ray_start import init_ray
    import ray
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(name)s: %(message)s")
    init_ray(None, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    print("ray up at", ray.get_runtime_context().gcs_address, flush=True)
    ray.shutdown()
""")


def _dead_port() -> int:
    with socket.socket() as s:  # a free port the system just handed out: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_recorded_cluster_is_skipped_and_a_local_ray_starts() -> None:
    root = Path("/tmp") / f"spanrl-ray-{os.getpid()}"  # short: Ray's socket paths live under it
    (root / "ray").mkdir(parents=True, exist_ok=True)
    record = root / "ray" / "ray_current_cluster"
    record.write_text(f"127.0.0.1:{_dead_port()}\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(root)}
    try:
        done = subprocess.run([sys.executable, "-c", _DRIVER], env=env, capture_output=True, text=True, timeout=180)
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{record} names 127.0.0.1:" in done.stdout and "starting a local cluster instead" in done.stdout
    assert "ray up at" in done.stdout


def test_a_record_is_read_where_ray_writes_it_and_an_answering_one_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert ray_start.recorded_cluster() is None  # no record: Ray's own rule (start one) applies
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        live = f"127.0.0.1:{listener.getsockname()[1]}"
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text(live + "\n")
        assert ray_start.recorded_cluster() == (tmp_path / "ray" / "ray_current_cluster", live)
        assert ray_start._answers(live)
    assert not ray_start._answers(f"127.0.0.1:{_dead_port()}")
    assert not ray_start._answers("no-port-here")


@pytest.mark.parametrize("via_env", [False, True])
def test_auto_with_a_dead_record_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      via_env: bool) -> None:
    """``auto`` asks to join a running cluster: a local one would not be what was asked."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_dead_port()}\n")
    if via_env:
        monkeypatch.setenv("RAY_ADDRESS", "auto")
    else:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=r"^Ray address 'auto' joins the cluster recorded in .*ray_current_cluster, "
                                          r"127\.0\.0\.1:\d+, where nothing answers: start one there"):
        ray_start.init_ray(None if via_env else "auto")
