"""Fidelity of bench-nccl's numbers: ddpdoctor all_reduce busbw / a minimal hand-written
torch.distributed loop with the same sizes, iterations and rank count (gloo on CPU, sizes >= 4 MiB).

Goal: ratio >= 0.97 (ddpdoctor's timing adds no overhead and measures the same thing).
Both are measured in the same run, alternating, several rounds; the median ratio is printed.

    .venv/bin/python bench/bench_fidelity.py [--nproc 2] [--rounds 3] [--iters 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time

from ddpdoctor.bench.launcher import launch_local
from ddpdoctor.bench.math import bandwidths, coll_counts
from ddpdoctor.bench.plan import BenchPlan
from ddpdoctor.edge.ports import pick_free_port

SIZES = (4 * 1024**2, 8 * 1024**2, 16 * 1024**2)

# The baseline: what a user would write by hand (one process per rank, rank 0's timing printed).
HAND_LOOP = textwrap.dedent(
    """
    import datetime, os, sys, time, warnings
    warnings.filterwarnings("ignore")
    import torch, torch.distributed as dist
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    iters, warmup = int(sys.argv[4]), int(sys.argv[5])
    sizes = [int(s) for s in sys.argv[6].split(",")]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(size, t.item(), flush=True)
    dist.destroy_process_group()
    """
)


def hand_loop(nproc: int, iters: int, warmup: int) -> dict[int, float]:
    port = pick_free_port()
    args = [str(iters), str(warmup), ",".join(str(s) for s in SIZES)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HAND_LOOP, str(r), str(nproc), str(port), *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(nproc)
    ]
    out = procs[0].communicate(timeout=600)[0]
    for p in procs[1:]:
        p.wait(timeout=60)
    busbw = {}
    for line in out.split("\n"):
        if line.strip():
            size, seconds = line.split()
            busbw[int(size)] = bandwidths(coll_counts("all_reduce", int(size), 4, nproc), float(seconds))[1]
    return busbw


def ddpdoctor_run(nproc: int, iters: int, warmup: int) -> dict[int, float]:
    plan = BenchPlan(ops=("all_reduce",), sizes=SIZES, iters=iters, warmup=warmup, check=True)
    result = launch_local(plan, nproc=nproc, backend="gloo", step_timeout_s=300)
    if not result.ok:
        raise SystemExit(
            f"ddpdoctor run failed: {result.root_cause.describe() if result.root_cause else '?'}"
        )
    return {r["size"]: r["busbw"] for r in result.rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    ratios: list[float] = []
    per_size: dict[int, list[float]] = {s: [] for s in SIZES}
    for rnd in range(a.rounds):
        # Alternate the order so drift on a shared machine does not favour one side.
        if rnd % 2 == 0:
            ours, theirs = ddpdoctor_run(a.nproc, a.iters, a.warmup), hand_loop(a.nproc, a.iters, a.warmup)
        else:
            theirs, ours = hand_loop(a.nproc, a.iters, a.warmup), ddpdoctor_run(a.nproc, a.iters, a.warmup)
        for s in SIZES:
            r = ours[s] / theirs[s]
            per_size[s].append(r)
            ratios.append(r)
        print(
            f"round {rnd + 1}: "
            + ", ".join(
                f"{s // 1024**2} MiB ddpdoctor {ours[s]:.3f} / hand {theirs[s]:.3f} GB/s" for s in SIZES
            ),
            flush=True,
        )
    for s in SIZES:
        print(f"{s // 1024**2:>3} MiB: median ratio {statistics.median(per_size[s]):.3f}")
    med = statistics.median(ratios)
    print(
        f"fidelity ratio (ddpdoctor busbw / hand-written loop, gloo, {a.nproc} ranks, >= 4 MiB): {med:.3f} "
        f"(goal >= 0.97) on {os.cpu_count()} CPUs at {time.strftime('%Y-%m-%d %H:%M')}"
    )


if __name__ == "__main__":
    main()
