"""Two sides in different collectives, no majority: which call is the odd one, read from the stacks and
the source of both call chains (never run). A DDP forward broadcast against a backward all-reduce, a
collective in an exception handler or behind an `if` on the rank, a `no_sync()` accumulation boundary, a
recv/recv deadlock. Pure; `ctx` is verdict.py's context (who, where, code, facts.sources)."""

from __future__ import annotations

import re
from typing import Any, Optional

from ddpdoctor.hang.diverge import checkpoint_recompute, conditional_call, generator_end
from ddpdoctor.hang.findings import plural_ranks
from ddpdoctor.hang.join_split import join_unshadowed
from ddpdoctor.hang.sides import _at, _mechanism, _side, _user_line
from ddpdoctor.hang.source import (
    cached_function,
    enclosing_if,
    except_around,
    function_mentions,
    function_source,
    loop_around,
    rank_guard,
)
from ddpdoctor.hang.stacks import RankStack

_DDP_FORWARD_FRAMES = frozenset({
    "_pre_forward", "_sync_buffers", "_sync_module_buffers", "_check_and_sync_module_buffers",
    "_sync_module_states", "_distributed_broadcast_coalesced", "_rebuild_buckets",
})


def _in_ddp_forward(stack: RankStack) -> bool:
    """Whether the main thread is blocked in the collective DDP's forward issues before the module runs
    (the buffer broadcast with broadcast_buffers=True, the bucket rebuild's broadcast)."""
    main = stack.main
    if main is None or not (stack.waiting_in() or "").startswith("DistributedDataParallel"):
        return False
    for frame in main.frames:
        if frame.is_user:
            return False
        if frame.filename.endswith("torch/nn/parallel/distributed.py") and \
                frame.name.rsplit(".", 1)[-1] in _DDP_FORWARD_FRAMES:
            return True
    return False


def ddp_forward_backward(ctx: Any, a: RankStack, b: RankStack, groups: list[Any]) -> Optional[dict[str, Any]]:
    """One side blocked in DDP's forward broadcast, the other in backward's gradient all-reduce: the two
    collectives can never pair, so the forward side runs the DDP-wrapped model where the others do not
    (a forward that only some ranks run, e.g. an evaluation through the wrapper on one rank)."""
    fwd, bwd = (a, b) if _in_ddp_forward(a) else (b, a)
    if not _in_ddp_forward(fwd) or not (bwd.waiting_in() or "").startswith("backward"):
        return None
    culprits, others = _side(groups, fwd), _side(groups, bwd)
    who = plural_ranks(culprits)
    summary = (
        f"{who} {'runs' if len(culprits) == 1 else 'run'} a forward of the DDP-wrapped model at "
        f"{_user_line(ctx, fwd)}, whose first act is a collective (DDP broadcasts the module's buffers, "
        f"broadcast_buffers=True, or its rebuilt buckets, before every forward with grad enabled), while "
        f"{plural_ranks(others)} {'waits' if len(others) == 1 else 'wait'} in backward's gradient all-reduce at "
        f"{_user_line(ctx, bwd)}: a forward/backward mismatch, the broadcast and the all-reduce never pair. "
        f"{who} ran the wrapped model on a path the others do not take (an evaluation or extra forward on "
        "some ranks only)"
    )
    fix = (
        "On a rank alone, run the unwrapped module (`model.module`) under `torch.no_grad()`, or run the "
        "evaluation on every rank; DistributedDataParallel(broadcast_buffers=False) when buffers need no sync."
    )
    frame = fwd.user_frame()
    threads = [] if frame is None else [_at(ctx, frame.filename, frame.line, "ddp_forward")]
    return _mechanism("ddp.forward_backward_mismatch", summary, fix, culprits, threads)


def _first_hit(ctx: Any, stack: RankStack, probe: Any) -> Optional[tuple[Any, int]]:
    """(frame, line) of the innermost user frame of the main thread where probe(lines, frame.line) holds."""
    if stack.main is None:
        return None
    for frame in stack.main.frames:
        if not frame.is_user:
            continue
        lines = ctx.facts.sources.get(frame.filename)
        found = probe(lines, frame.line) if lines else None
        if found:
            return frame, found
    return None


