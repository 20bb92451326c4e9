"""The I/O of `ddpdoctor hang`: every read of the live machine happens here, each bounded in time and
size, and comes back as data (never an exception) for the pure modules to judge.

- processes: psutil, plus a few variables from /proc/PID/environ (ENV_KEYS only: environments hold secrets)
- NCCL RAS: a TCP conversation with the RAS port (Equivalent: `echo 'verbose status' | nc 127.0.0.1 28028`)
- py-spy: `py-spy dump --json --pid PID` through runner.run_argv (timeout, own process group)
- Flight Recorder dumps: bounded reads of files (parsed by hang.fr's restricted unpickler)
- source lines of the user's script, read (never imported) to show the line a rank is stuck on
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from ddpdoctor.edge.files import (
    in_kernel_dir,
    is_regular_file,
    read_quoted_source,
    read_user_bytes,
    source_roots,
    user_path_mode,
)
from ddpdoctor.edge.procfs import read_group_and_session, read_stderr_tail, read_task_wchans
from ddpdoctor.edge.procfs import read_process_state as process_state
from ddpdoctor.hang.findings import HangFacts, IoPeer
from ddpdoctor.hang.fr import (
    MAX_BUILT_OBJECTS,
    MAX_DUMP_BYTES,
    MAX_PLAUSIBLE_RANK,
    Budget,
    Dump,
    DumpError,
    Frame,
    parse_dump,
    rank_from_name,
)
from ddpdoctor.hang.procs import ENV_KEYS, ProcInfo, Worker, spawn_ranks_by_order
from ddpdoctor.hang.progress import LONG_LOOK_STEP_S, Activity, Sample, judge_motion, look_longer
from ddpdoctor.hang.ras import MAX_REPLY_BYTES, RAS_DEFAULT_ADDR
from ddpdoctor.hang.stacks import RankStack, parse_pyspy_result, spawn_rank
from ddpdoctor.parsers.pytraceback import PyTraceback, last_traceback

MAX_ENVIRON_BYTES = 1024 * 1024
# Dumps read from one directory or prefix (a job's ranks; more files are named as left out), and the
# objects all of them may be built into together (fr.Budget; one real dump spends ~70k).
MAX_FR_FILES = 1024
MAX_FR_TOTAL_OBJECTS = 8_000_000


def read_environ(pid: int) -> tuple[dict[str, str], str]:
    """The ENV_KEYS variables of a process, or ('', why not) when /proc/PID/environ is unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read(MAX_ENVIRON_BYTES)
    except OSError as exc:
        return {}, f"/proc/{pid}/environ: {exc.strerror or exc}"
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode("utf-8", "replace")
        if sep and name in ENV_KEYS:
            env[name] = value.decode("utf-8", "replace")[:500]
    return env, ""


def list_processes() -> list[ProcInfo]:
    """Every process psutil can see, with the job-related variables of those whose environ is readable.

    Equivalent: `ps -eo pid,ppid,args` + `tr '\\0' '\\n' < /proc/PID/environ`.
    """
    import psutil

    out = []
    host = socket.gethostname()
    for proc in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
        info = proc.info
        cmdline = tuple(info.get("cmdline") or ())
        if not cmdline:
            continue
        joined = " ".join(cmdline[:8])
        # Only python processes and launchers can be ranks; skip reading everyone else's environ.
        env: dict[str, str] = {}
        env_error = ""
        if "python" in joined or "torchrun" in joined or (info.get("name") or "").startswith("pt_"):
            env, env_error = read_environ(info["pid"])
        out.append(
            ProcInfo(
                pid=info["pid"], ppid=info.get("ppid") or 0, name=info.get("name") or "",
                cmdline=tuple(c[:500] for c in cmdline[:64]), env=env, env_error=env_error, host=host,
            )
        )
    return out


@dataclass(frozen=True)
class RasReply:
    addr: str
    data: bytes = b""
    error: str = ""  # refused, timed out, ...
    error_kind: str = ""  # refused | timeout | unreachable | bad_addr
    duration_s: float = 0.0
    command: str = ""


