"""Verdicts from how the live processes behave rather than where they stand: the job progressed between
the snapshots (progress.py), a rank spins in a Python loop, or --pid names a process that is no
distributed job at all. Pure; `ctx` is verdict.py's context (who, where, records)."""

from __future__ import annotations

import re
from typing import Any, Optional

from ddpdoctor.hang.findings import HangFacts, plural_ranks, ranks_verb
from ddpdoctor.hang.loop_split import loop_split, loop_split_mechanism, split_sides
from ddpdoctor.hang.mismatch import (
    both_receive,
    ddp_forward_backward,
    object_collective_against_plain,
    tie_breaker,
)
from ddpdoctor.hang.progress import Motion
from ddpdoctor.hang.source import left_loop
from ddpdoctor.hang.spin import loop_reason
from ddpdoctor.hang.stacks import RankStack, threads_in_collective
from ddpdoctor.hang.waits import server_waits_on_itself


def empty_verdict(kind: str, summary: str, fix: str, source: Optional[str]) -> dict[str, Any]:
    return {
        "kind": kind, "summary": summary, "culprit_ranks": [], "other_ranks": [], "culprits": [],
        "collective": None, "tie": False, "fix": fix, "source": source,
    }


def verdict_progressing(ctx: Any, motion: Motion) -> dict[str, Any]:
    """Something moved between the snapshots: not a hang. The slowest rank, if one stands out, is named
    as a straggler (a warning), never as a culprit."""
    moved = "; ".join(motion.evidence[:3])
    summary = f"progressing, not hung: in {motion.span_s:.1f}s between {motion.samples} snapshots, {moved}"
    fix = ""
    verdict = empty_verdict("progressing", summary, fix, "progress")
    if motion.stragglers:
        keys = [r.key for r in motion.stragglers]
        lead = keys[0]
        waiting = next((s.waiting_in() for s in ctx.facts.stacks if s.waiting_in()), None)
        where = ctx.where_stack(lead)
        verdict["summary"] += (
            f". The slowest is {ctx.who(lead) if len(keys) == 1 else plural_ranks(keys)} (a straggler, not a "
            f"culprit): in no snapshot did it wait in a collective"
            + (f"; it is in {where}" if where else "")
            + (f", while the others wait for it in {waiting}" if waiting else "")
        )
        verdict["fix"] = (
            f"Nothing hangs. If the job is slower than it should be, look at what {plural_ranks(keys)} does at "
            "that line (a slow step, I/O, a dataloader, a host-device sync like .item()): the other ranks "
            "wait for it at every step."
        )
        verdict["stragglers"] = ctx.records(keys)
    return verdict


