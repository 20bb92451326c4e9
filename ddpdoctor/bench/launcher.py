"""Starts the ranks, watches them with a wall-clock deadline, and never leaves one behind.

Ranks are forked by a zygote process (`ddpdoctor.bench.zygote`) that has imported torch but never
touched CUDA: start costs one torch import, and no rank is forked after CUDA init (the launcher
itself never imports torch). The zygote and its ranks form their own process group, killed as one.
Each rank reports (op, size) over its own pipe; a step that outlives `step_timeout_s` — process-group
init included, which PyTorch's own watchdog does not cover — gets the stuck ranks' Python stacks
(faulthandler on SIGUSR1) and then every rank is killed. A rank that raises or dies by a signal is
reported as the root cause; the other ranks' failures are its consequences.

Under torchrun or srun nothing is spawned: external.py joins that launch. What a launch returns
(rank states, failures, the root cause) is in outcome.py. ~650 lines kept together: starting the
zygote, the per-rank pipes and the watchdog loop share one LaunchResult and one deadline.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from pathlib import Path
from typing import Any, Mapping, Optional

from ddpdoctor.bench.outcome import (
    LAUNCHER_RANK,
    EventCallback,
    LaunchRefused,
    LaunchResult,
    RankFailure,
    RankState,
    first_line,
    is_peer_failure,
    pick_root_cause,
    signal_name,
)
from ddpdoctor.bench.plan import Job, RankSpec
from ddpdoctor.edge.ports import pick_free_port
from ddpdoctor.edge.proctree import kill_tree
from ddpdoctor.edge.runner import kill_process_group

MASTER_ADDR = "127.0.0.1"
PORT_ATTEMPTS = 3
# After the first failure, how long to keep listening before judging: the root cause's own report
# (an exception or an exit status) often arrives just after its peers' complaints.
FAILURE_GRACE_S = 1.0
# Waiting for the ranks' stack dumps ends as soon as each rank has acknowledged its dump (rankN.stack.done).
# A rank that has not after STACK_WAIT_S is given up unless it is runnable (continued or starved of CPU on a
# loaded machine: it will dump once scheduled); STACK_WAIT_MAX_S bounds the wait in every case.
STACK_WAIT_S = 3.0
STACK_WAIT_MAX_S = 15.0
EXIT_WAIT_S = 5.0
# The start of a rank (the zygote's interpreter and `import torch`, then the fork) is not a step of the
# benchmark: a cold import from a network filesystem can take tens of seconds whatever --timeout says.
# It gets its own finite allowance, at least the step timeout.
START_ALLOWANCE_S = 60.0
LOG_TAIL_CHARS = 3000

_ADDR_IN_USE = re.compile(r"EADDRINUSE|address already in use|errno\s*[:=]?\s*98\b", re.IGNORECASE)

def _process_status(pid: Optional[int]) -> str:
    if pid is None:
        return ""
    try:
        import psutil

        return str(psutil.Process(pid).status())
    except Exception:  # noqa: BLE001 - gone or not visible
        return "gone"


def _wait_dead(pids: list[int], timeout_s: float = EXIT_WAIT_S) -> None:
    """Wait until every pid is gone or a zombie (reaped by whoever inherited it)."""
    import psutil

    end = time.monotonic() + timeout_s
    while pids and time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                pass
        pids = alive
        if pids:
            time.sleep(0.02)


def _tail(path: Path, limit: int = LOG_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace").strip()


def _child_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def launch_local(
    job: Job,
    *,
    nproc: int,
    backend: str,
    step_timeout_s: float,
    total_timeout_s: Optional[float] = None,
    master_port: Optional[int] = None,
    on_event: Optional[EventCallback] = None,
    env: Optional[Mapping[str, str]] = None,
    pg_timeout_s: Optional[float] = None,
) -> LaunchResult:
    """Run `job` on `nproc` local ranks bound to 127.0.0.1.

    `master_port` pinned: used as is (a taken port is refused, see `refuse_taken_port`); otherwise a
    free port is picked and the launch retried on a clash. Never raises for a rank's failure: the
    LaunchResult says what happened. KeyboardInterrupt stops every rank and is reported as
    `interrupted`.
    """
    if nproc < 1:
        raise ValueError("nproc must be at least 1")
    if master_port is not None:
        refuse_taken_port(master_port)
    attempts = 0
    start = time.monotonic()
    deadline = start + total_timeout_s if total_timeout_s else None
    while True:
        attempts += 1
        port = master_port if master_port is not None else pick_free_port(MASTER_ADDR)
        result = _launch_once(
            job,
            nproc=nproc,
            backend=backend,
            port=port,
            step_timeout_s=step_timeout_s,
            deadline=deadline,
            on_event=on_event,
            env=_child_env(env or {}),
            pg_timeout_s=pg_timeout_s or default_pg_timeout(step_timeout_s),
        )
        result.port_attempts = attempts
        clash = result.root_cause is not None and bool(_ADDR_IN_USE.search(result.root_cause.message))
        if clash and master_port is None and attempts < PORT_ATTEMPTS:
            continue  # someone took the port between the pick and rank 0's bind: try another
        result.duration_s = time.monotonic() - start
        return result


def start_limit(step_timeout_s: float) -> float:
    """Seconds a rank may take to start (interpreter, `import torch`, fork) before it reports ready."""
    return max(step_timeout_s, START_ALLOWANCE_S)


class _SigtermAsInterrupt:
    """While armed, SIGTERM stops the launch the way Ctrl-C does (KeyboardInterrupt), so the rows
    measured so far are reported and every rank is killed; once disarmed (cleanup), a SIGTERM is only
    recorded, so that it cannot cut the cleanup short and orphan a rank.

    Only in the main thread (Python delivers signals there); elsewhere SIGTERM keeps its disposition.
    """

    def __init__(self, result: LaunchResult) -> None:
        self.result, self.armed, self.previous = result, False, None
        self.installed = threading.current_thread() is threading.main_thread()

    def __enter__(self) -> _SigtermAsInterrupt:
        if self.installed:
            self.previous = signal.signal(signal.SIGTERM, self._handle)
            self.armed = True
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.result.interrupted = True
        self.result.interrupted_by = "SIGTERM"
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def disarm(self) -> None:
        self.armed = False

    def __exit__(self, *exc: Any) -> None:
        if self.installed:
            signal.signal(signal.SIGTERM, self.previous if self.previous is not None else signal.SIG_DFL)


def default_pg_timeout(step_timeout_s: float) -> float:
    """The process group's own timeout: longer than the watchdog's, so the watchdog names the
    stuck rank before PyTorch turns the hang into errors on the healthy ranks."""
    return max(step_timeout_s * 2, step_timeout_s + 10)


def refuse_taken_port(port: int) -> None:
    """Raise LaunchRefused naming the holder when a pinned MASTER_PORT is already bound."""
    from ddpdoctor.edge.ports import find_port_holder

    holder = find_port_holder(port)
    if holder is not None:
        raise LaunchRefused(holder.describe())


def _launch_once(
    job: Job,
    *,
    nproc: int,
    backend: str,
    port: int,
    step_timeout_s: float,
    deadline: Optional[float],
    on_event: Optional[EventCallback],
    env: dict[str, str],
    pg_timeout_s: float,
) -> LaunchResult:
    result = LaunchResult(world_size=nproc, backend=backend, master_port=port, timeout_s=step_timeout_s)
    try:
        pipes = _open_pipes(nproc)
    except OSError as exc:
        _record_start_failure(result, nproc, exc)
        return result
    try:
        workdir = Path(tempfile.mkdtemp(prefix="ddpdoctor-bench-"))
    except OSError as exc:
        # The pipes may have taken the last file descriptors: tempfile then reports "No usable temporary
        # directory" (ENOENT). Either way no rank started: the launcher's failure, never a traceback.
        for r, w in pipes:
            os.close(r)
            os.close(w)
        _record_start_failure(result, nproc, exc)
        return result
    write_fds = [w for _, w in pipes]
    conns = {rank: Connection(r, writable=False) for rank, (r, _) in enumerate(pipes)}
    specs = [
        RankSpec(
            rank=rank,
            world_size=nproc,
            local_rank=rank,
            backend=backend,
            master_addr=MASTER_ADDR,
            master_port=port,
            pg_timeout_s=pg_timeout_s,
            job=job,
            env={},
            log_path=str(workdir / f"rank{rank}.log"),
            stack_path=str(workdir / f"rank{rank}.stack"),
        )
        for rank in range(nproc)
    ]
    zygote: Optional[subprocess.Popen[bytes]] = None
    sigterm = _SigtermAsInterrupt(result).__enter__()
    try:
        try:
            with open(workdir / "zygote.log", "wb") as zlog:
                zygote = subprocess.Popen(
                    [sys.executable, "-m", "ddpdoctor.bench.zygote"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=zlog,
                    pass_fds=write_fds,
                    env=env,
                    # Own session: Ctrl-C in the terminal reaches only us, and one killpg ends every rank.
                    start_new_session=True,
                )
        except OSError as exc:  # fork refused (EAGAIN, ENOMEM) or out of descriptors: no rank can run
            _record_start_failure(result, nproc, exc)
            return result  # the finally below closes the pipes and removes workdir
        for w in write_fds:
            os.close(w)
        write_fds = []
        now = time.monotonic()
        for rank in range(nproc):
            result.ranks[rank] = RankState(rank=rank, since=now, limit=start_limit(step_timeout_s))
        assert zygote.stdin is not None
        zygote.stdin.write(pickle.dumps({"specs": specs, "fds": [w for _, w in pipes]}))
        zygote.stdin.close()
        _watch(result, zygote, conns, step_timeout_s, deadline, on_event, workdir)
    except KeyboardInterrupt:
        result.interrupted = True
        result.interrupted_by = result.interrupted_by or "SIGINT"
    finally:
        sigterm.disarm()
        for w in write_fds:
            os.close(w)
        _stop_all(zygote, result)
        for conn in conns.values():
            conn.close()
        _cleanup(workdir)
        sigterm.__exit__()
    return result


def _stop_all(zygote: Optional[subprocess.Popen[bytes]], result: LaunchResult) -> None:
    """SIGKILL the zygote's process group and every rank we know of, then reap the zygote."""
    if zygote is None:
        return
    if zygote.poll() is None or any(s.exitcode is None for s in result.ranks.values()):
        kill_process_group(zygote)
        for s in result.ranks.values():
            if s.exitcode is None and s.pid:
                kill_tree(s.pid, include_root=True)
        _wait_dead([s.pid for s in result.ranks.values() if s.exitcode is None and s.pid])
    try:
        zygote.wait(EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        zygote.kill()
        zygote.wait()
    if zygote.stdout is not None:
        zygote.stdout.close()


def _cleanup(workdir: Path) -> None:
    for p in workdir.glob("*"):
        try:
            p.unlink()
        except OSError:
            pass
    try:
        workdir.rmdir()
    except OSError:
        pass


def _handle_message(result: LaunchResult, msg: Mapping[str, Any], on_event: Optional[EventCallback]) -> None:
    rank = int(msg.get("rank", -1))
    state = result.ranks.get(rank)
    if state is None:
        return
    kind = msg.get("kind")
    if kind == "hello":
        state.host = str(msg.get("host", ""))
        state.pid = int(msg.get("pid") or 0) or state.pid
    elif kind == "step":
        state.step = int(msg.get("step", 0))
        state.op = str(msg.get("op", ""))
        state.size = int(msg.get("size", 0))
        state.since = time.monotonic()
        limit = msg.get("timeout_s")
        state.limit = float(limit) if isinstance(limit, (int, float)) else None
    elif kind == "row":
        result.rows.append(dict(msg["row"]))
    elif kind == "env":
        result.env = dict(msg.get("env") or {})
    elif kind == "done":
        state.done = True
        state.result = msg.get("result")
    elif kind == "error" and not state.done:
        message = str(msg.get("message", ""))
        result.failures.append(
            RankFailure(
                rank=rank,
                kind="exception",
                op=state.op,
                size=state.size,
                host=state.host,
                pid=state.pid,
                exc_type=str(msg.get("exc_type", "")),
                message=message,
                traceback=str(msg.get("traceback", "")),
                at=time.monotonic(),
                peer_failure=is_peer_failure(message),
            )
        )
    if on_event is not None:
        on_event(rank, msg)


def _drain(conn: Connection, result: LaunchResult, on_event: Optional[EventCallback]) -> bool:
    """Handle every message waiting on a rank's pipe; False once the rank has closed it."""
    try:
        while conn.poll():
            _handle_message(result, conn.recv(), on_event)
    except (EOFError, OSError):
        return False
    return True


def _watch(
    result: LaunchResult,
    zygote: subprocess.Popen[bytes],
    conns: dict[int, Connection],
    step_timeout_s: float,
    deadline: Optional[float],
    on_event: Optional[EventCallback],
    workdir: Path,
) -> None:
    open_conns = dict(conns)
    exited: set[int] = set()
    assert zygote.stdout is not None
    zfd: Optional[int] = zygote.stdout.fileno()
    pending = b""
    first_failure_at: Optional[float] = None
    while True:
        by_conn = {c: r for r, c in open_conns.items()}
        ready = wait_ready(list(by_conn) + ([zfd] if zfd is not None else []), timeout=0.1)
        for obj in ready:
            if obj in by_conn and not _drain(obj, result, on_event):
                open_conns.pop(by_conn[obj], None)
        if zfd is not None and zfd in ready:
            data = os.read(zfd, 65536)
            if not data:
                zfd = None
                zygote.wait(EXIT_WAIT_S)
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                parts = line.decode(errors="replace").split()
                if (
                    len(parts) != 3
                    or not parts[1].lstrip("-").isdigit()
                    or not parts[2].lstrip("-").isdigit()
                ):
                    continue
                rank, value = int(parts[1]), int(parts[2])
                if rank not in result.ranks:
                    continue
                if parts[0] == "pid":
                    result.ranks[rank].pid = value
                elif parts[0] == "exit":
                    conn = open_conns.pop(rank, None)
                    if conn is not None:
                        _drain(conn, result, on_event)
                    exited.add(rank)
                    _record_exit(result, rank, value, workdir)
            if zfd is None and len(exited) < len(result.ranks):
                _record_launcher_failure(result, zygote, workdir)
        now = time.monotonic()
        if result.failures and first_failure_at is None:
            first_failure_at = now
        if all(s.done for s in result.ranks.values()):
            # Every rank is past its last collective: nothing is lost by ending them now, and their
            # teardown (barrier, gloo/NCCL destructors, exit) would only add to the wall time.
            break
        if first_failure_at is not None and (now - first_failure_at >= FAILURE_GRACE_S or zfd is None):
            break
        stuck = [
            s
            for s in result.ranks.values()
            if not s.done and s.rank not in exited and now - s.since > (s.limit or step_timeout_s)
        ]
        over_total = deadline is not None and now > deadline
        if first_failure_at is None and (stuck or over_total):
            result.timed_out = True
            waiting = [s for s in result.ranks.values() if not s.done and s.rank not in exited]
            _report_stuck(result, waiting, workdir)
            break
    for f in result.failures:
        if f.kind == "exception":
            f.log_tail = _tail(workdir / f"rank{f.rank}.log")
    result.root_cause = pick_root_cause(result.failures)


def _open_pipes(nproc: int) -> list[tuple[int, int]]:
    """One pipe per rank (its reports to us); on failure, the ones already opened are closed."""
    pipes: list[tuple[int, int]] = []
    try:
        for _ in range(nproc):
            pipes.append(os.pipe())
    except OSError:
        for r, w in pipes:
            os.close(r)
            os.close(w)
        raise
    return pipes


def _record_start_failure(result: LaunchResult, nproc: int, exc: OSError) -> None:
    """Resources ran out before any rank ran (too many ranks for this machine): the launcher's failure."""
    message = f"{type(exc).__name__}: {exc}"
    if exc.errno == errno.EMFILE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        message += (
            f" ({nproc} ranks need {2 * nproc} pipe ends here and the open-files limit is {soft}): "
            "start fewer ranks (--nproc) or raise the limit (ulimit -n)"
        )
    elif exc.errno in (errno.EAGAIN, errno.ENOMEM):
        message += f" (starting {nproc} ranks): start fewer ranks (--nproc) or free memory/processes"
    elif "temporary directory" in str(exc):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        message += (
            f" (creating the work directory for {nproc} ranks; the open-files limit is {soft}): start fewer "
            "ranks (--nproc), raise the limit (ulimit -n), or check TMPDIR is writable"
        )
    failure = RankFailure(
        rank=LAUNCHER_RANK,
        kind="exception",
        op="start",
        size=0,
        host=socket.gethostname(),
        exc_type=type(exc).__name__,
        message=message,
        at=time.monotonic(),
    )
    result.failures.append(failure)
    result.root_cause = failure


def _record_launcher_failure(result: LaunchResult, zygote: subprocess.Popen[bytes], workdir: Path) -> None:
    if any(f.rank == LAUNCHER_RANK for f in result.failures) or any(s.done for s in result.ranks.values()):
        return
    log = _tail(workdir / "zygote.log")
    result.failures.append(
        RankFailure(
            rank=LAUNCHER_RANK,
            kind="exit",
            op="start",
            size=0,
            host=socket.gethostname(),
            pid=zygote.pid,
            exitcode=zygote.returncode,
            message=first_line(log.splitlines()[-1] if log else "") or "the rank launcher exited early",
            at=time.monotonic(),
            log_tail=log,
        )
    )


def _record_exit(result: LaunchResult, rank: int, exitcode: Optional[int], workdir: Path) -> None:
    state = result.ranks[rank]
    state.exitcode = exitcode
    if state.done or exitcode is None:
        return
    if any(f.rank == rank for f in result.failures):
        return  # it reported its exception before exiting
    failure = RankFailure(
        rank=rank,
        kind="signal" if exitcode < 0 else "exit",
        op=state.op,
        size=state.size,
        host=state.host,
        pid=state.pid,
        exitcode=exitcode,
        signal=signal_name(exitcode) if exitcode < 0 else "",
        at=time.monotonic(),
        log_tail=_tail(workdir / f"rank{rank}.log"),
    )
    result.failures.append(failure)


def _acks(workdir: Path, rank: int) -> int:
    """How many stack dumps the rank has acknowledged so far (one byte each in rankN.stack.done)."""
    try:
        return (workdir / f"rank{rank}.stack.done").stat().st_size
    except OSError:
        return 0


def _await_stack_dumps(
    waiting: list[RankState], workdir: Path, acked_before: Mapping[int, int]
) -> dict[int, str]:
    """Until every rank still alive has acknowledged the dump just requested (see
    worker.acknowledge_stack_dumps); returns, for each rank that did not, why (its process status and
    how long it was waited for).

    A dump counts only past the acknowledgements counted before SIGUSR1 was sent (`acked_before`): any
    other signal with a Python handler also writes a byte to the wakeup fd, and a file that is merely
    non-empty would be read before the dump is written.
    """
    start = time.monotonic()
    pending = list(waiting)
    missing: dict[int, str] = {}
    while pending:
        elapsed = time.monotonic() - start
        still = []
        for s in pending:
            if _acks(workdir, s.rank) > acked_before.get(s.rank, 0):
                continue
            status = _process_status(s.pid)
            if status in ("gone", "zombie", "dead"):
                missing[s.rank] = f"process {status}, waited {elapsed:.1f}s"
            else:
                still.append(s)
        pending = still
        if not pending:
            break
        runnable = any(_process_status(s.pid) == "running" for s in pending)
        if elapsed >= STACK_WAIT_MAX_S or (elapsed >= STACK_WAIT_S and not runnable):
            # Alive but neither dumping nor waiting for a CPU: the signal cannot get through.
            for s in pending:
                missing[s.rank] = f"process {_process_status(s.pid) or 'unknown'}, waited {elapsed:.1f}s"
            break
        time.sleep(0.02)
    return missing


def _request_stack_dump(pid: int) -> None:
    """SIGUSR1 to the rank's main thread (a forked rank's main thread id is its pid).

    Process-directed, a signal pending in a stopped rank is taken, once SIGCONT wakes every thread, by
    whichever thread runs first, often one of gloo's; faulthandler then walks the main thread's frames
    while the main thread, continued too, runs on past the frame that stopped it. Directed at the main
    thread, the dump is taken there before it returns to Python code.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.tgkill(pid, pid, signal.SIGUSR1) == 0:
            return
    except (OSError, AttributeError):  # no tgkill (not Linux, or a libc without it)
        pass
    os.kill(pid, signal.SIGUSR1)


def _report_stuck(result: LaunchResult, waiting: list[RankState], workdir: Path) -> None:
    """Dump the Python stacks of the ranks still in a step, then record them as stuck."""
    now = time.monotonic()
    statuses = {s.rank: _process_status(s.pid) for s in waiting}
    acked_before = {s.rank: _acks(workdir, s.rank) for s in waiting}
    unsent: dict[int, str] = {}
    for s in waiting:
        if not s.pid:
            unsent[s.rank] = "its pid was never reported"
            continue
        try:
            _request_stack_dump(s.pid)
            if statuses[s.rank] in ("stopped", "tracing-stop"):
                os.kill(s.pid, signal.SIGCONT)  # so it can run the dump
        except (ProcessLookupError, PermissionError) as exc:
            unsent[s.rank] = f"SIGUSR1 not delivered: {exc.strerror or type(exc).__name__}"
    missing = _await_stack_dumps([s for s in waiting if s.rank not in unsent], workdir, acked_before)
    missing.update(unsent)
    stacks = {s.rank: _tail(workdir / f"rank{s.rank}.stack", 6000) for s in waiting}
    for s in waiting:
        stack = stacks.get(s.rank, "")
        note = missing.get(s.rank, "")
        if not stack and not note:
            note = "acknowledged, but the stack file is empty"
        result.failures.append(
            RankFailure(
                rank=s.rank,
                kind="stuck",
                op=s.op,
                size=s.size,
                step=s.step,
                host=s.host,
                pid=s.pid,
                at=s.since,
                status=statuses[s.rank],
                stack=stack,
                stack_missing="" if stack else note,
                message=f"no progress for {now - s.since:.1f}s (limit {s.limit or result.timeout_s:g}s)",
            )
        )


