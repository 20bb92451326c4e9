"""`ddpdoctor hang` on a real NCCL job on one GPU: NCCL RAS answers (JSON on NCCL >= 2.28.7, text
before), the Flight Recorder dump of an NCCL rank is readable, and an idle single-rank job is not
called hung. Skips without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _hang_harness import NO_PYSPY, HungJob, marker_line

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]
REPO = Path(__file__).resolve().parent.parent


def _keep_evidence(report: bytes, prefix: str, name: str = "hang-real-nccl", text: bytes = b"") -> None:
    """On a GPU node, DDPDOCTOR_EVIDENCE_DIR keeps the real report and Flight Recorder dumps as fixtures."""
    where = os.environ.get("DDPDOCTOR_EVIDENCE_DIR")
    if not where:
        return
    dest = Path(where) / name
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{name}.json").write_bytes(report)
    if text:
        (dest / f"{name}.txt").write_bytes(text)
    job_log = Path(prefix).parent / "job.log"
    if job_log.is_file():
        (dest / "job.log").write_bytes(job_log.read_bytes())
    for dump in Path(prefix).parent.glob(Path(prefix).name + "*"):
        if dump.is_file():
            (dest / f"fr-{dump.name}").write_bytes(dump.read_bytes())


def _hang(job: HungJob, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "hang", "--pid", str(job.proc.pid), "--fr", job.prefix, *args],
        capture_output=True, timeout=120, cwd=REPO, env=dict(os.environ, COLUMNS="200"),
    )


def test_hang_on_a_real_nccl_job(tmp_path):
    job = HungJob("idle", tmp_path, nproc=1, HANG_BACKEND="nccl")
    try:
        job.wait_for_dumps()
        out = _hang(job, "--json", "--timeout", "10")
        _keep_evidence(out.stdout, job.prefix)
    finally:
        job.kill()
    assert job.alive() == []
    report = json.loads(out.stdout)
    ras = next(f for f in report["findings"] if f["id"] == "hang.ras")
    assert ras["severity"] == "info", ras  # RAS answered and every rank is accounted for
    assert report["ras"]["nccl_version"] and report["ras"]["communicators"] >= 1
    fr = report["flight_recorder"]
    assert fr["ranks"] == [0] and fr["errors"] == []
    # The dump is NCCL's own recorder's (_dump_nccl_trace): the job's three all_reduces are in it.
    assert any(seq >= 3 for per_rank in fr["last_enqueued"].values() for seq in per_rank.values()), fr
    assert report["verdict"]["kind"] == "none"
    if NO_PYSPY:
        # Seen on the H100 node (2026-11-27), whose image has no py-spy: RAS and the Flight Recorder agree,
        # but with no stack an idle rank cannot be told from a stuck one: exit 3, never a pass.
        stacks = next(f for f in report["findings"] if f["id"] == "hang.stacks")
        assert stacks["severity"] == "error" and "py-spy is not installed" in stacks["summary"]
        assert report["exit_code"] == 3
    else:
        assert report["exit_code"] == 0
        assert report["stacks"][0]["frames"] or report["stacks"][0]["error_kind"] == "permission"



def test_rank_late_for_the_first_nccl_collective(tmp_path):
    """Two ranks on one GPU: the last never touches the GPU and sleeps before its first collective, so rank 0
    waits inside NCCL's communicator creation (lazy, at the first collective) — the most common NCCL hang at
    start-up: one rank still loading data or a checkpoint. The culprit is the sleeping rank, at its line."""
    job = HungJob("late", tmp_path, nproc=2, HANG_BACKEND="nccl")
    try:
        job.wait_for_dumps()
        out = _hang(job, "--json", "--timeout", "15")
        text = _hang(job, "--timeout", "15")
        _keep_evidence(out.stdout, job.prefix, "hang-late-peer-nccl", text.stdout + text.stderr)
    finally:
        job.kill()
    assert job.alive() == []
    report = json.loads(out.stdout)
    verdict = report["verdict"]
    if NO_PYSPY:
        pytest.skip("py-spy is not installed: the late rank's line needs its stack")
    assert verdict["culprit_ranks"] == [1], verdict
    assert verdict["culprits"][0]["line"] == marker_line("late"), verdict
    assert report["exit_code"] == 1
