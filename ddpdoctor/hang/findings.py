"""The findings of `ddpdoctor hang`: their declarations, the facts they are judged from, and one finding
per source (job, stacks, NCCL RAS, Flight Recorder). Pure; verdict.py builds the root-cause verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.hang.align import Alignment, describe_entry
from ddpdoctor.hang.fr import Dump
from ddpdoctor.hang.procs import HELPER_KINDS, Job
from ddpdoctor.hang.progress import Sample
from ddpdoctor.hang.ras import RasStatus
from ddpdoctor.hang.stacks import RankStack, describe_stack, group_stacks, odd_ones_out
from ddpdoctor.parsers.pytraceback import PyTraceback

VERDICT = define(
    "hang.verdict",
    "Why the job hangs",
    "The root cause of a hanging job, from every source `ddpdoctor hang` could read (Python stacks of "
    "the ranks, Flight Recorder dumps, NCCL RAS): which rank is behind or out of step, where in the "
    "code, and what the other ranks wait in. Its kind (`data.kind`) is `behind` (a rank never reached "
    "the collective the others wait in), `desync` (ranks issued different collectives at the same "
    "sequence number), `only_some` (a collective only some ranks issued, e.g. inside `if rank == 0:`), "
    "`stack_outlier` (one rank's stack differs from all others, no collective data), `stopped` (a rank "
    "is stopped by SIGSTOP, Ctrl-Z or a debugger), `spinning` (a rank runs a Python loop at full CPU, "
    "never in a collective, while the others stand still), `exited` (a local rank's process is gone "
    "while the others wait in a collective: uneven data), `missing` (RAS: a "
    "rank is unresponsive), `all_waiting` (every local rank waits in the same collective: the cause is "
    "on another node or in the network), `all_blocked` (nothing moved and every rank blocks outside "
    "torch.distributed, e.g. both in a socket send: all are named), `progressing` (something moved between the snapshots taken a "
    "second apart: not a hang; the slowest rank is named as a straggler, a warning), `joining` (every rank "
    "waits in init_process_group in every snapshot: the ranks that never joined, or that were given another "
    "MASTER_PORT or WORLD_SIZE, are named), `not_distributed` "
    "(--pid names a process with no sign of torch.distributed) or `none` (no sign of a hang). When the "
    "culprit waits in no collective, `data.mechanism` says why, read from all its threads: a stable dotted "
    "id (`lock.order_deadlock`, `lock.self_deadlock`, `queue.join_without_task_done`, "
    "`queue.get_no_producer`, `loop.poll_retry`, `event.never_set`, `semaphore.count_zero`, `process.join_child`, "
    "`subprocess.wait_child`, ...; all in docs/hang.md) and the phrase the summary gives after `why it waits:`.",
    "Fix the code path of the named rank: make every rank issue the same collectives in the same order.",
)
STACKS = define(
    "hang.stacks",
    "Python stacks of the ranks",
    "Each local rank's Python stack (`py-spy dump --pid`), grouped: identical stacks are one group; a "
    "rank whose stack differs from the rest is named. Needs py-spy (`pip install ddpdoctor[hang]`) and "
    "permission to ptrace the ranks.",
    "Install py-spy (`pip install 'ddpdoctor[hang]'`) and allow ptrace: run as the job's user with "
    "`kernel.yama.ptrace_scope` 0 (`sysctl kernel.yama.ptrace_scope=0`), as root, or in a container "
    "started with `--cap-add SYS_PTRACE`.",
)
RAS = define(
    "hang.ras",
    "NCCL RAS",
    "NCCL's RAS port (NCCL >= 2.24; 127.0.0.1:28028 or NCCL_RAS_ADDR) queried for the job's "
    "communicators: ranks that are missing or unresponsive, ranks that launched fewer collectives than "
    "their peers. Not listening means no NCCL communicator runs on this node (gloo jobs have none).",
    "If the job uses NCCL, check `NCCL_RAS_ENABLE` is not 0 and query the address in NCCL_RAS_ADDR.",
)
FLIGHT_RECORDER = define(
    "hang.flight_recorder",
    "Flight Recorder dumps",
    "torch's Flight Recorder dumps of the ranks (`--fr PATH|PREFIX`), read with a restricted unpickler "
    "that builds only plain containers and scalars (a pickle asking for anything else is refused, never "
    "run), then aligned by (process group, collective sequence id).",
    "Enable the recorder before starting the job: `TORCH_FR_BUFFER_SIZE=2000 "
    "TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_ TORCH_NCCL_DUMP_ON_TIMEOUT=1`.",
)
JOB = define(
    "hang.job",
    "Job found on this node",
    "The distributed job's processes on this node: the torchrun/elastic agent and its workers, their "
    "RANK and LOCAL_RANK read from /proc/PID/environ.",
    "Point at the job with `--pid PID` (the torchrun agent or any rank), or run on a node where it runs.",
)


@dataclass(frozen=True)
class IoPeer:
    """A process at the other end of a rank's socket or pipe (edge.peers.other_ends) and what it does now: its
    stacks and the locals of its main thread's innermost user frame (py-spy dump --locals)."""

    pid: int
    via: str
    argv: tuple[str, ...]
    stack: Optional[RankStack]
    locals: dict[str, str] = field(default_factory=dict)