def tie_breaker(ctx: Any, a: RankStack, b: RankStack, groups: list[Any]) -> Optional[dict[str, Any]]:
    """Two sides in different collectives, no majority: which call is the odd one, read from the source of
    both call chains. A collective in an exception handler runs only on the rank that raised; one behind an
    `if` on the rank runs on some ranks only; a backward all-reduce in a function that uses `no_sync()`
    means this rank reached its accumulation boundary when the other did not. None when neither or both
    sides show the same sign (then it is a mismatch between both)."""
    reading = join_unshadowed(ctx, a, b, groups)
    if reading is not None:
        return reading
    cached = {id(s): _first_hit(ctx, s, cached_function) for s in (a, b)}
    if bool(cached[id(a)]) != bool(cached[id(b)]):
        # Held-out hang set 11, j02: `@functools.lru_cache def steps_per_epoch(n_local, ...)` all-reduces; a rank
        # whose arguments repeat gets the cached value and skips the collective the other side waits in.
        inside, skipped = (a, b) if cached[id(a)] else (b, a)
        frame, line = cached[id(inside)]  # type: ignore[misc]
        culprits, waiting = _side(groups, skipped), _side(groups, inside)
        decorator = ctx.code(frame.filename, line)
        summary = (
            f"{plural_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in {inside.waiting_in() or 'a collective'} "
            f"at {_user_line(ctx, inside)}, inside {frame.name}(), which `{decorator}` (line {line}) caches: its body, "
            f"and the collective in it, runs only when the arguments are new, so {plural_ranks(culprits)}, whose call "
            f"hit the cache, skipped it and went on to {skipped.waiting_in() or 'a collective'} at "
            f"{_user_line(ctx, skipped)}"
        )
        fix = ("Do not cache a function that calls a collective (every rank must run it on every call), or cache only "
               "on values equal on every rank; compute the rank-local part, then all_reduce outside the cache.")
        return _mechanism("mismatch.cached_collective", summary, fix, culprits, [_at(ctx, frame.filename, line,
                                                                                    "cache")])
    probes = (
        ("mismatch.exception_handler", except_around),
        ("mismatch.rank_only_call", rank_guard),
    )
    for kind, probe in probes:
        hits = {id(s): _first_hit(ctx, s, probe) for s in (a, b)}
        if bool(hits[id(a)]) == bool(hits[id(b)]):
            continue
        odd, other = (a, b) if hits[id(a)] else (b, a)
        frame, line = hits[id(odd)]  # type: ignore[misc]
        culprits, others = _side(groups, odd), _side(groups, other)
        who = plural_ranks(culprits)
        code = ctx.code(frame.filename, line)
        wait, other_wait = odd.waiting_in() or "a collective", other.waiting_in() or "a collective"
        if kind == "mismatch.exception_handler":
            summary = (
                f"{who} {'waits' if len(culprits) == 1 else 'wait'} in {wait} called from the exception handler "
                f"`{code}` at line {line} of {frame.name}(): {who} raised where the others did not, and the "
                f"handler calls a collective the others never reach; they wait in {other_wait} at "
                f"{_user_line(ctx, other)}"
            )
            fix = ("Call no collective on an error path only one rank takes: re-raise (the launcher tears the job "
                   "down), or agree on errors first (all_reduce an error flag every step) so all ranks stop together.")
        elif wait in P2P_RECV and other_wait not in P2P_RECV:
            # A receive under a rank test is the peer side of a send, not a call only some ranks make: the
            # sender has left the exchange (held-out hang set 6, j06: a validation exchange one batch short).
            summary = (
                f"{who} {'waits' if len(culprits) == 1 else 'wait'} to receive ({wait} at {_user_line(ctx, odd)}, "
                f"the receiving side of `{code}` at line {line} of {frame.name}()) a message the other side will not "
                f"send: {plural_ranks(others)} left the exchange and {'waits' if len(others) == 1 else 'wait'} in "
                f"{other_wait} at {_user_line(ctx, other)}, so the two sides disagree on how many messages the "
                "exchange has (a count computed from rank-local data: a per-rank split or length)"
            )
            fix = ("Make both sides agree on the number of messages: compute it from values equal on every rank "
                   "(broadcast or all_reduce the count first), or send an end marker the receiver stops on.")
            return _mechanism("sendrecv.count_mismatch", summary, fix, culprits, [_at(ctx, frame.filename, line, kind)])
        else:
            summary = (
                f"{who} {'waits' if len(culprits) == 1 else 'wait'} in {wait} at {_user_line(ctx, odd)}, a call "
                f"only the ranks that `{code}` (line {line} of {frame.name}()) lets through make: the other side "
                f"({plural_ranks(others)}) skipped it and waits in {other_wait} at {_user_line(ctx, other)}"
            )
            fix = ("Call that function on every rank when it runs collectives (e.g. "
                   "ZeroRedundancyOptimizer.consolidate_state_dict must be called by all ranks); put only the "
                   "rank-local work (saving a file) under the `if` on the rank.")
        return _mechanism(kind, summary, fix, culprits, [_at(ctx, frame.filename, line, kind)])
    for sync, other in ((a, b), (b, a)):
        if not (sync.waiting_in() or "").startswith("backward") or (other.waiting_in() or "").startswith("backward"):
            continue
        hit = _first_hit(ctx, sync, lambda lines, n: function_mentions(lines, n, "no_sync("))
        if hit is None:
            continue
        frame, line = hit
        culprits = _side(groups, sync)
        who = plural_ranks(culprits)
        summary = (
            f"{who} {'waits' if len(culprits) == 1 else 'wait'} in backward's gradient all-reduce at "
            f"{_user_line(ctx, sync)}, in a function that accumulates gradients with `no_sync()` (line {line}): "
            f"a backward outside no_sync all-reduces, one inside does not, so {who} reached an accumulation "
            f"boundary where {plural_ranks(_side(groups, other))} did not ({plural_ranks(_side(groups, other))} "
            f"went on to {other.waiting_in() or 'a collective'} at {_user_line(ctx, other)}): the accumulation "
            "length differs between ranks"
        )
        fix = ("Decide when to leave no_sync() from values equal on every rank (a constant number of micro-batches, "
               "or the minimum over ranks via all_reduce(MIN)), never from rank-local data such as the shard size.")
        return _mechanism("mismatch.accumulation_boundary", summary, fix, culprits,
                          [_at(ctx, frame.filename, line, "no_sync")])
    # Last, the general readings of where the two chains part: a checkpointed forward re-run in backward, a
    # generator's end, an `if` on a value that differs between ranks.
    return (checkpoint_recompute(ctx, a, b, groups) or generator_end(ctx, a, b, groups)
            or conditional_call(ctx, a, b, groups))


