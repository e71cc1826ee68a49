"""``ray.init`` for spanrl's Ray users (``rollouts.backend: ray``, ``spanrl sweep``), without Ray's one stall.

With no address (or ``auto``) and no ``RAY_ADDRESS``, ``ray.init`` joins the cluster that the machine's last
``ray start`` recorded in ``ray_current_cluster`` (in Ray's temp folder). A ``ray start`` that was killed
leaves that record behind, and ``ray.init`` then retries the dead address for ever, printing nothing on the
terminal (a sweep in CI sat 500 s that way). Here a record whose address does not accept a connection is
skipped with no address (a warning in the log; a local cluster starts, as it would with no record) and refused
with ``auto`` (which asks to join a running cluster, so a local one would not be what was asked). Any other
address (argument or ``RAY_ADDRESS``) is used as given.

"Answers" is a TCP connection within ``CONNECT_TIMEOUT_S`` (name resolution not counted): another program on
the recorded port (Redis shares Ray's default 6379) passes for Ray, and ``ray.init`` then behaves as Ray's.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError

__all__ = ["init_ray", "recorded_cluster"]

logger = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 2.0


def recorded_cluster() -> tuple[Path, str] | None:
    """The record of the last ``ray start`` on this machine and the address in it, if there is one. Ray's temp
    folder, by Ray's own rule (``ray._common.utils.get_default_system_temp_dir``, Ray 2.60): ``RAY_TMPDIR``,
    else ``TMPDIR`` (Linux), else ``/tmp`` (Linux, macOS), else the system's."""
    if "RAY_TMPDIR" in os.environ:
        root = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        root = os.environ["TMPDIR"]
    elif sys.platform.startswith(("linux", "darwin")):
        root = "/tmp"
    else:
        root = tempfile.gettempdir()
    path = Path(root, "ray", "ray_current_cluster")
    try:
        address = path.read_text().strip()
    except OSError:
        return None
    return (path, address) if address else None


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")  # Ray writes host:port, IPv6 as [::1]:port
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def init_ray(address: str | None, **kwargs: Any) -> None:
    """``ray.init(address=address, **kwargs)``; with ``address`` None or ``auto`` (or ``RAY_ADDRESS=auto``) and a
    recorded cluster that does not answer: None starts a local one instead (a warning in the log), ``auto`` is
    a `ConfigError` naming the record."""
    import ray

    wanted = os.environ.get("RAY_ADDRESS") or address
    if wanted in (None, "auto"):
        record = recorded_cluster()
        if record is not None and not _answers(record[1]):
            path, stale = record
            if wanted == "auto":
                raise ConfigError(
                    f"Ray address 'auto' joins the cluster recorded in {path}, {stale}, where nothing "
                    "answers: start one there (ray start --head) or remove the record (ray stop)"
                )
            logger.warning(
                "Ray: %s names %s, where nothing answers (a `ray start` that ended without `ray stop`?); "
                "starting a local cluster instead",
                path,
                stale,
            )
            address = "local"
    ray.init(address=address, **kwargs)
