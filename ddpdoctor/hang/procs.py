"""Which processes on this node make up the job: torchrun/elastic agents and their workers. Pure.

probe_io lists processes (psutil) and reads /proc/PID/environ where permitted; this module decides
which of them are ranks of one job, from their command lines, parents and RANK/LOCAL_RANK/
TORCHELASTIC_RUN_ID variables.

A rank's own children inherit its RANK/LOCAL_RANK (DataLoader workers, a multiprocessing Pool, a
`subprocess.Popen([sys.executable, ...])`, torch's compile workers): a process whose ancestor carries the
same RANK/LOCAL_RANK is a helper of that rank (split_ranks), listed under it, never a rank of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Optional

from ddpdoctor.core.launchenv import read_launch_env

# The variables read from a worker's environment (nothing else is kept: environments hold secrets).
ENV_KEYS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR", "MASTER_PORT", "NCCL_RAS_ADDR", "NCCL_RAS_ENABLE", "TORCH_FR_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
    # Which Slurm job a rank belongs to: `srun --overlap --jobid J ddpdoctor hang` diagnoses job J.
    "SLURM_JOB_ID",
    "PYTHONPATH",  # the job's source tree: where `hang` may quote source lines from
)
_AGENT_MARKERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "torchx")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # only ENV_KEYS
    env_error: str = ""  # why /proc/PID/environ could not be read
    host: str = ""


@dataclass(frozen=True)
class Worker:
    pid: int
    rank: Optional[int]
    local_rank: Optional[int]
    cmdline: tuple[str, ...]
    env: Mapping[str, str]
    env_error: str = ""
    # Where `rank` came from when not from RANK in the environment (a torch.multiprocessing.spawn rank
    # sets it in code): the spawn machinery's process index or the order its parent started it.
    rank_from: str = ""


@dataclass(frozen=True)
class Helper:
    """A process a rank started that inherited its launch variables (split_ranks): never a rank."""

    pid: int
    rank_pid: int  # the rank it belongs to
    kind: str  # helper_kind: "DataLoader worker", "Python subprocess", ...
    cmdline: tuple[str, ...]


@dataclass
class Job:
    agent_pid: Optional[int]
    agent_cmdline: tuple[str, ...]
    workers: list[Worker] = field(default_factory=list)
    world_size: Optional[int] = None
    run_id: str = ""
    more_agents: tuple[int, ...] = ()  # other agents of the same run on this node (merged in)
    helpers: list[Helper] = field(default_factory=list)  # the ranks' helper processes (split_ranks)

    def ras_addr(self) -> Optional[str]:
        for worker in self.workers:
            if worker.env.get("NCCL_RAS_ADDR"):
                return worker.env["NCCL_RAS_ADDR"]
        return None

    def fr_prefix(self) -> Optional[str]:
        for worker in self.workers:
            prefix = worker.env.get("TORCH_FR_DUMP_TEMP_FILE") or worker.env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
            if prefix:
                return prefix
        return None


def is_agent(proc: ProcInfo) -> bool:
    """A torchrun / torch.distributed.run / launch process (the elastic agent)."""
    joined = " ".join(proc.cmdline[:4])
    first = proc.cmdline[0].rsplit("/", 1)[-1] if proc.cmdline else ""
    # `timeout 60 torchrun ...` or `srun torchrun ...` mention torchrun but are not the agent.
    if not (_is_python(proc) or first == "torchrun"):
        return False
    return any(marker in joined for marker in _AGENT_MARKERS) and "ddpdoctor" not in joined


# Python children of a launcher that are not ranks: multiprocessing's bookkeeping processes.
_HELPER_MARKERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "semaphore_tracker")


def is_bookkeeping(command_line: str) -> bool:
    """A command line of multiprocessing's own bookkeeping process (resource tracker, forkserver)."""
    return any(marker in command_line for marker in _HELPER_MARKERS)


def _is_helper(proc: ProcInfo) -> bool:
    return is_bookkeeping(" ".join(proc.cmdline[:6]))