P2P_RECV = frozenset({"recv", "irecv"})
P2P_OPS = frozenset({"send", "isend", "recv", "irecv"})


def _skips_send(ctx: Any, stack: RankStack) -> Optional[int]:
    """Line of a `continue`/`break` in the loop around the rank's recv, after that recv and before a send
    of the same loop body: a path on which this rank receives and never answers."""
    frame = stack.user_frame()
    lines = ctx.facts.sources.get(frame.filename) if frame is not None else None
    if frame is None or not lines:
        return None
    loop = loop_around(lines, frame.line)
    if loop is None:
        return None
    skip = None
    for number in range(frame.line + 1, loop.end + 1):
        code = lines[number - 1].split("#", 1)[0].strip()
        if skip is None and code in ("continue", "break"):
            skip = number
        elif skip is not None and ("send(" in code):
            return skip
    return None


def both_receive(ctx: Any, groups: list[Any]) -> Optional[dict[str, Any]]:
    """Every side waits in a point-to-point recv: each waits for a message from another, so none sends.
    The stacks cannot say whose send was skipped; the mechanism names the deadlock and both lines."""
    stacks = [g.example for g in groups]
    if len(stacks) < 2 or not all((s.waiting_in() or "") in P2P_RECV for s in stacks):
        return None
    sides = "; ".join(f"{plural_ranks(g.ranks)} in recv at {_user_line(ctx, g.example)}" for g in groups)
    skips = {i: _skips_send(ctx, g.example) for i, g in enumerate(groups)}
    if sum(1 for v in skips.values() if v) == 1:
        i, line = next((i, v) for i, v in skips.items() if v)
        culprits = sorted(groups[i].ranks)
        who = plural_ranks(culprits)
        frame = groups[i].example.user_frame()
        summary = (
            f"every rank waits to receive ({sides}): each waits for a message another rank should send, so none "
            f"sends. {who}'s loop can skip its send: `{ctx.code(frame.filename, line)}` at line {line} of "
            f"{frame.name}() jumps past the send that follows its recv, so the peer waits for a message {who} never "
            "sent while " + ("it" if len(culprits) == 1 else "they") + " went on to the next recv"
        )
        fix = ("Send on every path: when a micro-batch is skipped, still send (a zero gradient, or a flag the peer "
               "checks) instead of `continue` past the send.")
        return _mechanism("sendrecv.skipped_send", summary, fix, culprits, [_at(ctx, frame.filename, line, "skips_send")])
    summary = (
        f"every rank waits to receive ({sides}): each waits for a message another rank should send, so none "
        "sends. A send one of them should have made was skipped (a `continue`, an early exit or an error path "
        "between its recv and its send), or the tags or peers do not match: compare both call chains"
    )
    fix = ("Make every recv have a matching send on the peer on every path (skip work, not the send), or use "
           "batch_isend_irecv with the same list on both sides.")
    return _mechanism("sendrecv.both_receive", summary, fix, [], [])


