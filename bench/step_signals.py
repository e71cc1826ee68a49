"""What ``credit.step_signals`` costs ``load_transitions``: the same store loaded in ``step`` mode without and with
the four signals (the extra work: reading each call's output messages, the tool spans' facts and their attribution,
store/step_facts.py).

The store is bench/decompose.py's (``generate``: 100 spans a rollout, 5 LLM calls with exact token ids, one
``execute_tool`` span after each call), every fifth tool span marked ERROR (the rest succeed), written straight
into a DuckDB file.
Prints the median wall and CPU seconds (``time.process_time``, DuckDB's threads too) of --rounds loads each.

Usage:
    .venv/bin/python bench/step_signals.py [--rollouts 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decompose import generate  # noqa: E402

_SIGNALS = {"tool_error": -0.2, "nonzero_exit": -0.2, "denied": -0.1, "retry": -0.1}


def _with_failed_tools(table: pa.Table) -> pa.Table:
    """The ``execute_tool`` spans moved after their call (generate starts them with it), every fifth one ERROR."""
    tool = np.array([op == "execute_tool" for op in table.column("operation_name").to_pylist()])
    start = table.column("start_ns").to_numpy() + np.where(tool, 52_000_000, 0)  # the call's client span ends at 50 ms
    end = np.where(tool, start + 30_000_000, table.column("end_ns").to_numpy())
    status = np.array(table.column("status_code").to_pylist(), dtype=object)
    status[np.flatnonzero(tool)[2::5]] = "ERROR"
    for name, values in (("start_ns", pa.array(start)), ("end_ns", pa.array(end)),
                         ("status_code", pa.array(status, pa.string()))):
        table = table.set_column(table.schema.get_field_index(name), name, values.cast(table.schema.field(name).type))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from spanrl.algorithms.credit import CreditConfig
    from spanrl.algorithms.transitions import load_transitions
    from spanrl.store import SpanStore

    with tempfile.TemporaryDirectory() as tmp:
        store = SpanStore.open(str(Path(tmp) / "bench.duckdb"))
        table = _with_failed_tools(generate(args.rollouts))
        store.append(table)
        print(f"{table.num_rows:,} spans, {args.rollouts:,} rollouts; load {os.getloadavg()[0]:.1f}")
        for label, credit in (("step", CreditConfig(mode="step")),
                              ("step + step_signals", CreditConfig(mode="step", step_signals=_SIGNALS))):
            walls, cpus = [], []
            for _ in range(args.rounds):
                w0, c0 = time.perf_counter(), time.process_time()
                batch = load_transitions(store, credit=credit)
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
            counts = {k: v for k, v in batch.report.items() if k.startswith("step_signal")}
            print(f"{label:>20}: {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU "
                  f"(median of {args.rounds}); {len(batch):,} transitions {counts or ''}")
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