def verdict_spinning(ctx: Any, motion: Motion) -> dict[str, Any]:
    """A rank busy on CPU, never in a collective, while every other rank stood still."""
    keys = [r.key for r in motion.spinning]
    lead = motion.spinning[0]
    others = [r.key for r in motion.ranks if r.key not in keys]
    waiting = next((s for s in ctx.facts.stacks if s.waiting_in() and s.rank not in keys), None)
    where = ctx.where_stack(lead.key)
    busiest = busiest_frame(ctx, lead.pid)
    if busiest is not None:
        frame, hits, seen = busiest
        code = ctx.code(frame.filename, frame.line)
        where = f"{frame.where()} in {frame.name}()" + (f" `{code}`" if code else "") + (
            f" (the line it was on in {hits} of {seen} snapshots)" if seen > 1 else "")
    share = f"{lead.cpu_share:.0%}" if lead.cpu_share is not None else "most"
    summary = (
        f"{ctx.who(lead.key) if len(keys) == 1 else plural_ranks(keys)} "
        f"{'spins' if len(keys) == 1 else 'spin'}: its main thread was on CPU {share} of {motion.span_s:.1f}s and "
        f"never in a collective" + (f", in {where}" if where else "")
        + (f", while {ranks_verb(others, 'waits', 'wait')} in {waiting.waiting_in()} at {ctx.where_line(waiting)}"
           if waiting and others else "")
        + " and did not move -> the cause is a loop on "
        + f"{plural_ranks(keys)} that does not end, not the network"
    )
    verdict = empty_verdict(
        "spinning", summary,
        "Look at the loop at that line: its exit condition never becomes true on this rank (a flag another "
        "rank or thread should set, a condition on data that differs between ranks). A loop that waits for "
        "something should sleep and give up after a timeout.",
        "progress",
    )
    records = ctx.records(keys)
    if busiest is not None and records:
        frame = busiest[0]
        records[0].update(rank_where=records[0]["where"] or "", where=where, file=frame.filename, line=frame.line)
    verdict.update(culprit_ranks=[k for k in keys if k >= 0], other_ranks=[k for k in others if k >= 0],
                   culprits=records)
    if busiest is not None and busiest[1] == busiest[2] and busiest[2] > 1:
        regex = _regex_call(ctx.code(busiest[0].filename, busiest[0].line))
        if regex:
            # One line in every snapshot, and that line is one regex call: it never returns.
            verdict["summary"] = verdict["summary"].replace(
                "the cause is a loop on", "the cause is one regular-expression call on").replace(
                " that does not end, not the network", f" (`{regex}`) that does not return, not the network")
            return with_loop_mechanism(verdict, {
                "id": "regex.backtracking",
                "summary": f"the rank was on the same line in every snapshot, a `{regex}` call: a regular expression "
                "with nested or overlapping repetition (`(a+)+`, `(\\w+\\s?)*$`) backtracks exponentially on some "
                "inputs, so one call runs for hours on this rank's text while the others wait",
                "threads": [], "pids": [],
                "fix": "Rewrite the pattern without nested quantifiers (atomic groups or possessive quantifiers on "
                "Python >= 3.11, or a simpler pattern), bound the input length, or use a linear-time engine "
                "(re2).",
            })
    if busiest is not None:
        found = loop_reason(ctx.facts, lead.pid, busiest[0])
        if found is not None:
            return with_loop_mechanism(verdict, found)
    return verdict


_REGEX_CALL = re.compile(r"\b(re\.(?:match|fullmatch|search|findall|finditer|sub|subn|split)|[A-Za-z_]\w*\."
                         r"(?:match|fullmatch|search|findall|finditer|sub|subn))\(")


def _regex_call(code: str) -> str:
    """`re.match` / `PATTERN.search` when the line calls a regular expression (a compiled one is named in
    capitals or ends in `_re`/`_RE`/`pattern`, as most code names them), else ''."""
    m = _REGEX_CALL.search(code)
    if not m:
        return ""
    name = m.group(1)
    receiver = name.split(".")[0]
    if receiver == "re" or receiver.isupper() or receiver.lower().endswith(("_re", "regex", "pattern", "pat")):
        return name
    return ""


def _is_loop_header(code: str) -> bool:
    return code.startswith(("while ", "while(", "for ", "async for "))


def busiest_frame(ctx: Any, pid: int) -> Optional[tuple[Any, int, int]]:
    """(innermost user frame, snapshots it was in, snapshots) of a spinning rank: the line its loop spends
    its time on, counted over every snapshot, not only the last. A loop's header (`while ...:`) is
    passed once per turn, so a body line sampled as often wins, and the header only when no body line
    was ever sampled."""
    counts: dict[tuple[str, int], int] = {}
    frames: dict[tuple[str, int], Any] = {}
    seen = 0
    for sample in ctx.facts.samples:
        for stack in sample.stacks:
            frame = stack.user_frame() if stack.pid == pid else None
            if frame is None:
                continue
            seen += 1
            key = (frame.filename, frame.line)
            counts[key] = counts.get(key, 0) + 1
            frames.setdefault(key, frame)
    if not counts:
        return None
    body = {k: n for k, n in counts.items() if not _is_loop_header(ctx.code(*k))}
    pick = max(body or counts, key=lambda k: ((body or counts)[k], -k[1]))
    return frames[pick], counts[pick], seen


_DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID")


def not_distributed(facts: HangFacts) -> bool:
    """The process(es) --pid named are Python, readable, and show no sign of torch.distributed: no
    launcher variable, no frame in torch.distributed or torch.multiprocessing on any thread."""
    job = facts.job
    if job is None:
        return False
    if any(w.env.get(k) for w in job.workers for k in _DISTRIBUTED_ENV) or any(w.env_error for w in job.workers):
        return False
    if not facts.stacks or any(not s.threads for s in facts.stacks):
        return False
    return not any(
        "torch/distributed" in f.filename or "torch/multiprocessing" in f.filename
        for s in facts.stacks for t in s.threads for f in t.frames
    )


def verdict_not_distributed(ctx: Any) -> dict[str, Any]:
    pids = ", ".join(str(w.pid) for w in (ctx.facts.job.workers if ctx.facts.job else [])[:8])
    return empty_verdict(
        "not_distributed",
        f"not a distributed job: process {pids} has no RANK/WORLD_SIZE/MASTER_ADDR in its environment and no "
        "thread of it is in torch.distributed or torch.multiprocessing, so there is no collective to hang in",
        "Give --pid the torchrun agent or a rank of the job (`ps -ef | grep torchrun`), or run without --pid "
        "to find the job on this node.",
        "stacks",
    )


def _int_env(env: Any, name: str) -> Optional[int]:
    value = env.get(name) if env else None
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else None


def exited_ranks(facts: HangFacts) -> list[tuple[int, Optional[int]]]:
    """(local rank, global rank) of the ranks this node's launcher started that are gone: fewer live
    workers than LOCAL_WORLD_SIZE. The global rank assumes torchrun's contiguous numbering per node."""
    job = facts.job
    if job is None or not job.workers:
        return []
    # A rank whose forked child outlived it (procs.forked_orphans) is gone, whatever the launch variables say.
    orphaned = [(r, r) for _, r, _ in facts.orphans if r is not None and all(w.rank != r for w in job.workers)]
    size = next((v for w in job.workers if (v := _int_env(w.env, "LOCAL_WORLD_SIZE")) is not None), None)
    present = {w.local_rank for w in job.workers if w.local_rank is not None}
    if size is None or size > 1024 or len(present) != len(job.workers):
        return sorted(set(orphaned))
    base = next((w.rank - w.local_rank for w in job.workers if w.rank is not None and w.local_rank is not None), None)
    gone = [(lr, base + lr if base is not None else None) for lr in range(size) if lr not in present]
    return gone + [o for o in sorted(set(orphaned)) if all(g != o[1] for _, g in gone)]


def verdict_exited(ctx: Any) -> Optional[dict[str, Any]]:
    """A local rank is gone while the live ones wait in a collective: it left the training loop early
    (uneven data: its sampler ran out first) or returned from its main function."""
    gone = exited_ranks(ctx.facts)
    live = [s for s in ctx.facts.stacks if s.main is not None]
    if not gone or not live or not all(s.waiting_in() for s in live):
        return None
    keys = [g if g is not None else -1 for _, g in gone]
    names = ", ".join(f"rank {g}" if g is not None else f"local rank {lr}" for lr, g in gone)
    waiting = live[0]
    others = sorted(s.rank if s.rank is not None else -s.pid for s in live)
    verdict = empty_verdict(
        "exited",
        f"{names} {'has' if len(gone) == 1 else 'have'} exited (no process left for "
        f"{'it' if len(gone) == 1 else 'them'} on this node) while {ranks_verb(others, 'waits', 'wait')} in "
        f"{waiting.waiting_in()} at {ctx.where_line(waiting)} -> the cause is a rank that left the training "
        "loop before the others (uneven data: its share of the dataset ran out first), not the network",
        "Give every rank the same number of steps: DistributedSampler(..., drop_last=True) (or equal-length "
        "shards), or wrap the loop in `with torch.distributed.algorithms.Join([model]):` so ranks that run out "
        "shadow the others' collectives; a rank that returns early must still join every collective.",
        "stacks",
    )
    verdict.update(culprit_ranks=[k for k in keys if k >= 0], other_ranks=[r for r in others if r >= 0],
                   culprits=[{"rank": g, "pid": None, "host": ctx.facts.host, "where": "exited", "file": None,
                              "line": None, "chain": []} for _, g in gone])
    orphans = [o for o in ctx.facts.orphans if o[1] in keys]
    if orphans:
        _crashed_with_child(ctx, verdict, orphans, waiting)
    return verdict