# The arguments ranks must agree on, per torch.distributed call (distributed_c10d.py's parameter names):
# the root of a rooted collective, the peer and tag of a point-to-point call.
ROOTED_ARGS: dict[str, tuple[str, ...]] = {
    "broadcast": ("src", "group_src"), "broadcast_object_list": ("src", "group_src"),
    "reduce": ("dst", "group_dst"), "gather": ("dst", "group_dst"), "gather_object": ("dst", "group_dst"),
    "scatter": ("src", "group_src"), "scatter_object_list": ("src", "group_src"),
    "send": ("dst", "tag", "group_dst"), "recv": ("src", "tag", "group_src"),
    "isend": ("dst", "tag", "group_dst"), "irecv": ("src", "tag", "group_src"),
}
_P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})
_ROOT_ARG = {op: names[0] for op, names in ROOTED_ARGS.items() if op not in _P2P_OPS}


def _as_int(text: Optional[str]) -> Optional[int]:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def argument_mismatch(ctx: Any, args_by_key: dict[int, dict[str, str]]) -> Optional[dict[str, Any]]:
    """Ranks in the same rooted collective with different roots (a broadcast whose `src` differs by rank),
    or a send and a recv that name each other but not the same tag: every rank is in the call, none can
    finish. `args_by_key`: rank key -> the call's arguments as py-spy's --locals printed them, "op" its name.
    The culprits are the ranks outside the majority; with no majority, all of them (a tie)."""
    if len(args_by_key) < 2:
        return None
    ops = {a.get("op") for a in args_by_key.values()}
    op = ops.pop() if len(ops) == 1 else None
    if op in _ROOT_ARG:
        name = _ROOT_ARG[op]
        roots = {k: _as_int(a.get(name)) for k, a in args_by_key.items()}
        if None in roots.values() or len(set(roots.values())) < 2:
            return None
        by_root: dict[int, list[int]] = {}
        for k, v in roots.items():
            by_root.setdefault(v, []).append(k)  # type: ignore[arg-type]
        sizes = sorted(len(v) for v in by_root.values())
        majority = max(by_root.values(), key=len) if sizes[-1] > sizes[-2] else None
        culprits = sorted(k for v in by_root.values() if v is not majority for k in v)
        sides = "; ".join(f"{plural_ranks(sorted(v))} with {name}={root}" for root, v in sorted(by_root.items()))
        summary = (
            f"every rank waits in {op}, but they disagree on its root ({sides}): each side waits for a "
            f"different {name}, so the {op} never completes. The value is computed per rank (a best-rank "
            "choice, a rank read from local state) without being shared"
        )
        fix = (f"Pass the same {name} on every rank: decide the root together (all_reduce/all_gather the "
               f"candidate, or broadcast it from a fixed rank first) before the {op}.")
        return _mechanism("collective.root_mismatch", summary, fix, culprits, [])
    sends = {k: a for k, a in args_by_key.items() if a.get("op") in ("send", "isend")}
    recvs = {k: a for k, a in args_by_key.items() if a.get("op") in ("recv", "irecv")}
    for rk, r in recvs.items():
        src = _as_int(r.get("src"))
        for sk, s in sends.items():
            if src != sk or _as_int(s.get("dst")) != rk:
                continue
            rtag, stag = _as_int(r.get("tag")), _as_int(s.get("tag"))
            if rtag is None or stag is None or rtag == stag:
                continue
            summary = (
                f"rank {sk} sends to rank {rk} with tag={stag} while rank {rk} receives from rank {sk} with "
                f"tag={rtag}: the tags differ, so the message never matches the receive and both wait"
            )
            fix = ("Use the same tag on both sides of every send/recv pair (one constant per message kind), or "
                   "leave tag at its default.")
            return _mechanism("sendrecv.tag_mismatch", summary, fix, sorted({rk, sk}), [])
    return peer_mismatch(args_by_key)


