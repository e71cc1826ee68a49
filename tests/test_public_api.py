"""The public surface of `spanrl`: an explicit, sorted `__all__` whose every name resolves."""

from __future__ import annotations

import subprocess
import sys

import spanrl


def test_all_is_sorted_and_unique():
    assert list(spanrl.__all__) == sorted(set(spanrl.__all__))


def test_every_exported_name_resolves():
    missing = [name for name in spanrl.__all__ if getattr(spanrl, name, None) is None]
    assert missing == []


def test_unknown_attribute_raises_attribute_error():
    try:
        spanrl.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_agent_side_import_does_not_load_torch():
    code = (
        "import sys, spanrl; spanrl.emit_reward; spanrl.agent; spanrl.rollout; "
        "import spanrl.instrumentation; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "spanrl", "--help"], capture_output=True, text=True, check=True)
    for command in ("collector", "sql", "store", "serve", "train", "sweep", "demo", "export", "ui"):
        assert command in out.stdout


def test_wire_contract_modules_are_light():
    # the span vocabulary, the token-array codec and the rollout URL: no OTel SDK, no torch
    code = (
        "import sys; from spanrl import codec, semconv; "
        "assert codec.decode_int32(codec.encode_int32([1, -2, 3])) == [1, -2, 3]; "
        "assert semconv.rollout_base_url('http://h:1/', 'r-1', 2) == 'http://h:1/rollouts/r-1/attempts/2/v1'; "
        "print(sorted(m for m in ('torch', 'opentelemetry.sdk', 'opentelemetry') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_algorithm_registry():
    from spanrl.algorithms import ALGORITHMS, algorithm_class
    from spanrl.quickstart import ALGORITHMS as QUICKSTART

    assert set(QUICKSTART) <= set(ALGORITHMS)
    assert {name: algorithm_class(name).__name__ for name in ALGORITHMS} == ALGORITHMS


def test_the_online_trainer_is_imported_from_its_room_alone():
    import spanrl.online
    import spanrl.trainer

    assert spanrl.online.__all__ == ["OnlineConfig", "OnlineTrainer"]
    assert (spanrl.online.OnlineConfig.__module__, spanrl.online.OnlineTrainer.__module__) == (
        "spanrl.online.config", "spanrl.online.trainer")
    assert not set(spanrl.online.__all__) & set(spanrl.trainer.__all__)  # one way to import each name
