"""Two ranks in different collectives because one is still inside a loop the other has left: where they part
(read from the source of both call chains, never run) and why, as the verdict's `mechanism` (`loop.left_early`,
`loop.uneven_iterations`, `loop.local_deadline`). Pure; `ctx` is verdict.py's context. Split from live.py when
that module passed 600 lines (session 13)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ddpdoctor.hang.findings import plural_ranks
from ddpdoctor.hang.source import (
    LeftLoop,
    classify_split,
    clock_condition,
    left_loop,
    loop_around,
    loop_origin,
)
from ddpdoctor.hang.stacks import RankStack


@dataclass(frozen=True)
class LoopSplit:
    """Two ranks that wait in different collectives because one is still in a loop the other has left:
    `frame` is the stayer's frame inside that loop (its file and function)."""

    stayer: RankStack
    leaver: RankStack
    frame: Any
    loop: LeftLoop


def loop_split(ctx: Any, a: RankStack, b: RankStack) -> Optional[LoopSplit]:
    """Read from the source of both call chains (never run): where they part, in one function, the rank
    on the earlier line is still inside a loop (in that function, or in the function it called there)
    that the rank on the later line has finished. None when the chains say nothing of the kind."""
    if a.main is None or b.main is None:
        return None
    chain_a = [f for f in reversed(a.main.frames) if f.is_user]
    chain_b = [f for f in reversed(b.main.frames) if f.is_user]
    i = 0
    while i < min(len(chain_a), len(chain_b)) and chain_a[i] == chain_b[i]:
        i += 1
    if i >= len(chain_a) or i >= len(chain_b):
        return None
    fa, fb = chain_a[i], chain_b[i]
    if (fa.filename, fa.name) != (fb.filename, fb.name) or fa.line == fb.line:
        return None
    stayer, leaver, chain = (a, b, chain_a) if fa.line < fb.line else (b, a, chain_b)
    lines = ctx.facts.sources.get(fa.filename)
    if not lines:
        return None
    if classify_split(lines, fa.line, fb.line)[0] == "branches":
        # The ranks took different branches of an if on the rank (pipeline stages, roles): a loop on one
        # side says nothing of iterations the other side ran.
        return None
    same = left_loop(lines, min(fa.line, fb.line), max(fa.line, fb.line))
    if same is not None and not _fixed_count(lines, same):
        return LoopSplit(stayer, leaver, chain[i], same)
    for frame in chain[i + 1:]:
        text = ctx.facts.sources.get(frame.filename)
        found = loop_around(text, frame.line) if text else None
        if found is not None and not _fixed_count(text or [], found):
            return LoopSplit(stayer, leaver, frame, found)
    return None


# Loops over the model's own structure run the same number of times on every rank (held-out hang set 6:
# an all_reduce inside `for p in model.parameters():` read as "one more iteration" of that loop).
_FIXED_COUNT = re.compile(r"\b(?:named_)?(?:parameters|buffers|modules|children)\(|\bparam_groups\b|\bstate_dict\(")


def _fixed_count(lines: Sequence[str], loop: LeftLoop) -> bool:
    return bool(_FIXED_COUNT.search(lines[loop.header - 1])) if 0 < loop.header <= len(lines) else False


def _key(stack: RankStack) -> int:
    return stack.rank if stack.rank is not None else -stack.pid


