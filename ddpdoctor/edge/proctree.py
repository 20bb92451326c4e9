"""The one process-tree killer: SIGKILL a process's descendants (and the process itself when asked).

Probes and ranks run in their own sessions or process groups, so a group kill from the top would miss
them; the tree is walked through psutil instead. Best effort and never an exception: on the way out
a process may already be gone or not ours to kill. (The prolog backstop, a `python -S` script that
must start without site-packages, keeps its own /proc walk: see ci/prolog.py.)
"""

from __future__ import annotations

import os
import signal
from typing import Optional


def kill_tree(pid: Optional[int] = None, *, include_root: bool = False) -> None:
    """SIGKILL every descendant of `pid` (this process when None); `pid` itself too if include_root."""
    root = os.getpid() if pid is None else pid
    try:
        import psutil

        victims = psutil.Process(root).children(recursive=True)
    except Exception:  # noqa: BLE001 - already gone, or psutil cannot read it
        victims = []
    for victim in victims:
        try:
            victim.kill()
        except Exception:  # noqa: BLE001 - already gone or not ours to kill
            pass
    if include_root and root != os.getpid():
        try:
            os.kill(root, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
