"""Judge a hanging job from what probe_io gathered: one verdict, root cause first, plus a finding per
source (stacks, NCCL RAS, Flight Recorder). Pure: facts in, HangReport out; nothing here reads or prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ddpdoctor.hang.align import Alignment, Divergence, align_dumps, describe_entry
from ddpdoctor.hang.fr import Dump
from ddpdoctor.hang.procs import Job
from ddpdoctor.hang.ras import RasStatus
from ddpdoctor.hang.ras import to_dict as ras_to_dict
from ddpdoctor.hang.source import classify_split
from ddpdoctor.hang.stacks import RankStack, describe_stack, group_stacks, odd_ones_out
from ddpdoctor.hang.stacks import to_dict as stack_to_dict
from ddpdoctor.model import Evidence, Finding, Severity, define, exit_code_for

HANG_SCHEMA_VERSION = "ddpdoctor.hang/1"

VERDICT = define(
    "hang.verdict",
    "Why the job hangs",
    "The root cause of a hanging job, from every source `ddpdoctor hang` could read (Python stacks of "
    "the ranks, Flight Recorder dumps, NCCL RAS): which rank is behind or out of step, where in the "
    "code, and what the other ranks wait in. Its kind (`data.kind`) is `behind` (a rank never reached "
    "the collective the others wait in), `desync` (ranks issued different collectives at the same "
    "sequence number), `only_some` (a collective only some ranks issued, e.g. inside `if rank == 0:`), "
    "`stack_outlier` (one rank's stack differs from all others, no collective data), `missing` (RAS: a "
    "rank is unresponsive), `all_waiting` (every local rank waits in the same collective: the cause is "
    "on another node or in the network) or `none` (no sign of a hang).",
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


@dataclass
class HangReport:
    host: str
    verdict: dict[str, Any]
    findings: list[Finding]
    facts: dict[str, Any]
    duration_s: float = 0.0

    def exit_code(self) -> int:
        return int(exit_code_for(self.findings))

    def to_dict(self) -> dict[str, Any]:
        from ddpdoctor import __version__

        return {
            "schema": HANG_SCHEMA_VERSION,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "host": self.host,
            "duration_s": round(self.duration_s, 3),
            "exit_code": self.exit_code(),
            "verdict": self.verdict,
            **self.facts,
            "findings": [{**f.to_dict(), "fix": f.fix or None} for f in self.findings],
        }


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


def _plural(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)


def _group_name(pg: str, name: str) -> str:
    if pg in ("0", "") or name == "default_pg":
        return "the default group"
    return f"process group {pg}" + (f" ({name})" if name else "")


class _Context:
    """Lookups the verdict needs: pid/host/stack by rank, source text by line."""

    def __init__(self, facts: HangFacts) -> None:
        self.facts = facts
        self.stack_by_rank = {s.rank: s for s in facts.stacks if s.rank is not None}
        self.pid_by_rank = {w.rank: w.pid for w in (facts.job.workers if facts.job else []) if w.rank is not None}

    def who(self, rank: int) -> str:
        pid = self.pid_by_rank.get(rank)
        return f"rank {rank} (pid {pid} on {self.facts.host})" if pid else f"rank {rank}"

    def code(self, filename: str, line: int) -> str:
        lines = self.facts.sources.get(filename)
        if lines and 0 < line <= len(lines):
            return lines[line - 1].strip()[:120]
        return ""

    def where_stack(self, rank: int) -> str:
        stack = self.stack_by_rank.get(rank)
        if stack is None or stack.main is None:
            return ""
        text = describe_stack(stack)
        frame = stack.user_frame()
        if frame is not None:
            code = self.code(frame.filename, frame.line)
            if code:
                text += f" `{code}`"
        return text

    def where_line(self, stack: RankStack) -> str:
        """`file:line `code`` of the rank's innermost user frame."""
        frame = stack.user_frame()
        if frame is None:
            return describe_stack(stack)
        code = self.code(frame.filename, frame.line)
        return frame.where() + (f" `{code}`" if code else "")

    def where_entry(self, entry: Any) -> str:
        text = describe_entry(entry)
        frame = entry.user_frame()
        if frame is not None:
            code = self.code(frame.filename, frame.line)
            if code:
                text += f" `{code}`"
        return text


