"""Judge a hanging job from what probe_io gathered: one verdict, root cause first, plus a finding per
source (stacks, NCCL RAS, Flight Recorder). Pure: facts in, HangReport out; nothing here reads or prints.
Its ~600 lines stay one module: every verdict source shares the _Context lookups (who, where, records);
the verdicts from behaviour and from loops live in live.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

from ddpdoctor.core.model import Evidence, Finding, Severity, exit_code_for
from ddpdoctor.hang.align import Alignment, Divergence, align_dumps, describe_entry
from ddpdoctor.hang.evidence import vet_dumps
from ddpdoctor.hang.findings import (
    FLIGHT_RECORDER,
    VERDICT,
    HangFacts,
    alignment_dict,
    format_ranks,
    fr_finding,
    group_name,
    job_dict,
    job_finding,
    plural_ranks,
    ranks_verb,
    ras_finding,
    stacks_finding,
)
from ddpdoctor.hang.join_split import join_unshadowed
from ddpdoctor.hang.live import (
    all_blocked,
    left_sequence,
    loop_tie_verdict,
    not_distributed,
    verdict_exited,
    verdict_no_job_at_pid,
    verdict_not_distributed,
    verdict_progressing,
    verdict_spinning,
    with_loop_mechanism,
)
from ddpdoctor.hang.loop_split import loop_split, loop_split_mechanism, split_sides
from ddpdoctor.hang.mismatch import (
    P2P_RECV,
    argument_mismatch,
    both_receive,
    ddp_forward_backward,
    object_collective_against_plain,
    skipped_subgroup,
    wrong_peer,
)
from ddpdoctor.hang.patterns import add_pattern_notes
from ddpdoctor.hang.progress import judge_motion, motion_dict
from ddpdoctor.hang.ras import RasStatus
from ddpdoctor.hang.ras import to_dict as ras_to_dict
from ddpdoctor.hang.rendezvous import verdict_agent_waiting, verdict_joining
from ddpdoctor.hang.source import classify_split
from ddpdoctor.hang.stacks import RankStack, describe_stack, group_stacks, odd_ones_out
from ddpdoctor.hang.stacks import to_dict as stack_to_dict

__all__ = ["HangFacts", "HangReport", "format_ranks", "judge_flight_recorder", "judge_hang"]

HANG_SCHEMA_VERSION = "ddpdoctor.hang/1"


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
            "findings": [f.to_json() for f in self.findings],
        }


class _Context:
    """Lookups the verdict needs: pid/host/stack by rank, source text by line."""

    def __init__(self, facts: HangFacts) -> None:
        self.facts = facts
        # Ranks are keyed as group_stacks numbers them: a process of unknown rank is -pid.
        self.stack_by_rank = {s.rank if s.rank is not None else -s.pid: s for s in facts.stacks}
        self.pid_by_rank = {w.rank: w.pid for w in (facts.job.workers if facts.job else []) if w.rank is not None}
        self.kept: list[Any] = []  # the dumps evidence.vet_dumps kept (of the live job)
        self.still = False  # nothing moved between the snapshots (progress.judge_motion said "hung")
        # rank key -> the arguments of the rooted collective / send / recv it waits in (py-spy --locals)
        self.call_args = {key: facts.collective_args[s.pid] for key, s in self.stack_by_rank.items()
                          if s.pid in facts.collective_args}
        # rank key -> the collective (or send/recv) its main thread waits in, None outside any
        self.waits = {key: s.waiting_in() for key, s in self.stack_by_rank.items()}

    def last_collective(self, rank: int, pg: Optional[str] = None) -> str:
        """`all_reduce #3 (16, Float) at file:line` of the last collective `rank` completed (or, when its
        dump records no state, issued) in the kept dumps; '' without a dump of that rank."""
        for dump in self.kept:
            if dump.rank != rank:
                continue
            entries = [e for e in dump.entries if not e.is_p2p and (pg is None or e.pg == pg)]
            done = [e for e in entries if e.state == "completed"] or entries
            if done:
                return self.where_entry(max(done, key=lambda e: e.seq))
        return ""

    def records(self, ranks: Sequence[int]) -> list[dict[str, Any]]:
        """The culprit records of `ranks` (for live.py's verdicts)."""
        return _culprit_records(self, ranks)

    def pid_of(self, rank: int) -> Optional[int]:
        """The pid of a rank (or of the process keyed -pid, whose rank is unknown)."""
        if rank < 0:
            return -rank
        stack = self.stack_by_rank.get(rank)
        return self.pid_by_rank.get(rank) or (stack.pid if stack else None)

    def chain(self, rank: int) -> list[str]:
        """The rank's user frames, outermost caller first, each with its source line: who called what
        (a lock taken twice shows as two frames of the same `with lock:`)."""
        stack = self.stack_by_rank.get(rank)
        if stack is None or stack.main is None:
            return []
        out = []
        for frame in reversed([f for f in stack.main.frames if f.is_user][:12]):
            code = self.code(frame.filename, frame.line)
            out.append(f"{frame.name}() {frame.where()}" + (f" `{code}`" if code else ""))
        return out

    def who(self, rank: int) -> str:
        if rank < 0:
            return f"pid {-rank} on {self.facts.host} (rank unknown)"
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
        return self._with_code(describe_stack(stack), stack.user_frame())

    def where_line(self, stack: RankStack) -> str:
        """`file:line `code`` of the rank's innermost user frame."""
        frame = stack.user_frame()
        if frame is None:
            return describe_stack(stack)
        code = self.code(frame.filename, frame.line)
        return frame.where() + (f" `{code}`" if code else "")

    def where_entry(self, entry: Any, ranks: Sequence[int] = ()) -> str:
        """`all_reduce #4 (16, Float) at file:line `code``; a dump without frames (the JSON form) takes the
        line from the live stack of one of `ranks` that waits in that collective."""
        if entry.user_frame() is None:
            for rank in ranks:
                stack = self.stack_by_rank.get(rank)
                if stack is not None and stack.waiting_in() == entry.op and stack.user_frame() is not None:
                    return f"{describe_entry(entry)} at {self.where_line(stack)}"
        return self._with_code(describe_entry(entry), entry.user_frame())

    def _with_code(self, text: str, frame: Any) -> str:
        """`text` followed by the source line of `frame`, when the file could be read."""
        code = self.code(frame.filename, frame.line) if frame is not None else ""
        return text + (f" `{code}`" if code else "")


def _culprit_records(ctx: _Context, ranks: Sequence[int]) -> list[dict[str, Any]]:
    out = []
    for rank in ranks:
        stack = ctx.stack_by_rank.get(rank)
        frame = stack.user_frame() if stack else None
        out.append(
            {
                "rank": rank if rank >= 0 else None,
                "pid": ctx.pid_by_rank.get(rank) if rank >= 0 else -rank,
                # Dumps may come from other nodes: only a rank running here is known to be on this host.
                "host": ctx.facts.host if (rank < 0 or rank in ctx.pid_by_rank or rank in ctx.stack_by_rank) else None,
                "where": ctx.where_stack(rank) or None,
                "file": frame.filename if frame else None,
                "line": frame.line if frame else None,
                "chain": ctx.chain(rank),
            }
        )
    return out


def _stack_outlier(
    ctx: _Context, summary: str, culprits: Sequence[int], others: Sequence[int], fix: str, tie: bool = False
) -> dict[str, Any]:
    """A verdict read from the live stacks alone (kind `stack_outlier`); a process whose rank is unknown is
    keyed -pid and is named in the records only."""
    return {
        "kind": "stack_outlier", "summary": summary,
        "culprit_ranks": [r for r in culprits if r >= 0], "other_ranks": [r for r in others if r >= 0],
        "culprits": _culprit_records(ctx, culprits), "collective": None, "tie": tie, "fix": fix, "source": "stacks",
    }


def _refine_desync(ctx: _Context, div: Divergence) -> tuple[Divergence, str, str]:
    """(divergence, kind, note): read the source around both calls of a desync; a call inside a
    rank-dependent `if` with the other call after it is a collective only some ranks issue, and its
    ranks are the culprits (with two ranks, whichever side that is)."""
    entry_c, entry_o = div.culprit_entry, div.other_entry
    frame_c = entry_c.user_frame() if entry_c is not None else None
    frame_o = entry_o.user_frame() if entry_o is not None else None
    if div.kind != "desync" or not frame_c or not frame_o or frame_c.filename != frame_o.filename:
        return div, div.kind, ""
    lines = ctx.facts.sources.get(frame_c.filename)
    if not lines:
        return div, div.kind, ""
    split, branch = classify_split(lines, frame_c.line, frame_o.line)
    if branch is None or split == "unknown":
        return div, div.kind, ""
    if split == "branches":
        return div, "desync", f" (ranks take different branches of `{branch.condition}` at line {branch.if_line})"
    if split == "only_some_other":
        div = replace(
            div, culprits=div.others, others=div.culprits, culprit_entry=entry_o, other_entry=entry_c,
            culprit_last=div.others_last, others_last=div.culprit_last,
        )
        frame_c = frame_o
    return div, "only_some", f" inside `{branch.condition}` ({frame_c.filename}:{branch.if_line})"


def _verdict_from_fr(ctx: _Context, div: Divergence) -> dict[str, Any]:
    div, kind, branch_note = _refine_desync(ctx, div)
    group = group_name(div.pg, div.pg_name)
    culprits, others = list(div.culprits), list(div.others)
    lead = culprits[0]
    stack_where = ctx.where_stack(lead)
    others_wait = f"{ranks_verb(others, 'waits', 'wait')} in " + (
        ctx.where_entry(div.other_entry, others) if div.other_entry is not None else f"#{div.others_last}"
    ) + f" of {group}"
    if kind == "behind":
        where = stack_where or (
            f"its last collective was {ctx.where_entry(div.culprit_entry)}" if div.culprit_entry else
            f"its last collective was #{div.culprit_last}"
        )
        if stack_where:
            where = f"its stack is in {stack_where}"
            last = ctx.last_collective(lead, div.pg) if len(culprits) == 1 else ""
            if last:
                where += f" (its last collective there: {last})"
        summary = (
            f"{ctx.who(lead) if len(culprits) == 1 else plural_ranks(culprits)} "
            f"{'is' if len(culprits) == 1 else 'are'} behind: {where}, while {others_wait} "
            f"-> the cause is on {plural_ranks(culprits)}, not the network"
        )
        fix = (
            f"Look at what {plural_ranks(culprits)} does at that line instead of reaching the collective (a slow "
            "or blocked step, I/O, a dataloader, a host-device sync like .item()); if it is waiting on "
            "something else, fix that."
        )
    elif kind in ("only_some", "extra"):
        what = ctx.where_entry(div.culprit_entry, culprits) if div.culprit_entry is not None else f"#{div.seq}"
        if kind == "extra":
            summary = (
                f"{ctx.who(lead) if len(culprits) == 1 else plural_ranks(culprits)} issued a collective the other ranks "
                f"did not: {what} of {group}, one more than {plural_ranks(others)} (last #{div.others_last}) "
                f"-> the cause is a collective only some ranks call, not the network"
            )
        else:
            summary = (
                f"{ctx.who(lead) if len(culprits) == 1 else plural_ranks(culprits)} issued {what}{branch_note} "
                f"that {plural_ranks(others)} never issue: they went on to "
                f"{ctx.where_entry(div.other_entry, others) if div.other_entry is not None else 'another collective'} "
                f"-> the cause is a collective only some ranks call, not the network"
            )
            kind = "only_some"
        fix = (
            "Every rank of a process group must call every collective of that group: move the collective "
            "out of the rank-dependent branch (e.g. all ranks compute the metric and all_reduce it, then "
            "only rank 0 logs it), or use a subgroup that holds only the ranks that call it."
        )
    else:
        c_what = ctx.where_entry(div.culprit_entry, culprits) if div.culprit_entry is not None else "?"
        o_what = ctx.where_entry(div.other_entry, others) if div.other_entry is not None else "?"
        if div.tie:
            summary = (
                f"{plural_ranks(others)} and {plural_ranks(culprits)} are out of step (desync) at #{div.seq} of {group}: "
                f"{plural_ranks(others)} issued {o_what}, {plural_ranks(culprits)} issued {c_what}{branch_note} "
                f"-> the cause is rank-dependent control flow, not the network"
            )
        else:
            summary = (
                f"{ctx.who(lead) if len(culprits) == 1 else plural_ranks(culprits)} "
                f"{'is' if len(culprits) == 1 else 'are'} out of step (desync): {'it' if len(culprits) == 1 else 'they'} issued "
                f"{c_what} where {plural_ranks(others)} issued {o_what}{branch_note} "
                f"-> the cause is the code path of {plural_ranks(culprits)}, not the network"
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


def _verdict_from_stopped(ctx: _Context) -> Optional[dict[str, Any]]:
    stopped = [s for s in ctx.facts.stacks if s.error_kind == "stopped"]
    if not stopped:
        return None
    ranks = sorted(s.rank if s.rank is not None else -s.pid for s in stopped)
    lead = ranks[0]
    # Its stack, read without attaching (py-spy --nonblocking), says where it stopped.
    where = ctx.where_stack(lead)
    return {
        "kind": "stopped",
        "summary": f"{ctx.who(lead) if len(ranks) == 1 else plural_ranks(ranks)} "
        f"{'is' if len(ranks) == 1 else 'are'} not running: {stopped[0].error}"
        + (f"; it stopped at {where}" if where else "")
        + " -> every other rank waits for it; the cause is that stop, not the network",
        "culprit_ranks": [r for r in ranks if r >= 0],
        "other_ranks": [],
        "culprits": _culprit_records(ctx, ranks),
        "collective": None,
        "tie": False,
        "fix": f"Resume it (`kill -CONT {stopped[0].pid}`) or detach the debugger; if a job scheduler "
        "suspended it, resume the job.",
        "source": "stacks",
    }


def _verdict_from_stacks(ctx: _Context, stacks: list[RankStack]) -> Optional[dict[str, Any]]:
    groups = group_stacks(stacks)
    if not groups:
        return None
    odd = odd_ones_out(groups)
    waiting = [g for g in groups if g.example.waiting_in()]
    mechanism: Optional[dict[str, Any]] = None
    skipped = skipped_subgroup(ctx, groups) if len(groups) > 1 and len(waiting) == len(groups) else None
    if skipped is not None:
        culprits, mechanism = skipped
        others = sorted(r for g in groups for r in g.ranks if r not in culprits)
        return with_loop_mechanism(_stack_outlier(
            ctx,
            f"{ctx.who(culprits[0]) if len(culprits) == 1 else plural_ranks(culprits)} skipped a collective of a "
            f"group {'it belongs' if len(culprits) == 1 else 'they belong'} to: the ranks are in different "
            "collectives (out of step) -> the cause is the code path of "
            f"{plural_ranks(culprits)}, not the network",
            culprits, others,
            "Make every member of a process group issue that group's collectives, in the same order.",
        ), mechanism)
    if odd:
        culprits = sorted(r for g in odd for r in g.ranks)
        main = groups[0] if groups[0] not in odd else next(g for g in groups if g not in odd)
        lead = culprits[0]
        main_where = describe_stack(main.example)
        who = ctx.who(lead) if len(culprits) == 1 else plural_ranks(culprits)
        odd_wait = ctx.stack_by_rank[lead].waiting_in() if lead in ctx.stack_by_rank else None
        main_wait = main.example.waiting_in()
        if odd_wait and main_wait:
            # Both sides wait in a collective, at different places: the ranks are out of step.
            summary = (
                f"{who} {'waits' if len(culprits) == 1 else 'wait'} in {odd_wait} at "
                f"{ctx.where_line(ctx.stack_by_rank[lead])}, while "
                f"{ranks_verb(main.ranks, 'waits', 'wait')} in {main_wait} at {ctx.where_line(main.example)}: the ranks are "
                f"in different collectives (out of step) -> the cause is the code path of {plural_ranks(culprits)}, "
                "not the network"
            )
            fix = (
                "Make every rank issue the same collectives in the same order: look for an if on the rank "
                "(or on data that differs between ranks) around those lines. `--fr` with Flight Recorder "
                "dumps tells a collective only some ranks call from ranks taking different branches."
            )
            odd_stack = ctx.stack_by_rank[lead]
            mechanism = object_collective_against_plain(ctx, odd_stack, main.example, groups) or \
                ddp_forward_backward(ctx, odd_stack, main.example, groups) or \
                join_unshadowed(ctx, odd_stack, main.example, groups)
            split = loop_split(ctx, ctx.stack_by_rank[lead], main.example) if mechanism is None else None
            if split is not None:
                mechanism = loop_split_mechanism(ctx, split, *split_sides(split, groups))
            if mechanism is None:
                mechanism = wrong_peer({k: a for k, a in ctx.call_args.items() if k in culprits}, ctx.waits)
        elif main_wait and not odd_wait:
            # Every other rank waits in a collective; this one is in none: it left the sequence of
            # collectives (it idles, or it left the loop the others are still in).
            summary, fix = left_sequence(ctx, who, culprits, lead, main)
        else:
            summary = (
                f"{who} {'is' if len(culprits) == 1 else 'are'} not where the others are: "
                f"{'its stack' if len(culprits) == 1 else 'the stack of ' + ctx.who(lead)} is in {ctx.where_stack(lead)}, while "
                + (
                    f"{ranks_verb(main.ranks, 'waits', 'wait')} in {main_wait} at {ctx.where_line(main.example)} "
                    if main_wait
                    else f"{ranks_verb(main.ranks, 'is', 'are')} in {main_where} "
                )
                + f"-> the cause is on {plural_ranks(culprits)}"
                + (", not the network" if main_wait else "")
            )
            fix = "Look at what the named rank does at that line instead of joining the collective."
        return with_loop_mechanism(_stack_outlier(ctx, summary, culprits, main.ranks, fix), mechanism)
    if len(groups) == 2 and len(waiting) == 2:
        # Two sides in different collectives with no majority: the source of both call chains can still say
        # which side is wrong, when one is inside a loop the other has left.
        from_loop = loop_tie_verdict(ctx, groups)
        if from_loop is not None:
            return from_loop
    if len(groups) > 1 and len(waiting) == len(groups):
        # No majority (e.g. two ranks), each side waiting in a different collective: out of step, and
        # the stacks alone cannot say which side is wrong.
        sides = "; ".join(
            f"{plural_ranks(g.ranks)} {'waits' if len(g.ranks) == 1 else 'wait'} in {g.example.waiting_in()} at "
            f"{ctx.where_line(g.example)}"
            for g in groups
        )
        ranks = sorted(r for g in groups for r in g.ranks)
        tie = _stack_outlier(
            ctx,
            f"the ranks are in different collectives (out of step): {sides} -> the cause is rank-dependent control "
            "flow, not the network",
            ranks, [],
            "Make every rank issue the same collectives in the same order: look for an if on the rank (or on data "
            "that differs between ranks) around those lines; `--fr` with Flight Recorder dumps gives the sequence "
            "numbers.",
            tie=True,
        )
        return with_loop_mechanism(tie, both_receive(ctx, groups) or argument_mismatch(ctx, ctx.call_args)
                                   or wrong_peer(ctx.call_args, ctx.waits))
    if len(groups) == 1 and waiting:
        ranks = list(groups[0].ranks)
        roots = argument_mismatch(ctx, {k: a for k, a in ctx.call_args.items() if k in ranks})
        if roots is not None:
            culprits = roots["culprits"] or ranks
            what = ("peers that do not pair up (" + roots["summary"].split(":")[0] + ")"
                    if roots["id"] in ("sendrecv.same_side", "sendrecv.peer_mismatch")
                    else "arguments that do not match across ranks")
            return with_loop_mechanism(_stack_outlier(
                ctx,
                f"every rank waits in {groups[0].example.waiting_in()} at {ctx.where_line(groups[0].example)}, with "
                f"{what} -> the cause is the code that computes them, not the network",
                culprits, [r for r in ranks if r not in culprits],
                "Compute the call's arguments the same way on every rank (or share them first).",
                tie=len(culprits) == len(ranks),
            ), roots)
        world = ctx.facts.job.world_size if ctx.facts.job else None
        elsewhere = world is not None and world > len(ranks)
        if not elsewhere and len(ranks) > 1 and (groups[0].example.waiting_in() or "") in P2P_RECV:
            return with_loop_mechanism(_stack_outlier(
                ctx,
                f"every rank ({plural_ranks(ranks)}) waits to receive in {groups[0].example.waiting_in()} at "
                f"{ctx.where_line(groups[0].example)} and all of the job's ranks are here -> none of them sends: a "
                "circular wait in the code, not the network",
                ranks, [],
                "Break the cycle: let one side send first (order the exchange by rank: even ranks send then receive, "
                "odd ranks receive then send), or post both at once with isend/irecv (batch_isend_irecv).",
                tie=True,
            ), {"id": "sendrecv.circular_recv", "threads": [], "pids": [],
                "summary": "each rank receives before it sends (a ring or an exchange written recv-then-send on every "
                "rank): every rank waits for a message its peer will send only after its own receive completes, so "
                "no message is ever sent",
                "fix": "Order the exchange by rank (even ranks send first, odd ranks receive first) or use "
                "isend/irecv / batch_isend_irecv so the sends are posted before the receives are waited on."})
        summary = (
            f"every local rank ({plural_ranks(ranks)}) waits in {describe_stack(groups[0].example)}: "
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
    if not waiting and ctx.still and len(stacks) > 1:
        return all_blocked(ctx, groups)
    return None


def _verdict_from_ras(ctx: _Context, ras: RasStatus) -> Optional[dict[str, Any]]:
    lagging = ras.missing or ras.behind
    if not lagging:
        return None
    ranks = sorted({r.rank for r in lagging if r.rank >= 0})
    by_rank = {r.rank: r for r in reversed(lagging)}
    first = lagging[0]
    what = "unresponsive (RAS got no data from it)" if ras.missing else (
        f"behind: it launched {first.count} {first.op or 'collective'} operations, its peers "
        f"{ras.ahead_count.get(first.comm, '?')}"
    )
    where = f" (pid {first.pid} on {first.host})" if first.pid else ""
    summary = f"{plural_ranks(ranks) if ranks else 'rank ?'}{where} {'are' if len(ranks) > 1 else 'is'} {what} in communicator {first.comm}"
    stack_where = ctx.where_stack(ranks[0]) if ranks else ""
    if stack_where:
        summary += f"; its stack is in {stack_where}"
    return {
        "kind": "missing" if ras.missing else "behind",
        "summary": summary + " -> the cause is on that rank",
        "culprit_ranks": ranks,
        "other_ranks": [],
        "culprits": [
            # RAS knows where every rank of the job runs: its pid and host win over "not on this node".
            {**record, "pid": record["pid"] or by_rank[record["rank"]].pid,
             "host": record["host"] or by_rank[record["rank"]].host or None}
            for record in _culprit_records(ctx, ranks)
        ],
        "collective": None,
        "tie": False,
        "fix": "Look at that rank's process on its node: `ddpdoctor hang` there shows its stack.",
        "source": "ras",
    }


def _fr_contradicted(ctx: _Context, verdict: dict[str, Any], live: list[RankStack]) -> str:
    """Why the live stacks contradict a Flight Recorder verdict ('' when they do not): every rank the
    dumps blame stands, live, exactly where the ranks they call its victims stand."""
    culprits, others = verdict["culprit_ranks"], verdict["other_ranks"]
    by_rank = {s.rank: s for s in live if s.rank is not None}
    if not culprits or not others or any(r not in by_rank for r in culprits):
        return ""
    other_places = {by_rank[r].signature() for r in others if r in by_rank}
    if not other_places or any(by_rank[r].signature() not in other_places for r in culprits):
        return ""
    return (
        f"the Flight Recorder dumps disagree with the live stacks: they blame {plural_ranks(culprits)} at "
        f"#{(verdict.get('collective') or {}).get('seq')}, but live {'it is' if len(culprits) == 1 else 'they are'} "
        f"where {plural_ranks(others)} {'is' if len(others) == 1 else 'are'} ({describe_stack(by_rank[culprits[0]])}); "
        "the dumps were taken at another moment, so the live stacks decide"
    )


def judge_hang(facts: HangFacts) -> HangReport:
    """All sources -> one verdict and a finding per source. A stopped rank first; then what moved
    between the snapshots (progressing, spinning); then, for a job where nothing moved, Flight Recorder
    alignment (unless the live stacks contradict it), the stacks, RAS."""
    ctx = _Context(facts)
    findings: list[Finding] = []
    vetting = vet_dumps(facts) if facts.dumps else None
    kept = vetting.kept if vetting is not None else []
    ctx.kept = list(kept)
    alignment: Optional[Alignment] = align_dumps(kept) if kept else None
    motion = judge_motion(facts.samples, facts.earlier_dumps, facts.dumps, facts.sources)
    ctx.still = motion.state == "hung"
    findings.append(job_finding(facts))
    findings.append(stacks_finding(facts))
    findings.append(ras_finding(facts))
    findings.append(fr_finding(facts, alignment, vetting))
    live = [s for s in facts.stacks if s.main is not None]
    # A stopped process explains a hang by itself, whatever the dumps say about the collectives.
    verdict: Optional[dict[str, Any]] = _verdict_from_stopped(ctx)
    if verdict is None and facts.job is not None and not_distributed(facts):
        verdict = verdict_not_distributed(ctx)
    if verdict is None and facts.job is None and not facts.dumps:
        verdict = verdict_no_job_at_pid(facts)
    if verdict is None:
        # Before progress: the rank hosting the store wakes hundreds of times a second while it waits.
        verdict = verdict_joining(ctx) or verdict_agent_waiting(facts)
    if verdict is None and motion.state == "progressing":
        verdict = verdict_progressing(ctx, motion)
    if verdict is None and motion.state == "spinning":
        verdict = verdict_spinning(ctx, motion)
    if verdict is None:
        verdict = verdict_exited(ctx)
    if verdict is None and alignment is not None and alignment.worst() is not None:
        verdict = _verdict_from_fr(ctx, alignment.worst())
        disagreement = _fr_contradicted(ctx, verdict, live)
        if disagreement:
            from_stacks = _verdict_from_stacks(ctx, live)
            if from_stacks is not None:
                from_stacks["summary"] += f"; {disagreement}"
                verdict = from_stacks
            else:
                verdict["summary"] += f"; {disagreement}"
    if verdict is None:
        verdict = _verdict_from_stacks(ctx, live)
    if verdict is None and facts.ras is not None:
        verdict = _verdict_from_ras(ctx, facts.ras)
    if verdict is None:
        verdict = {
            "kind": "none",
            "summary": "no sign of a hang: no rank is behind or out of step in what could be read",
            "culprit_ranks": [], "other_ranks": [], "culprits": [], "collective": None, "tie": False,
            "fix": "", "source": None,
        }
    add_pattern_notes(ctx, verdict)
    if verdict["kind"] == "progressing":
        severity = Severity.WARN if verdict.get("stragglers") else Severity.OK
    elif verdict["kind"] == "not_distributed":
        severity = Severity.ERROR
    else:
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
        "job": job_dict(facts),
        "stacks": [stack_to_dict(s) for s in facts.stacks],
        "stack_groups": [
            # A process whose rank is unknown is carried as -pid inside; outside, a rank is never negative.
            {"ranks": [r for r in g.ranks if r >= 0], "pids": [ctx.pid_of(r) for r in g.ranks],
             "pids_rank_unknown": [-r for r in g.ranks if r < 0], "label": plural_ranks(g.ranks),
             "where": describe_stack(g.example), "waiting_in": g.example.waiting_in()}
            for g in group_stacks(live)
        ],
        "ras": ras_to_dict(facts.ras) if facts.ras is not None else None,
        "flight_recorder": alignment_dict(alignment, facts, vetting),
        "progress": _joining_progress(motion_dict(motion)) if verdict["kind"] == "joining" else motion_dict(motion),
        "dataloader_workers": {
            str(pid): [stack_to_dict(w) for w in workers] for pid, workers in facts.worker_stacks.items()
        },
    }
    return HangReport(facts.host, verdict, findings, facts_out, facts.duration_s)


def _joining_progress(progress: dict[str, Any]) -> dict[str, Any]:
    """A job that never formed did not progress, whatever the wake-ups said: the rank hosting the TCPStore
    polls for the others (held-out hang set 6: the JSON said "progressing" beside a joining verdict)."""
    if progress.get("state") == "progressing":
        progress = {**progress, "state": "hung",
                    "evidence": ["wake-ups inside init_process_group are the store waiting for the other ranks, "
                                 "not progress", *progress.get("evidence", [])]}
    return progress


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
        "findings": [f.to_json() for f in fr_findings],
    }
    return data, fr_findings