def _crashed_with_child(ctx: Any, verdict: dict[str, Any], orphans: list[tuple[int, Optional[int], int]],
                        waiting: RankStack) -> None:
    """The gone rank left a process it forked (procs.forked_orphans): the rank died (its last traceback, read
    from the stderr file the child inherited, says how), and the child still holds the sockets it inherited, so
    the other ranks' connections to the dead rank never close and their collective waits instead of failing."""
    pid, rank, leader = orphans[0]
    found = ctx.facts.orphan_tracebacks.get(pid)
    own = found[1].own_frame() if found is not None else None
    how = (f" with `{found[1].exception[:160]}`" + (f" at {own.file}:{own.line} in {own.func}" if own else "")
           + f" (the last traceback in the stderr it shared with its child, {found[0]})") if found else ""
    verdict["summary"] = (
        f"rank {rank} has exited{how}; pid {pid}, a process it forked (it carries rank {rank}'s RANK, and pid "
        f"{leader}, which led its process group or session, is gone), is still running and holds the sockets it "
        f"inherited, so the other ranks never see rank {rank}'s connections close: "
        f"{ranks_verb(verdict['other_ranks'], 'waits', 'wait')} in {waiting.waiting_in()} at "
        f"{ctx.where_line(waiting)} instead of failing -> the cause is rank {rank}'s crash, kept silent by its child"
    )
    verdict["fix"] = (
        (f"Fix the `{found[1].type_name}`" + (f" at {own.file}:{own.line}" if own else "") + "; " if found else
         f"Read rank {rank}'s log for why it exited; ")
        + "start helper processes before init_process_group, or with the spawn start method (they then hold no "
        "copy of the process group's sockets), or make them exit with their parent (a pipe they watch, "
        "prctl PR_SET_PDEATHSIG), so a dead rank's connections close and the job fails instead of hanging."
    )
    for record in verdict["culprits"]:
        if record["rank"] == rank:
            record["where"] = f"exited; its forked child pid {pid} lives on"
            if own is not None:
                record["file"], record["line"] = own.file, own.line


def left_loop_note(ctx: Any, culprit: RankStack, waiter: RankStack) -> str:
    """', after the loop (`for ...` at line 48) the others are still in; it left through `break` at line
    52', when the culprit idles past the end of the loop the waiters' line is in, in the same function."""
    idle, wait = culprit.user_frame(), waiter.user_frame()
    if idle is None or wait is None or (idle.filename, idle.name) != (wait.filename, wait.name):
        return ""
    lines = ctx.facts.sources.get(idle.filename)
    found = left_loop(lines, wait.line, idle.line) if lines else None
    if found is None:
        return ""
    exits = ", ".join(f"`{ctx.code(idle.filename, n)}` at line {n}" for n in found.exits[:3])
    return (
        f", after the loop (`{ctx.code(idle.filename, found.header)}` at line {found.header}) the others are still in"
        + (f"; it left it through {exits}" if exits else "")
    )