def parse_addr(addr: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `host` (port 28028) -> (host, port); ValueError for garbage."""
    text = addr.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":") or "28028"
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, "28028"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {addr!r}")
    return host, int(port)


def query_ras(addr: str = RAS_DEFAULT_ADDR, timeout_s: float = 5.0, verbose: bool = True, json_format: bool = True) -> RasReply:
    """One RAS conversation bounded by `timeout_s` in all: handshake, TIMEOUT, format, (VERBOSE) STATUS.

    Equivalent: `printf 'CLIENT PROTOCOL 2\\nTIMEOUT 5\\nSET FORMAT json\\nVERBOSE STATUS\\n' | nc 127.0.0.1 28028`
    """
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        host, port = parse_addr(addr)
    except ValueError as exc:
        return RasReply(addr, error=str(exc), error_kind="bad_addr")
    # RAS gathers data from every process before it answers; tell it to give up before we do.
    ras_timeout = max(1, int(timeout_s) - 1)
    lines = ["CLIENT PROTOCOL 2", f"TIMEOUT {ras_timeout}"]
    if json_format:
        lines.append("SET FORMAT json")
    lines.append("VERBOSE STATUS" if verbose else "STATUS")
    command = "; ".join(lines)
    data = bytearray()
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            # Line by line, as ncclras does: the server reads one command per line and answers each.
            for line in lines[:-1]:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                sock.sendall(line.encode() + b"\n")
                reply = _read_line(sock, deadline)
                data += reply
                if not reply.endswith(b"\n"):
                    raise socket.timeout()
                if reply.startswith(b"ERROR") and line.startswith("SET FORMAT"):
                    # NCCL < 2.28.7 knows no JSON: go on in text.
                    data = data[: len(data) - len(reply)]
            sock.sendall(lines[-1].encode() + b"\n")
            while len(data) < MAX_REPLY_BYTES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout()
                sock.settimeout(remaining)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except ConnectionRefusedError:
        return RasReply(addr, bytes(data), f"connection to {host}:{port} refused: no NCCL process listens there",
                        "refused", time.monotonic() - start, command)
    except (socket.timeout, TimeoutError):
        return RasReply(addr, bytes(data), f"no complete answer from {host}:{port} within {timeout_s:g}s",
                        "timeout", time.monotonic() - start, command)
    except OSError as exc:
        return RasReply(addr, bytes(data), f"{host}:{port}: {exc.strerror or exc}", "unreachable",
                        time.monotonic() - start, command)
    except UnicodeError as exc:
        # The host name cannot be a DNS name (a label over 63 characters: the idna codec refuses it),
        # whether it came from --ras-addr or from the job's own NCCL_RAS_ADDR.
        return RasReply(addr, bytes(data), f"{host[:80]!r}{'...' if len(host) > 80 else ''} is not a valid host "
                        f"name ({exc})", "bad_addr", time.monotonic() - start, command)
    return RasReply(addr, bytes(data), duration_s=time.monotonic() - start, command=command)


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n") and len(buf) < 4096:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sock.settimeout(remaining)
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def find_pyspy() -> Optional[str]:
    """py-spy on PATH, or next to this interpreter (a venv's bin/ is often not on PATH)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def dump_stack(
    pid: int, rank: Optional[int], pyspy: Optional[str], timeout_s: float = 10.0, nonblocking: bool = False
) -> RankStack:
    """One rank's Python stacks. Equivalent: `py-spy dump --json --pid PID` (`--nonblocking` between
    activity readings: pausing a rank wakes its sleeping threads, which would look like progress)."""
    from ddpdoctor.edge.runner import run_argv

    state = process_state(pid)
    if state == "t":
        # Another tracer (a second py-spy) holds it for milliseconds; a debugger holds it for good.
        time.sleep(0.3)
        state = process_state(pid)
    if state in ("T", "t"):
        # A stopped rank (Ctrl-Z, SIGSTOP, a debugger holding it) hangs the whole job, and py-spy cannot
        # read it ("Failed to find python version"): say so instead.
        kind = "stopped by a debugger (tracing stop)" if state == "t" else "stopped (SIGSTOP or Ctrl-Z)"
        threads: list[Any] = []
        if pyspy is not None:
            # `--nonblocking` reads its memory without attaching (an attach would wait for a stopped
            # process): the line it stopped at.
            from ddpdoctor.edge.runner import run_argv

            seen = run_argv([pyspy, "dump", "--json", "--nonblocking", "--pid", str(pid)], timeout_s=min(timeout_s, 3.0))
            if seen.ok:
                threads = parse_pyspy_result(rank, pid, seen.stdout, seen.stderr, True).threads
        return RankStack(rank, pid, threads=threads, error=f"process {pid} is {kind}: /proc/{pid}/stat state {state}",
                         error_kind="stopped")
    if pyspy is None:
        return RankStack(rank, pid, error="py-spy is not installed", error_kind="missing")
    argv = [pyspy, "dump", "--json", "--pid", str(pid)] + (["--nonblocking"] if nonblocking else [])
    result = run_argv(argv, timeout_s=timeout_s)
    if result.timed_out:
        return RankStack(rank, pid, error=f"py-spy timed out after {timeout_s:g}s", error_kind="timeout")
    if not result.found:
        return RankStack(rank, pid, error=result.describe_failure(), error_kind="missing")
    return parse_pyspy_result(rank, pid, result.stdout, result.stderr, result.ok)


def ptrace_scope() -> Optional[int]:
    """kernel.yama.ptrace_scope, or None where Yama is absent."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def has_cap_sys_ptrace() -> Optional[bool]:
    """Whether this process holds CAP_SYS_PTRACE (bit 19 of CapEff), None when unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 19))
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class DumpRead:
    path: str
    dump: Optional[Dump] = None
    error: str = ""
    mtime: Optional[float] = None
    skipped: bool = False  # a partial dump (*.tmp), not read


def fr_candidates(spec: str) -> tuple[list[Path], list[Path]]:
    """(the dump files `--fr` names: a file, a directory (every file in it), or a prefix (`/tmp/fr_`);
    the partial ones left out: `*.tmp`, which a writer renames once the dump is whole).

    Never a file under /proc or /sys: the spec may come from a job's own TORCH_FR_DUMP_TEMP_FILE, and
    reading /proc/kmsg there would consume the kernel's messages."""
    if in_kernel_dir(spec):
        return [], []
    path = Path(spec)
    try:
        mode = user_path_mode(path)
        if mode is not None and stat.S_ISDIR(mode):
            files = sorted(p for p in path.iterdir() if is_regular_file(p) and not p.name.startswith("."))
        elif mode is not None and stat.S_ISREG(mode):
            files = [path]
        else:
            parent = path.parent if str(path.parent) else Path(".")
            parent_mode = user_path_mode(parent)
            if parent_mode is None or not stat.S_ISDIR(parent_mode):
                return [], []
            files = sorted(p for p in parent.iterdir() if p.name.startswith(path.name) and is_regular_file(p))
    except OSError:  # InputRefused: a spec from a job's environment that cannot be looked at is no dump
        return [], []
    files = [p for p in files if not in_kernel_dir(p)]
    partial = [p for p in files if p.name.endswith(".tmp")]
    return [p for p in files if not p.name.endswith(".tmp")], partial[:MAX_FR_FILES]


def _twin_name(path: str) -> str:
    """The name without .json/.pkl: torch's pickle and JSON dumps of one rank share it."""
    return re.sub(r"\.(json|pkl|pickle)$", "", path)