def _culprit_records(ctx: _Context, ranks: Sequence[int]) -> list[dict[str, Any]]:
    out = []
    for rank in ranks:
        stack = ctx.stack_by_rank.get(rank)
        frame = stack.user_frame() if stack else None
        out.append(
            {
                "rank": rank,
                "pid": ctx.pid_by_rank.get(rank),
                "host": ctx.facts.host,
                "where": ctx.where_stack(rank) or None,
                "file": frame.filename if frame else None,
                "line": frame.line if frame else None,
            }
        )
    return out


def _verdict_from_fr(ctx: _Context, div: Divergence) -> dict[str, Any]:
    group = _group_name(div.pg, div.pg_name)
    culprits, others = list(div.culprits), list(div.others)
    lead = culprits[0]
    stack_where = ctx.where_stack(lead)
    others_wait = f"{_plural(others)} wait in " + (
        ctx.where_entry(div.other_entry) if div.other_entry is not None else f"#{div.others_last}"
    ) + f" of {group}"
    kind = div.kind
    frame_c = div.culprit_entry.user_frame() if div.culprit_entry is not None else None
    frame_o = div.other_entry.user_frame() if div.other_entry is not None else None
    branch_note = ""
    if kind == "desync" and frame_c and frame_o and frame_c.filename == frame_o.filename:
        lines = ctx.facts.sources.get(frame_c.filename)
        if lines:
            split, branch = classify_split(lines, frame_c.line, frame_o.line)
            if split == "only_some" and branch is not None:
                kind = "only_some"
                branch_note = f" inside `{branch.condition}` ({frame_c.filename}:{branch.if_line})"
            elif split == "branches" and branch is not None:
                branch_note = f" (ranks take different branches of `{branch.condition}` at line {branch.if_line})"
    if kind == "behind":
        where = stack_where or (
            f"its last collective was {ctx.where_entry(div.culprit_entry)}" if div.culprit_entry else
            f"its last collective was #{div.culprit_last}"
        )
        if stack_where:
            where = f"its stack is in {stack_where}"
        summary = (
            f"{ctx.who(lead) if len(culprits) == 1 else _plural(culprits)} "
            f"{'is' if len(culprits) == 1 else 'are'} behind: {where}, while {others_wait} "
            f"-> the cause is on {_plural(culprits)}, not the network"
        )
        fix = (
            f"Look at what {_plural(culprits)} does at that line instead of reaching the collective (a slow "
            "or blocked step, I/O, a dataloader, a host-device sync like .item()); if it is waiting on "
            "something else, fix that."
        )
    elif kind in ("only_some", "extra"):
        what = ctx.where_entry(div.culprit_entry) if div.culprit_entry is not None else f"#{div.seq}"
        if kind == "extra":
            summary = (
                f"{ctx.who(lead) if len(culprits) == 1 else _plural(culprits)} issued a collective the other ranks "
                f"did not: {what} of {group}, one more than {_plural(others)} (last #{div.others_last}) "
                f"-> the cause is a collective only some ranks call, not the network"
            )
        else:
            summary = (
                f"{ctx.who(lead) if len(culprits) == 1 else _plural(culprits)} issued {what}{branch_note} "
                f"that {_plural(others)} never issue: they went on to "
                f"{ctx.where_entry(div.other_entry) if div.other_entry is not None else 'another collective'} "
                f"-> the cause is a collective only some ranks call, not the network"
            )
            kind = "only_some"
        fix = (
            "Every rank of a process group must call every collective of that group: move the collective "
            "out of the rank-dependent branch (e.g. all ranks compute the metric and all_reduce it, then "
            "only rank 0 logs it), or use a subgroup that holds only the ranks that call it."
        )
    else:
        c_what = ctx.where_entry(div.culprit_entry) if div.culprit_entry is not None else "?"
        o_what = ctx.where_entry(div.other_entry) if div.other_entry is not None else "?"
        if div.tie:
            summary = (
                f"{_plural(others)} and {_plural(culprits)} are out of step (desync) at #{div.seq} of {group}: "
                f"{_plural(others)} issued {o_what}, {_plural(culprits)} issued {c_what}{branch_note} "
                f"-> the cause is rank-dependent control flow, not the network"
            )
        else:
            summary = (
                f"{ctx.who(lead) if len(culprits) == 1 else _plural(culprits)} is out of step (desync): it issued "
                f"{c_what} where {_plural(others)} issued {o_what}{branch_note} "
                f"-> the cause is the code path of {_plural(culprits)}, not the network"
            )
        fix = (
            "Make every rank issue the same collective (same op, sizes and dtypes) at the same point: look "
            "for an if/else on the rank or on data that differs between ranks before that line."
        )
        kind = "desync"
    return {
        "kind": kind,
        "summary": summary,
        "culprit_ranks": culprits,
        "other_ranks": others,
        "culprits": _culprit_records(ctx, culprits),
        "collective": {
            "process_group": div.pg,
            "process_group_name": div.pg_name,
            "seq": div.seq,
            "culprit_op": div.culprit_entry.op if div.culprit_entry is not None else None,
            "others_op": div.other_entry.op if div.other_entry is not None else None,
        },
        "tie": div.tie,
        "fix": fix,
        "source": "flight_recorder",
    }


