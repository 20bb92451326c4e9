"""The one /proc/PID/stat reader (edge/procfs.py), and `check`'s job-pid walk that uses it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpdoctor.checks.gpu.collect import read_job_pids
from ddpdoctor.edge.procfs import read_parent_pid, read_process_state, read_stat_fields

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def test_this_process_and_a_missing_one() -> None:
    assert read_parent_pid(os.getpid()) == os.getppid()
    assert read_process_state(os.getpid()) in ("R", "S")
    assert read_stat_fields(2**31 - 1) is None and read_process_state(2**31 - 1) == ""


def test_command_name_with_parentheses_and_spaces(tmp_path: Path) -> None:
    # The kernel takes the command name from the executed file's name: a real process named "x) (y 1".
    exe = tmp_path / "x) (y 1"
    exe.symlink_to(Path(sys.executable).resolve())
    proc = subprocess.Popen([str(exe), "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while "x) (y" not in Path(f"/proc/{proc.pid}/stat").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "(x) (y 1)" in Path(f"/proc/{proc.pid}/stat").read_text()
        assert read_parent_pid(proc.pid) == os.getpid()
        assert read_process_state(proc.pid) in ("R", "S")
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _fake_proc(root: Path, pid: int, ppid: int, name: str = "python") -> None:
    # The proc(5) layout of a stat line (pid (comm) state ppid pgrp ...), shortened after pgrp.
    (root / str(pid)).mkdir()
    (root / str(pid) / "stat").write_text(f"{pid} ({name}) S {ppid} {ppid} 0\n")


def test_job_pids_are_read_from_the_proc_tree_given(tmp_path: Path) -> None:
    me = os.getpid()
    agent, sibling, grandchild, other = 4_000_001, 4_000_002, 4_000_003, 4_000_004
    _fake_proc(tmp_path, 1, 0, "init")
    _fake_proc(tmp_path, agent, 1, "torchrun")
    _fake_proc(tmp_path, me, agent)
    _fake_proc(tmp_path, sibling, agent, "python) (rank 1")
    _fake_proc(tmp_path, grandchild, sibling)
    _fake_proc(tmp_path, other, 1, "other job")
    (tmp_path / "self").mkdir()  # not a pid: skipped
    assert read_job_pids(str(tmp_path)) == frozenset({1, agent, me, sibling, grandchild})
