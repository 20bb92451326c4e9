"""The one reader of /proc/PID/stat: the fields after the command name, never an exception.

The command name (field 2) is chosen by the process and may hold spaces and parentheses, so the line
is split after its last ')'. Used by `check` (this job's processes, by parent pid) and `hang` (the
state letter of a rank: stopped, zombie).
"""

from __future__ import annotations

import os
import stat
from typing import Optional

# /proc/PID/stat is one line of ~52 fields; the command name is at most 64 bytes (TASK_COMM_LEN 16 today).
STAT_READ_LIMIT = 4096


def read_stat_fields(pid: int, proc: str = "/proc") -> Optional[list[str]]:
    """Fields 3.. of /proc/PID/stat (state, ppid, pgrp, ...), None when unreadable or malformed.

    Equivalent: cat /proc/PID/stat"""
    try:
        with open(os.path.join(proc, str(pid), "stat"), "rb") as handle:
            data = handle.read(STAT_READ_LIMIT)
    except OSError:
        return None
    _, sep, tail = data.rpartition(b")")
    if not sep:
        return None
    fields = tail.decode("ascii", "replace").split()
    return fields or None


def read_parent_pid(pid: int, proc: str = "/proc") -> Optional[int]:
    """The parent pid from /proc/PID/stat, None when unreadable."""
    fields = read_stat_fields(pid, proc)
    if fields is None or len(fields) < 2 or not fields[1].isascii() or not fields[1].isdigit():
        return None
    return int(fields[1])


def read_group_and_session(pid: int, proc: str = "/proc") -> Optional[tuple[int, int]]:
    """(process group, session) of the process from /proc/PID/stat, None when unreadable.
    Equivalent: ps -o pgid=,sid= -p PID"""
    fields = read_stat_fields(pid, proc)
    if not fields or len(fields) < 4 or not fields[2].isdigit() or not fields[3].isdigit():
        return None
    return int(fields[2]), int(fields[3])


def read_process_state(pid: int, proc: str = "/proc") -> str:
    """The state letter of /proc/PID/stat (R, S, D, T, t, Z, ...), '' when unreadable."""
    fields = read_stat_fields(pid, proc)
    return fields[0] if fields else ""


def read_task_wchans(pid: int, proc: str = "/proc", limit: int = 64) -> tuple[str, ...]:
    """The kernel function each thread of the process sleeps in (/proc/PID/task/TID/wchan: `anon_pipe_write`,
    `futex_wait_queue`, `do_epoll_wait`, ...; '0' when running), at most `limit` threads, () when unreadable.
    Equivalent: cat /proc/PID/task/*/wchan"""
    base = os.path.join(proc, str(pid), "task")
    try:
        tids = sorted(os.listdir(base), key=lambda t: (len(t), t))[:limit]
    except OSError:
        return ()
    out = []
    for tid in tids:
        try:
            with open(os.path.join(base, tid, "wchan"), "rb") as handle:
                out.append(handle.read(128).decode("ascii", "replace").strip())
        except OSError:
            continue
    return tuple(out)


STDERR_TAIL_BYTES = 65536  # of a rank's stderr file: the traceback that ended its script is at the end


def read_stderr_tail(pid: int, proc: str = "/proc", limit: int = STDERR_TAIL_BYTES) -> tuple[str, str, float] | None:
    """(path, last `limit` bytes as text, its mtime) of the process's stderr when it is a regular file owned by the
    process's own user (a launcher's `> rank1.log 2>&1`, torchrun --redirects), None otherwise: a terminal, a
    pipe, a socket or someone else's file is never read. Equivalent: tail -c 65536 /proc/PID/fd/2"""
    fd = os.path.join(proc, str(pid), "fd", "2")
    try:
        owner = os.stat(os.path.join(proc, str(pid))).st_uid
        # stat before open: opening a pipe's or a terminal's end would block or take the rank's output
        if not stat.S_ISREG(os.stat(fd).st_mode):
            return None
        with open(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != owner:
                return None
            handle.seek(max(0, info.st_size - limit))
            data = handle.read(limit)
        path = os.readlink(fd)
    except OSError:
        return None
    return path, data.decode("utf-8", "replace"), info.st_mtime


def read_main_thread_activity(pid: int, proc: str = "/proc") -> Optional[tuple[int, int]]:
    """(nanoseconds on CPU, voluntary context switches) of the process's main thread, None when
    unreadable. Only the main thread: a Python rank's progress happens there, while helper threads
    (a store keep-alive, a dump thread) wake on their own even when the job hangs.

    Equivalent: cat /proc/PID/task/PID/schedstat; grep voluntary_ctxt_switches /proc/PID/task/PID/status"""
    base = os.path.join(proc, str(pid), "task", str(pid))
    try:
        with open(os.path.join(base, "schedstat"), "rb") as handle:
            sched = handle.read(STAT_READ_LIMIT).split()
        with open(os.path.join(base, "status"), "rb") as handle:
            status = handle.read(16 * STAT_READ_LIMIT)
    except OSError:
        return None
    switches = None
    for line in status.splitlines():
        if line.startswith(b"voluntary_ctxt_switches:"):
            value = line.split(b":", 1)[1].strip()
            switches = int(value) if value.isdigit() else None
    if not sched or not sched[0].isdigit() or switches is None:
        return None
    return int(sched[0]), switches
