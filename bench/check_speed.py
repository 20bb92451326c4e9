"""Start-up cost of `ddpdoctor check` against `python -c "import torch"`, measured in the same run.

The check imports torch only in its torch-info subprocess, which `check` starts right after option
parsing, before the areas are imported, so every other probe overlaps it: the goal is a ratio of at
most 1.3.

    python bench/check_speed.py [--reps 5] [--json]

Runs are interleaved (baseline, check, baseline, check, ...) so a busy machine slows both alike; the
first pair warms the page cache and is not counted. Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GOAL = 1.3
TIMEOUT_S = 300


def time_argv(argv: list[str]) -> tuple[float, int]:
    """Wall time of one run (output discarded) and its exit status."""
    start = time.perf_counter()
    proc = subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=TIMEOUT_S, check=False
    )
    return time.perf_counter() - start, proc.returncode


def measure(reps: int, check_args: list[str]) -> dict:
    baseline_argv = [sys.executable, "-c", "import torch"]
    check_argv = [sys.executable, "-m", "ddpdoctor", "check", *check_args]
    time_argv(baseline_argv)  # warm-up, not counted
    time_argv(check_argv)
    base, check, codes = [], [], set()
    for _ in range(reps):
        t, _code = time_argv(baseline_argv)
        base.append(t)
        t, code = time_argv(check_argv)
        check.append(t)
        codes.add(code)
    b, c = statistics.median(base), statistics.median(check)
    paired = statistics.median(c_i / b_i for c_i, b_i in zip(check, base))
    return {
        "reps": reps,
        "import_torch_s": round(b, 3),
        "check_s": round(c, 3),
        "ratio": round(c / b, 3),
        # Each check ran right after its baseline: the median of those pairs follows load drift best.
        "ratio_paired_median": round(paired, 3),
        # The fastest runs are the least disturbed ones: on a shared machine they show the intrinsic cost.
        "ratio_of_minimums": round(min(check) / min(base), 3),
        "goal": GOAL,
        "met": c / b <= GOAL,
        "check_exit_codes": sorted(codes),
        "check_argv": " ".join(["ddpdoctor", "check", *check_args]),
        "cpus": os.cpu_count(),
        "runs": {"import_torch_s": [round(x, 3) for x in base], "check_s": [round(x, 3) for x in check]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions (median is reported)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("check_args", nargs="*", help="extra arguments for `ddpdoctor check` (after --)")
    args = parser.parse_args(argv)
    result = measure(max(args.reps, 1), args.check_args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"check start-up: `{result['check_argv']}` {result['check_s']:.2f}s vs `python -c 'import torch'` "
            f"{result['import_torch_s']:.2f}s (median of {result['reps']}) -> ratio {result['ratio']:.2f} "
            f"(goal <= {GOAL}: {'met' if result['met'] else 'MISSED'}); median of paired ratios "
            f"{result['ratio_paired_median']:.2f}, ratio of fastest runs {result['ratio_of_minimums']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
