"""Rewards that can be trained on, a stage between the receivers and the batcher (`RewardCheck`).

A span whose reward cannot be trained on is rejected alone. One reward of
1e200 passes a float64 finiteness check and overflows float32 in the loss (issue 28); a NaN or an infinity
stops whatever averages it. So every decoded request, from either decoder and either receiver, is checked
before it is queued: a span is rejected (OTLP partial success, with the reason) when

* its typed reward (``spanrl.reward.value`` / ``gen_ai.evaluation.score.value``, the ``reward_value``
  column) is NaN, infinite or outside ``reward_range``;
* a reward event on it (``spanrl.reward`` / ``gen_ai.evaluation.result``) carries a value key whose value
  is not a number, or not finite (JSON has no NaN: the encoders write NaN and infinities as null), or is
  outside ``reward_range``. An evaluation event with only a label and no score is not a reward and passes.

The rest of the request is stored. The readers check again (store/views.sql's ``rollout_rewards``), for
rows stored before this check existed.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from spanrl import semconv as sc
from spanrl.collector.encoding import EncodedBatch
from spanrl.collector.otlp_json import MAX_ERRORS_REPORTED

__all__ = ["DEFAULT_REWARD_RANGE", "RewardCheck", "check_rewards", "reward_problem"]

DEFAULT_REWARD_RANGE = (-sc.REWARD_ABS_MAX, sc.REWARD_ABS_MAX)
_EVENT_NAMES = (sc.REWARD_SPAN_NAME, sc.GEN_AI_EVALUATION_RESULT_EVENT)
_EVENT_KEYS = (sc.REWARD_VALUE, sc.GEN_AI_EVALUATION_SCORE_VALUE)


def reward_problem(value: Any, low: float, high: float) -> str | None:
    """Why ``value`` is not a usable reward (None when it is): a finite number in ``[low, high]``."""
    if isinstance(value, bool) or value is None:
        got = "null (NaN or an infinity)" if value is None else repr(value)
        return f"must be a finite number in [{low:g}, {high:g}], got {got}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"must be a finite number in [{low:g}, {high:g}], got {value!r}"
    if not math.isfinite(number) or not low <= number <= high:
        return f"must be a finite number in [{low:g}, {high:g}], got {number!r}"
    return None


def _event_problem(events_json: str, low: float, high: float) -> str | None:
    try:
        events = orjson.loads(events_json)
    except orjson.JSONDecodeError:  # never expected: the encoders wrote it
        return None
    for event in events if isinstance(events, list) else ():
        if not isinstance(event, dict) or event.get("name") not in _EVENT_NAMES:
            continue
        attributes = event.get("attributes") or {}
        for key in _EVENT_KEYS:
            if key in attributes:
                problem = reward_problem(attributes[key], low, high)
                if problem is not None:
                    return f"event {event['name']!r}: {key} {problem}"
    return None


def _float64_column(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, present) of a float64 column, read from its buffers: pyarrow's ``to_numpy`` imports pandas
    on first use (0.5 s on the HTTP receiver's event loop) and ``fill_null`` took ~7 ms a batch."""
    values, present = [], []
    for chunk in column.chunks:
        n, offset = len(chunk), chunk.offset
        validity, data = chunk.buffers()
        values.append(np.frombuffer(data, dtype=np.float64, count=n, offset=offset * 8))
        if validity is None:
            present.append(np.ones(n, dtype=bool))
        else:
            bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
            present.append(bits[offset : offset + n].astype(bool))
    return np.concatenate(values), np.concatenate(present)


def check_rewards(batch: EncodedBatch, low: float, high: float) -> EncodedBatch:
    """Drop the spans of ``batch`` whose reward is unusable (see the module docstring), in place: its
    table, ``accepted``, ``rejected`` and ``error_message`` (the first reasons, as the decoders word
    them). Returns the batch. Cheap when no span carries a reward (two vectorised scans)."""
    table = batch.table
    if table is None or table.num_rows == 0:
        return batch
    problems: dict[int, str] = {}
    values = table.column("reward_value")
    if values.null_count < len(values):
        numbers, present = _float64_column(values)
        with np.errstate(invalid="ignore"):
            bad = present & ~(np.isfinite(numbers) & (numbers >= low) & (numbers <= high))
        for row in np.flatnonzero(bad).tolist():
            problems[row] = f"reward {reward_problem(values[row].as_py(), low, high)}"
    events = table.column("events")
    if events.null_count < len(events):
        hits = pc.or_(pc.match_substring(events, _EVENT_NAMES[0]), pc.match_substring(events, _EVENT_NAMES[1]))
        rows = pc.indices_nonzero(pc.fill_null(hits, False))
        for row, text in zip(rows.to_pylist(), events.take(rows).to_pylist()):
            if row not in problems:
                problem = _event_problem(text, low, high)
                if problem is not None:
                    problems[row] = problem
    if not problems:
        return batch
    span_ids, names = table.column("span_id"), table.column("name")
    reasons = [f"span {span_ids[r].as_py()} ({names[r].as_py()!r}): {problems[r]}" for r in sorted(problems)]
    keep = pa.array([r not in problems for r in range(table.num_rows)])
    kept = table.filter(keep)
    earlier = batch.error_message.partition(" rejected: ")[2]  # "N span(s) rejected: reason; reason"
    shown = ([earlier] if earlier else []) + reasons[: max(MAX_ERRORS_REPORTED - (1 if earlier else 0), 1)]
    total = batch.rejected + len(problems)
    more = len(problems) - (len(shown) - (1 if earlier else 0))
    batch.table = kept if kept.num_rows else None
    batch.accepted = kept.num_rows
    batch.rejected = total
    batch.error_message = f"{total} span(s) rejected: {'; '.join(shown)}" + (f" (and {more} more)" if more > 0 else "")
    return batch


class RewardCheck:
    """Between the receivers and the batcher: `check_rewards` on every batch, then ``next_consumer``.

    ``consume`` changes the batch in place (the receivers read its ``rejected`` and ``error_message``
    for their reply after the call) and does not keep it; the batcher does."""

    def __init__(self, reward_range: tuple[float, float], next_consumer: Any) -> None:
        self.low, self.high = float(reward_range[0]), float(reward_range[1])
        self._next = next_consumer

    def consume(self, batch: EncodedBatch) -> "Future[int]":
        return self._next.consume(check_rewards(batch, self.low, self.high))