def _verdict_from_stacks(ctx: _Context, stacks: list[RankStack]) -> Optional[dict[str, Any]]:
    groups = group_stacks(stacks)
    if not groups:
        return None
    odd = odd_ones_out(groups)
    waiting = [g for g in groups if g.example.waiting_in()]
    if odd:
        culprits = sorted(r for g in odd for r in g.ranks)
        main = groups[0] if groups[0] not in odd else next(g for g in groups if g not in odd)
        lead = culprits[0]
        main_where = describe_stack(main.example)
        who = ctx.who(lead) if len(culprits) == 1 else _plural(culprits)
        odd_wait = ctx.stack_by_rank[lead].waiting_in() if lead in ctx.stack_by_rank else None
        main_wait = main.example.waiting_in()
        if odd_wait and main_wait:
            # Both sides wait in a collective, at different places: the ranks are out of step.
            summary = (
                f"{who} waits in {odd_wait} at {ctx.where_line(ctx.stack_by_rank[lead])}, while "
                f"{_plural(main.ranks)} wait in {main_wait} at {ctx.where_line(main.example)}: the ranks are "
                f"in different collectives (out of step) -> the cause is the code path of {_plural(culprits)}, "
                "not the network"
            )
            fix = (
                "Make every rank issue the same collectives in the same order: look for an if on the rank "
                "(or on data that differs between ranks) around those lines. `--fr` with Flight Recorder "
                "dumps tells a collective only some ranks call from ranks taking different branches."
            )
        else:
            summary = (
                f"{who} is not where the others are: its stack is in {ctx.where_stack(lead)}, while "
                f"{_plural(main.ranks)} "
                + (f"wait in {main_wait} at {ctx.where_line(main.example)} " if main_wait else f"are in {main_where} ")
                + f"-> the cause is on {_plural(culprits)}"
                + (", not the network" if main_wait else "")
            )
            fix = "Look at what the named rank does at that line instead of joining the collective."
        return {
            "kind": "stack_outlier",
            "summary": summary,
            "culprit_ranks": culprits,
            "other_ranks": list(main.ranks),
            "culprits": _culprit_records(ctx, culprits),
            "collective": None,
            "tie": False,
            "fix": fix,
            "source": "stacks",
        }
    if len(groups) == 1 and waiting:
        ranks = list(groups[0].ranks)
        world = ctx.facts.job.world_size if ctx.facts.job else None
        elsewhere = world is not None and world > len(ranks)
        summary = (
            f"every local rank ({_plural(ranks)}) waits in {describe_stack(groups[0].example)}: "
            + (
                f"no rank on {ctx.facts.host} is behind; the job has {world} ranks, so look at the others "
                "(`srun ... ddpdoctor hang` on every node) or at the network"
                if elsewhere
                else "no rank is behind; the collective itself does not complete (network, NCCL transport, "
                "or a peer that died)"
            )
        )
        return {
            "kind": "all_waiting",
            "summary": summary,
            "culprit_ranks": [],
            "other_ranks": ranks,
            "culprits": [],
            "collective": None,
            "tie": False,
            "fix": "Run `ddpdoctor hang` on every node of the job; if all wait in the same collective, run "
            "`ddpdoctor check` and `ddpdoctor bench-nccl` on the nodes for a network fault.",
            "source": "stacks",
        }
    return None


def _verdict_from_ras(ctx: _Context, ras: RasStatus) -> Optional[dict[str, Any]]:
    lagging = ras.missing or ras.behind
    if not lagging:
        return None
    ranks = sorted({r.rank for r in lagging if r.rank >= 0})
    first = lagging[0]
    what = "unresponsive (RAS got no data from it)" if ras.missing else (
        f"behind: it launched {first.count} {first.op or 'collective'} operations, its peers "
        f"{ras.ahead_count.get(first.comm, '?')}"
    )
    where = f" (pid {first.pid} on {first.host})" if first.pid else ""
    summary = f"rank {format_ranks(ranks) or '?'}{where} is {what} in communicator {first.comm}"
    stack_where = ctx.where_stack(ranks[0]) if ranks else ""
    if stack_where:
        summary += f"; its stack is in {stack_where}"
    return {
        "kind": "missing" if ras.missing else "behind",
        "summary": summary + " -> the cause is on that rank",
        "culprit_ranks": ranks,
        "other_ranks": [],
        "culprits": _culprit_records(ctx, ranks),
        "collective": None,
        "tie": False,
        "fix": "Look at that rank's process on its node: `ddpdoctor hang` there shows its stack.",
        "source": "ras",
    }