def _worker(proc: ProcInfo) -> Worker:
    launch = read_launch_env(proc.env)
    return Worker(proc.pid, launch.get("RANK"), launch.get("LOCAL_RANK"), proc.cmdline, dict(proc.env), proc.env_error)


def _has_rank(proc: ProcInfo) -> bool:
    launch = read_launch_env(proc.env)
    return launch.get("RANK") is not None or launch.get("LOCAL_RANK") is not None


def spawn_ranks_by_order(workers: list[Worker], start_times: Mapping[int, float]) -> list[Worker]:
    """Ranks of torch.multiprocessing.spawn's children from the order their parent started them: spawn
    starts process i = 0, 1, ... in turn, so the i-th started is process index i. Only when every worker
    is a spawned child with a known start time and none has a rank yet; else the workers unchanged."""
    if not workers or any(w.rank is not None for w in workers) or any(w.pid not in start_times for w in workers):
        return workers
    if not all(any("--multiprocessing-fork" in a or "spawn_main" in a for a in w.cmdline[:8]) for w in workers):
        return workers
    ordered = sorted(workers, key=lambda w: (start_times[w.pid], w.pid))
    return [
        replace(w, rank=i, local_rank=i, rank_from=(
            f"the order torch.multiprocessing.spawn's parent started its children (process index {i}; "
            "its locals could not be read)"))
        for i, w in enumerate(ordered)
    ]


def _is_spawned(proc: ProcInfo) -> bool:
    """A child of multiprocessing's spawn start method (torch.multiprocessing.spawn's ranks)."""
    return any("--multiprocessing-fork" in arg or "spawn_main" in arg for arg in proc.cmdline[:8])


def _is_python(proc: ProcInfo) -> bool:
    first = proc.cmdline[0].rsplit("/", 1)[-1] if proc.cmdline else proc.name
    return first.startswith("python") or proc.name.startswith("python") or first.startswith("pt_")


def find_jobs(procs: list[ProcInfo], own_pid: int = -1) -> list[Job]:
    """Group processes into jobs: each agent with the workers below it, plus workers with no agent
    (srun/mpirun-launched ranks) grouped by TORCHELASTIC_RUN_ID or MASTER_ADDR:MASTER_PORT. The ranks'
    helpers (split_ranks) go with their rank's job."""
    by_pid = {p.pid: p for p in procs}
    jobs: dict[object, Job] = {}
    for proc in procs:
        if proc.pid == own_pid:
            continue
        if is_agent(proc):
            jobs.setdefault(("agent", proc.pid), Job(proc.pid, proc.cmdline))
    ranks, helpers = split_ranks(procs, own_pid)
    job_of: dict[int, Job] = {}
    for proc in ranks:
        agent = _agent_of(proc, by_pid)
        # The worker's own RANK/LOCAL_RANK/WORLD_SIZE, read by the launch reader every command uses.
        launch = read_launch_env(proc.env)
        key: object = ("agent", agent) if agent is not None else (
            "run", proc.env.get("TORCHELASTIC_RUN_ID") or f"{proc.env.get('MASTER_ADDR')}:{proc.env.get('MASTER_PORT')}"
        )
        job = jobs.setdefault(key, Job(None, ()))
        job.workers.append(_worker(proc))
        job.world_size = job.world_size or launch.get("WORLD_SIZE")
        job.run_id = job.run_id or proc.env.get("TORCHELASTIC_RUN_ID", "")
        job_of[proc.pid] = job
    for helper in helpers:
        if helper.rank_pid in job_of:
            job_of[helper.rank_pid].helpers.append(helper)
    for job in jobs.values():
        job.workers.sort(key=lambda w: (w.rank if w.rank is not None else 1 << 30, w.pid))
    return [job for job in jobs.values() if job.workers]


def launch_key(proc: ProcInfo) -> Optional[tuple[Optional[str], Optional[str]]]:
    """The process's RANK and LOCAL_RANK as written in its environment (None when it has neither): a
    child inherits them unchanged, so equal keys mean "the same rank's process"."""
    rank, local = proc.env.get("RANK"), proc.env.get("LOCAL_RANK")
    return None if rank is None and local is None else (rank, local)