def _pairs(pairs: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a} and {b}" for a, b in pairs)


def _p2p_peer(key: int, args: dict[str, str]) -> Optional[tuple[str, int]]:
    """("send" or "recv", the peer rank) of a rank waiting in send/isend (its dst) or recv/irecv (its src); None
    for another call, a recv from any source (src=None pairs with whoever sends) or a peer that is itself."""
    op = args.get("op")
    if op not in P2P_OPS:
        return None
    side = "send" if op in ("send", "isend") else "recv"
    other = _as_int(args.get("dst" if side == "send" else "src"))
    return (side, other) if other is not None and other != key else None


def peer_mismatch(args_by_key: dict[int, dict[str, str]]) -> Optional[dict[str, Any]]:
    """Point-to-point calls whose peers do not pair up: two ranks that send to each other (neither receives:
    a gloo or NCCL send waits for the matching receive), two that each wait to receive from the other, or a
    send to a rank that waits for a third one. `args_by_key` as argument_mismatch's."""
    peer = {key: found for key, a in args_by_key.items() if (found := _p2p_peer(key, a)) is not None}
    same = {"send": [], "recv": []}  # type: dict[str, list[tuple[int, int]]]
    for key, (side, other) in sorted(peer.items()):
        if key < other and peer.get(other) == (side, key):
            same[side].append((key, other))
    every_recv = all(side == "recv" for side, _ in peer.values()) and len(peer) == len(args_by_key)
    # Every rank receiving: a circular wait, which the verdict names as such (sendrecv.circular_recv / both_receive).
    if same["send"] or (same["recv"] and not every_recv):
        parts = []
        if same["send"]:
            parts.append(f"{'ranks' if len(same['send']) == 1 else 'pairs'} {_pairs(same['send'])} send to each other "
                         "and neither receives")
        if same["recv"]:
            parts.append(f"{'ranks' if len(same['recv']) == 1 else 'pairs'} {_pairs(same['recv'])} wait to receive "
                         "from each other and neither sends")
        both = bool(same["send"]) and bool(same["recv"])
        summary = (
            "; ".join(parts) + ": both partners of "
            + ("each pair" if len(same["send"]) + len(same["recv"]) > 1 else "the pair")
            + " took the same side of the exchange (a send waits for the matching receive in gloo and NCCL), so "
            "no message moves"
            + ("; the partner and the side are computed by rules that disagree (e.g. partner = rank + world/2 with "
               "'even ranks send first': partners 0 and 2 are both even)" if both else "")
        )
        fix = ("Make the two partners of every exchange take opposite sides (derive who sends first from the pair, "
               "e.g. the lower rank sends first), or post both directions at once with isend/irecv "
               "(batch_isend_irecv) and wait on both.")
        culprits = sorted({r for pairs in same.values() for pair in pairs for r in pair})
        return _mechanism("sendrecv.same_side", summary, fix, culprits, [])
    for key, (side, other) in sorted(peer.items()):
        if side != "send" or other not in peer:
            continue
        their_side, theirs = peer[other]
        if their_side == "recv" and theirs != key:
            summary = (
                f"rank {key} sends to rank {other}, but rank {other} waits to receive from rank {theirs}: the peers "
                "do not pair up, so both wait (the peer is computed differently on the two sides)"
            )
            fix = ("Compute each exchange's peer the same way on both sides (the receiver's src must be the "
                   "sender's rank), or receive from any source with src=None and read the sender from the result.")
            return _mechanism("sendrecv.peer_mismatch", summary, fix, sorted({key, other}), [])
    return None


