"""`ddpdoctor hang` on a real 2-rank gloo job whose ranks have helper processes that inherit their
RANK/LOCAL_RANK (2 persistent DataLoader workers, forked, and a `python -c 'import time; time.sleep(600)'`
subprocess each; tests/_hang_helpers_job.py). Rank 1 sleeps while rank 0 waits in all_reduce: the verdict
must name rank 1 and its line, and the helpers must be listed under their ranks, never counted as ranks.

Run under a real torchrun agent and started without an agent, as srun or mpirun start ranks (the ranks'
parent then carries no RANK; before helpers were told apart, that layout read as 8 ranks, each rank
number four times). Every process is SIGKILLed with its process group in the finalizer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from _hang_harness import HungJob, marker_line

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "schemas" / "hang.schema.json").read_text())
JOB = Path(__file__).with_name("_hang_helpers_job.py")


class AgentlessJob:
    """Two ranks started by this test with RANK/WORLD_SIZE/MASTER_* in their environment, each leading
    its own session (its helpers inherit it): one killpg per rank takes its helpers too."""

    def __init__(self, tmp: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.tmp = tmp
        self.log = open(tmp / "job.log", "wb")
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(JOB)], stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True,
                env=dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", HANG_READY_DIR=str(tmp),
                         PYTHONUNBUFFERED="1"),
            )
            for rank in range(2)
        ]
        self.ranks = [p.pid for p in self.procs]

    def wait_ready(self, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while not all((self.tmp / f"ready_{r}").exists() for r in range(2)):
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > deadline:
                raise AssertionError(f"the job did not get ready: {(self.tmp / 'job.log').read_text()[-2000:]}")
            time.sleep(0.3)

    def kill(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module", params=["agentless", "torchrun"])
def job(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    started = AgentlessJob(tmp) if request.param == "agentless" else HungJob("helpers", tmp, nproc=2, script=JOB)
    try:
        started.wait_ready()
        yield request.param, started
    finally:
        started.kill()


def _helpers_below(rank_pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(rank_pid).children(recursive=True)]


def test_helpers_are_listed_under_their_rank_and_the_verdict_names_the_rank(job):
    layout, started = job
    if layout == "agentless":
        rank_pids, pid = started.ranks, started.ranks[0]
    else:
        import psutil

        rank_pids = [c.pid for c in psutil.Process(started.proc.pid).children()]
        pid = started.proc.pid
    helpers = {r: _helpers_below(r) for r in rank_pids}
    assert all(len(h) >= 3 for h in helpers.values()), helpers  # 2 DataLoader workers + the subprocess
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "hang", "--json", "--no-ras", "--pid", str(pid)],
        capture_output=True, timeout=120, cwd=REPO, env=dict(os.environ, COLUMNS="200"),
    )
    report = json.loads(out.stdout)
    jsonschema.validate(report, SCHEMA)
    ranks = report["job"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and sorted(r["pid"] for r in ranks) == sorted(rank_pids), ranks
    if layout == "agentless":
        assert [(r["rank"], r["pid"]) for r in ranks] == [(0, started.ranks[0]), (1, started.ranks[1])]
    assert report["job"]["world_size"] == 2
    listed = report["job"]["helpers"]
    for rank_pid, below in helpers.items():
        mine = [h for h in listed if h["rank_pid"] == rank_pid]
        assert sorted(h["pid"] for h in mine) == sorted(below), (mine, below)
        kinds = sorted(h["kind"] for h in mine)
        assert kinds == ["DataLoader worker", "DataLoader worker", "Python subprocess"], kinds
    job_summary = next(f["summary"] for f in report["findings"] if f["id"] == "hang.job")
    assert job_summary.startswith("2 local rank(s) of a 2-rank job"), job_summary
    assert "rank 0 helpers: 2 DataLoader workers" in job_summary and "rank 1 helpers: 2 DataLoader workers" in job_summary
    # No helper is looked at as a rank: the stacks are the two ranks' own.
    assert sorted(s["pid"] for s in report["stacks"]) == sorted(rank_pids)
    if not all(s["frames"] for s in report["stacks"]):
        pytest.skip("py-spy could not read the ranks here (ptrace denied)")
    verdict = report["verdict"]
    assert verdict["culprit_ranks"] == [1], verdict
    assert out.returncode == 1 and verdict["kind"] == "stack_outlier", verdict
    culprit = verdict["culprits"][0]
    assert culprit["pid"] == next(r["pid"] for r in ranks if r["rank"] == 1)
    assert culprit["file"].endswith("_hang_helpers_job.py") and culprit["line"] == marker_line("helpers", JOB), culprit
    assert verdict["summary"].startswith("rank 1 "), verdict["summary"]
    assert f"_hang_helpers_job.py:{marker_line('waits', JOB)}" in verdict["summary"], verdict["summary"]