def judge_hang(facts: HangFacts) -> HangReport:
    """All sources -> one verdict (FR alignment first, then stacks, then RAS) and a finding per source."""
    ctx = _Context(facts)
    findings: list[Finding] = []
    alignment: Optional[Alignment] = align_dumps(facts.dumps) if facts.dumps else None
    findings.append(_job_finding(facts))
    findings.append(_stacks_finding(facts))
    findings.append(_ras_finding(facts))
    findings.append(_fr_finding(facts, alignment))
    verdict: Optional[dict[str, Any]] = None
    if alignment is not None and alignment.worst() is not None:
        verdict = _verdict_from_fr(ctx, alignment.worst())
    if verdict is None:
        verdict = _verdict_from_stacks(ctx, [s for s in facts.stacks if s.main is not None])
    if verdict is None and facts.ras is not None:
        verdict = _verdict_from_ras(ctx, facts.ras)
    if verdict is None:
        verdict = {
            "kind": "none",
            "summary": "no sign of a hang: no rank is behind or out of step in what could be read",
            "culprit_ranks": [], "other_ranks": [], "culprits": [], "collective": None, "tie": False,
            "fix": "", "source": None,
        }
    severity = Severity.FAIL if verdict["kind"] not in ("none", "all_waiting") else Severity.WARN
    if verdict["kind"] == "none":
        # The job finding alone says nothing about the job's state: only stacks, RAS and FR do.
        sources_ran = any(f.severity in (Severity.OK, Severity.INFO, Severity.WARN) for f in findings[1:])
        severity = Severity.OK if sources_ran else Severity.ERROR
        if not sources_ran:
            errors = [f.summary for f in findings if f.severity == Severity.ERROR]
            verdict["summary"] = "inconclusive, nothing could be read: " + (errors[0] if errors else "no source ran")
            verdict["fix"] = next((f.fix for f in findings if f.severity == Severity.ERROR and f.fix), "")
    evidence = [Evidence(f.title, f.summary) for f in findings if f.severity not in (Severity.SKIP,)]
    findings.insert(
        0,
        VERDICT.finding(
            severity, verdict["summary"], evidence=evidence[:6], fix=verdict["fix"] or None,
            data={k: v for k, v in verdict.items() if k not in ("summary", "fix")},
        ),
    )
    facts_out = {
        "job": _job_dict(facts),
        "stacks": [stack_to_dict(s) for s in facts.stacks],
        "stack_groups": [
            {"ranks": list(g.ranks), "where": describe_stack(g.example), "waiting_in": g.example.waiting_in()}
            for g in group_stacks([s for s in facts.stacks if s.main is not None])
        ],
        "ras": ras_to_dict(facts.ras) if facts.ras is not None else None,
        "flight_recorder": _alignment_dict(alignment, facts),
    }
    return HangReport(facts.host, verdict, findings, facts_out, facts.duration_s)


def _job_dict(facts: HangFacts) -> Optional[dict[str, Any]]:
    if facts.job is None:
        return None
    return {
        "agent_pid": facts.job.agent_pid,
        "world_size": facts.job.world_size,
        "ranks": [{"rank": w.rank, "local_rank": w.local_rank, "pid": w.pid} for w in facts.job.workers],
    }


def _alignment_dict(alignment: Optional[Alignment], facts: HangFacts) -> Optional[dict[str, Any]]:
    if alignment is None and not facts.dump_errors:
        return None
    out: dict[str, Any] = {"ranks": [], "divergences": [], "last_enqueued": {}, "errors": facts.dump_errors}
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


