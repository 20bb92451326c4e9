"""The hard total time bound of `ddpdoctor check --prolog`.

A Slurm Prolog or HealthCheckProgram that hangs blocks the node (Slurm kills it only after
PrologEpilogTimeout, and a stuck health check keeps running every interval). The engine already bounds
every probe by --timeout; this is the backstop for anything outside the probes: at the hard deadline
the process prints one line, kills its children and exits with the inconclusive code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Optional

from ddpdoctor.core.model import ExitCode, define
from ddpdoctor.edge.proctree import kill_tree

# On top of --timeout: Python start-up is already behind us, the engine needs at most 0.5 s of slack,
# and rendering a few lines takes milliseconds.
PROLOG_GRACE_S = 2.0
DEADLINE = define(
    "core.prolog.deadline",
    "Prolog time bound reached",
    "`check --prolog` did not finish within --timeout + 2 s (+ 10 s with --on-fail drain), so it stopped "
    "itself (exit 3) rather than block the node's prolog or health check. Something outside the probes "
    "hung: the node is suspect.",
    "Run `ddpdoctor check -v --timeout 60` on the node by hand to see which probe is slow.",
)


DEADLINE_THREAD = "ddpdoctor-prolog-deadline"
# The backstop process acts this long after the in-process timer should have: by then the timer thread
# has had its chance, and only a thread holding the GIL in C code (a long regex match, a hung extension
# call) can have kept it from running.
BACKSTOP_DELAY_S = 1.0

# Run as `python -S -c`: no site import, so it starts in milliseconds and needs nothing installed. It
# sleeps until the deadline, leaves early when its parent is gone, and otherwise prints the line, kills
# every descendant of the parent (from /proc) and the parent itself. It keeps this /proc walk rather than
# edge.proctree.kill_tree because it runs without site-packages, where psutil lives.
_BACKSTOP = r"""
import os, signal, sys, time
parent, delay, line = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
end = time.monotonic() + delay
while time.monotonic() < end:
    if os.getppid() != parent:
        sys.exit(0)
    time.sleep(min(0.1, max(end - time.monotonic(), 0.0)))
children = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
try:
    os.write(1, line.encode())
except OSError:
    pass
doomed, todo = [], [parent]
while todo:
    for child in children.get(todo.pop(), []):
        if child != os.getpid():
            doomed.append(child)
            todo.append(child)
for pid in [parent, *doomed]:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""


class HardDeadline:
    """The armed bound: an in-process timer and, as its backstop, a watchdog process."""

    def __init__(self, timer: threading.Timer, backstop: Optional[subprocess.Popen[bytes]]) -> None:
        self.timer = timer
        self.backstop = backstop

    def cancel(self) -> None:
        """The check is over: disarm both (a process that goes on must not be ended later)."""
        self.timer.cancel()
        if self.backstop is not None and self.backstop.poll() is None:
            self.backstop.kill()
            self.backstop.wait()


def _start_backstop(seconds: float, line: str) -> Optional[subprocess.Popen[bytes]]:
    try:
        return subprocess.Popen(
            [sys.executable, "-S", "-c", _BACKSTOP, str(os.getpid()), f"{seconds + BACKSTOP_DELAY_S}", line],
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
    except OSError:
        return None  # the timer alone still bounds every run that does not hold the GIL


def arm_hard_deadline(seconds: float) -> HardDeadline:
    """After `seconds`, print one drain-reason line, kill the children and exit 3, whatever is running.

    A thread that holds the GIL in C code (a regex match over a huge value, a stuck extension call)
    starves the timer thread, so a watchdog process backs it up BACKSTOP_DELAY_S later: it prints the
    same line and SIGKILLs this process and its descendants (exit status 137 instead of 3; any non-zero
    status drains the node alike). The caller cancels the returned bound when the check is over: in a
    process that goes on (tests calling the CLI in-process) a forgotten bound would end it later.
    """
    line = f"{DEADLINE.id}: ddpdoctor check did not finish within {seconds:g}s\n"

    def expire() -> None:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - stdout may be closed; the exit code still says it
            pass
        kill_tree()
        os._exit(int(ExitCode.INCONCLUSIVE))

    timer = threading.Timer(seconds, expire)
    timer.name = DEADLINE_THREAD
    timer.daemon = True
    backstop = _start_backstop(seconds, line)
    timer.start()
    return HardDeadline(timer, backstop)
