"""`ddpdoctor hang` on real gloo jobs under a real torchrun agent that do NOT hang, or spin: several
snapshots a second apart must tell a healthy or slow job (progressing, exit 0) from a hung one, and a
rank in a Python loop that never ends (spinning, exit 1) from both.

The jobs are tests/_hang_progress_job.py; each runs in its own session and is SIGKILLed as a group.
Each verdict is asked for several times: one snapshot said "hung" on 5 of 6 runs of a healthy job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from _hang_harness import NO_PYSPY, NPROC, PROGRESS_JOB, HungJob, marker_line, started

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "schemas" / "hang.schema.json").read_text())
RUNS = 3


def run_hang(*args: str) -> tuple[dict, int, str]:
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "hang", *args],
        capture_output=True, timeout=120, cwd=REPO, env=dict(os.environ, COLUMNS="200"),
    )
    text = out.stdout.decode()
    if "--json" in args:
        report = json.loads(text)
        jsonschema.validate(report, SCHEMA)
        assert report["exit_code"] == out.returncode
        return report, out.returncode, text
    return {}, out.returncode, text


@pytest.fixture(scope="module", params=["healthy", "slow", "spin", "io", "fetch"])
def running(request, tmp_path_factory):
    with started(HungJob(request.param, tmp_path_factory.mktemp(request.param), script=PROGRESS_JOB)) as job:
        yield request.param, job


def _readable(report: dict) -> bool:
    return bool(report["stacks"]) and all(s["frames"] for s in report["stacks"])


def test_progressing_or_spinning_every_time(running):
    scenario, job = running
    for attempt in range(RUNS):
        report, code, _ = run_hang("--pid", str(job.proc.pid), "--no-ras", "--json")
        if not _readable(report):
            pytest.skip("py-spy cannot attach here")
        verdict, progress = report["verdict"], report["progress"]
        assert progress["samples"] >= 2 and progress["span_s"] > 0.5, progress
        if scenario == "spin":
            assert verdict["kind"] == "spinning" and code == 1, (attempt, verdict, progress)
            assert verdict["culprit_ranks"] == [NPROC - 1]
            culprit = verdict["culprits"][0]
            # The loop's body line, sampled over the longer look, not its `while` header.
            assert culprit["line"] == marker_line("spin", PROGRESS_JOB) + 1, (culprit, progress)
            assert progress["samples"] > 2 and progress["span_s"] > 4, progress
            assert "spin_forever()" in culprit["where"], culprit
            assert "spins" in verdict["summary"] and "did not move" in verdict["summary"]
            states = {r["rank"]: r["state"] for r in progress["ranks"]}
            assert states[NPROC - 1] == "spinning" and {states[0], states[1]} == {"waiting"}, progress
        else:
            assert verdict["kind"] == "progressing" and code == 0, (attempt, verdict, progress)
            assert verdict["culprit_ranks"] == [] and progress["evidence"], progress
            if scenario == "io":
                # Rank 0 writes for ~2.5 s while the others wait in the barrier: the longer look waits for
                # the barrier to complete instead of calling it hung.
                assert not verdict.get("stragglers") or [s["rank"] for s in verdict["stragglers"]] == [0]
            if scenario == "slow" and verdict.get("stragglers"):
                # The slow rank is named as the straggler (never a culprit) when the snapshots caught
                # it outside the collective every time, as they do at 0.5 s of sleep per step.
                assert [s["rank"] for s in verdict["stragglers"]] == [NPROC - 1], verdict
                assert report["findings"][0]["severity"] == "warn"


@pytest.mark.skipif(bool(NO_PYSPY), reason=NO_PYSPY or "-")
def test_text_says_progressing_and_exit_0(running):
    scenario, job = running
    if scenario == "spin":
        pytest.skip("covered above")
    _, code, text = run_hang("--pid", str(job.proc.pid), "--no-ras")
    assert "progressing, not hung" in text and code == 0, text


def test_one_snapshot_is_still_available(running):
    # --samples 1 judges one snapshot, as before: no progress data, a verdict from the stacks.
    _, job = running
    report, _, _ = run_hang("--pid", str(job.proc.pid), "--no-ras", "--json", "--samples", "1")
    assert report["progress"]["state"] == "unknown" and report["progress"]["samples"] == 1


def test_timeout_bounds_the_whole_run(running):
    # 10 snapshots a second apart do not fit in 3 s: fewer are taken, and the run ends in time.
    import time

    _, job = running
    start = time.monotonic()
    report, _, _ = run_hang("--pid", str(job.proc.pid), "--no-ras", "--json", "--samples", "10", "--timeout", "3")
    elapsed = time.monotonic() - start
    assert 2 <= report["progress"]["samples"] < 10
    assert report["duration_s"] <= 3.5, report["duration_s"]
    print(f"hang --timeout 3 --samples 10: {elapsed:.1f}s wall including the interpreter start")