def _job_finding(facts: HangFacts) -> Finding:
    if facts.job is None:
        severity = Severity.SKIP if facts.dumps else Severity.ERROR
        return JOB.finding(severity, facts.job_error or "no job found", evidence=[Evidence("psutil.process_iter", "")])
    job = facts.job
    ranks = ", ".join(
        f"rank {w.rank if w.rank is not None else '?'} pid {w.pid}" for w in job.workers[:16]
    )
    unreadable = [w.pid for w in job.workers if w.env_error]
    summary = f"{len(job.workers)} local rank(s) of a {job.world_size or '?'}-rank job" + (
        f" under agent pid {job.agent_pid}" if job.agent_pid else ""
    )
    if unreadable:
        summary += f"; /proc/PID/environ unreadable for pid {', '.join(map(str, unreadable[:8]))} (rank unknown)"
    return JOB.finding(
        Severity.INFO, summary,
        evidence=[Evidence("psutil.process_iter + /proc/PID/environ", ranks)],
        data=_job_dict(facts) or {},
    )


def _stacks_finding(facts: HangFacts) -> Finding:
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
        evidence.append(Evidence(f"py-spy dump --json --pid {group.example.pid}", f"{_plural(group.ranks)}: {describe_stack(group.example)}"))
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
                + "): run as root or the job's user with `sysctl kernel.yama.ptrace_scope=0`, or start the "
                "container with `--cap-add SYS_PTRACE`",
                evidence=evidence,
            )
        return STACKS.finding(Severity.ERROR, f"no stack could be read: {failed[0].error}", evidence=evidence)
    groups = group_stacks(got)
    odd = odd_ones_out(groups)
    summary = f"{len(got)} stack(s) in {len(groups)} group(s)"
    if odd:
        summary += "; odd one(s) out: " + "; ".join(
            f"{_plural(g.ranks)} in {describe_stack(g.example)}" for g in odd
        )
    if failed:
        summary += f"; {len(failed)} rank(s) unreadable ({failed[0].error})"
    return STACKS.finding(Severity.WARN if odd else Severity.INFO, summary, evidence=evidence, fix="" if not odd else None)


def _ras_finding(facts: HangFacts) -> Finding:
    command = f"{facts.ras_addr}: {facts.ras_command}" if facts.ras_addr else "NCCL RAS"
    if facts.ras is None:
        if not facts.ras_error:
            return RAS.finding(Severity.SKIP, "not queried (--no-ras)")
        if facts.ras_error_kind == "refused":
            return RAS.finding(
                Severity.SKIP,
                f"{facts.ras_error} (NCCL < 2.24, RAS disabled, or a job without NCCL communicators such as gloo)",
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


def _fr_finding(facts: HangFacts, alignment: Optional[Alignment]) -> Finding:
    evidence = [Evidence(f"read {facts.fr_spec}", e) for e in facts.dump_errors[:4]]
    if alignment is None:
        if facts.dump_errors:
            return FLIGHT_RECORDER.finding(Severity.ERROR, facts.dump_errors[0], evidence=evidence)
        return FLIGHT_RECORDER.finding(Severity.SKIP, "no dump given (--fr)" if not facts.fr_spec else f"no dump found at {facts.fr_spec}")
    summary = f"{len(alignment.ranks)} rank dump(s) ({format_ranks(alignment.ranks)})"
    worst = alignment.worst()
    if worst is not None:
        summary += f"; first divergence: {worst.kind} at #{worst.seq} of {_group_name(worst.pg, worst.pg_name)}"
    else:
        summary += "; all ranks agree on every recorded collective"
    for pg, last in alignment.last_enqueued.items():
        evidence.append(Evidence(f"pg {pg} last enqueued", ", ".join(f"rank {r}: #{s}" for r, s in sorted(last.items()))))
    if facts.dump_errors:
        summary += f"; {len(facts.dump_errors)} file(s) refused or unreadable"
    return FLIGHT_RECORDER.finding(Severity.INFO, summary, evidence=evidence)


def judge_flight_recorder(facts: HangFacts) -> tuple[dict[str, Any], list[Finding]]:
    """The Flight Recorder part of a hang report, for `explain DIR`: (verdict, alignment and findings as
    JSON-able data; the findings)."""
    report = judge_hang(facts)
    fr_findings = [f for f in report.findings if f.id in (VERDICT.id, FLIGHT_RECORDER.id)]
    if report.verdict["kind"] == "none" and not facts.dumps:
        fr_findings = [f for f in fr_findings if f.id == FLIGHT_RECORDER.id]
    data = {
        "verdict": report.verdict,
        "alignment": report.facts["flight_recorder"],
        "exit_code": int(exit_code_for(fr_findings)),
        "findings": [{**f.to_dict(), "fix": f.fix or None} for f in fr_findings],
    }
    return data, fr_findings