def read_dumps(spec: str) -> list[DumpRead]:
    """Read and parse every dump `--fr` names; the pickle and JSON of one rank are not both kept, two
    different dumps claiming one rank are both named (the second left out, never silently), and the
    files past MAX_FR_FILES or past the shared object budget are named as left out."""
    out: list[DumpRead] = []
    seen_ranks: dict[int, int] = {}
    total = Budget(MAX_FR_TOTAL_OBJECTS)
    candidates, partial = fr_candidates(spec)
    out.extend(DumpRead(str(path), skipped=True) for path in partial)
    for index, path in enumerate(candidates):
        if index >= MAX_FR_FILES or total.left <= 0:
            why = f"more than {MAX_FR_FILES} files" if index >= MAX_FR_FILES else (
                f"the dumps before them already hold {MAX_FR_TOTAL_OBJECTS} objects")
            out.append(DumpRead(str(path), error=f"{len(candidates) - index} file(s) from {path} on left out: {why}"))
            break
        try:
            mtime: Optional[float] = path.stat().st_mtime
        except OSError:
            mtime = None
        try:
            # The shared bounded reader: regular files only, a file over the limit refused by its size.
            data = read_user_bytes(path, MAX_DUMP_BYTES)
        except OSError as exc:
            out.append(DumpRead(str(path), error=f"{path}: {exc.strerror or exc}"))
            continue
        name_rank = rank_from_name(path.name)
        if name_rank is not None and name_rank > MAX_PLAUSIBLE_RANK:
            out.append(DumpRead(str(path), error=(
                f"{path}: its name claims rank {name_rank}, more than any job has ({MAX_PLAUSIBLE_RANK}); "
                "left out")))
            continue
        budget = Budget(min(MAX_BUILT_OBJECTS, total.left))
        try:
            dump = parse_dump(data, str(path), name_rank, budget)
        except DumpError as exc:
            out.append(DumpRead(str(path), error=f"{path}: {exc}"))
            continue
        finally:
            total.left -= budget.limit - max(budget.left, 0)
        if dump.rank is not None and dump.rank in seen_ranks:
            previous = out[seen_ranks[dump.rank]]
            if _twin_name(previous.path) != _twin_name(str(path)):
                out.append(DumpRead(str(path), error=(
                    f"{path}: claims rank {dump.rank}, as {previous.path} does; left out (one dump per rank "
                    "is aligned: are these from different jobs or runs?)")))
                continue
            # Prefer the pickle: only it carries the Python frames that name the source line.
            if previous.dump is not None and not previous.dump.entries_have_frames() and dump.entries_have_frames():
                out[seen_ranks[dump.rank]] = DumpRead(str(path), dump, mtime=mtime)
            continue
        if dump.rank is not None:
            seen_ranks[dump.rank] = len(out)
        out.append(DumpRead(str(path), dump, mtime=mtime))
    return out


def read_source(filename: str, roots: list[str], owner_uid: Optional[int] = None) -> Optional[list[str]]:
    """A source file's lines (read as text, never imported or executed, redacted), or None when it is
    outside `roots` or not a regular file (edge.files.read_quoted_source says exactly when)."""
    text = read_quoted_source(filename, roots, owner_uid)
    return None if text is None else text.splitlines()


def _script_dir(cmdline: tuple[str, ...], cwd: str) -> Optional[str]:
    """The directory of the script a `python [opts] script.py ...` command line runs (sys.path[0])."""
    for arg in cmdline[1:8]:
        if arg.startswith("-"):
            if arg in ("-m", "-c"):
                return None
            continue
        return os.path.dirname(os.path.join(cwd, arg))
    return None