def verdict_no_job_at_pid(facts: HangFacts) -> Optional[dict[str, Any]]:
    """--pid named a process no launcher rule recognises, with no rank-like children (procs.select_job):
    not a distributed job, known without reading a stack."""
    if "is not a distributed job" not in facts.job_error:
        return None
    return empty_verdict(
        "not_distributed", facts.job_error,
        "Give --pid the torchrun agent, the torch.multiprocessing.spawn parent or a rank of the job "
        "(`ps -ef | grep -e torchrun -e multiprocessing`), or run without --pid to find the job on this node.",
        None,
    )


def _thread_in_collective(stack: RankStack) -> bool:
    """Whether a thread other than the main one is blocked in a collective (hang.waits names it)."""
    return next(threads_in_collective(stack), None) is not None


def left_sequence(ctx: Any, who: str, culprits: list[int], lead: int, main: Any) -> tuple[str, str]:
    """(summary, fix) when every other rank waits in a collective and `culprits` are in none: they left
    the sequence of collectives (they idle, or left the loop the others are still in)."""
    lead_stack = ctx.stack_by_rank.get(lead)
    loop_note = left_loop_note(ctx, lead_stack, main.example) if lead_stack is not None else ""
    one = len(culprits) == 1
    last = ctx.last_collective(lead)
    summary = (
        f"{who} {'has' if one else 'have'} "
        + ("left the loop of collectives the others are still in" if loop_note else
           "left the sequence of collectives (never reached the one the others wait in)")
        + f": {ranks_verb(list(main.ranks), 'waits', 'wait')} in {main.example.waiting_in()} at "
        f"{ctx.where_line(main.example)}, while {'it is' if one else 'they are'} in no collective"
        + (" on the main thread" if lead_stack is not None and _thread_in_collective(lead_stack) else "")
        + ": "
        f"{'its stack' if one else 'the stack of ' + ctx.who(lead)} is in {ctx.where_stack(lead)}"
        + loop_note
        + (f"; its last completed collective: {last}" if last else "")
        + f" -> the cause is on {plural_ranks(culprits)}, not the network"
    )
    fix = (
        "Look at what the named rank does at that line instead of joining the collective the others wait "
        "in; if it left the loop early (a `break`, a condition or data that differs between ranks), make "
        "every rank run the same number of iterations and collectives."
    )
    return summary, fix


def loop_tie_verdict(ctx: Any, groups: list[Any]) -> Optional[dict[str, Any]]:
    """Two stack groups in different collectives, no majority: a verdict that names one side when the
    source says one is inside a loop the other has left (loop_split), else None."""
    a, b = groups[0].example, groups[1].example
    mechanism = object_collective_against_plain(ctx, a, b, groups) or ddp_forward_backward(ctx, a, b, groups)
    split = loop_split(ctx, a, b) if mechanism is None else None
    if split is not None:
        mechanism = loop_split_mechanism(ctx, split, *split_sides(split, groups))
    if mechanism is None:
        mechanism = tie_breaker(ctx, a, b, groups)
    if mechanism is None:
        found = both_receive(ctx, groups)
        mechanism = found if found is not None and found["culprits"] else None
    if mechanism is not None:
        culprits = list(mechanism["culprits"])
        others = sorted(r for g in groups for r in g.ranks if r not in culprits)
        lead_stack = ctx.stack_by_rank[culprits[0]]
        other_stack = next(g.example for g in groups if culprits[0] not in g.ranks)
        verdict = {
            "kind": "stack_outlier",
            "summary": (
                f"{ctx.who(culprits[0]) if len(culprits) == 1 else plural_ranks(culprits)} "
                f"{'waits' if len(culprits) == 1 else 'wait'} in {lead_stack.waiting_in()} at "
                f"{ctx.where_line(lead_stack)}, while {ranks_verb(others, 'waits', 'wait')} in "
                f"{other_stack.waiting_in()} at {ctx.where_line(other_stack)}: the ranks are in different "
                f"collectives (out of step) -> the cause is the code path of {plural_ranks(culprits)}, not the "
                "network"
            ),
            "culprit_ranks": [r for r in culprits if r >= 0],
            "other_ranks": [r for r in others if r >= 0],
            "culprits": ctx.records(culprits),
            "collective": None,
            "tie": False,
            "fix": "Make every rank run the same iterations and issue the same collectives in the same order.",
            "source": "stacks",
        }
        return with_loop_mechanism(verdict, mechanism)
    return None


