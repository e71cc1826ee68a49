"""The services' one lifecycle (spanrl/lifecycle.py): each refusal names the service, the call and the state."""

from __future__ import annotations

import pytest

from spanrl.errors import CollectorError, ServingError
from spanrl.lifecycle import Lifecycle, State


def test_start_once_stop_once_and_refusals_name_the_state() -> None:
    life = Lifecycle("collector", CollectorError)
    assert life.state is State.NEW and life.end() is True and life.end() is False  # stopped before start: fine
    with pytest.raises(CollectorError, match="^cannot start a collector that is stopped; create a new one$"):
        life.begin()
    life = Lifecycle("policy server", ServingError)
    assert life.begin(again=True) is True and life.begin(again=True) is False  # a second start: a no-op
    with pytest.raises(ServingError, match="^cannot start a policy server that is running; create a new one$"):
        life.begin()
    life.refuse("submit to", State.STOPPED)  # running: allowed
    assert life.end() is True
    with pytest.raises(ServingError, match="^cannot submit to a policy server that is stopped$"):
        life.refuse("submit to", State.STOPPED)