# `group=expert_group` in the line that calls the collective; `expert_group = dist.new_group(expert_ranks)` (or
# `ranks=[1, 2, 3]`, `range(1, 4)`) where the group is made; a repr of a list or range of ranks.
_GROUP_KW = re.compile(r"\bgroup\s*=\s*([A-Za-z_][\w.]{0,100})")
_NEW_GROUP = re.compile(r"^\s*([A-Za-z_][\w.]{0,100})\s*=\s*[\w.]{0,60}new_group\(\s*(?:ranks\s*=\s*)?(.{1,300})")
_RANGE = re.compile(r"^range\(\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?(?:,\s*(-?\d+)\s*)?\)$")
_INT_LIST = re.compile(r"^[\[(]\s*-?\d+(?:\s*,\s*-?\d+){0,4095}\s*,?\s*[\])]$")


def _ranks_of(text: str) -> Optional[list[int]]:
    """[1, 2, 3] / (1, 2) / range(1, 4) -> the ranks; None for anything else (a name, an expression)."""
    text = text.strip()
    if _INT_LIST.match(text):
        return [int(n) for n in re.findall(r"-?\d+", text)]
    found = _RANGE.match(text)
    if found:
        a, b, step = found.groups()
        start, stop = (0, int(a)) if b is None else (int(a), int(b))
        return list(range(start, stop, int(step) if step else 1))[:4096]
    return None


def _first_arg(text: str) -> str:
    """The first argument of a call whose text (after the opening parenthesis) is `text`: up to the first comma or
    closing parenthesis outside brackets."""
    depth = 0
    for index, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return text[:index].strip()
            depth -= 1
        elif char == "," and depth == 0:
            return text[:index].strip()
    return text.strip()


def group_members(lines: list[str] | tuple[str, ...], code: str, frame_locals: dict[str, str]) -> Optional[tuple[str, list[int]]]:
    """(group name, its ranks) of the collective on `code` (`dist.all_reduce(x, group=expert_group)`), from the
    `new_group(...)` that made it in the same file and, when it was given a name (`new_group(expert_ranks)`), that
    name's value in the calling frame's locals (py-spy --locals)."""
    named = _GROUP_KW.search(code)
    if named is None:
        return None
    name = named.group(1)
    for text in lines:
        made = _NEW_GROUP.match(text)
        if made is None or made.group(1) != name:
            continue
        arg = _first_arg(made.group(2))
        ranks = _ranks_of(arg) or (_ranks_of(frame_locals.get(arg, "")) if re.fullmatch(r"[A-Za-z_]\w*", arg) else None)
        if ranks:
            return name, ranks
    return None


