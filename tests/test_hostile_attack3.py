"""Issue #26, third attack pass: X1 (lint's exit code for an unreadable path named on the command line)
and E2 (a newline in a file name never starts an output line). Real files, real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A default-tier finding (DDP002: GPU from the global rank in a multi-node program, Slurm's node id read).
TRIGGER = 'import os, torch\nrank = int(os.environ["RANK"])\nnode = int(os.environ["SLURM_NODEID"])\ntorch.cuda.set_device(rank)\n'
NCCL_LINE = "host:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1]\nhost:1:1 [0] misc NCCL WARN Net : Connection closed by remote peer\n"
INJECTED = "\n::error file=INJECTED,line=1::INJECTED-BY-NAME\n"


def ddpdoctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], capture_output=True, text=True, timeout=120, cwd=REPO,
        env=dict(os.environ, COLUMNS="400", PYTHONPATH=str(REPO)),
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["through-a-file", "too-long", "fifo", "device", "link-loop"])
def test_lint_unreadable_named_path_is_a_usage_error(kind: str, tmp_path: Path) -> None:
    regular = tmp_path / "plain.txt"
    regular.write_text("x\n")
    path = {
        "through-a-file": str(regular / "x.py"),
        "too-long": str(tmp_path / ("l" * 300 + ".py")),
        "fifo": str(tmp_path / "pipe.py"),
        "device": "/dev/zero",
        "link-loop": str(tmp_path / "loop.py"),
    }[kind]
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "link-loop":
        os.symlink("loop.py", path)
    out = ddpdoctor("lint", path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1 and out.stdout == ""


@pytest.mark.parametrize("fmt", ["text", "github", "junit", "markdown"])
def test_lint_file_name_with_newline_stays_on_one_line(fmt: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / f"a.py{INJECTED}b.py").write_text(TRIGGER)
    out = ddpdoctor("lint", "--format", fmt, str(repo))
    assert out.returncode == 1, out.stderr
    assert "INJECTED-BY-NAME" in out.stdout  # the finding is there ...
    assert not re.search(r"(?m)^::error file=INJECTED", out.stdout)  # ... but starts no line of its own


@pytest.mark.parametrize("fmt", ["table", "github", "markdown", "junit"])
def test_explain_file_name_with_newline_stays_on_one_line(fmt: str, tmp_path: Path) -> None:
    log = tmp_path / f"rank0.log{INJECTED}x.log"
    log.write_text(NCCL_LINE)
    out = ddpdoctor("explain", "--format", fmt, str(log))
    assert out.returncode in (0, 1), out.stderr
    assert not re.search(r"(?m)^::error file=INJECTED", out.stdout + out.stderr), out.stdout
