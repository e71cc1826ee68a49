"""`configure()` / `flush()` for processes that do not run under opentelemetry-instrument."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spanrl.errors import ConfigError
from spanrl.instrumentation import configure

_SCRIPT = """
import sys
from opentelemetry import trace
import spanrl
from spanrl.instrumentation import configure, flush
provider = configure(sys.argv[1], service_name="trainer-callable")
assert configure("http://elsewhere:1") is provider          # idempotent: the first setup stays
assert trace.get_tracer_provider() is provider
for i in range(3):
    with spanrl.rollout(f"r-cfg-{i}", task_id="t", attempt=1):
        with spanrl.agent("solver"):
            spanrl.emit_tool_call("add", {"a": i}, i + 1)
        spanrl.emit_reward(i / 2)
spanrl.emit_reward(9.0)                                      # outside any rollout: env ids
assert flush(10.0) is True
print("flushed")
"""


def test_configure_exports_rollouts_to_the_collector(collector_proc):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPANRL_"))}
    env.update(SPANRL_ROLLOUT_ID="r-env", SPANRL_TASK_ID="t-env")
    out = subprocess.run([sys.executable, "-c", _SCRIPT, f"http://{collector_proc.grpc_endpoint}"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "flushed" in out.stdout
    assert "ignored" in out.stderr  # the second endpoint was refused with a warning
    rows = collector_proc.sql(
        "SELECT rollout_id, task_id, count(*) AS spans, max(reward_value) AS reward, any_value(service_name) AS service"
        " FROM spans GROUP BY ALL ORDER BY rollout_id"
    )
    assert [(r["rollout_id"], r["task_id"], r["spans"], r["reward"]) for r in rows] == [
        ("r-cfg-0", "t", 4, 0.0),
        ("r-cfg-1", "t", 4, 0.5),
        ("r-cfg-2", "t", 4, 1.0),
        ("r-env", "t-env", 1, 9.0),
    ]
    assert {r["service"] for r in rows} == {"trainer-callable"}


def test_configure_bad_argument_raises_config_error():
    with pytest.raises(ConfigError, match="schedule_delay_millis must be a positive integer, got -1"):
        from spanrl.instrumentation import InstrumentationConfig

        configure(config=InstrumentationConfig(schedule_delay_millis=-1))