def rank_source_roots(pid: int, cmdline: tuple[str, ...], env: Mapping[str, str]) -> list[str]:
    """The job's own source tree as this rank sees it: its cwd, its script's directory and its PYTHONPATH
    (sys.path without the installed packages), read from /proc. Equivalent: readlink /proc/PID/cwd."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return []
    candidates = [cwd, _script_dir(cmdline, cwd) or ""]
    candidates += [os.path.join(cwd, p) for p in env.get("PYTHONPATH", "").split(":")[:32] if p]
    return source_roots(candidates)


def _uid_of(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def gather_facts(
    pid: Optional[int],
    fr_spec: Optional[str],
    ras_addr: Optional[str],
    use_ras: bool,
    use_stacks: bool,
    timeout_s: float,
    use_fr: bool = True,
    samples: int = 2,
    interval_s: float = 1.0,
    local_skipped: str = "",
) -> HangFacts:
    """Everything `ddpdoctor hang` reads, in parallel where it can, the whole run bounded by timeout_s.

    `samples` snapshots `interval_s` apart (stacks read without pausing the ranks, their main threads'
    CPU time and sleeps, RAS counts) tell a hang from a slow job (progress.py); fewer are taken when
    timeout_s leaves no room for them. With `local_skipped` (why), this node's processes are not looked
    at: no job, no stacks, only RAS and the dumps `fr_spec` names."""
    from concurrent.futures import ThreadPoolExecutor

    from ddpdoctor.hang.procs import find_jobs, select_job
    from ddpdoctor.hang.ras import parse_ras, split_reply

    start = time.monotonic()
    deadline = start + timeout_s
    facts = HangFacts(host=socket.gethostname(), fr_spec=fr_spec or "", job_skipped=local_skipped)
    if not local_skipped and (use_stacks or use_ras or pid is not None or not fr_spec):
        procs = list_processes()
        if pid is not None and not any(p.pid == pid for p in procs):
            facts.pid_error = f"no such process: {pid}" if not os.path.exists(f"/proc/{pid}") else ""
        jobs = find_jobs(procs, own_pid=os.getpid())
        facts.job, facts.job_error = select_job(jobs, pid, procs, os.environ.get("SLURM_JOB_ID"))
        # Ranks of other launcher-less groups on this node: a rank started with another MASTER_PORT or
        # WORLD_SIZE forms a "job" of its own, and is the one the selected job waits for.
        facts.strays = [(w.rank, w.pid, f"{w.env.get('MASTER_ADDR', '?')}:{w.env.get('MASTER_PORT', '?')}",
                         w.env.get("WORLD_SIZE", "?"))
                        for j in jobs if j is not facts.job and j.agent_pid is None
                        for w in j.workers[:64] if w.rank is not None][:256]
    addr = ras_addr or (facts.job.ras_addr() if facts.job else None) or os.environ.get("NCCL_RAS_ADDR") or RAS_DEFAULT_ADDR
    if not fr_spec and use_fr and facts.job is not None:
        # The job said where torch dumps on a watchdog timeout (TORCH_FR_DUMP_TEMP_FILE): read what is there.
        prefix = facts.job.fr_prefix()
        if prefix:
            facts.fr_spec, facts.fr_from_job = prefix, True
            # An empty path is said as such (fr_finding), not read as a missing --fr.
            fr_spec = prefix if fr_candidates(prefix)[0] else None
    pyspy = find_pyspy()
    if facts.job is not None and facts.job.workers and all(w.rank is None for w in facts.job.workers):
        facts.job.workers = spawn_ranks(facts.job.workers, pyspy, min(3.0, timeout_s / 3))
    if facts.job is not None and len(facts.job.workers) > 1:
        _drop_forked_orphans(facts)
    facts.pyspy_missing = use_stacks and facts.job is not None and pyspy is None
    facts.ptrace_scope = ptrace_scope()
    facts.cap_sys_ptrace = has_cap_sys_ptrace()
    facts.pyspy_found = pyspy is not None
    workers = facts.job.workers if (facts.job and use_stacks) else []
    facts.rank_start = _start_times([w.pid for w in (facts.job.workers if facts.job else [])])
    if facts.job is not None and facts.job.agent_pid and not facts.job.workers and use_stacks:
        # No rank to read: the agent's own stack says where it waits (the elastic rendezvous).
        facts.agent_stack = dump_stack(facts.job.agent_pid, None, pyspy, min(timeout_s, 5.0))
        facts.agent_start = _start_times([facts.job.agent_pid]).get(facts.job.agent_pid)
    # Nothing to watch move (no rank's stack, no RAS): one snapshot, no interval to sleep through.
    count = max(1, samples) if (workers or use_ras) else 1
    fr_stats: dict[str, tuple[int, int]] = {}
    with ThreadPoolExecutor(max_workers=max(2, min(16, len(workers) + 1))) as pool:
        index = 0
        while index < count or (workers and _look_longer(facts, deadline)):
            if index:
                # Sleep to the next snapshot only when the rest of the run still fits in the timeout.
                step = interval_s if index < count else LONG_LOOK_STEP_S
                wait = facts.samples[-1].t + step - time.monotonic()
                if time.monotonic() + max(0.0, wait) + 0.5 > deadline:
                    break
                time.sleep(max(0.0, wait))
            budget = max(0.5, deadline - time.monotonic())
            ras_future = (
                pool.submit(query_ras, addr, min(timeout_s, budget))
                if use_ras and (index == 0 or index == count - 1) else None
            )
            sample = Sample(time.monotonic())
            sample.activity = {w.pid: a for w in workers if (a := _activity(w.pid)) is not None}
            stack_futures = [
                pool.submit(dump_stack, w.pid, w.rank, pyspy, min(timeout_s, budget), count > 1) for w in workers
            ]
            if index == 0 and fr_spec:
                read_fr_into(facts, fr_spec)
                fr_stats = _stat_all(facts.dumps)
            sample.stacks = [f.result() for f in stack_futures]
            if ras_future is not None:
                _take_ras(facts, ras_future.result(), sample, parse_ras, split_reply)
            facts.samples.append(sample)
            index += 1
        facts.stacks = _final_stacks(facts, workers, pyspy, deadline, timeout_s, pool)
        facts.taken_at = time.time()
        if fr_stats and _stat_all(facts.dumps) != fr_stats:
            # The job wrote its dumps again while we looked: keep both reads, the seqs tell progress.
            facts.earlier_dumps, facts.dumps, facts.dump_errors = facts.dumps, [], []
            read_fr_into(facts, fr_spec or "")
        facts.worker_stacks = _dataloader_workers(facts, pyspy, deadline, timeout_s, pool)
        facts.helper_stacks = _waited_children(facts, pyspy, deadline, timeout_s, pool)
        facts.io_peers = _io_peers(facts, pyspy, min(timeout_s, 5.0))
    facts.children = _rank_children(facts)
    facts.child_wchans = {pid: read_task_wchans(pid) for kids in facts.children.values() for pid, _, _ in kids[:16]}
    facts.exit_tracebacks = _exit_tracebacks(facts)
    read_sources_into(facts)
    facts.sleep_locals = _sleep_locals(facts, pyspy, min(timeout_s, 5.0))
    facts.collective_args = _collective_args(facts, pyspy, min(timeout_s, 5.0))
    facts.group_locals = _group_locals(facts, pyspy, min(timeout_s, 5.0))
    facts.init_locals = _init_locals(facts, pyspy, min(timeout_s, 5.0))
    facts.joining_locals = _joining_locals(facts, pyspy, min(timeout_s, 5.0))
    facts.loop_locals = _loop_locals(facts, pyspy, min(timeout_s, 5.0))
    facts.loop_gap_s = _LOOP_GAP_S if facts.loop_locals else 0.0
    facts.duration_s = time.monotonic() - start
    return facts


def _collective_args(facts: HangFacts, pyspy: Optional[str], timeout_s: float) -> dict[int, dict[str, str]]:
    """The arguments of the rooted collective or send/recv each rank waits in (broadcast's `src`, recv's `src`
    and `tag`): ranks that disagree on them wait forever in the same call. Read when every rank with a stack
    waits in such a call (one py-spy --locals per rank), or for the (at most 8) ranks in a send/recv when the
    others are elsewhere. Equivalent: `py-spy dump --json --locals
    --nonblocking --pid PID`."""
    from ddpdoctor.hang.mismatch import P2P_OPS, ROOTED_ARGS
    from ddpdoctor.hang.stacks import frame_locals

    out: dict[int, dict[str, str]] = {}
    if pyspy is None:
        return out
    calls = []
    for stack in facts.stacks[:64]:
        main = stack.main
        if main is None:
            continue
        frame = next((f for f in main.frames if f.name in ROOTED_ARGS and f.filename.endswith("distributed_c10d.py")),
                     None)
        if frame is not None:
            calls.append((stack, frame))
    live = [s for s in facts.stacks if s.main is not None]
    if len(calls) < 2 or len(calls) != len(live):
        # Some ranks in a send/recv while the others are elsewhere: the peer each names says whether it is the
        # rank that waits for it (a few ranks only, so it stays cheap).
        calls = [(s, f) for s, f in calls if f.name in P2P_OPS][:8]
        if not calls:
            return out
    for stack, frame in calls:
        found = frame_locals(_dump_locals(pyspy, stack.pid, timeout_s), frame.name, frame.line)
        if found:
            out[stack.pid] = {"op": frame.name, **{k: v for k, v in found.items() if k in ROOTED_ARGS[frame.name]}}
    return out


def _init_locals(facts: HangFacts, pyspy: Optional[str], timeout_s: float) -> dict[str, str]:
    """The arguments one rank waiting inside torch's init_process_group gave it (world_size, rank, backend): what
    the script asked for, beside what the launcher set. Equivalent: `py-spy dump --json --locals --nonblocking
    --pid PID`."""
    from ddpdoctor.hang.stacks import frame_locals

    if pyspy is None:
        return {}
    first: dict[str, str] = {}
    for stack in facts.stacks[:8]:
        main = stack.main
        frame = next((f for f in main.frames if f.name.endswith("init_process_group")
                      and f.filename.endswith("distributed_c10d.py")), None) if main is not None else None
        if frame is None:
            continue
        found = frame_locals(_dump_locals(pyspy, stack.pid, timeout_s), frame.name, frame.line)
        method = found.get("init_method", "").strip("'\"")
        if method.startswith(("file:", "tcp:")):
            # The store each rank's init_method names (a file, its cwd resolving a relative path; a tcp address)
            # decides who meets whom, so every rank's is read, not only the first one's.
            try:
                cwd = os.readlink(f"/proc/{stack.pid}/cwd")
            except OSError:
                cwd = ""
            facts.init_methods[stack.pid] = (method[:400], cwd)
        if not first:
            first = {k: v for k, v in found.items() if k in ("world_size", "rank", "backend", "init_method")}
        if not facts.init_methods:
            break
    return first


def _joining_locals(facts: HangFacts, pyspy: Optional[str], timeout_s: float) -> dict[int, dict[str, str]]:
    """The locals of the user frame from which each rank (at most 8) calls init_process_group, read only when
    every rank with a stack waits inside it: values the ranks should share (a store prefix, a run id, a file
    name) but computed each for itself. Equivalent: `py-spy dump --json --locals --nonblocking --pid PID`."""
    from ddpdoctor.hang.rendezvous import joining
    from ddpdoctor.hang.stacks import frame_locals

    live = [s for s in facts.stacks if s.main is not None]
    if pyspy is None or len(live) < 2 or any(joining(s) is None for s in live):
        return {}
    out: dict[int, dict[str, str]] = {}
    for stack in live[:8]:
        frame = stack.user_frame()
        if frame is None:
            continue
        found = frame_locals(_dump_locals(pyspy, stack.pid, timeout_s), frame.name, frame.line)
        if found:
            out[stack.pid] = found
    return out


def _group_locals(facts: HangFacts, pyspy: Optional[str], timeout_s: float) -> dict[int, dict[str, str]]:
    """The locals of the user frame that calls a collective on a named group (`all_reduce(x, group=experts)`), one
    rank per call line, when the ranks wait in more than one place: what the group was made of
    (`new_group(expert_ranks)`, expert_ranks = [1, 2, 3]). Equivalent: `py-spy dump --json --locals --nonblocking
    --pid PID`."""
    from ddpdoctor.hang.stacks import frame_locals

    out: dict[int, dict[str, str]] = {}
    if pyspy is None or len({s.signature() for s in facts.stacks if s.main is not None}) < 2:
        return out
    seen: set[tuple[str, int]] = set()
    for stack in facts.stacks[:64]:
        frame = stack.user_frame() if stack.waiting_in() else None
        lines = facts.sources.get(frame.filename) if frame is not None else None
        if frame is None or not lines or not 0 < frame.line <= len(lines) or "group=" not in lines[frame.line - 1]:
            continue
        if (frame.filename, frame.line) in seen:
            continue
        seen.add((frame.filename, frame.line))
        found = frame_locals(_dump_locals(pyspy, stack.pid, timeout_s), frame.name, frame.line)
        if found:
            out[stack.pid] = found
        if len(seen) >= 4:
            break
    return out


_LOCALS_ARGV = ("dump", "--json", "--locals", "--nonblocking", "--pid")


def _dump_locals(pyspy: str, pid: int, timeout_s: float) -> str:
    """`py-spy dump --json --locals --nonblocking --pid PID` (non-blocking: a pause would wake a sleep or a
    blocked call): its JSON text, '' when it failed."""
    from ddpdoctor.edge.runner import run_argv

    seen = run_argv([pyspy, *_LOCALS_ARGV, str(pid)], timeout_s=timeout_s)
    return seen.stdout if seen.ok else ""


def _innermost_user_line(facts: HangFacts, stack: RankStack) -> Optional[tuple[Frame, str]]:
    """(frame, source line) when the main thread's innermost frame is the user's own code, on a line read."""
    main = stack.main
    frame = main.frames[0] if main is not None and main.frames else None
    lines = facts.sources.get(frame.filename) if frame is not None else None
    if frame is None or not frame.is_user or not lines or not 0 < frame.line <= len(lines):
        return None
    return frame, lines[frame.line - 1]


def _sleep_locals(facts: HangFacts, pyspy: Optional[str], timeout_s: float) -> dict[int, dict[str, str]]:
    """The locals of each rank that sleeps on its innermost user line (`time.sleep(delay)`): what the
    delay is worth. Equivalent: `py-spy dump --json --locals --nonblocking --pid PID` (_dump_locals)."""
    from ddpdoctor.hang.stacks import frame_locals

    out: dict[int, dict[str, str]] = {}
    if pyspy is None:
        return out
    for stack in facts.stacks[:16]:
        at = _innermost_user_line(facts, stack)
        if at is None or "sleep(" not in at[1]:
            continue
        found = frame_locals(_dump_locals(pyspy, stack.pid, timeout_s), at[0].name, at[0].line)
        if found:
            out[stack.pid] = found
    return out


_LOOP_GAP_S = 0.5


def _loop_locals(facts: HangFacts, pyspy: Optional[str], timeout_s: float) -> dict[int, list[tuple[int, dict[str, str]]]]:
    """Two reads, half a second apart, of the locals of each rank or DataLoader worker whose main thread runs
    Python inside a loop of the user's code (not a sleep): whether what the loop's exit condition reads
    moves. Equivalent: `py-spy dump --json --locals --nonblocking --pid PID` (_dump_locals), twice."""
    from ddpdoctor.hang.spin import looping_frame
    from ddpdoctor.hang.stacks import innermost_locals

    if pyspy is None:
        return {}
    wanted: list[tuple[int, str]] = []
    for stack in [*facts.stacks[:16], *(w for ws in facts.worker_stacks.values() for w in ws[:8])]:
        at = _innermost_user_line(facts, stack)
        if at is None or "sleep(" in at[1] or stack.main is None:
            continue
        # The loop around the innermost line, or around a caller's (a helper the loop calls, spin.looping_frame).
        loop = looping_frame(stack.main.frames, facts.sources)
        if loop is not None:
            wanted.append((stack.pid, loop.name))
    out: dict[int, list[tuple[int, dict[str, str]]]] = {}
    for index in range(2):
        if index:
            time.sleep(_LOOP_GAP_S)
        for pid, name in wanted[:8]:
            found = innermost_locals(_dump_locals(pyspy, pid, timeout_s), name)
            if found is not None:
                out.setdefault(pid, []).append(found)
    return {pid: reads for pid, reads in out.items() if reads}


def spawn_ranks(workers: list[Worker], pyspy: Optional[str], timeout_s: float) -> list[Worker]:
    """The ranks of torch.multiprocessing.spawn's children, which set RANK in code, not in their
    environment: read from each child's `_wrap(fn, i, ...)` frame (`py-spy dump --json --locals
    --nonblocking`, stacks.spawn_rank), else from the order their parent started them (procs.
    spawn_ranks_by_order). Workers that are no spawn children come back unchanged."""
    from concurrent.futures import ThreadPoolExecutor

    if pyspy is not None:
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(workers)))) as pool:
            texts = list(pool.map(lambda w: _dump_locals(pyspy, w.pid, timeout_s), workers))
        found = [spawn_rank(text) if text else None for text in texts]
        ranks = [f[0] for f in found if f is not None]
        if found and all(f is not None for f in found) and len(set(ranks)) == len(ranks):
            out = [replace(w, rank=f[0], local_rank=w.local_rank if w.local_rank is not None else f[0], rank_from=f[1])
                   for w, f in zip(workers, found) if f is not None]
            return sorted(out, key=lambda w: (w.rank if w.rank is not None else 1 << 30, w.pid))
    return spawn_ranks_by_order(workers, _start_times([w.pid for w in workers]))


# Time kept, after the last snapshot of a longer look, for the rest of the run (a rank's stack read again,
# its DataLoader workers' stacks, source lines).
LONG_LOOK_RESERVE_S = 1.5


def _look_longer(facts: HangFacts, deadline: float) -> bool:
    """More snapshots, beyond --samples, while nothing has completed yet and a rank is outside every
    collective (progress.look_longer), as long as the timeout leaves room for the rest of the run."""
    if len(facts.samples) < 2 or time.monotonic() + LONG_LOOK_STEP_S + LONG_LOOK_RESERVE_S > deadline:
        return False
    return look_longer(judge_motion(facts.samples), facts.samples)


def _activity(pid: int) -> Optional[Activity]:
    from ddpdoctor.edge.procfs import read_main_thread_activity

    reading = read_main_thread_activity(pid)
    return Activity(*reading) if reading is not None else None


def _start_times(pids: list[int]) -> dict[int, float]:
    """pid -> process start (epoch seconds), for telling a dump older than the job."""
    import psutil

    out = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).create_time()
        except (psutil.Error, OSError):
            continue
    return out


def _stat_all(dumps: list[Dump]) -> dict[str, tuple[int, int]]:
    out = {}
    for dump in dumps:
        try:
            st = os.stat(dump.source)
        except OSError:
            continue
        out[dump.source] = (st.st_mtime_ns, st.st_size)
    return out


def _take_ras(facts: HangFacts, reply: RasReply, sample: Sample, parse_ras: Any, split_reply: Any) -> None:
    """Keep the last RAS reply (or why there is none) in facts, its operation counts in the sample."""
    if reply.error and facts.ras is not None:
        return  # a later conversation failed: the earlier answer stands
    facts.ras_addr, facts.ras_command = reply.addr, reply.command
    if reply.error:
        facts.ras_error, facts.ras_error_kind = reply.error, reply.error_kind
        return
    try:
        _, body = split_reply(reply.data)
        facts.ras = parse_ras(body)
        facts.ras_error = facts.ras_error_kind = ""
        sample.ras_counts = dict(facts.ras.op_counts or facts.ras.ahead_count)
    except ValueError as exc:
        facts.ras_error, facts.ras_error_kind = f"{reply.addr}: {exc}", "garbage"


def _final_stacks(
    facts: HangFacts, workers: list[Any], pyspy: Optional[str], deadline: float, timeout_s: float, pool: Any
) -> list[RankStack]:
    """The last snapshot's stacks; a rank py-spy could not read without pausing it (it ran meanwhile)
    is read once more, paused, after the last activity reading (pausing wakes its threads)."""
    if not facts.samples:
        return []
    last = list(facts.samples[-1].stacks)
    retry = [i for i, s in enumerate(last) if s.main is None and s.error_kind in ("other", "garbage", "timeout")]
    budget = deadline - time.monotonic()
    if retry and budget > 0.3 and len(facts.samples) > 1:
        futures = {i: pool.submit(dump_stack, last[i].pid, last[i].rank, pyspy, min(timeout_s, budget)) for i in retry}
        for i, future in futures.items():
            again = future.result()
            if again.main is not None:
                last[i] = again
    return last


def _rank_children(facts: HangFacts) -> dict[int, list[tuple[int, str, str]]]:
    """Each rank's live child processes: (pid, kind, command line). The kind is the helper's
    (procs.helper_kind) where the child is a known helper, else `process`. Equivalent: `ps --ppid PID`."""
    import psutil

    kinds = {h.pid: h.kind for h in (facts.job.helpers if facts.job is not None else [])}
    out: dict[int, list[tuple[int, str, str]]] = {}
    for stack in facts.stacks:
        try:
            children = psutil.Process(stack.pid).children()[:16]
        except (psutil.Error, OSError):
            continue
        found = []
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmdline = " ".join(child.cmdline()[:16])[:200]
            except (psutil.Error, OSError):
                continue
            found.append((child.pid, kinds.get(child.pid, "process"), cmdline))
        if found:
            out[stack.pid] = found
    return out


def _dataloader_workers(
    facts: HangFacts, pyspy: Optional[str], deadline: float, timeout_s: float, pool: Any
) -> dict[int, list[RankStack]]:
    """The stacks of the DataLoader worker processes of each rank that waits on its DataLoader."""
    waiting = [s for s in facts.stacks if s.data_wait()]
    return _children_stacks(waiting, 8, pyspy, deadline, timeout_s, pool)


def _children_stacks(
    stacks: list[RankStack], limit: int, pyspy: Optional[str], deadline: float, timeout_s: float, pool: Any
) -> dict[int, list[RankStack]]:
    """py-spy stacks of the first `limit` child processes of each of these ranks, by the rank's pid, within
    the deadline."""
    import psutil

    out: dict[int, list[RankStack]] = {}
    for stack in stacks:
        try:
            children = [c.pid for c in psutil.Process(stack.pid).children()][:limit]
        except (psutil.Error, OSError):
            continue
        budget = deadline - time.monotonic()
        if not children or budget <= 0.2:
            continue
        # Non-blocking: attaching pauses the child, and a child blocked writing to a full pipe then gave up its
        # write and exited (seen here: Popen.wait on a child with stdout=PIPE), dissolving the very hang.
        futures = [pool.submit(dump_stack, pid, stack.rank, pyspy, min(timeout_s, budget), True) for pid in children]
        found = [f.result() for f in futures]
        for index, child in enumerate(found):
            # A non-blocking read of a process that runs (a worker spinning in a collate_fn) can catch its
            # memory mid-change and fail on a loaded machine: one more read.
            budget = deadline - time.monotonic()
            if child.main is None and child.error_kind not in ("gone", "permission", "not_python") and budget > 0.5:
                found[index] = dump_stack(child.pid, stack.rank, pyspy, min(timeout_s, budget), True)
        out[stack.pid] = found
    return out


_CHILD_WAITS = ("multiprocessing/process.py", "multiprocessing/popen_fork.py", "multiprocessing/pool.py",
                "subprocess.py")


def _waited_children(
    facts: HangFacts, pyspy: Optional[str], deadline: float, timeout_s: float, pool: Any
) -> dict[int, list[RankStack]]:
    """The stacks of the child processes of each rank whose main thread waits on children (Process.join,
    Popen.wait, a multiprocessing Pool): why the child does not finish is the reason the rank waits.
    A child that is no Python process gives an empty stack."""
    waiting = [
        s
        for s in facts.stacks
        if s.main is not None
        and not s.waiting_in()
        and any(f.filename.endswith(_CHILD_WAITS) for f in s.main.frames)
    ]
    return _children_stacks(waiting, 4, pyspy, deadline, timeout_s, pool)


def _io_peers(facts: HangFacts, pyspy: Optional[str], timeout_s: float) -> dict[int, list[IoPeer]]:
    """For (at most 4) ranks outside every collective whose main thread blocks in the user's own line or a
    socket read: the processes of the same user at the other end of their sockets and pipes (edge.peers), the
    job's own ranks and agent left out, each with its stacks and its innermost user frame's locals. Equivalent:
    `ls -l /proc/PID/fd`, `cat /proc/PID/net/tcp`, then `py-spy dump --json --locals --nonblocking --pid PEER`."""
    from ddpdoctor.edge.peers import other_ends
    from ddpdoctor.hang.io_peers import READ_LIBRARY
    from ddpdoctor.hang.stacks import frame_locals

    if facts.job is None:
        return {}
    skip = {w.pid for w in facts.job.workers} | ({facts.job.agent_pid} if facts.job.agent_pid else set())
    out: dict[int, list[IoPeer]] = {}
    for stack in facts.stacks[:64]:
        main = stack.main
        if main is None or not main.frames or stack.waiting_in() or len(out) >= 4:
            continue
        inner = main.frames[0]
        if not (inner.is_user or inner.filename.endswith(READ_LIBRARY)):
            continue
        peers: list[IoPeer] = []
        for peer in other_ends(stack.pid, skip, budget_s=1.0, limit=2):
            text = _dump_locals(pyspy, peer.pid, timeout_s) if pyspy is not None else ""
            seen = parse_pyspy_result(None, peer.pid, text, "", bool(text)) if text else None
            frame = seen.user_frame() if seen is not None else None
            values = frame_locals(text, frame.name, frame.line) if frame is not None else {}
            peers.append(IoPeer(peer.pid, peer.via, peer.argv, seen, values))
        if peers:
            out[stack.pid] = peers
    return out


def read_fr_into(facts: HangFacts, spec: str) -> None:
    """Add the dumps `spec` names to facts (and why each unusable file was left out)."""
    before = (len(facts.dumps), len(facts.dump_errors))
    for read in read_dumps(spec):
        if read.skipped:
            facts.dump_skipped.append(read.path)
        elif read.dump is not None:
            facts.dumps.append(read.dump)
            if read.mtime is not None:
                facts.dump_mtimes[read.dump.source] = read.mtime
        else:
            facts.dump_errors.append(read.error)
    if (len(facts.dumps), len(facts.dump_errors)) == before:
        facts.dump_errors.append(f"{spec}: no Flight Recorder dump there (a file, a directory or a prefix)")


def _drop_forked_orphans(facts: HangFacts) -> None:
    """Take out of the job the processes that are a dead rank's forked children (procs.forked_orphans), and keep
    the last traceback of the stderr file they inherited from it (what ended the rank), when written since the
    child started. Equivalent: ps -o pid,pgid,sid; ls /proc/LEADER."""
    from ddpdoctor.hang.procs import forked_orphans

    assert facts.job is not None
    leaders = {w.pid: found for w in facts.job.workers[:256] if (found := read_group_and_session(w.pid)) is not None}
    dead = {x for pair in leaders.values() for x in pair if x > 1 and not os.path.exists(f"/proc/{x}")}
    orphans = forked_orphans(facts.job.workers, leaders, dead) if dead else []
    if not orphans:
        return
    gone = {w.pid for w, _ in orphans}
    facts.job.workers = [w for w in facts.job.workers if w.pid not in gone]
    facts.orphans = [(w.pid, w.rank, leader) for w, leader in orphans]
    started = _start_times(sorted(gone))
    for w, _ in orphans:
        found = _stderr_traceback(w.pid, started.get(w.pid))
        if found is not None:
            facts.orphan_tracebacks[w.pid] = found


def _stderr_traceback(pid: int, started: Optional[float]) -> Optional[tuple[str, PyTraceback]]:
    """(the file, its last traceback) of the process's stderr when it is a regular file of its own user
    (procfs.read_stderr_tail, its last 64 KiB) written since `started` (the process's start, epoch seconds):
    a file untouched since then holds an earlier run's tracebacks."""
    tail = read_stderr_tail(pid)
    if tail is None or (started is not None and tail[2] < started):
        return None
    traceback = last_traceback(tail[1])
    return (tail[0], traceback) if traceback is not None else None


def _exit_tracebacks(facts: HangFacts) -> dict[int, tuple[str, PyTraceback]]:
    """The last traceback on the stderr file of each rank whose script has ended but whose process lives on (its
    exit joins a thread or a child that never ends): the exception that ended the script. Only a regular file
    of the rank's own user is read (procfs.read_stderr_tail), only its last 64 KiB."""
    return {stack.pid: found for stack in facts.stacks
            if stack.script_ended() and (found := _stderr_traceback(stack.pid, facts.rank_start.get(stack.pid)))}


def read_sources_into(facts: HangFacts) -> None:
    """Read (never run) the source files the stacks and dumps point at, to quote the lines.

    A frame names any path its job (or a dump's writer) chose, so only the job's own tree is read: for a
    live rank its cwd, script directory and PYTHONPATH, with the rank's uid as the owner a file must
    have; for a dump also the reader's cwd and the dump's directory, with the dump file's owner (an owner
    that cannot be read, a rank gone meanwhile, means nothing is quoted). Never /proc, /sys, /dev or /etc
    (edge.files.read_quoted_source)."""
    workers = facts.job.workers if facts.job is not None else []
    job_roots: list[str] = []
    for worker in workers:
        job_roots += rank_source_roots(worker.pid, worker.cmdline, worker.env)
    if facts.job is not None and facts.job.agent_pid is not None and any(w.rank_from for w in workers):
        # spawn's children run `python -c ...`: the script is on their parent's command line.
        job_roots += rank_source_roots(facts.job.agent_pid, facts.job.agent_cmdline, {})
    wanted: dict[str, tuple[list[str], Optional[int]]] = {}
    # Every snapshot's frames (a spinning rank's busiest line may be in an earlier one), and the
    # DataLoader workers' (the line a stuck worker is on).
    every = [s for sample in facts.samples for s in sample.stacks] + list(facts.stacks)
    every += [w for workers in facts.worker_stacks.values() for w in workers]
    every += [h for helpers in facts.helper_stacks.values() for h in helpers]
    every += [p.stack for peers in facts.io_peers.values() for p in peers if p.stack is not None]
    for stack in every:
        frame = stack.user_frame()
        if frame is not None:
            wanted.setdefault(frame.filename, (job_roots, _uid_of(f"/proc/{stack.pid}")))
    for stack in facts.stacks:
        # Every thread's user files too: why a rank waits (hang.waits) reads the line each thread is on
        # and the `with LOCK:` blocks around its callers.
        for thread in stack.threads:
            for frame in [f for f in thread.frames if f.is_user][:12]:
                wanted.setdefault(frame.filename, (job_roots, _uid_of(f"/proc/{stack.pid}")))
    for pid, (_, traceback) in facts.exit_tracebacks.items():
        own = traceback.own_frame()
        if own is not None:  # the line that raised, quoted in the verdict
            wanted.setdefault(own.file, (job_roots, _uid_of(f"/proc/{pid}")))
    for dump in facts.dumps:
        roots = source_roots([*job_roots, os.getcwd(), os.path.dirname(os.path.abspath(dump.source))])
        for entry in dump.entries[-8:]:
            frame = entry.user_frame()
            if frame is not None:
                wanted.setdefault(frame.filename, (roots, _uid_of(dump.source)))
    for filename in sorted(wanted)[:_MAX_SOURCES]:
        roots, owner = wanted[filename]
        if owner is None:
            continue
        lines = read_source(filename, roots, owner)
        if lines is not None:
            facts.sources[filename] = lines
    # The job's own modules those files import (`from mirror import CheckpointMirror` beside train.py): the line
    # that would end a wait may sit in a file no live thread is in now (held-out hang set 13, j08: the thread
    # that should set the Event had already ended). Same roots and owner; never more than _MAX_SOURCES in all.
    for filename in [f for f in sorted(facts.sources) if wanted.get(f, (None,))[0] is job_roots]:
        roots, owner = wanted[filename]
        for module in local_imports(filename, facts.sources[filename]):
            if len(facts.sources) >= _MAX_SOURCES:
                return
            if module not in facts.sources:
                lines = read_source(module, roots, owner)  # type: ignore[arg-type]
                if lines is not None:
                    facts.sources[module] = lines


_MAX_SOURCES = 32
_IMPORT = re.compile(r"^\s*(?:from\s+(?P<base>\.*[\w.]*)\s+import\s+(?P<names>[\w\s,()]+)|import\s+(?P<mods>[\w.]+(?:\s*,\s*[\w.]+)*))")


def local_imports(filename: str, lines: list[str]) -> list[str]:
    """Paths of the modules `filename` imports that exist beside it (`import mirror`, `from utils.io import x`,
    `from .mirror import y`, `from . import mirror`): the job's own files, not installed packages."""
    here = os.path.dirname(filename)
    out: list[str] = []
    for text in lines:
        found = _IMPORT.match(text)
        if found is None:
            continue
        if found.group("mods") is not None:
            modules = [m.strip() for m in found.group("mods").split(",")]
        elif found.group("base").strip("."):
            modules = [found.group("base")]
        else:  # `from . import a, b`: the names are modules of that package
            names = re.findall(r"\w+", found.group("names"))
            modules = [found.group("base") + n for n in names if n != "as"]
        for name in modules:
            dots = len(name) - len(name.lstrip("."))
            folder = here
            for _ in range(max(dots - 1, 0)):
                folder = os.path.dirname(folder)
            stem = os.path.join(folder, *name.lstrip(".").split("."))
            for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
                if candidate not in out and os.path.isfile(candidate):
                    out.append(candidate)
    return out


def gather_fr_facts(specs: list[str]) -> HangFacts:
    """Only the Flight Recorder part (for `explain DIR`): dumps of every spec, and their source lines."""
    start = time.monotonic()
    facts = HangFacts(host=socket.gethostname(), fr_spec=", ".join(specs))
    for spec in specs:
        read_fr_into(facts, spec)
    read_sources_into(facts)
    facts.duration_s = time.monotonic() - start
    return facts