def with_loop_mechanism(verdict: dict[str, Any], mechanism: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The verdict with why the ranks parted (live.loop_split_mechanism): its `mechanism`, quoted in the
    summary after `why it waits:`, its fix first."""
    if mechanism is None:
        return verdict
    verdict["mechanism"] = {k: mechanism[k] for k in ("id", "summary", "threads", "pids")}
    verdict["summary"] += f"; why it waits: {mechanism['summary']}"
    verdict["fix"] = f"{mechanism['fix']} {verdict['fix']}".strip()
    return verdict


# A socket call in the user's line that blocks until the peer reads (send) or writes (recv).
_SOCKET_SEND = (".sendall(", ".send(", ".sendto(")


def all_blocked(ctx: Any, groups: list[Any]) -> dict[str, Any]:
    """Nothing moved, and no rank waits in a collective: every rank is blocked outside torch.distributed,
    each in its own wait (a socket, a file, a lock, a queue). They wait on each other through that channel,
    or on something outside the job; every rank is named (a tie) with where it waits. When each blocks
    sending on a socket, the sends deadlock: each peer sends before it reads, and the buffers are full."""
    ranks = sorted(r for g in groups for r in g.ranks)
    places = []
    codes = []
    for g in groups:
        frame = g.example.user_frame()
        code = ctx.code(frame.filename, frame.line) if frame is not None else ""
        codes.append(code)
        places.append(f"{plural_ranks(sorted(g.ranks))} {'is' if len(g.ranks) == 1 else 'are'} at "
                      f"{ctx.where_stack(g.ranks[0])}")
    summary = (
        f"every rank is blocked outside torch.distributed and nothing moved between the snapshots: "
        f"{'; '.join(places)} -> the ranks wait on each other (or on something outside the job) through that "
        "channel, not in a collective"
    )
    verdict = empty_verdict(
        "all_blocked", summary,
        "Look at what each rank waits for at its line and who should provide it; give such waits a timeout.",
        "stacks",
    )
    verdict.update(culprit_ranks=[r for r in ranks if r >= 0], culprits=ctx.records(ranks), tie=len(ranks) > 1)
    for rank in ranks:
        stack = ctx.stack_by_rank.get(rank)
        serving = server_waits_on_itself(stack, ctx.facts.sources) if stack is not None else None
        if serving is None:
            continue
        # The rank whose server waits on itself is the culprit; the others wait for that server.
        others = [r for r in ranks if r != rank]
        verdict.update(culprit_ranks=[rank] if rank >= 0 else [], culprits=ctx.records([rank]), tie=False,
                       other_ranks=[r for r in others if r >= 0])
        verdict["summary"] = (
            f"{ctx.who(rank)} is the culprit: nothing moved and no rank waits in a collective; "
            + "; ".join(places) + " -> the other ranks wait for its server"
        )
        return with_loop_mechanism(verdict, serving.to_dict() | {"fix": serving.fix})
    if codes and all(any(s in c for s in _SOCKET_SEND) for c in codes):
        mechanism = {
            "id": "socket.mutual_send",
            "summary": "every rank blocks sending on a socket: each sends to its peer before it reads what the peer "
            "sends, and once a message is larger than the kernel's socket buffers a send waits for the peer to "
            "read, which it never does while it is sending too (a send/send deadlock)",
            "threads": [], "pids": [],
            "fix": "Do not send before reading on both sides: let one side send first and the other receive first "
            "(order by rank), send from a separate thread, or use non-blocking sockets (selectors) that read while "
            "they write; bound the message size.",
        }
        verdict = with_loop_mechanism(verdict, mechanism)
    return verdict
