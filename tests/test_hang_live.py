"""`ddpdoctor hang` on real gloo jobs that hang on purpose under a real torchrun agent.

Each scenario of tests/_hang_job.py runs with 3 ranks; the job dumps its own Flight Recorder buffers
while hung; `ddpdoctor hang` runs as a real subprocess with real py-spy. The whole job runs in its own
session and is SIGKILLed as a group in the finalizer: nothing is left running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from _hang_harness import NO_PYSPY, NPROC, HungJob, marker_line

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "schemas" / "hang.schema.json").read_text())


def run_hang(*args: str) -> tuple[dict, float]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "hang", "--json", *args],
        capture_output=True, timeout=120, cwd=REPO, env=dict(os.environ, COLUMNS="200"),
    )
    elapsed = time.monotonic() - start
    assert out.returncode in (0, 1, 3), out.stderr.decode()
    report = json.loads(out.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["exit_code"] == out.returncode
    return report, elapsed


@pytest.fixture(scope="module", params=["sleep", "mismatch", "skip"])
def hung(request, tmp_path_factory):
    job = HungJob(request.param, tmp_path_factory.mktemp(request.param))
    try:
        job.wait_for_dumps()
        yield request.param, job
    finally:
        job.kill()
        assert len(job.ranks) >= NPROC
        assert job.alive() == [], "processes of the hung job survived"


EXPECTED = {
    # scenario: (verdict kind with FR, culprit rank, marker of the culprit's source line)
    "sleep": ("behind", 2, "sleep"),
    "mismatch": ("desync", 1, "mismatch"),
    "skip": ("only_some", 0, "skip"),
}


def _stacks_readable(report: dict) -> bool:
    stacks = report["stacks"]
    return bool(stacks) and all(s["frames"] for s in stacks)


def test_hang_names_rank_and_line_with_flight_recorder(hung):
    scenario, job = hung
    report, elapsed = run_hang("--pid", str(job.proc.pid), "--fr", job.prefix)
    print(f"{scenario}: ddpdoctor hang took {elapsed:.1f}s")  # measured, not asserted (see bench/)
    kind, rank, marker = EXPECTED[scenario]
    verdict = report["verdict"]
    assert verdict["kind"] == kind, verdict
    assert verdict["culprit_ranks"] == [rank], verdict
    assert report["exit_code"] == 1
    assert report["job"]["world_size"] == NPROC
    assert sorted(r["rank"] for r in report["job"]["ranks"]) == list(range(NPROC))
    assert report["flight_recorder"]["ranks"] == list(range(NPROC))
    assert f"rank {rank}" in verdict["summary"]
    if _stacks_readable(report):
        culprit = verdict["culprits"][0]
        assert culprit["file"].endswith("_hang_job.py")
        assert culprit["line"] == marker_line(marker), culprit
        assert f"_hang_job.py:{marker_line(marker)}" in verdict["summary"]
        if scenario == "sleep":
            # Where it idles, and the last collective it completed, from its dump.
            assert "its last collective there: all_reduce #3" in verdict["summary"], verdict["summary"]
    else:
        pytest.skip("py-spy could not read the ranks here (ptrace denied): line checked from FR only")


def test_hang_names_rank_from_stacks_alone(hung):
    scenario, job = hung
    report, _ = run_hang("--pid", str(job.proc.pid), "--no-ras")
    if not _stacks_readable(report):
        assert report["findings"][2]["severity"] == "error"
        assert "ptrace" in report["findings"][2]["summary"] or "py-spy" in report["findings"][2]["summary"]
        pytest.skip("py-spy cannot attach here")
    _, rank, marker = EXPECTED[scenario]
    verdict = report["verdict"]
    assert verdict["kind"] == "stack_outlier", verdict
    assert verdict["culprit_ranks"] == [rank]
    assert verdict["culprits"][0]["line"] == marker_line(marker)
    groups = report["stack_groups"]
    assert len(groups) == 2 and sorted(groups[0]["ranks"] + groups[1]["ranks"]) == list(range(NPROC))


def test_hang_reports_ras_absent_for_gloo(hung):
    _, job = hung
    report, _ = run_hang("--pid", str(job.proc.pid), "--no-stacks", "--ras-addr", "127.0.0.1:1")
    ras = next(f for f in report["findings"] if f["id"] == "hang.ras")
    assert ras["severity"] == "skip" and "refused" in ras["summary"]


_AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _nobody_cannot_import() -> str:
    """Why `nobody` cannot run this interpreter and import ddpdoctor from this checkout ('' when it can).

    A checkout or virtualenv inside a directory only root may enter (a clone under /root, a `mktemp -d`
    folder) is out of `nobody`'s reach: the test would then see an empty output, not ptrace's refusal.
    """
    try:
        probe = subprocess.run(
            [*_AS_NOBODY, sys.executable, "-c", "import ddpdoctor.cli"],
            capture_output=True, text=True, timeout=60, cwd="/", env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run the interpreter as nobody: {exc}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return f"user nobody cannot run {sys.executable} and import ddpdoctor from {REPO}: {last}"
    return ""


@pytest.mark.skipif(bool(NO_PYSPY), reason=NO_PYSPY or "-")
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_ptrace_denied_is_a_clear_error(hung):
    # ddpdoctor run as nobody against root's job: py-spy really is denied, environ really is unreadable.
    why = _nobody_cannot_import()
    if why:
        pytest.skip(why)
    _, job = hung
    out = subprocess.run(
        [*_AS_NOBODY, sys.executable, "-m", "ddpdoctor",
         "hang", "--pid", str(job.proc.pid), "--no-ras", "--json"],
        capture_output=True, timeout=120, cwd="/", env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    report = json.loads(out.stdout)
    stacks = next(f for f in report["findings"] if f["id"] == "hang.stacks")
    assert stacks["severity"] == "error" and "ptrace denied" in stacks["summary"]
    assert "--cap-add SYS_PTRACE" in stacks["summary"] and "ptrace_scope=0" in stacks["summary"]
    assert {s["error_kind"] for s in report["stacks"]} == {"permission"}
    assert all(r["rank"] is None for r in report["job"]["ranks"])  # environ unreadable: rank unknown
    assert report["exit_code"] == 3 and report["verdict"]["kind"] == "none"


def test_dumps_found_from_the_jobs_torch_fr_dump_temp_file(tmp_path):
    job = HungJob("skip", tmp_path, announce_prefix=True)
    try:
        job.wait_for_dumps()
        report, _ = run_hang("--pid", str(job.proc.pid), "--no-ras")
        without, _ = run_hang("--pid", str(job.proc.pid), "--no-ras", "--no-fr")
    finally:
        job.kill()
    assert job.alive() == []
    assert report["verdict"]["source"] == "flight_recorder" and report["verdict"]["kind"] == "only_some"
    assert report["flight_recorder"]["ranks"] == list(range(NPROC))
    assert without["flight_recorder"] is None
    if _stacks_readable(without):
        assert without["verdict"]["source"] == "stacks"


def test_pid_of_a_spawn_parent(tmp_path):
    import socket
    import time

    spawn_job = Path(__file__).with_name("_hang_spawn_job.py")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path / "spawn.log", "wb")
    proc = subprocess.Popen([sys.executable, str(spawn_job), str(tmp_path), str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready_{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "spawn.log").read_text()
            time.sleep(0.2)
        time.sleep(1)  # rank 0 enters its all_reduce
        report, _ = run_hang("--pid", str(proc.pid), "--no-ras", "--no-fr")
        text = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", "hang", "--pid", str(proc.pid), "--no-ras", "--no-fr"],
            capture_output=True, timeout=120, cwd=REPO, env=dict(os.environ, COLUMNS="200"),
        ).stdout.decode()
        # The sleeping rank stopped (SIGSTOP, Ctrl-Z): still named with the line it stopped at.
        sleeper = next(r["pid"] for r in report["job"]["ranks"] if r["rank"] == 1)
        os.kill(sleeper, signal.SIGSTOP)
        stopped, _ = run_hang("--pid", str(proc.pid), "--no-ras", "--no-fr")
    finally:
        os.killpg(proc.pid, 9)  # spawn's children stay in the parent's process group
        proc.wait(timeout=30)
        log.close()
    # RANK is set in code only: read from spawn's `_wrap(fn, i, ...)` frame (or the start order), never negative.
    ranks = report["job"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1], ranks
    assert all("torch.multiprocessing.spawn" in r["rank_from"] for r in ranks), ranks
    if not _stacks_readable(report):
        pytest.skip("py-spy cannot attach here")
    assert all("--locals" in r["rank_from"] for r in ranks), ranks
    verdict = report["verdict"]
    line = next(n for n, t in enumerate(spawn_job.read_text().splitlines(), 1) if "HANG-LINE spawn" in t)
    assert verdict["kind"] == "stack_outlier" and verdict["culprits"][0]["line"] == line, verdict
    assert verdict["culprit_ranks"] == [1] and verdict["culprits"][0]["rank"] == 1, verdict
    assert f"rank 1 (pid {sleeper} on" in verdict["summary"], verdict["summary"]
    assert "rank -" not in text and "(rank unknown)" not in text and "torch.multiprocessing.spawn" in text, text
    assert all(r >= 0 for g in report["stack_groups"] for r in g["ranks"])
    stop = stopped["verdict"]
    assert stop["kind"] == "stopped" and stop["culprit_ranks"] == [1], stop
    assert stop["culprits"][0]["line"] == line and f"it stopped at {spawn_job}:{line}" in stop["summary"], stop


def test_pid_of_a_process_that_is_not_a_distributed_job():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        time.sleep(1)
        report, _ = run_hang("--pid", str(proc.pid), "--no-ras", "--no-fr")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    # Known from its command line and environment alone (no RANK, no spawn children): py-spy is not needed.
    assert report["verdict"]["kind"] == "not_distributed" and report["exit_code"] == 3, report["verdict"]
    assert "not a distributed job" in report["verdict"]["summary"]


def test_pid_of_no_process():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)  # its pid is free now (and not reused within the second this test takes)
    report, _ = run_hang("--pid", str(proc.pid), "--no-ras", "--no-fr")
    assert report["exit_code"] == 3
    assert f"no such process: {proc.pid}" in report["verdict"]["summary"], report["verdict"]
