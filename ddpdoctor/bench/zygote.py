"""Forks the ranks of one launch: `python -m ddpdoctor.bench.zygote` (started by the launcher only).

It imports torch once, never touches CUDA, then forks one child per rank, so start-up costs one
torch import instead of one per rank and no rank is forked from a process with CUDA initialized.
Protocol: the launcher writes a pickled {"specs": [RankSpec], "fds": [int]} to stdin (each fd is the
write end of that rank's progress pipe, passed with pass_fds); the zygote prints `pid RANK PID` when
a rank starts and `exit RANK CODE` when it ends (negative CODE: killed by that signal).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from multiprocessing.connection import Connection


def main() -> None:
    request = pickle.load(sys.stdin.buffer)
    from ddpdoctor.bench import worker  # torch: once, here, before any fork

    worker.die_with_parent()
    # SIGTERM is the launcher's to handle (it kills this process group itself); a zygote dying first
    # would read as a launcher failure instead of the interruption it is.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    specs, fds = request["specs"], request["fds"]
    out = sys.stdout
    children: dict[int, int] = {}
    for spec, fd in zip(specs, fds):
        out.flush()
        pid = os.fork()
        if pid == 0:
            for other in fds:
                if other != fd:
                    os.close(other)
            worker.rank_main(spec, Connection(fd, readable=False))
            os._exit(1)  # rank_main never returns
        children[pid] = spec.rank
        out.write(f"pid {spec.rank} {pid}\n")
        out.flush()
    for fd in fds:
        os.close(fd)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        rank = children.pop(pid, None)
        if rank is not None:
            out.write(f"exit {rank} {os.waitstatus_to_exitcode(status)}\n")
            out.flush()


if __name__ == "__main__":
    main()