@dataclass
class HangFacts:
    host: str
    job: Optional[Job] = None
    job_error: str = ""
    stacks: list[RankStack] = field(default_factory=list)
    pyspy_missing: bool = False
    ptrace_scope: Optional[int] = None
    cap_sys_ptrace: Optional[bool] = None
    ras: Optional[RasStatus] = None
    ras_error: str = ""
    ras_error_kind: str = ""
    ras_addr: str = ""
    ras_command: str = ""
    dumps: list[Dump] = field(default_factory=list)
    dump_errors: list[str] = field(default_factory=list)
    fr_spec: str = ""
    sources: dict[str, Sequence[str]] = field(default_factory=dict)  # filename -> lines (read, not run)
    duration_s: float = 0.0
    # Snapshots about a second apart (progress.py tells hung from slow with them); `stacks` is the last.
    samples: list[Sample] = field(default_factory=list)
    # The dumps as first read, when the files changed before the last snapshot (their seqs grew).
    earlier_dumps: list[Dump] = field(default_factory=list)
    dump_mtimes: dict[str, float] = field(default_factory=dict)  # dump source -> mtime (epoch seconds)
    dump_skipped: list[str] = field(default_factory=list)  # files left out unread (partial *.tmp dumps)
    rank_start: dict[int, float] = field(default_factory=dict)  # pid -> process start (epoch seconds)
    # (rank, pid, MASTER_ADDR:MASTER_PORT, WORLD_SIZE) of ranks on this node outside the selected job that no
    # launcher started (a rank given another port or world size groups apart).
    strays: list[tuple[int, int, str, str]] = field(default_factory=list)
    agent_stack: Optional[RankStack] = None  # the torchrun agent's stack, read when it has no worker
    agent_start: Optional[float] = None  # and when it started (epoch seconds)
    taken_at: float = 0.0  # when the last snapshot was taken (epoch seconds): how long the ranks have run
    # pid of a rank waiting on its DataLoader -> its worker processes' stacks
    worker_stacks: dict[int, list[RankStack]] = field(default_factory=dict)
    # pid of a rank whose main thread waits on its own child processes (Process.join, Popen.wait, a Pool)
    # -> the Python children's stacks: the reason is where the child is
    helper_stacks: dict[int, list[RankStack]] = field(default_factory=dict)
    # rank pid -> its live child processes (pid, kind, command line), read after the last snapshot: what
    # a rank in Process.join / Popen.wait waits for (a `sleep` child carries no readable RANK, so it is
    # no helper).
    children: dict[int, list[tuple[int, str, str]]] = field(default_factory=dict)
    # child pid -> the kernel wait of each of its threads (/proc/PID/task/*/wchan): `anon_pipe_write` is a
    # child blocked writing to a pipe nobody reads.
    child_wchans: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # pid of a rank whose script has ended (its main thread is in the interpreter's exit: multiprocessing's exit
    # handler, threading._shutdown) -> (its stderr file, the last traceback in that file's tail): what ended it.
    exit_tracebacks: dict[int, tuple[str, PyTraceback]] = field(default_factory=dict)
    # (pid, rank, the gone leader) of processes that carry a rank's RANK but are a child it forked and outlived
    # (procs.forked_orphans): no rank, the sign that the rank itself exited; with the last traceback of the
    # stderr file they inherited from it, when there is one.
    orphans: list[tuple[int, Optional[int], int]] = field(default_factory=list)
    orphan_tracebacks: dict[int, tuple[str, PyTraceback]] = field(default_factory=dict)
    # pid -> name -> repr: the locals of a rank's innermost user frame when it sleeps there (py-spy --locals).
    sleep_locals: dict[int, dict[str, str]] = field(default_factory=dict)
    # pid -> two reads, `loop_gap_s` apart, of (line, name -> repr) of the innermost user frame of a rank or
    # DataLoader worker that runs Python in a loop: what its exit condition reads, and whether it changed.
    loop_locals: dict[int, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    loop_gap_s: float = 0.0
    # pid -> the arguments of the rooted collective or point-to-point call a rank waits in (broadcast's src,
    # recv's src and tag; py-spy --locals of that torch.distributed frame), with "op" its name.
    collective_args: dict[int, dict[str, str]] = field(default_factory=dict)
    # pid -> name -> repr: the locals of the user frame that calls a collective on a named group
    # (`group=expert_group`), one rank per call line: what `new_group(expert_ranks)` was given.
    group_locals: dict[int, dict[str, str]] = field(default_factory=dict)
    # name -> repr: the arguments of init_process_group as one waiting rank passed them (its world_size, rank),
    # read when ranks wait inside it (py-spy --locals of torch's init_process_group frame).
    init_locals: dict[str, str] = field(default_factory=dict)
    # pid -> (init_method, cwd) of each rank waiting in init_process_group with a file:// or tcp:// init_method: a
    # relative path, a per-rank path or a per-rank port puts the ranks in different stores.
    init_methods: dict[int, tuple[str, str]] = field(default_factory=dict)
    # pid -> name -> repr: the locals of the user frame that calls init_process_group, every rank's (at most 8),
    # read when every rank waits there: a store prefix or run id each rank computed for itself shows up here.
    joining_locals: dict[int, dict[str, str]] = field(default_factory=dict)
    # rank pid -> the processes at the other end of its sockets and pipes (not the job's own), read for a rank
    # outside every collective whose main thread blocks in code of its own (a read, a recv): who should answer.
    io_peers: dict[int, list[IoPeer]] = field(default_factory=dict)
    pid_error: str = ""  # --pid names no process
    job_skipped: str = ""  # why this node's processes were not looked at (--ras-addr without --pid)
    fr_from_job: bool = False  # fr_spec is the job's TORCH_FR_DUMP_TEMP_FILE, not --fr
    pyspy_found: bool = False


def format_ranks(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 4] -> '0-2, 4'."""
    values = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for value in values:
        if start is None:
            start = prev = value
        elif value == prev + 1:
            prev = value
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = value
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def plural_ranks(ranks: Sequence[int]) -> str:
    """'rank 2', 'ranks 0-1, 3'; a process whose rank is unknown (its environ was unreadable) is carried
    as -pid and shown as 'pid N (rank unknown)'."""
    known = [r for r in ranks if r >= 0]
    unknown = [f"pid {-r}" for r in ranks if r < 0]
    parts = ([("rank " if len(known) == 1 else "ranks ") + format_ranks(known)] if known else []) + unknown
    return " and ".join(parts) + (" (rank unknown)" if unknown else "")


def ranks_verb(ranks: Sequence[int], singular: str, plural: str) -> str:
    """`plural_ranks(ranks)` followed by the verb that agrees with it: 'rank 0 waits', 'ranks 0-1 wait'."""
    return f"{plural_ranks(ranks)} {singular if len(ranks) == 1 else plural}"


def group_name(pg: str, name: str) -> str:
    if pg in ("0", "") or name == "default_pg":
        return "the default group"
    return f"process group {pg}" + (f" ({name})" if name else "")


def job_dict(facts: HangFacts) -> Optional[dict[str, Any]]:
    if facts.job is None:
        return None
    rank_by_pid = {w.pid: w.rank for w in facts.job.workers}
    return {
        "agent_pid": facts.job.agent_pid,
        "world_size": facts.job.world_size,
        "ranks": [
            {"rank": w.rank, "local_rank": w.local_rank, "pid": w.pid, **({"rank_from": w.rank_from} if w.rank_from else {})}
            for w in facts.job.workers
        ],
        "helpers": [
            {"pid": h.pid, "rank_pid": h.rank_pid, "rank": rank_by_pid.get(h.rank_pid), "kind": h.kind}
            for h in facts.job.helpers[:MAX_HELPERS_LISTED]
        ],
    }


def alignment_dict(alignment: Optional[Alignment], facts: HangFacts, vetting: Any = None) -> Optional[dict[str, Any]]:
    if alignment is None and not facts.dump_errors and vetting is None and not facts.dump_skipped:
        return None
    out: dict[str, Any] = {
        "ranks": [], "divergences": [], "last_enqueued": {}, "errors": facts.dump_errors,
        "ignored": list(vetting.ignored) if vetting is not None else [],
        "ranks_without_dump": list(vetting.ranks_without_dump) if vetting is not None else [],
        "skipped_partial": list(facts.dump_skipped),
    }
    if alignment is not None:
        out["ranks"] = list(alignment.ranks)
        out["last_enqueued"] = {pg: {str(r): s for r, s in v.items()} for pg, v in alignment.last_enqueued.items()}
        out["divergences"] = [
            {
                "kind": d.kind, "process_group": d.pg, "seq": d.seq, "culprit_ranks": list(d.culprits),
                "other_ranks": list(d.others), "tie": d.tie,
                "culprit": describe_entry(d.culprit_entry) if d.culprit_entry else None,
                "others": describe_entry(d.other_entry) if d.other_entry else None,
            }
            for d in alignment.divergences
        ]
    return out


# Helper processes listed per job (a rank with a large DataLoader and a compile pool has dozens).
MAX_HELPERS_LISTED = 256


def describe_helpers(job: Job) -> list[str]:
    """One line per rank that has helpers: 'rank 0 helpers: 2 DataLoader workers (pids 11, 12), 1 Python
    subprocess (pid 13)'. Helpers inherited the rank's RANK; they are never counted as ranks."""
    lines = []
    for worker in job.workers:
        mine = [h for h in job.helpers if h.rank_pid == worker.pid]
        if not mine:
            continue
        kinds: dict[str, list[int]] = {}
        for helper in mine:
            kinds.setdefault(helper.kind, []).append(helper.pid)
        parts = [
            f"{len(pids)} {HELPER_KINDS.get(kind, kind) if len(pids) > 1 else kind} "
            f"(pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids[:8]))}{', ...' if len(pids) > 8 else ''})"
            for kind, pids in kinds.items()
        ]
        who = f"rank {worker.rank}" if worker.rank is not None else f"pid {worker.pid} (rank unknown)"
        lines.append(f"{who} helpers: {', '.join(parts)}")
    return lines


def job_finding(facts: HangFacts) -> Finding:
    if facts.job is None and facts.job_skipped:
        return JOB.finding(Severity.SKIP, facts.job_skipped)
    if facts.job is None:
        severity = Severity.SKIP if facts.dumps else Severity.ERROR
        why = facts.pid_error or facts.job_error or "no job found"
        return JOB.finding(severity, why, evidence=[Evidence("psutil.process_iter", "")])
    job = facts.job
    ranks = ", ".join(
        f"rank {w.rank if w.rank is not None else '?'} pid {w.pid}" for w in job.workers[:16]
    )
    unreadable = [w.pid for w in job.workers if w.env_error]
    spawned = [w for w in job.workers if w.rank_from]
    summary = f"{len(job.workers)} local rank(s) of a {job.world_size or '?'}-rank job" + (
        (f" started by torch.multiprocessing.spawn from pid {job.agent_pid}" if spawned else f" under agent pid {job.agent_pid}")
        if job.agent_pid else ""
    ) + (
        f" and {len(job.more_agents)} more agent(s) of run {job.run_id} (pid {', '.join(map(str, job.more_agents[:8]))})"
        if job.more_agents else ""
    )
    if unreadable and not spawned:
        summary += f"; /proc/PID/environ unreadable for pid {', '.join(map(str, unreadable[:8]))} (rank unknown)"
    if spawned:
        summary += f"; ranks (set in code, not in the environment) read from {spawned[0].rank_from}"
    helpers = describe_helpers(job)
    if helpers:
        # Processes that inherited a rank's RANK: named so nobody takes them for ranks, never counted.
        summary += "; " + "; ".join(helpers[:8]) + (f"; {len(helpers) - 8} more" if len(helpers) > 8 else "")
    return JOB.finding(
        Severity.INFO, summary,
        evidence=[Evidence("psutil.process_iter + /proc/PID/environ", ranks)]
        + [Evidence(f"rank {w.rank} pid {w.pid}", w.rank_from) for w in spawned[:16]]
        + [Evidence("helper processes (same RANK as their rank's, below it)", line) for line in helpers[:16]],
        data=job_dict(facts) or {},
    )


def stacks_finding(facts: HangFacts) -> Finding:
    got = [s for s in facts.stacks if s.main is not None]
    failed = [s for s in facts.stacks if s.main is None]
    if not facts.stacks:
        return STACKS.finding(Severity.SKIP, "no rank to look at" if facts.job is None else "not collected")
    if facts.pyspy_missing:
        return STACKS.finding(
            Severity.ERROR,
            "py-spy is not installed, so no rank's Python stack could be read: `pip install 'ddpdoctor[hang]'` "
            "(or `pip install py-spy`)",
            evidence=[Evidence("shutil.which('py-spy')", "not found")],
            fix="pip install 'ddpdoctor[hang]'",
        )
    evidence = []
    for group in group_stacks(got):
        evidence.append(Evidence(f"py-spy dump --json --pid {group.example.pid}", f"{plural_ranks(group.ranks)}: {describe_stack(group.example)}"))
    for stack in failed[:4]:
        evidence.append(Evidence(f"py-spy dump --json --pid {stack.pid}", stack.error))
    if failed and not got:
        kinds = {s.error_kind for s in failed}
        if "permission" in kinds:
            reasons = []
            if facts.ptrace_scope is not None and facts.ptrace_scope > 0:
                reasons.append(f"kernel.yama.ptrace_scope is {facts.ptrace_scope}")
            if facts.cap_sys_ptrace is False:
                reasons.append("this process lacks CAP_SYS_PTRACE")
            return STACKS.finding(
                Severity.ERROR,
                "py-spy may not attach to the ranks (ptrace denied"
                + (": " + ", ".join(reasons) if reasons else "")
                + "): run ddpdoctor as root, or as the job's user with `sysctl kernel.yama.ptrace_scope=0`; in "
                "a container, start it with `--cap-add SYS_PTRACE`",
                evidence=evidence,
                # py-spy is there (it ran and was refused): the fix is the permission, not an install.
                fix="Allow ptrace: run as the job's user with `sysctl kernel.yama.ptrace_scope=0`, as root, or in "
                "a container started with `--cap-add SYS_PTRACE` (Kubernetes: securityContext.capabilities.add: "
                '["SYS_PTRACE"]).',
            )
        # py-spy ran (it is installed): the definition's "Install py-spy" would be no fix at all.
        fix = None if not facts.pyspy_found else (
            "Check that the pids are Python processes of the job and still running; `py-spy dump --pid PID` "
            "shows py-spy's own message."
        )
        return STACKS.finding(Severity.ERROR, f"no stack could be read: {failed[0].error}", evidence=evidence, fix=fix)
    groups = group_stacks(got)
    odd = odd_ones_out(groups)
    summary = f"{len(got)} stack(s) in {len(groups)} group(s)"
    if odd:
        summary += "; odd one(s) out: " + "; ".join(
            f"{plural_ranks(g.ranks)} in {describe_stack(g.example)}" for g in odd
        )
    if failed:
        summary += f"; {len(failed)} rank(s) unreadable ({failed[0].error})"
    return STACKS.finding(Severity.WARN if odd else Severity.INFO, summary, evidence=evidence, fix="" if not odd else None)


def ras_finding(facts: HangFacts) -> Finding:
    command = f"{facts.ras_addr}: {facts.ras_command}" if facts.ras_addr else "NCCL RAS"
    if facts.ras is None:
        if not facts.ras_error:
            return RAS.finding(Severity.SKIP, "not queried (--no-ras)")
        if facts.ras_error_kind == "refused":
            return RAS.finding(
                Severity.SKIP,
                f"{facts.ras_error} (NCCL < 2.24, RAS disabled, no NCCL communicator created yet — NCCL starts RAS "
                "with the first, which torch creates in the first collective — or a job without NCCL such as gloo)",
                evidence=[Evidence(command, facts.ras_error)],
            )
        return RAS.finding(Severity.ERROR, facts.ras_error, evidence=[Evidence(command, facts.ras_error)])
    ras = facts.ras
    excerpt = (ras.errors_text + "\n" + ras.warnings_text).strip()[:600]
    if ras.missing or ras.behind or ras.dead_processes:
        parts = []
        if ras.missing:
            parts.append(f"missing/unresponsive rank(s) {format_ranks([r.rank for r in ras.missing if r.rank >= 0]) or '?'}")
        if ras.behind:
            parts.append(f"rank(s) {format_ranks([r.rank for r in ras.behind])} launched fewer collectives")
        if ras.dead_processes:
            parts.append(f"{len(ras.dead_processes)} process(es) considered dead")
        return RAS.finding(Severity.WARN, f"NCCL {ras.nccl_version}: " + "; ".join(parts),
                           evidence=[Evidence(command, excerpt)], fix="")
    summary = f"NCCL {ras.nccl_version}: {len(ras.comms) or len(ras.group_rows)} communicator(s), every rank answered, counts agree"
    if ras.timeouts:
        summary += f"; {ras.timeouts} RAS timeout(s) while gathering"
    return RAS.finding(Severity.INFO, summary, evidence=[Evidence(command, excerpt or "(no errors, no warnings)")])


def _anything_recorded(dumps: list[Dump]) -> bool:
    return any(dump.entries or dump.pg_status or dump.pg_names or dump.pg_ranks for dump in dumps)


def fr_finding(facts: HangFacts, alignment: Optional[Alignment], vetting: Any = None) -> Finding:
    """The Flight Recorder source: what the kept dumps say, and which were left out and why (`vetting`:
    evidence.DumpVetting)."""
    evidence = [Evidence(f"read {facts.fr_spec}", e) for e in facts.dump_errors[:4]]
    notes = list(vetting.notes()) if vetting is not None else []
    if facts.dump_skipped:
        notes.append(f"skipped {len(facts.dump_skipped)} partial dump(s) (*.tmp, still being written)")
    evidence += [Evidence(f"read {facts.fr_spec}", note) for note in notes]
    if alignment is None:
        if notes and (vetting is not None and vetting.ignored or not facts.dump_errors):
            return FLIGHT_RECORDER.finding(
                Severity.WARN, "no dump of the live job: " + "; ".join(notes), evidence=evidence, fix=""
            )
        if facts.dump_errors:
            return FLIGHT_RECORDER.finding(Severity.ERROR, facts.dump_errors[0], evidence=evidence)
        if facts.fr_from_job:
            return FLIGHT_RECORDER.finding(
                Severity.SKIP,
                f"the job's TORCH_FR_DUMP_TEMP_FILE ({facts.fr_spec}) holds no dump yet: torch writes one per rank "
                "when the NCCL watchdog times out (TORCH_NCCL_DUMP_ON_TIMEOUT=1); pass --fr for dumps elsewhere",
            )
        return FLIGHT_RECORDER.finding(Severity.SKIP, "no dump given (--fr)" if not facts.fr_spec else f"no dump found at {facts.fr_spec}")
    summary = f"{len(alignment.ranks)} rank dump(s) ({format_ranks(alignment.ranks)})"
    without = list(vetting.ranks_without_dump) if vetting is not None else []
    worst = alignment.worst()
    if worst is not None:
        summary += f"; first divergence: {worst.kind} at #{worst.seq} of {group_name(worst.pg, worst.pg_name)}"
    elif not _anything_recorded(vetting.kept if vetting is not None else facts.dumps):
        # An empty buffer agrees with everything: saying "all ranks agree" of it would be a verdict about
        # nothing (seen on GPU nodes: dumps taken with the API of another backend's recorder).
        summary += (
            "; none records a collective or a process group, so they cannot show who is behind (recording was "
            "off — TORCH_FR_BUFFER_SIZE unset or 0 when the job started — or the dump was taken before any "
            "collective, or from another backend's recorder)"
        )
        if without:
            summary += f" ({plural_ranks(without)}: no dump)"
    elif without:
        summary += f"; the dumped ranks agree on every recorded collective ({plural_ranks(without)}: no dump)"
    else:
        summary += "; all ranks agree on every recorded collective"
    if without and worst is not None:
        summary += f"; no dump of {plural_ranks(without)}"
    if notes:
        summary += "; " + "; ".join(notes)
    for pg, last in alignment.last_enqueued.items():
        evidence.append(Evidence(f"pg {pg} last enqueued", ", ".join(f"rank {r}: #{s}" for r, s in sorted(last.items()))))
    if facts.dump_errors:
        summary += f"; {len(facts.dump_errors)} file(s) refused or unreadable"
    return FLIGHT_RECORDER.finding(Severity.INFO, summary, evidence=evidence)