def split_ranks(procs: list[ProcInfo], own_pid: int = -1) -> tuple[list[ProcInfo], list[Helper]]:
    """The processes that are ranks, and the helpers of those ranks. Pure.

    A process is a rank when its parent is a launcher (a torchrun agent; a spawner, below) or when it
    carries RANK/LOCAL_RANK and no ancestor of it below the launcher carries the same RANK/LOCAL_RANK
    (its parent is srun/slurmstepd, mpirun, a shell, init). A process whose ancestor is a process of the
    job with the same RANK/LOCAL_RANK is a helper of the highest such ancestor, its rank: DataLoader
    workers (fork or spawn), a multiprocessing Pool, a Python subprocess, torch compile workers.

    A spawner is a process with two or more children whose RANK/LOCAL_RANK differ (a script that starts
    its ranks itself, e.g. torch.multiprocessing.spawn after setting RANK per child): its children are
    ranks even where one of them carries the spawner's own RANK, and the spawner is no rank."""
    by_pid = {p.pid: p for p in procs}
    spawners = _spawners(procs)
    ranks: list[ProcInfo] = []
    helpers: list[Helper] = []
    for proc in procs:
        if proc.pid == own_pid or is_agent(proc) or proc.pid in spawners:
            continue
        parent = by_pid.get(proc.ppid)
        under_launcher = parent is not None and (is_agent(parent) or parent.pid in spawners)
        agent = _agent_of(proc, by_pid)
        if parent is not None and is_agent(parent):
            # The agent's own workers are ranks even with an unreadable environ (rank unknown).
            ranks.append(proc)
            continue
        if not _has_rank(proc):
            continue
        owner = None if under_launcher else _rank_ancestor(proc, by_pid, spawners, own_pid)
        if owner is not None:
            helpers.append(Helper(proc.pid, owner.pid, helper_kind(proc, owner), proc.cmdline))
        elif (agent is not None or _is_python(proc)) and not _is_helper(proc):
            # multiprocessing's resource tracker of a spawner carries its RANK but is never a rank.
            ranks.append(proc)
    ranked = {p.pid for p in ranks}
    # A helper's owner is its highest same-RANK ancestor; it is a rank unless it sits under no launcher
    # and is no Python process (then neither is kept).
    return ranks, [h for h in helpers if h.rank_pid in ranked]


def _spawners(procs: list[ProcInfo]) -> set[int]:
    keys: dict[int, set[object]] = {}
    for proc in procs:
        key = launch_key(proc)
        if key is not None and _has_rank(proc) and not is_agent(proc):
            keys.setdefault(proc.ppid, set()).add(key)
    return {pid for pid, distinct in keys.items() if len(distinct) >= 2}


def _rank_ancestor(
    proc: ProcInfo, by_pid: Mapping[int, ProcInfo], spawners: set[int], own_pid: int
) -> Optional[ProcInfo]:
    """The highest ancestor with the process's RANK/LOCAL_RANK, below the nearest launcher (agent or
    spawner); None when there is none. A bounded walk: pid loops must not spin."""
    key = launch_key(proc)
    found: Optional[ProcInfo] = None
    seen: set[int] = set()
    current = by_pid.get(proc.ppid)
    while current is not None and current.pid not in seen and len(seen) < 64:
        if is_agent(current) or current.pid in spawners or current.pid == proc.pid:
            break
        if current.pid != own_pid and launch_key(current) == key:
            found = current
        seen.add(current.pid)
        current = by_pid.get(current.ppid)
    return found


# psutil's name of a process is its main thread's name, which torch sets in the processes it starts.
_DATALOADER_WORKER_NAME = "pt_data_worker"
# What helper_kind calls a helper, and the plural for several of them.
HELPER_KINDS = {
    "DataLoader worker": "DataLoader workers",
    "torch compile worker": "torch compile workers",
    "multiprocessing bookkeeping process": "multiprocessing bookkeeping processes",
    "multiprocessing spawn child": "multiprocessing spawn children",
    "multiprocessing fork child": "multiprocessing fork children",
    "Python subprocess": "Python subprocesses",
    "process": "processes",
}


