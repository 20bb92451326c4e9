"""Start a job of tests/_hang_job.py that hangs on purpose under a real torchrun agent, and kill it.

Shared by tests/test_hang_live.py and bench/bench_hang.py. The job leads its own session, so one
killpg takes the agent and every rank; `group_alive` proves nothing survived.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

JOB = Path(__file__).with_name("_hang_job.py")
NPROC = 3


def marker_line(tag: str) -> int:
    for number, text in enumerate(JOB.read_text().splitlines(), 1):
        if f"HANG-LINE {tag}" in text:
            return number
    raise AssertionError(tag)


def _torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run"]


class HungJob:
    def __init__(self, scenario: str, tmp: Path) -> None:
        self.prefix = str(tmp / "fr_rank_")
        env = dict(os.environ, HANG_FR_PREFIX=self.prefix, HANG_FR_AFTER="2", TORCH_FR_BUFFER_SIZE="200",
                   PYTHONUNBUFFERED="1")
        self.log = open(tmp / "job.log", "wb")
        self.proc = subprocess.Popen(
            [*_torchrun(), "--standalone", "--nproc-per-node", str(NPROC),
             str(JOB), scenario],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=tmp,
        )

    def wait_for_dumps(self, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if all(Path(f"{self.prefix}{r}").exists() for r in range(NPROC)):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"job exited with {self.proc.returncode}")
            time.sleep(0.3)
        raise AssertionError("the hung job did not dump its Flight Recorder buffers in time")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()


def group_alive(pgid: int) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    alive.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return alive


