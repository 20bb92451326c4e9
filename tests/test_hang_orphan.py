"""A rank that crashed while a child it forked lives on (held-out hang set 9, j08's class): the child carries the
rank's RANK and holds its gloo sockets, so the others wait in their all_reduce instead of failing. `hang` must
not take the child for the rank: it says the rank exited, with the exception from the stderr file the child
inherited, and names the child. Real processes, each rank in its own session as srun and launch scripts start
them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hang_harness import NO_PYSPY, free_port, marker_line
from test_hang_evidence import run_hang

SCRIPT = Path(__file__).with_name("_hang_orphan_job.py")
pytestmark = pytest.mark.skipif(bool(NO_PYSPY), reason=NO_PYSPY)



def _children_of(pids: list[int]) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True, timeout=30).stdout
    return [int(p) for p, s in (line.split() for line in out.splitlines()) if int(s) in pids]


def test_a_crashed_rank_whose_forked_child_lives_on(tmp_path):
    port, world = free_port(), 3
    procs, logs = [], []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), HANG_READY_DIR=str(tmp_path), GLOO_SOCKET_IFNAME="lo")
        log = open(tmp_path / f"rank{rank}.log", "wb")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT)], env=env, start_new_session=True,
                                      stdout=log, stderr=subprocess.STDOUT))
    sessions = [p.pid for p in procs]
    try:
        deadline = time.monotonic() + 120
        while procs[2].poll() is None or not (tmp_path / "step_0_3").exists():
            assert time.monotonic() < deadline, "the last rank did not crash"
            time.sleep(0.2)
        time.sleep(2)  # the others into their all_reduce
        report = run_hang("--pid", str(procs[0].pid))
    finally:
        for pid in _children_of(sessions) + sessions:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait(timeout=30)
        for log in logs:
            log.close()
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "exited", verdict
    assert verdict["culprit_ranks"] == [2] and verdict["other_ranks"] == [0, 1], verdict
    summary = verdict["summary"]
    assert "rank 2 has exited with `IndexError: Target 5 is out of bounds.` at " in summary, summary
    assert f"(the last traceback in the stderr it shared with its child, {tmp_path / 'rank2.log'})" in summary
    assert "a process it forked" in summary and "holds the sockets it inherited" in summary, summary
    assert verdict["culprits"][0]["line"] == marker_line("raise", SCRIPT), verdict["culprits"]
    assert verdict["fix"].startswith("Fix the `IndexError` at "), verdict["fix"]
    assert "find_unused_parameters" not in verdict["fix"], verdict["fix"]
