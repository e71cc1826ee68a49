"""Users' late verdicts as OpenTelemetry GenAI evaluation events, with the plain OTel API (no spanrl).

It follows ``plain_agent.py``'s request logs and, ``--delay`` seconds after each answer, records a
``gen_ai.evaluation.result`` event (``gen_ai.evaluation.name``, ``gen_ai.evaluation.score.value``, and
``gen_ai.response.id``: the completion it judges) on a span of its own. Run it under
``opentelemetry-instrument`` so the SDK exports to ``OTEL_EXPORTER_OTLP_ENDPOINT`` like any service::

    opentelemetry-instrument python examples/production/plain_feedback.py --request-log requests-a.jsonl --delay 3

Some requests are never judged (``--never``), some twice (``--twice``: wrong first, right
``--second-after`` s later; the latest verdict wins); which ones depends only on the conversation id.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
import zlib
from pathlib import Path

from opentelemetry import context, trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colors import TASKS, is_right  # noqa: E402

_TASKS = {t["id"]: t for t in TASKS}
_tracer = trace.get_tracer("plain-feedback")


def plan(record: dict, *, never: float, twice: float) -> list[tuple[float, float]]:
    """The verdicts for one request: ``[(second_after multiples after the first, value), ...]``."""
    u = (zlib.crc32(record["conversation_id"].encode()) % 10_000) / 10_000
    right = 1.0 if is_right(_TASKS[record["task_id"]], record["answer"]) else 0.0
    if u < never:
        return []
    if u < never + twice:
        return [(0.0, 1.0 - right), (1.0, right)]
    return [(0.0, right)]


def send(response_id: str, value: float) -> None:
    """One verdict: the GenAI conventions' evaluation event, keyed by the response it judges."""
    with _tracer.start_as_current_span("user verdict", context=context.Context()) as span:  # a trace of its own
        span.add_event("gen_ai.evaluation.result", {
            "gen_ai.evaluation.name": "user_satisfied", "gen_ai.evaluation.score.value": value,
            "gen_ai.response.id": response_id,
        })


def _flush() -> None:
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)  # the SDK's; the API has none
    if flush is not None:
        flush()


def _read_new(paths: list[str], offsets: dict[str, int]) -> list[dict]:
    """Complete lines appended to the request logs since the last call."""
    records = []
    for path in paths:
        if not Path(path).exists():
            continue
        with open(path) as handle:
            handle.seek(offsets[path])
            for line in iter(handle.readline, ""):
                if not line.endswith("\n"):
                    break
                offsets[path] += len(line.encode())
                records.append(json.loads(line))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--request-log", action="append", required=True, help="an agent's request log (repeatable)")
    parser.add_argument("--delay", type=float, default=3.0, help="seconds between an answer and its verdict")
    parser.add_argument("--never", type=float, default=0.15, help="share of requests never judged")
    parser.add_argument("--twice", type=float, default=0.15, help="share judged twice (the latest wins)")
    parser.add_argument("--second-after", type=float, default=1.0, help="seconds between the two verdicts")
    parser.add_argument("--sent-log", default=None, help="JSONL file to append each verdict sent to")
    args = parser.parse_args(argv)
    offsets = {path: 0 for path in args.request_log}
    queue: list[tuple[float, int, dict, float]] = []
    sent_log = open(args.sent_log, "a") if args.sent_log else None
    n = 0
    while True:
        for record in _read_new(args.request_log, offsets):
            for after, value in plan(record, never=args.never, twice=args.twice):
                heapq.heappush(queue, (record["time"] + args.delay + after * args.second_after, n, record, value))
                n += 1
        sent = 0
        while queue and queue[0][0] <= time.time():
            _, _, record, value = heapq.heappop(queue)
            send(record["response_id"], value)
            if sent_log is not None:
                sent_log.write(json.dumps({"conversation_id": record["conversation_id"], "value": value,
                                           "time": time.time()}) + "\n")
            sent += 1
        if sent:
            _flush()
            if sent_log is not None:
                sent_log.flush()
        time.sleep(0.1)


if __name__ == "__main__":
    raise SystemExit(main())
