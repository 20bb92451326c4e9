"""Time from `ddpdoctor hang` starting to its verdict, on the three hung gloo jobs of tests/_hang_job.py.

Goal (issue #18): on a CPU machine each scenario is named correctly (rank and source line) within 15 s
of `ddpdoctor hang` starting. For each scenario this starts the job (3 ranks under torchrun), waits
until it hangs and has dumped its Flight Recorder buffers, then runs `ddpdoctor hang --pid AGENT --fr
PREFIX --json` as a fresh process (imports included) and reports the wall time and whether the verdict
names the expected rank and line. The job is killed as a process group afterwards.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _hang_harness import HungJob, marker_line  # noqa: E402

EXPECTED = {"sleep": (2, "sleep"), "mismatch": (1, "mismatch"), "skip": (0, "skip")}
GOAL_S = 15.0


def run_once(scenario: str, extra: list[str]) -> tuple[float, bool, str]:
    with tempfile.TemporaryDirectory() as tmp:
        job = HungJob(scenario, Path(tmp))
        try:
            job.wait_for_dumps()
            start = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-m", "ddpdoctor", "hang", "--pid", str(job.proc.pid), "--fr", job.prefix,
                 "--json", *extra],
                capture_output=True, timeout=120,
            )
            elapsed = time.monotonic() - start
        finally:
            job.kill()
            assert job.alive() == []
    verdict = json.loads(out.stdout)["verdict"]
    rank, tag = EXPECTED[scenario]
    culprit = (verdict.get("culprits") or [{}])[0]
    right = verdict["culprit_ranks"] == [rank] and culprit.get("line") == marker_line(tag)
    return elapsed, right, verdict["summary"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    worst = 0.0
    all_right = True
    for scenario in EXPECTED:
        for _ in range(args.rounds):
            elapsed, right, summary = run_once(scenario, [])
            worst = max(worst, elapsed)
            all_right &= right
            print(f"{scenario:9} {elapsed:6.2f}s  {'named correctly' if right else 'WRONG'}: {summary}", flush=True)
    print(f"worst time to verdict {worst:.2f}s (goal {GOAL_S:.0f}s); all named correctly: {all_right}")
    return 0 if all_right and worst <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