def helper_kind(proc: ProcInfo, rank: Optional[ProcInfo] = None) -> str:
    """What a rank's helper process is (a key of HELPER_KINDS), from its name and command line (no stack
    is read for it): a DataLoader worker names itself pt_data_worker, spawn's children run spawn_main, a
    fork child keeps its rank's command line."""
    joined = " ".join(proc.cmdline[:6])
    if proc.name == _DATALOADER_WORKER_NAME:
        return "DataLoader worker"
    if "compile_worker" in joined:
        return "torch compile worker"
    if _is_helper(proc):
        return "multiprocessing bookkeeping process"
    if _is_spawned(proc):
        return "multiprocessing spawn child"
    if rank is not None and proc.cmdline == rank.cmdline:
        return "multiprocessing fork child"
    return "Python subprocess" if _is_python(proc) else "process"


def helpers_below(members: list[ProcInfo], procs: list[ProcInfo]) -> list[Helper]:
    """The helpers of `members`, ranks that select_job took from a pid no rule recognises (an mp.spawn
    parent's children, which may carry no RANK at all): their Python descendants with the member's
    RANK/LOCAL_RANK, or any when the member carries none (its rank is set in code)."""
    by_pid = {p.pid: p for p in procs}
    member_pids = {m.pid for m in members}
    out = []
    for proc in procs:
        if proc.pid in member_pids or not _is_python(proc):
            continue
        seen: set[int] = set()
        current = by_pid.get(proc.ppid)
        while current is not None and current.pid not in seen and len(seen) < 64:
            if current.pid in member_pids:
                if launch_key(current) is None or launch_key(current) == launch_key(proc):
                    out.append(Helper(proc.pid, current.pid, helper_kind(proc, current), proc.cmdline))
                break
            seen.add(current.pid)
            current = by_pid.get(current.ppid)
    return out


def _agent_of(proc: ProcInfo, by_pid: Mapping[int, ProcInfo]) -> Optional[int]:
    """The nearest agent among the process's ancestors (bounded walk: pid loops must not spin)."""
    seen = set()
    current = by_pid.get(proc.ppid)
    while current is not None and current.pid not in seen and len(seen) < 64:
        if is_agent(current):
            return current.pid
        seen.add(current.pid)
        current = by_pid.get(current.ppid)
    return None


def of_slurm_job(jobs: list[Job], slurm_job_id: Optional[str]) -> list[Job]:
    """The jobs whose ranks run in Slurm job `slurm_job_id` (ddpdoctor's own SLURM_JOB_ID when it runs
    as a step of that job, `srun --overlap --jobid J`), or all of them when none is known to: a node
    shared with other jobs must not make the one asked about ambiguous."""
    if not slurm_job_id:
        return jobs
    mine = [j for j in jobs if any(w.env.get("SLURM_JOB_ID") == slurm_job_id for w in j.workers)]
    return mine or jobs


