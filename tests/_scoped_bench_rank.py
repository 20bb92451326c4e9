"""One rank of tests/test_cluster_loopback.py::test_scoped_benchmark_intra_and_inter_node (run by torchrun).

Initializes gloo the way bench-nccl's joined ranks do (env://, explicit timeout), runs the helper,
and prints the rows as JSON on global rank 0.
"""

from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist

from ddpdoctor.bench.plan import BenchPlan
from ddpdoctor.cluster.topology import run_scoped_benchmark

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
plan = BenchPlan(ops=("all_reduce", "all_gather"), sizes=(4096,), iters=2, warmup=1, check=True)
rows = run_scoped_benchmark(plan, torch.device("cpu"), "gloo")
if dist.get_rank() == 0:
    sys.stdout.write(json.dumps({"schema": "test.scoped/1", "rows": rows}) + "\n")
dist.destroy_process_group()
