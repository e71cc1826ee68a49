"""A feedback service: users judge answers seconds (in production: minutes, days) after they got them.

It follows the agents' request logs and, ``--delay`` seconds after each answer, sends the user's verdict
with ``spanrl.emit_feedback`` from this separate process. The key rotates over the three kinds a real
system has at hand: the rollout id, the completion's response id, the trace id. Like real users, some
never answer (``--never``) and some change their mind (``--twice``: a wrong verdict first, the real one
``--second-after`` seconds later; the latest wins)::

    python examples/production/feedback.py --log requests-a.jsonl --log requests-b.jsonl --delay 3

Which requests get no feedback, or two, depends only on the rollout id (reproducible).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
import zlib
from pathlib import Path

import spanrl
from spanrl.instrumentation import configure, flush

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colors import TASKS, is_right  # noqa: E402

_TASKS = {t["id"]: t for t in TASKS}
_KEYS = ("rollout_id", "response_id", "trace_id")


def plan(record: dict, *, never: float, twice: float) -> list[tuple[float, float]]:
    """The verdicts for one request: ``[(seconds after the first, value), ...]``, empty for none."""
    u = (zlib.crc32(record["rollout_id"].encode()) % 10_000) / 10_000
    right = 1.0 if is_right(_TASKS[record["task_id"]], record["answer"]) else 0.0
    if u < never:
        return []
    if u < never + twice:
        return [(0.0, 1.0 - right), (1.0, right)]
    return [(0.0, right)]


def send(record: dict, value: float, n: int) -> None:
    key = _KEYS[n % len(_KEYS)]
    spanrl.emit_feedback(value, **{key: record[key]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", action="append", required=True, help="an agent's request log (repeatable)")
    parser.add_argument("--delay", type=float, default=3.0, help="seconds between an answer and its verdict")
    parser.add_argument("--never", type=float, default=0.15, help="share of requests never judged")
    parser.add_argument("--twice", type=float, default=0.15, help="share judged twice (the latest wins)")
    parser.add_argument("--second-after", type=float, default=1.0, help="seconds between the two verdicts")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: never)")
    parser.add_argument("--sent-log", default=None, help="JSONL file to append each verdict sent to")
    args = parser.parse_args(argv)
    configure(service_name="spanrl-feedback")
    offsets = {path: 0 for path in args.log}
    queue: list[tuple[float, int, dict, float]] = []
    started, n = time.monotonic(), 0
    sent_log = open(args.sent_log, "a") if args.sent_log else None
    while args.seconds is None or time.monotonic() - started < args.seconds:
        for path in args.log:  # new requests: schedule their verdicts
            if not Path(path).exists():
                continue
            with open(path) as handle:
                handle.seek(offsets[path])
                for line in iter(handle.readline, ""):
                    if not line.endswith("\n"):
                        break
                    offsets[path] += len(line.encode())
                    record = json.loads(line)
                    for after, value in plan(record, never=args.never, twice=args.twice):
                        due = record["time"] + args.delay + after * args.second_after
                        heapq.heappush(queue, (due, n, record, value))
                    n += 1
        sent = 0
        while queue and queue[0][0] <= time.time():
            _, i, record, value = heapq.heappop(queue)
            send(record, value, i)
            if sent_log is not None:
                sent_log.write(json.dumps({"rollout_id": record["rollout_id"], "value": value, "key": _KEYS[i % 3],
                                           "time": time.time()}) + "\n")
            sent += 1
        if sent:
            flush()
            if sent_log is not None:
                sent_log.flush()
        time.sleep(0.1)
    flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
