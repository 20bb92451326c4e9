"""Capture the py-spy dumps stored in tests/fixtures/hang_waits/ (run by hand, never by pytest):
each scenario of tests/_hang_waits_job.py under a real torchrun agent (2 gloo ranks on CPU); once both
ranks are ready and 2 s have passed, `py-spy dump --json --locals --nonblocking --pid PID` of each rank,
saved as <scenario>.rank<N>.json. Usage: python tests/_capture_waits.py [scenario ...]"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _hang_harness import HungJob

HERE = Path(__file__).parent
SCRIPT = HERE / "_hang_waits_job.py"
OUT = HERE / "fixtures" / "hang_waits"
PYSPY = str(Path(sys.executable).parent / "py-spy")
SCENARIOS = ["lock_order", "self_lock", "queue_join", "queue_get", "mp_queue_get", "poll", "event", "barrier",
             "proc_join", "popen_wait", "writer", "flock", "pipe_read", "fifo_open", "store_get"]


def rank_of(pid: int) -> int:
    return int(psutil.Process(pid).environ()["RANK"])


def main() -> None:
    for scenario in sys.argv[1:] or SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            job = HungJob(scenario, Path(tmp), nproc=2, script=SCRIPT)
            try:
                job.wait_ready()
                time.sleep(2)
                ranks = [c.pid for c in psutil.Process(job.proc.pid).children()]
                for pid in ranks:
                    out = subprocess.run([PYSPY, "dump", "--json", "--locals", "--nonblocking", "--pid", str(pid)],
                                         capture_output=True, timeout=30, text=True)
                    (OUT / f"{scenario}.rank{rank_of(pid)}.json").write_text(out.stdout)
                print(scenario, "captured", ranks)
            finally:
                job.kill()


if __name__ == "__main__":
    main()