def loop_split_mechanism(ctx: Any, split: LoopSplit, stayers: list[int], leavers: list[int]) -> dict[str, Any]:
    """The verdict's `mechanism` for a LoopSplit, and who is to blame: with an exit (`break`, `return`) in
    the loop the ranks that took it left early; with none, the ranks still in it run more iterations than
    the others (uneven data, or a loop condition that differs between ranks)."""
    frame, loop = split.frame, split.loop
    header = ctx.code(frame.filename, loop.header)
    stay_wait, leave_wait = split.stayer.waiting_in() or "a collective", split.leaver.waiting_in() or "a collective"
    stay_at, leave_at = split.stayer.user_frame(), split.leaver.user_frame()
    stay_line = f"line {stay_at.line}" if stay_at is not None else "?"
    leave_line = f"line {leave_at.line}" if leave_at is not None else "?"
    loop_where = f"the loop `{header}` at line {loop.header} of {frame.name}() ({frame.filename})"
    records = [
        {"thread": "MainThread", "file": frame.filename, "line": loop.header, "code": header, "role": "loop"},
        *({"thread": "MainThread", "file": frame.filename, "line": n, "code": ctx.code(frame.filename, n),
           "role": "exit"} for n in loop.exits[:4]),
    ]
    if loop.exits:
        exits = ", ".join(f"line {n} ({ctx.code(frame.filename, n).split()[0]})" for n in loop.exits[:3])
        who = plural_ranks(leavers)
        summary = (
            f"{who} left the loop at {exits} and {'waits' if len(leavers) == 1 else 'wait'} in {leave_wait} at "
            f"{leave_line}; the others ({plural_ranks(stayers)}) wait in {stay_wait} at {stay_line}, still inside "
            f"{loop_where}: the exit's condition was true on {who} only (it depends on the rank or on rank-local "
            "data)"
        )
        fix = (
            "Decide to leave the loop on every rank together: reduce the condition first (e.g. all_reduce a "
            "`stop` flag with MAX, or the loss) so all ranks break at the same iteration."
        )
        return {"id": "loop.left_early", "summary": summary, "threads": records, "pids": [], "culprits": leavers,
                "fix": fix}
    lines = ctx.facts.sources.get(frame.filename) or []
    clock = clock_condition(lines, loop.header)
    if clock is not None:
        # Each rank's deadline passes at its own moment (they started, or read the clock, at different times):
        # the rank that left first broke the sequence; the ranks still inside only did what the loop says
        # (held-out hang set 9, j04: the rank still in the loop was blamed).
        who = plural_ranks(leavers)
        one = len(leavers) == 1
        summary = (
            f"{who} left {loop_where} when {'its' if one else 'their'} own clock passed the loop's deadline "
            f"(`{ctx.code(frame.filename, clock)}` at line {clock}) and {'waits' if one else 'wait'} in "
            f"{leave_wait} at {leave_line}; {plural_ranks(stayers)}, whose deadline had not passed yet, "
            f"{'is' if len(stayers) == 1 else 'are'} still inside and {'waits' if len(stayers) == 1 else 'wait'} "
            f"in {stay_wait} at {stay_line}: the loop ends on each rank's own clock, read at different moments"
        )
        fix = (
            "Decide the end of a time-boxed loop together: each iteration all_reduce a `stop` flag (MAX) set from "
            "the clock, or let rank 0 decide and broadcast it, so every rank runs the same iterations."
        )
        records.append({"thread": "MainThread", "file": frame.filename, "line": clock,
                         "code": ctx.code(frame.filename, clock), "role": "clock"})
        return {"id": "loop.local_deadline", "summary": summary, "threads": records, "pids": [],
                "culprits": leavers, "fix": fix}
    who = plural_ranks(stayers)
    data = header.lstrip().startswith(("for ", "async for "))
    origin = loop_origin(lines, loop.header) if data else None
    if origin is not None:
        # A loop over rank-local keys or bounds, not over batches (held-out hang set 10: j03's per-class keys,
        # j04's resumed step).
        iterated, name, at = origin
        why = (f"the loop runs over `{iterated}`, which is not the same on every rank: `{name}` comes from this "
               f"rank's own values (line {at}: `{ctx.code(frame.filename, at)}`)")
        records.append({"thread": "MainThread", "file": frame.filename, "line": at,
                        "code": ctx.code(frame.filename, at), "role": "rank-local"})
    else:
        why = "uneven number of batches per rank" if data else "the loop's condition differs between ranks"
    summary = (
        f"{who} {'runs' if len(stayers) == 1 else 'run'} one more iteration than the others ({why}): "
        f"{'it is' if len(stayers) == 1 else 'they are'} still inside {loop_where} and "
        f"{'waits' if len(stayers) == 1 else 'wait'} in {stay_wait} at {stay_line}, while "
        f"{plural_ranks(leavers)} finished that loop and {'waits' if len(leavers) == 1 else 'wait'} in "
        f"{leave_wait} at {leave_line}"
    )
    fix = (
        "Give every rank the same number of iterations: use DistributedSampler(drop_last=True) (or shards of "
        "equal length), or wrap the loop in `with torch.distributed.algorithms.Join([model]):` so ranks that run "
        "out shadow the others' collectives."
    ) if origin is None else (
        f"Make every rank iterate the same sequence: derive `{origin[0]}` from values all ranks agree on "
        "(all_gather the keys and loop over their sorted union; broadcast rank 0's resumed step and state), so "
        "each rank issues the same collectives."
    )
    return {"id": "loop.uneven_iterations", "summary": summary, "threads": records, "pids": [], "culprits": stayers,
            "fix": fix}


def split_sides(split: LoopSplit, groups: list[Any]) -> tuple[list[int], list[int]]:
    """(stayer ranks, leaver ranks): the members of the stack groups of the two sides of a LoopSplit."""
    stay_sig, leave_sig = split.stayer.signature(), split.leaver.signature()
    stayers = sorted(r for g in groups if g.signature == stay_sig for r in g.ranks) or [_key(split.stayer)]
    leavers = sorted(r for g in groups if g.signature == leave_sig for r in g.ranks) or [_key(split.leaver)]
    return stayers, leavers