def skipped_subgroup(ctx: Any, groups: list[Any]) -> Optional[tuple[list[int], dict[str, Any]]]:
    """Ranks wait in a collective on a subgroup (`group=expert_group`) that a member of that group is not in:
    that member waits in another collective, having skipped the group's one (a data-dependent `if` around it,
    an expert that got no tokens). It is the culprit; the group's other members wait for it, and the ranks
    outside the group wait in the collective it is in. Returns (culprits, mechanism)."""
    for group in groups:
        stack = group.example
        frame = stack.user_frame()
        if not stack.waiting_in() or frame is None or stack.waiting_in() in P2P_OPS:
            continue  # a send/recv on a group involves two ranks, not every member
        lines = ctx.facts.sources.get(frame.filename)
        if not lines or not 0 < frame.line <= len(lines):
            continue
        found = group_members(lines, lines[frame.line - 1], ctx.facts.group_locals.get(stack.pid, {}))
        if found is None:
            continue
        name, members = found
        here = set(group.ranks)
        missing = sorted(r for r in members if r not in here and r in ctx.stack_by_rank)
        if not missing or not here <= set(members):
            continue
        elsewhere = ctx.stack_by_rank[missing[0]]
        branch = enclosing_if(lines, frame.line)
        cond = f", inside `{branch.condition.strip()}` (line {branch.if_line})" if branch is not None else ""
        summary = (
            f"{plural_ranks(sorted(here))} wait in {stack.waiting_in()} on group `{name}` (ranks "
            f"{', '.join(map(str, members))}) at {frame.where()}{cond}, but {plural_ranks(missing)} of that group "
            f"{'is' if len(missing) == 1 else 'are'} instead in {elsewhere.waiting_in() or 'other code'} at "
            f"{ctx.where_line(elsewhere)}: {'it' if len(missing) == 1 else 'they'} skipped the group's collective"
            + (" (its condition was false there)" if branch is not None else "")
            + ", so the group waits for "
            + ("it" if len(missing) == 1 else "them")
            + " and the ranks outside the group wait with it in the other collective"
        )
        fix = (f"Call the collective on `{name}` on every member of the group, every time (move it out of the `if`, "
               "and let a member with nothing to contribute pass zeros), or decide the condition the same way on all "
               "of the group's ranks first (an all_reduce of the flag).")
        threads = [_at(ctx, frame.filename, frame.line, "group_collective")]
        theirs = elsewhere.user_frame()
        if theirs is not None:
            threads.append(_at(ctx, theirs.filename, theirs.line, "skipped_to"))
        return missing, _mechanism("mismatch.subgroup_skipped", summary, fix, missing, threads)
    return None


def wrong_peer(args_by_key: dict[int, dict[str, str]], waits: dict[int, Optional[str]]) -> Optional[dict[str, Any]]:
    """A rank in a point-to-point call whose peer is in a collective, not in the matching send/recv: the peer is
    the wrong rank. With a rank that waits for a message from it as well, the likely slip is the numbering: a rank
    of a sub-group or pipeline stage passed as `dst`/`src`, which torch reads as a global rank (held-out hang set 8,
    j01). `args_by_key` as argument_mismatch's; `waits`: rank key -> the collective its stack waits in."""
    peers = {key: found for key, a in args_by_key.items() if (found := _p2p_peer(key, a)) is not None}
    for key, (side, other) in sorted(peers.items()):
        sends = side == "send"
        theirs = waits.get(other)
        if not theirs or theirs in P2P_OPS:
            continue
        partners = sorted(k for k, (s, o) in peers.items() if k != key and s != side and o == key)
        summary = (
            f"rank {key} {'sends to' if sends else 'waits to receive from'} rank {other}, but rank {other} waits in "
            f"{theirs}, not in a {'recv' if sends else 'send'}"
            + (f", while {plural_ranks(partners)} {'waits' if len(partners) == 1 else 'wait'} to "
               f"{'receive from' if sends else 'send to'} rank {key}" if partners else "")
            + (": the peer is the wrong rank — likely a rank of a sub-group or pipeline stage used where torch "
               "expects the global rank (send/recv's dst/src are global ranks even with group=)" if partners else
               f": rank {other} reaches its {'recv' if sends else 'send'} only after that {theirs} (if ever), which "
               f"rank {key} joins only after this {'send' if sends else 'recv'} — an ordering deadlock — or the "
               "peer is the wrong rank")
        )
        fix = ("Pass the peer's global rank (dist.get_global_rank(group, peer), or group_dst=/group_src= on "
               "PyTorch >= 2.6) and compute it the same way on both sides of the exchange." if partners else
               "Put the send/recv and the collective in the same order on both ranks (or post the exchange with "
               "isend/irecv before the collective and wait after it), and check that the peer is the rank meant.")
        return _mechanism("sendrecv.wrong_peer", summary, fix, [key], [])
    return None


