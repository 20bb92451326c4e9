"""bench-nccl against nccl-tests on the same GPUs: per-op, per-size time ratio ddpdoctor / nccl-tests.

Goal (issue #14): with the same GPUs and the same NCCL, ratio within 0.90-1.10 at every size from
1 KiB to 1 GiB for every op nccl-tests measures out of place (all_gather, reduce_scatter, all_to_all,
sendrecv; torch's all_reduce/broadcast/reduce are in place and are compared with nccl-tests' in-place
columns, reported but outside the goal). Two pairings, each run alternately, `--rounds` times, medians:

    graph:  ddpdoctor bench-nccl --graph     vs  <op>_perf -G 1
    eager:  ddpdoctor bench-nccl --no-graph  vs  <op>_perf (default)

nccl-tests runs its GPUs from one process (`-g N`), ddpdoctor one rank per GPU; with one GPU both are
one process. nccl-tests binaries are looked up in --nccl-tests DIR, then $NCCL_TESTS_DIR, then PATH
(`build/` below a directory is tried too); without them the script prints that it was skipped, and why,
and exits 0.

    .venv/bin/python bench/bench_vs_nccl_tests.py [--nccl-tests DIR] [--nproc N] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from ddpdoctor.bench.compare import (
    BINARIES,
    GOAL_HIGH,
    GOAL_LOW,
    TimeRatio,
    goal_misses,
    median_times,
    nccl_tests_column,
    nccl_tests_times,
    our_times,
    ratio_table_lines,
)
from ddpdoctor.parsers.nccl_tests import parse_nccl_tests

RUN_TIMEOUT_S = 600
# --raw DIR: every nccl-tests stdout and bench-nccl JSON kept there (fixtures for replaying a GPU run).
_raw: dict[str, Any] = {"dir": None, "n": 0}


def _keep_raw(name: str, text: str) -> None:
    if _raw["dir"] is None:
        return
    _raw["n"] += 1
    (Path(_raw["dir"]) / f"{_raw['n']:03d}-{name}").write_text(text)


def find_binaries(explicit: Optional[str], env: dict[str, str]) -> tuple[dict[str, str], str]:
    """op -> path of its nccl-tests binary, and where they were looked for (for the skip message)."""
    places: list[Path] = []
    for base in (explicit, env.get("NCCL_TESTS_DIR")):
        if base:
            places += [Path(base), Path(base) / "build"]
    found: dict[str, str] = {}
    for op, name in BINARIES.items():
        for place in places:
            candidate = place / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                found[op] = str(candidate)
                break
        else:
            on_path = shutil.which(name, path=env.get("PATH"))
            if on_path:
                found[op] = on_path
    where = ", ".join(str(p) for p in places) + (", " if places else "") + "PATH"
    return found, where


def run_nccl_tests(binary: str, args: argparse.Namespace, graph: bool) -> str:
    argv = [
        binary,
        "-b", args.min_bytes, "-e", args.max_bytes, "-f", "2",
        "-g", str(args.nproc), "-n", str(args.iters), "-w", str(args.warmup),
        "-G", "1" if graph else "0",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}"
        )
    _keep_raw(f"{Path(binary).name}{'-G1' if graph else ''}.txt", proc.stdout)
    return proc.stdout


def run_ddpdoctor(op: str, args: argparse.Namespace, graph: bool) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        argv = [
            sys.executable, "-m", "ddpdoctor", "bench-nccl", "--backend", "nccl",
            "--nproc", str(args.nproc), "--ops", op,
            "--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes, "--step-factor", "2",
            "--iters", str(args.iters), "--warmup", str(args.warmup),
            "--graph" if graph else "--no-graph", "--json", str(out),
        ]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if not out.exists():
            raise RuntimeError(f"{' '.join(argv)} wrote no JSON ({proc.returncode}): {proc.stderr[-1500:]}")
        _keep_raw(f"bench-nccl-{op}{'-graph' if graph else ''}.json", out.read_text())
        data = json.loads(out.read_text())
    rows = data.get("rows") or []
    wrong = sum(r.get("wrong") or 0 for r in rows)
    if wrong:
        raise RuntimeError(f"ddpdoctor bench-nccl --ops {op}: {wrong} wrong elements")
    return rows


def measure(args: argparse.Namespace, binaries: dict[str, str], mode: str) -> list[TimeRatio]:
    graph = mode == "graph"
    ratios: list[TimeRatio] = []
    for op in args.ops.split(","):
        if op not in binaries:
            print(f"  {op}: no nccl-tests binary ({BINARIES.get(op, '?')}): not compared", flush=True)
            continue
        column = nccl_tests_column(op)
        ours, theirs, timings = [], [], set()
        for i in range(args.rounds):
            # Alternate which tool goes first, so that neither always runs on a warmer GPU.
            order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
            for who in order:
                if who == "ours":
                    rows = run_ddpdoctor(op, args, graph)
                    timings |= {str(r.get("timing")) for r in rows if r.get("timing")}
                    ours.append(our_times(rows, op))
                else:
                    theirs.append(
                        nccl_tests_times(parse_nccl_tests(run_nccl_tests(binaries[op], args, graph)), column)
                    )
        mine, other = median_times(ours), median_times(theirs)
        if graph and timings != {"graph"}:
            print(
                f"  note: {op} was timed {', '.join(sorted(timings))} by ddpdoctor (capture fell back)",
                flush=True,
            )
        ratios += [
            TimeRatio(op, s, column, mine.get(s), other.get(s)) for s in sorted(set(mine) | set(other))
        ]
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nccl-tests", default=None, help="directory holding the nccl-tests binaries")
    ap.add_argument("--nproc", type=int, default=1, help="GPUs (nccl-tests -g, ddpdoctor --nproc)")
    ap.add_argument("--ops", default=",".join(BINARIES))
    ap.add_argument("--min-bytes", default="1K")
    ap.add_argument("--max-bytes", default="1G")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="graph,eager", help="graph, eager or both")
    ap.add_argument("--json", default=None, help="write every ratio as JSON to this file")
    ap.add_argument("--raw", default=None, help="keep every raw nccl-tests output and bench-nccl JSON in this directory")
    args = ap.parse_args()
    if args.raw:
        Path(args.raw).mkdir(parents=True, exist_ok=True)
        _raw["dir"] = args.raw
    binaries, where = find_binaries(args.nccl_tests, dict(os.environ))
    if not binaries:
        print(f"skipped: no nccl-tests binaries ({', '.join(BINARIES.values())}) found in {where}")
        print(
            "build them (git clone https://github.com/NVIDIA/nccl-tests && make -C nccl-tests) and pass --nccl-tests DIR"
        )
        return 0
    report: dict[str, Any] = {"goal": [GOAL_LOW, GOAL_HIGH], "binaries": binaries, "modes": {}}
    missed = 0
    for mode in args.modes.split(","):
        print(f"\n== {mode} ==", flush=True)
        try:
            ratios = measure(args, binaries, mode)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"failed: {exc}")
            return 1
        for line in ratio_table_lines(ratios, mode):
            print(line)
        misses = goal_misses(ratios)
        missed += len(misses)
        print(
            f"# {mode}: {len(misses)} out-of-place size(s) from 1 KiB to 1 GiB outside {GOAL_LOW}-{GOAL_HIGH}"
        )
        report["modes"][mode] = [r.to_dict() for r in ratios]
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