def select_job(
    jobs: list[Job],
    pid: Optional[int],
    procs: Optional[list[ProcInfo]] = None,
    slurm_job_id: Optional[str] = None,
) -> tuple[Optional[Job], str]:
    """The job to diagnose: the one holding `pid` (agent or worker), or the only one (of Slurm job
    `slurm_job_id` when given, see of_slurm_job); else why not.

    A `pid` that is in no job (a launcher ddpdoctor does not know, e.g. `mp.spawn`, whose ranks set RANK
    in code) is taken as the parent of its Python children, or as a lone rank."""
    if pid is not None:
        for job in jobs:
            if job.agent_pid == pid or any(w.pid == pid for w in job.workers):
                return job, ""
        for job in jobs:
            # A rank's DataLoader worker or subprocess: the job of its rank (listed among its helpers).
            if any(h.pid == pid for h in job.helpers):
                return job, ""
        by_pid = {p.pid: p for p in procs or []}
        if procs is not None and pid not in by_pid:
            return None, f"no such process: {pid} (not running on this node, or not visible from here)"
        if pid in by_pid and is_agent(by_pid[pid]):
            # A torchrun agent that has started no worker: it waits in the rendezvous for other nodes (or
            # between restarts). A job of its own, with no rank yet (rendezvous.verdict_agent_waiting).
            return Job(pid, by_pid[pid].cmdline), ""
        if pid in by_pid:
            parent = by_pid[pid]
            # Only processes that look like ranks: RANK/LOCAL_RANK set, or children that mp.spawn started
            # (their command line says so). Any Python process, or PID 1, is no job (#26: "OK, no hang").
            # A spawned child is a rank itself (mp.spawn's parent is not spawned): its own spawned children
            # are its DataLoader workers or Pool, not ranks.
            children = [] if _is_spawned(parent) else [
                p for p in procs or []
                if p.ppid == pid and _is_python(p) and not _is_helper(p) and (_has_rank(p) or _is_spawned(p))
            ]  # fmt: skip
            members = children or ([parent] if _is_python(parent) and (_has_rank(parent) or _is_spawned(parent)) else [])
            if members:
                workers = [_worker(p) for p in members]
                return Job(
                    pid if children else None, parent.cmdline if children else (), workers,
                    helpers=helpers_below(members, procs or []),
                ), ""
        return None, (
            f"process {pid} is not a distributed job: not a torchrun agent, and neither it nor its Python "
            "children carry RANK/LOCAL_RANK or were started by torch.multiprocessing.spawn"
        )
    jobs = of_slurm_job(jobs, slurm_job_id)
    if not jobs:
        return None, "no distributed job found on this node (no torchrun agent, no process with RANK set)"
    jobs = merge_runs(jobs)
    if len(jobs) > 1:
        listing = "; ".join(
            f"agent {j.agent_pid}" if j.agent_pid else f"ranks pid {','.join(str(w.pid) for w in j.workers[:4])}"
            for j in jobs
        )
        return None, f"{len(jobs)} jobs on this node ({listing}): pick one with --pid"
    return jobs[0], ""


def merge_runs(jobs: list[Job]) -> list[Job]:
    """Agents of one run on this node (`srun --ntasks-per-node=8 torchrun --nproc-per-node 1`: one agent
    per rank, all with the same TORCHELASTIC_RUN_ID) are one job. `--pid AGENT` still picks one agent's
    ranks (select_job looks at the jobs before they are merged)."""
    out: list[Job] = []
    by_run: dict[str, Job] = {}
    for job in jobs:
        if not job.run_id or job.agent_pid is None:
            out.append(job)
            continue
        first = by_run.get(job.run_id)
        if first is None:
            merged = Job(job.agent_pid, job.agent_cmdline, list(job.workers), job.world_size, job.run_id,
                         helpers=list(job.helpers))
            by_run[job.run_id] = merged
            out.append(merged)
            continue
        first.workers.extend(job.workers)
        first.helpers.extend(job.helpers)
        first.more_agents = (*first.more_agents, job.agent_pid)
        first.world_size = first.world_size or job.world_size
    for job in out:
        job.workers.sort(key=lambda w: (w.rank if w.rank is not None else 1 << 30, w.pid))
    return out


def forked_orphans(
    workers: list[Worker], leaders: Mapping[int, tuple[int, int]], dead: set[int]
) -> list[tuple[Worker, int]]:
    """(worker, its gone leader) for the rank-looking processes that are children a rank forked (os.fork, a fork
    Process) and outlived it. Pure. `leaders`: pid -> (process group, session) from /proc/PID/stat; `dead`: the
    leader pids no longer alive. A process whose group or session leader is a dead process, in a job whose other
    ranks each lead their own group or session (setsid, start_new_session: srun, most launch scripts), was not
    started by the launcher: a rank forked it (it carries that rank's RANK) and then exited."""
    orphans: list[tuple[Worker, int]] = []
    for index in (0, 1):  # process group, then session
        leading = [w for w in workers if leaders.get(w.pid, (0, 0))[index] == w.pid]
        if not leading:
            continue
        for w in workers:
            leader = leaders.get(w.pid, (0, 0))[index]
            if leader and leader != w.pid and leader in dead and all(o is not w for o, _ in orphans):
                orphans.append((w, leader))
    return orphans