# torch.distributed's object collectives pickle the objects and run two collectives of the tensor API: the sizes,
# then the bytes (torch/distributed/distributed_c10d.py: broadcast_object_list broadcasts object_sizes_tensor,
# then object_tensor; all_gather_object and gather_object all_gather the sizes first; send_object_list sends the
# sizes, then the bytes). A peer that calls the plain collective once pairs with the first of the two.
_OBJECT_COLLECTIVES = {
    "broadcast_object_list": ("broadcast", "two broadcasts (the sizes of the pickled objects, then their bytes)"),
    "all_gather_object": ("all_gather", "two all_gathers (the sizes of the pickled objects, then their bytes)"),
    "gather_object": ("gather", "an all_gather of the pickled sizes, then a gather of the bytes"),
    "scatter_object_list": ("scatter", "two scatters (the pickled objects, then their sizes)"),
    "send_object_list": ("send", "two sends (the sizes of the pickled objects, then their bytes)"),
    "recv_object_list": ("recv", "two recvs (the sizes of the pickled objects, then their bytes)"),
}
_OBJECT_CALL = re.compile(r"\b(" + "|".join(_OBJECT_COLLECTIVES) + r")\s*\(")


def _plain_call(op: str) -> re.Pattern[str]:
    return re.compile(r"(?:^|[^\w])" + op + r"\s*\(")


def object_collective_against_plain(ctx: Any, a: RankStack, b: RankStack, groups: list[Any]) -> Optional[dict[str, Any]]:
    """One side inside an object collective (`broadcast_object_list`), whose function calls the plain
    collective of the same kind (`broadcast`) on another branch: the peers' one plain call paired with the
    first of the object collective's two, they went on, and the second waits with no peer (held-out hang set
    12, j01: rank 0 broadcast_object_list, the others `dist.broadcast(start)`)."""
    for inside, other in ((a, b), (b, a)):
        frame = inside.user_frame()
        lines = ctx.facts.sources.get(frame.filename) if frame is not None else None
        if frame is None or not lines or not 0 < frame.line <= len(lines):
            continue
        call = _OBJECT_CALL.search(lines[frame.line - 1].split("#", 1)[0])
        if call is None:
            continue
        name = call.group(1)
        op, steps = _OBJECT_COLLECTIVES[name]
        plain = _plain_call(op)
        found = next((number for number, text in _function_lines(lines, frame.line)
                      if number != frame.line and plain.search(text.split("#", 1)[0])), None)
        if found is None:
            continue
        culprits, others = _side(groups, inside), _side(groups, other)
        one = len(others) == 1
        summary = (
            f"{plural_ranks(culprits)} {'calls' if len(culprits) == 1 else 'call'} {name}() at line {frame.line}, "
            f"which runs {steps}, while line {found} of the same function, on the other ranks' path, calls a plain "
            f"{op}() once: {plural_ranks(others)}'s {op} paired with the first of the two, "
            f"{'it' if one else 'they'} went on, and the second has no peer"
        )
        fix = (
            f"Call the same function on every rank: {name}() on the receiving ranks too (with a list of "
            f"placeholders of the same length), or a plain {op}() of a tensor on every rank."
        )
        threads = [_at(ctx, frame.filename, frame.line, "object_collective"), _at(ctx, frame.filename, found, "plain_collective")]
        return _mechanism("collective.object_vs_plain", summary, fix, culprits, threads)
    return None


def _function_lines(lines: list[str] | tuple[str, ...], line: int) -> list[tuple[int, str]]:
    """(1-based number, text) of every line of the function that holds `line`."""
    found = function_source(lines, line)
    if found is None:
        return []
    start, text = found
    return [(start + i, lines[start - 1 + i]) for i in range(len(text.splitlines()))]
