"""Start a job of tests/_hang_job.py that hangs on purpose under a real torchrun agent, and kill it.

Shared by tests/test_hang_live.py and bench/bench_hang.py. The job leads its own session, so one
killpg takes the agent and every rank; `group_alive` proves nothing survived.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ddpdoctor.hang.probe_io import find_pyspy

JOB = Path(__file__).with_name("_hang_job.py")
NPROC = 3


PROGRESS_JOB = Path(__file__).with_name("_hang_progress_job.py")


def marker_line(tag: str, script: Path = JOB) -> int:
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if f"HANG-LINE {tag}" in text:
            return number
    raise AssertionError(tag)


def _torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run"]


class HungJob:
    def __init__(
        self, scenario: str, tmp: Path, nproc: int = NPROC, announce_prefix: bool = False, script: Path = JOB,
        **env_extra: str,
    ) -> None:
        self.prefix = str(tmp / "fr_rank_")
        self.nproc = nproc
        self.tmp = tmp
        env = dict(os.environ, HANG_FR_PREFIX=self.prefix, HANG_READY_DIR=str(tmp), HANG_FR_AFTER="1", TORCH_FR_BUFFER_SIZE="200",
                   PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo", **env_extra)
        if announce_prefix:
            # Where torch would dump on an NCCL watchdog timeout: `hang` finds the dumps from it alone.
            env["TORCH_FR_DUMP_TEMP_FILE"] = self.prefix
        self.log = open(tmp / "job.log", "wb")
        self.ranks: list[int] = []
        self.proc = subprocess.Popen(
            # Like --standalone, but the rendezvous listens on 127.0.0.1 only.
            [*_torchrun(), "--nnodes", "1", "--local-addr", "127.0.0.1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", "127.0.0.1:0",
             "--rdzv-id", f"hang-{os.getpid()}-{scenario}", "--max-restarts", "0", "--nproc-per-node", str(nproc),
             str(script), scenario],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=tmp,
        )

    def wait_for_dumps(self, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if all(Path(f"{self.prefix}{r}").exists() for r in range(self.nproc)):
                self.ranks = self.descendants()
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"job exited with {self.proc.returncode}")
            time.sleep(0.3)
        raise AssertionError("the hung job did not dump its Flight Recorder buffers in time")

    def wait_ready(self, limit_s: float = 120.0) -> None:
        """Until every rank touched `ready_<rank>` in tmp (the jobs that do not dump)."""
        deadline = time.monotonic() + limit_s
        while not all((self.tmp / f"ready_{r}").exists() for r in range(self.nproc)):
            if self.proc.poll() is not None:
                raise AssertionError(f"job exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError("the job did not get ready in time")
            time.sleep(0.3)
        self.ranks = self.descendants()

    def descendants(self) -> list[int]:
        import psutil

        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the agent's group and every rank's: torchrun starts each rank in a session of its own,
        so killing the agent's group alone would leave the ranks running."""
        pids = [self.proc.pid, *self.descendants(), *self.ranks]
        for pid in pids:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.proc.wait(timeout=30)
        self.log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.1)

    def alive(self) -> list[int]:
        """Pids of this job (agent, ranks, anything in their process groups) still running."""
        pids = {self.proc.pid, *self.ranks}
        return sorted(p for p in pids if _running(p)) + [p for g in pids for p in group_alive(g) if p not in pids]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


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


# Tests that read the ranks' Python stacks need py-spy (the `hang` extra, in the test extras): a GPU
# image without it skips them rather than failing (seen on the H100 node, 2026-11-27).
NO_PYSPY = "" if find_pyspy() else "py-spy is not installed (pip install 'ddpdoctor[hang]')"


@contextmanager
def started(job: HungJob) -> Iterator[HungJob]:
    """The job once ready; on the way out every process of it is killed, and none may survive."""
    try:
        job.wait_ready()
        yield job
    finally:
        job.kill()
        assert job.alive() == [], "processes of the job survived"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a job's MASTER_PORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

