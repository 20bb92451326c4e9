"""The hard total time bound of `ddpdoctor check --prolog`.

A Slurm Prolog or HealthCheckProgram that hangs blocks the node (Slurm kills it only after
PrologEpilogTimeout, and a stuck health check keeps running every interval). The engine already bounds
every probe by --timeout; this is the backstop for anything outside the probes: at the hard deadline
the process prints one line, kills its children and exits with the inconclusive code.
"""

from __future__ import annotations

import os
import sys
import threading

from ddpdoctor.model import ExitCode, define

# On top of --timeout: Python start-up is already behind us, the engine needs at most 0.5 s of slack,
# and rendering a few lines takes milliseconds.
PROLOG_GRACE_S = 2.0
DEADLINE = define(
    "core.prolog.deadline",
    "Prolog time bound reached",
    "`check --prolog` did not finish within --timeout + 2 s, so it stopped itself (exit 3) rather than "
    "block the node's prolog or health check. Something outside the probes hung: the node is suspect.",
    "Run `ddpdoctor check -v --timeout 60` on the node by hand to see which probe is slow.",
)


def kill_children() -> None:
    """SIGKILL every descendant of this process (probes run in their own sessions, so a group kill of
    ours would miss them)."""
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - best effort on the way out
        return
    for child in children:
        try:
            child.kill()
        except Exception:  # noqa: BLE001 - already gone or not ours to kill
            pass


DEADLINE_THREAD = "ddpdoctor-prolog-deadline"


def arm_hard_deadline(seconds: float) -> threading.Timer:
    """After `seconds`, print one drain-reason line, kill the children and exit 3, whatever is running.

    The caller cancels the returned timer when the check is over: in a process that goes on (tests
    calling the CLI in-process) a forgotten timer would end that process later.
    """

    def expire() -> None:
        line = f"{DEADLINE.id}: ddpdoctor check did not finish within {seconds:g}s\n"
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - stdout may be closed; the exit code still says it
            pass
        kill_children()
        os._exit(int(ExitCode.INCONCLUSIVE))

    timer = threading.Timer(seconds, expire)
    timer.name = DEADLINE_THREAD
    timer.daemon = True
    timer.start()
    return timer
