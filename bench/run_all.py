"""Run every benchmark in this directory, one after another (`make bench`).

Each script prints its own ratio against a baseline measured in the same run; this runner only
sequences them (never in parallel: they would measure each other) and reports which ones failed
to run. `--quick` uses smaller inputs for a fast look (the figures in docs/performance.md come from
the full runs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    # name: (full arguments, quick arguments)
    "check_speed.py": ([], ["--reps", "2"]),
    "bench_launch.py": ([], ["--rounds", "1"]),
    "bench_fidelity.py": ([], ["--rounds", "1"]),
    "bench_lint.py": ([], ["--runs", "1"]),
    "lint_corpus.py": (["score"], ["score"]),  # skipped (exit 0) until `lint_corpus.py extract` has run
    "bench_explain.py": ([], ["--size", "128"]),
    "bench_hang.py": ([], ["--rounds", "1"]),
    # Skips (exit 0) without nccl-tests binaries or GPUs.
    "bench_vs_nccl_tests.py": ([], ["--rounds", "1"]),
}
TIMEOUT_S = 1800


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller inputs, one repetition")
    ap.add_argument("only", nargs="*", help="run only these scripts (e.g. bench_lint.py)")
    args = ap.parse_args()
    failed: list[str] = []
    for name, (full, quick) in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        argv = [sys.executable, str(HERE / name), *(quick if args.quick else full)]
        print(f"\n=== {name} {' '.join(argv[2:])}", flush=True)
        try:
            rc = subprocess.run(argv, timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = -1
            print(f"{name}: timed out after {TIMEOUT_S}s", flush=True)
        if rc != 0:
            failed.append(f"{name} (exit {rc})")
    print("\nbenchmarks that did not complete: " + (", ".join(failed) if failed else "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
