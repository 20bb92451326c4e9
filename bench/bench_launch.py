"""Launch cost: wall time of
    ddpdoctor bench-nccl --nproc 8 --backend gloo --ops all_reduce --min-bytes 1K --max-bytes 1K
divided by a trivial one-all_reduce job started with `torchrun --standalone --nproc-per-node 8`.

Goal: ratio <= 0.3 (one torch import in the zygote, forked ranks, instead of one import per rank
plus torchrun's agent). Both measured in the same run, alternating; medians printed.

    .venv/bin/python bench/bench_launch.py [--rounds 3] [--nproc 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TRIVIAL = textwrap.dedent(
    """
    import datetime, warnings
    warnings.filterwarnings("ignore")
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    x = torch.ones(256)
    dist.all_reduce(x)
    dist.destroy_process_group()
    """
)


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600
    )
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=8)
    a = ap.parse_args()
    env = dict(os.environ)
    env.pop("MASTER_PORT", None)
    # `python -m`, not the console scripts next to the interpreter: ddpdoctor may run from the source tree
    # (PYTHONPATH=., nothing installed), and torchrun may not be on PATH either.
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    ours_argv = [
        sys.executable,
        "-m",
        "ddpdoctor",
        "bench-nccl",
        "--nproc",
        str(a.nproc),
        "--backend",
        "gloo",
        "--ops",
        "all_reduce",
        "--min-bytes",
        "1K",
        "--max-bytes",
        "1K",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial_allreduce.py"
        script.write_text(TRIVIAL)
        theirs_argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(a.nproc),
            str(script),
        ]
        ours, theirs = [], []
        for rnd in range(a.rounds):
            if rnd % 2 == 0:
                ours.append(timed(ours_argv, env))
                theirs.append(timed(theirs_argv, env))
            else:
                theirs.append(timed(theirs_argv, env))
                ours.append(timed(ours_argv, env))
            print(f"round {rnd + 1}: bench-nccl {ours[-1]:.2f}s, torchrun {theirs[-1]:.2f}s", flush=True)
    o, t = statistics.median(ours), statistics.median(theirs)
    print(
        f"launch ratio (bench-nccl / torchrun trivial job, {a.nproc} ranks, gloo): {o:.2f}s / {t:.2f}s = "
        f"{o / t:.3f} (goal <= 0.3) on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
