"""One rank of tests/test_cluster_loopback.py::test_scoped_benchmark_intra_and_inter_node (run by torchrun).

Initializes gloo the way bench-nccl's joined ranks do (env://, explicit timeout), runs the helper with
a reporter that records every step, row and wait, prints the rows as JSON on global rank 0, and writes
each rank's recorded events to $SCOPED_EVENTS_DIR/rank<R>.json.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.bench.plan import BenchPlan
from ddpdoctor.cluster.topology import run_scoped_benchmark

STEP_TIMEOUT_S = 30.0


class Recorder:
    """A bench.worker.Reporter that keeps what the watchdog of a joined rank would be told."""

    def __init__(self) -> None:
        self.events: list[list[Any]] = []

    def step(self, op: str, size: int) -> None:
        self.events.append(["step", op, size])

    def row(self, row: dict[str, Any]) -> None:
        self.events.append(["row", row.get("scope"), row.get("node"), row.get("op")])

    def wait(self, label: str, timeout_s: float) -> None:
        self.events.append(["wait", label, timeout_s])


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
plan = BenchPlan(ops=("all_reduce", "all_gather"), sizes=(4096,), iters=2, warmup=1, check=True)
recorder = Recorder()
rows = run_scoped_benchmark(plan, torch.device("cpu"), "gloo", recorder, step_timeout_s=STEP_TIMEOUT_S)
if os.environ.get("SCOPED_EVENTS_DIR"):
    out = Path(os.environ["SCOPED_EVENTS_DIR"]) / f"rank{dist.get_rank()}.json"
    out.write_text(json.dumps(recorder.events))
if dist.get_rank() == 0:
    sys.stdout.write(json.dumps({"schema": "test.scoped/1", "rows": rows}) + "\n")
dist.destroy_process_group()
