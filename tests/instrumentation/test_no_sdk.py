"""The emit API where no OTel SDK is installed or configured: silent no-ops that never raise."""

from __future__ import annotations

import subprocess
import sys

_BLOCK_SDK = """
import sys
class _NoSDK:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, _NoSDK())
"""

_USE_EVERYTHING = """
import asyncio, logging
logging.basicConfig(level=logging.WARNING)
import spanrl
spanrl.emit_reward(0.5)
spanrl.emit_reward({"a": 1, "b": 2})
spanrl.emit_observation({"x": 1})
spanrl.emit_tool_call("calc", {"a": 1}, 2)
spanrl.emit_feedback(1.0, response_id="chatcmpl-1")
call = spanrl.emit_prompt("hi", model="m")
spanrl.emit_response("hello", call=call, completion_token_ids=[1, 2])
with spanrl.rollout("r-1", task_id="t") as root:
    assert not root.is_recording()
    from opentelemetry import baggage
    assert baggage.get_baggage("spanrl.rollout.id") == "r-1"
    with spanrl.agent("planner"):
        spanrl.emit_reward(1.0)

@spanrl.agent("solver")
async def solve():
    return 3
assert asyncio.run(solve()) == 3
try:
    with spanrl.agent("x"):
        raise ValueError("mine")
except ValueError as exc:
    assert str(exc) == "mine"
assert spanrl.instrumentation.flush(0.1) is False
print("torch" in sys.modules, any(m.startswith("opentelemetry.sdk") for m in sys.modules))
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


# The one line a process without an SDK prints: feedback sent from it would go nowhere (the rest is silent).
_NO_SDK_FEEDBACK = ("WARNING:spanrl.instrumentation:spanrl: emit_feedback: no OpenTelemetry SDK in this process, "
                    "so the feedback is not sent; call spanrl.instrumentation.configure() first and "
                    "spanrl.instrumentation.flush() before exiting, or run under opentelemetry-instrument\n")


def test_emit_api_without_sdk_installed_is_a_noop_that_warns_only_of_lost_feedback():
    out = _run(_BLOCK_SDK + "import sys\n" + _USE_EVERYTHING)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False"
    assert out.stderr == _NO_SDK_FEEDBACK


def test_emit_api_without_sdk_configured_is_a_noop_that_warns_only_of_lost_feedback():
    out = _run("import sys\n" + _USE_EVERYTHING)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("False")
    assert out.stderr == _NO_SDK_FEEDBACK


def test_bad_values_without_sdk_only_warn():
    code = _BLOCK_SDK + (
        "import logging, spanrl\nlogging.basicConfig()\n"
        "spanrl.emit_reward('high')\nspanrl.emit_reward(float('nan'), name='n')\n"
        "spanrl.emit_tool_call(None, object(), object())\nspanrl.emit_response(object())\n"
        "with spanrl.agent(None):\n    pass\nprint('survived')\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "survived"
    assert "value of reward 'reward' must be a finite number, got 'high' (str)" in out.stderr
    assert "value of reward 'n' must be a finite number, got nan (float)" in out.stderr
    assert "Traceback" not in out.stderr
