"""Throughput and peak memory of `ddpdoctor explain` on a generated log with realistic noise.

Generates a log of --size MB (default 1024) in a temporary directory (never in the repository): training
progress lines, tqdm redraws, NCCL INFO init chatter with host:pid:tid prefixes, [rankN]: warnings,
DeepSpeed-style [INFO]/[WARNING] lines and Python tracebacks of caught exceptions, with real failure lines
(an OOM kill and its consequences) near the end. Then runs, interleaved and as separate processes:

  baseline  python reading the file in 1 MiB chunks and counting newlines (the I/O floor)
  explain   python -m ddpdoctor explain FILE --json

and prints MB/s, peak RSS (os.wait4 of each child) and the explain/baseline throughput ratio.
Goals: >= 100 MB/s and <= 200 MB peak RSS.

    python bench/bench_explain.py [--size MB] [--reps N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_MB_S = 100.0
GOAL_RSS_MB = 200.0
TIMEOUT_S = 600
BASELINE = (
    "import sys\n"
    "n = 0\n"
    "with open(sys.argv[1], 'rb') as f:\n"
    "    while True:\n"
    "        b = f.read(1 << 20)\n"
    "        if not b:\n"
    "            break\n"
    "        n += b.count(b'\\n')\n"
    "print(n)\n"
)

# Failure lines quoted from public issues (tests/fixtures/explain/lines.json has their sources).
FAILURE_TAIL = [
    "[Sun Mar 30 08:24:00 2025] Out of memory: Killed process 14750 (python) total-vm:26,184,840kB, "
    "anon-rss:153,700,88kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:38964kB oom_score_adj:0",
    "[rank1]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
    "Timeout(ms)=600000) ran for 600060 milliseconds before timing out.",
    "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 14749 closing signal SIGTERM",
    "E0521 15:43:02.809000 161210 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed "
    "(exitcode: -9) local_rank: 0 (pid: 14750) of binary: /usr/bin/python3",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
]


def _noise_pool(rng: random.Random, n: int) -> list[bytes]:
    host = "gpu-node-17"
    templates = [
        lambda: (
            f"[rank{rng.randint(0, 7)}]: Epoch {rng.randint(0, 90)} | step {rng.randint(0, 99999)} | "
            f"loss {rng.random() * 4:.4f} | lr 1.00e-04 | grad_norm {rng.random():.3f} | tok/s {rng.randint(10**4, 10**6)}"
        ),
        lambda: (
            f"{host}:{rng.randint(1000, 99999)}:{rng.randint(1000, 99999)} [{rng.randint(0, 7)}] NCCL INFO "
            f"Channel {rng.randint(0, 31):02d}/0 : {rng.randint(0, 7)}[{rng.randint(0, 7)}] -> "
            f"{rng.randint(0, 7)}[{rng.randint(0, 7)}] via P2P/IPC/read"
        ),
        lambda: (
            f"{host}:{rng.randint(1000, 99999)}:{rng.randint(1000, 99999)} [{rng.randint(0, 7)}] NCCL INFO "
            "Using network IB"
        ),
        lambda: (
            f"[2024-05-01 12:{rng.randint(0, 59):02d}:33,123] [INFO] [logging.py:128:log_dist] "
            f"[Rank {rng.randint(0, 7)}] step={rng.randint(0, 99999)}, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]"
        ),
        lambda: (
            "[2024-05-01 12:00:01,000] [WARNING] [stage3.py:1850:step] 1 pytorch allocator cache flushes "
            "since last step. this happens when there is high memory pressure"
        ),
        lambda: (
            f"{rng.randint(0, 99)}%|####      | {rng.randint(0, 9999)}/10000 [00:{rng.randint(10, 59)}<01:23, "
            f" 3.19it/s, loss=0.{rng.randint(0, 9999)}]\r{rng.randint(0, 99)}%|####      | "
            f"{rng.randint(0, 9999)}/10000 [00:{rng.randint(10, 59)}<01:22,  3.20it/s]"
        ),
        lambda: (
            f"[rank{rng.randint(0, 7)}]:/opt/conda/lib/python3.10/site-packages/torch/utils/checkpoint.py:"
            "464: UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly."
        ),
        lambda: (
            '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501, in '
            "_call_impl"
        ),
        lambda: "Traceback (most recent call last):",
        lambda: f"INFO:root:Saving checkpoint to /checkpoints/run-{rng.randint(0, 999)}/model.pt",
        lambda: f"wandb: logging step {rng.randint(0, 99999)} metrics: train/loss={rng.random():.4f}",
    ]
    weights = [40, 12, 2, 10, 2, 8, 3, 2, 1, 2, 6]
    return [rng.choices(templates, weights)[0]().encode() + b"\n" for _ in range(n)]


def generate_log(path: Path, size_mb: int, seed: int = 0) -> int:
    """Write about size_mb MB of noise plus a failure tail to path; returns the size in bytes."""
    rng = random.Random(seed)
    pool = _noise_pool(rng, 50_000)
    target = size_mb * 1_000_000
    written = 0
    with open(path, "wb") as f:
        while written < target:
            block = b"".join(rng.choices(pool, k=20_000))
            f.write(block)
            written += len(block)
        tail = "\n".join(FAILURE_TAIL).encode() + b"\n"
        f.write(tail)
        written += len(tail)
    return written


def run_child(argv: list[str]) -> tuple[float, float, int, float]:
    """Wall seconds, peak RSS in MB (this child only), exit status and CPU seconds (user + system)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait(timeout=TIMEOUT_S)
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    return wall, usage.ru_maxrss / 1024.0, proc.returncode, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024, help="log size in MB (default 1024)")
    ap.add_argument("--reps", type=int, default=1, help="interleaved repetitions; medians are reported")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ddpdoctor-bench-explain-") as tmp:
        log = Path(tmp) / "train.log"
        t0 = time.perf_counter()
        size = generate_log(log, args.size)
        gen_s = time.perf_counter() - t0
        base_argv = [sys.executable, "-c", BASELINE, str(log)]
        explain_argv = [sys.executable, "-m", "ddpdoctor", "explain", str(log), "--json"]
        run_child(base_argv)  # warm the page cache
        base, expl = [], []
        rc = 0
        for _ in range(max(1, args.reps)):
            base.append(run_child(base_argv))
            expl.append(run_child(explain_argv))
            rc = expl[-1][2]
    mb = size / 1e6
    base_s = statistics.median(r[0] for r in base)
    expl_s = statistics.median(r[0] for r in expl)
    expl_cpu = statistics.median(r[3] for r in expl)
    result = {
        "size_mb": round(mb, 1),
        "generate_s": round(gen_s, 1),
        "baseline_mb_s": round(mb / base_s, 1),
        "explain_mb_s": round(mb / expl_s, 1),
        "explain_cpu_mb_s": round(mb / expl_cpu, 1),
        "explain_peak_rss_mb": round(max(r[1] for r in expl), 1),
        "baseline_peak_rss_mb": round(max(r[1] for r in base), 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "ratio_explain_to_baseline": round(base_s / expl_s, 3),
        "explain_exit_code": rc,
        "goal_mb_s": GOAL_MB_S,
        "goal_rss_mb": GOAL_RSS_MB,
    }
    result["meets_goals"] = (
        result["explain_mb_s"] >= GOAL_MB_S and result["explain_peak_rss_mb"] <= GOAL_RSS_MB and rc == 1
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"log: {mb:.0f} MB generated in {gen_s:.1f}s (temporary directory, removed)")
        print(f"baseline (read + count lines): {result['baseline_mb_s']:.0f} MB/s")
        print(
            f"explain: {result['explain_mb_s']:.0f} MB/s (goal >= {GOAL_MB_S:.0f}), "
            f"peak RSS {result['explain_peak_rss_mb']:.0f} MB (goal <= {GOAL_RSS_MB:.0f}), exit {rc}"
        )
        print(f"explain per CPU second (user+sys): {result['explain_cpu_mb_s']:.0f} MB/s")
        print(f"ratio explain/baseline throughput: {result['ratio_explain_to_baseline']:.3f}")
        print(
            f"load average {result['load_average_1m']} on {result['cpus']} CPUs (other work slows both runs)"
        )
        print("meets goals" if result["meets_goals"] else "DOES NOT meet goals")
    return 0 if result["meets_goals"] else 1


if __name__ == "__main__":
    sys.exit(main())
