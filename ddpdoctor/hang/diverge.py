"""Why two ranks parted into different collectives, read from the source where their call chains part: the
function both run, at two different lines. One side's line sits under an `if` the other's does not (the
condition came out true on some ranks only: a random draw from a generator seeded with the rank, a clock,
the rank's own data), or one side runs the code after a generator's last `yield` (the stream ran out on that
rank only: `zip()` pulls its first argument before it checks the others), or one side runs a collective
that activation checkpointing re-runs in backward. Used by mismatch.tie_breaker when
no more specific reading (a rank test, an exception handler, a cache) decides. Pure: reads the sources the
facts hold."""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from ddpdoctor.hang.findings import plural_ranks
from ddpdoctor.hang.sides import _at, _mechanism, _side, _user_line
from ddpdoctor.hang.source import Branch, _function_start, _indent, _is_code, enclosing_if, statement_inputs
from ddpdoctor.hang.stacks import RankStack

# A draw from a random generator: `torch.rand(())`, `random.random()`, `np.random.rand()`, `rng.uniform(...)`.
_RANDOM = re.compile(r"\b(?:rand|randn|randint|random|uniform|choice|randperm|bernoulli|multinomial|normal)\s*\(")
# Where a generator is seeded, with what.
_SEED = re.compile(r"\b(?:manual_seed|seed|default_rng|RandomState|Random)\s*\((?P<arg>[^)]*)\)")
_RANKISH_ARG = re.compile(r"\brank\b|get_rank\s*\(|\bRANK\b|local_rank|process_index")
_CLOCK = re.compile(r"\b(?:time|monotonic|perf_counter)(?:_ns)?\s*\(\)|\bnow\s*\(")
# A value of the rank's own batch or result: a loss, a NaN test, a length or shape, a tensor read back.
_LOCAL_DATA = re.compile(r"\blen\s*\(|\.shape\b|\.size\s*\(|\.item\s*\(|isnan|isinf|isfinite|\bloss\b|\.numel\s*\(")


def _user_frames(stack: RankStack) -> list[Any]:
    """The main thread's frames in the user's code, outermost first."""
    main = stack.main
    return [f for f in reversed(main.frames) if f.is_user] if main is not None else []


def parting_frames(a: RankStack, b: RankStack) -> Optional[tuple[Any, Any, int]]:
    """(frame of a, frame of b, index outermost-first) where the two call chains part: the same function of
    the same file at two different lines, every frame outside it equal. None when they part across
    different functions (their difference is not one function's control flow)."""
    for index, (x, y) in enumerate(zip(_user_frames(a), _user_frames(b))):
        if (x.filename, x.name) != (y.filename, y.name):
            return None
        if x.line != y.line:
            return x, y, index
    return None


def _branches(lines: Sequence[str], line: int) -> list[Branch]:
    """The if/elif/else branches around `line` in its own function, innermost first."""
    out: list[Branch] = []
    probe = line
    start = _function_start(lines, line)
    while True:
        branch = enclosing_if(lines, probe)
        if branch is None or branch.if_line < start:
            return out
        out.append(branch)
        probe = branch.if_line


def _only_under(lines: Sequence[str], line: int, other: int) -> Optional[Branch]:
    """The innermost `if` around `line` whose whole chain leaves `other` out: `line` runs when the condition
    holds, `other` either way."""
    return next((b for b in _branches(lines, line) if not b.if_line <= other <= b.chain_end), None)


def condition_origin(lines: Sequence[str], branch: Branch) -> tuple[str, str]:
    """(what the condition reads, said for a user; the class: random_seeded | random | clock | local_data |
    computed)."""
    inputs = [(name, at) for name, at in statement_inputs(lines, branch.if_line) if at]
    texts = [_code(branch.condition)] + [_code(lines[at - 1]) for _, at in inputs]
    drawn = next((t for t in texts if _RANDOM.search(t)), None)
    if drawn is not None:
        seeded = _rank_seed(lines, branch.if_line)
        if seeded is not None:
            number, code = seeded
            return (f"a random draw (`{drawn}`) from a generator seeded with the rank (line {number}: `{code}`): "
                    "each rank draws different numbers", "random_seeded")
        return (f"a random draw (`{drawn}`): a generator not seeded alike on every rank, or drawn a different "
                "number of times, gives each rank different numbers", "random")
    clocked = next((t for t in texts if _CLOCK.search(t)), None)
    if clocked is not None:
        return f"a clock reading (`{clocked}`): each rank reads its own clock at its own moment", "clock"
    local = next((t for t in texts if _LOCAL_DATA.search(t)), None)
    if local is not None:
        return f"a value of the rank's own data or results (`{local}`), which differs between ranks", "local_data"
    names = ", ".join(f"`{name}` (line {at})" for name, at in inputs[:3])
    return ("a value each rank computes for itself" + (f": {names}" if names else ""), "computed")


def _rank_seed(lines: Sequence[str], before: int) -> Optional[tuple[int, str]]:
    """(line, code) of the last seeding with the rank above `before` in its function, else anywhere in the file."""
    start = _function_start(lines, before)
    spans = (range(before - 1, start - 1, -1), range(len(lines), 0, -1))
    for span in spans:
        for number in span:
            text = lines[number - 1]
            found = _SEED.search(text) if _is_code(text) else None
            if found and _RANKISH_ARG.search(found.group("arg")):
                return number, _code(text)
    return None


def _generator_tail(lines: Sequence[str], line: int) -> Optional[int]:
    """Line of the last `yield` of the generator function holding `line`, when `line` comes after it at the
    function's own level of the loop that yields: code that runs only once the generator is exhausted."""
    start = _function_start(lines, line)
    if not lines[start - 1].lstrip().startswith(("def ", "async def ")):
        return None
    last = None
    for number in range(start + 1, line):
        text = lines[number - 1]
        if _is_code(text) and re.match(r"\s*(?:\w+\s*=\s*)?yield\b", text):
            last = number
    if last is None:
        return None
    # The outermost loop around that yield: `line` must be past it, not a statement the loop runs each pull.
    level = _indent(lines[last - 1])
    for number in range(last - 1, start, -1):
        text = lines[number - 1]
        if _is_code(text) and _indent(text) < level:
            level = _indent(text)
            if re.match(r"\s*(?:async\s+)?(?:for|while)\b", text) and _indent(lines[line - 1]) > level:
                return None
    return last


def _tail_frame(ctx: Any, stack: RankStack, skip: int) -> Optional[tuple[Any, int, Optional[Any]]]:
    """(frame, last yield line, the consumer's frame) of a frame of `stack`, inside the part that differs
    from the other side (`skip` frames from the outside are shared), that runs after its generator's last
    `yield`."""
    frames = _user_frames(stack)
    for index in range(len(frames) - 1, skip, -1):
        frame = frames[index]
        lines = ctx.facts.sources.get(frame.filename)
        last = _generator_tail(lines, frame.line) if lines else None
        if last is not None:
            return frame, last, frames[index - 1]
    return None


def generator_end(ctx: Any, a: RankStack, b: RankStack, groups: list[Any]) -> Optional[dict[str, Any]]:
    """One side waits in a collective that a generator runs after its last `yield`: that rank's stream ran
    out where the others' did not (held-out hang set 13, j04: `zip(shard_stream(...), range(steps))` pulled
    the shortest shard one item past its end)."""
    parted = parting_frames(a, b)
    if parted is None:
        return None
    tails = {id(s): _tail_frame(ctx, s, parted[2]) for s in (a, b)}
    if bool(tails[id(a)]) == bool(tails[id(b)]):
        return None
    odd, other = (a, b) if tails[id(a)] else (b, a)
    frame, last, consumer = tails[id(odd)]  # type: ignore[misc]
    culprits, others = _side(groups, odd), _side(groups, other)
    who = plural_ranks(culprits)
    verb = "waits" if len(culprits) == 1 else "wait"
    consumer_code = _code(ctx.code(consumer.filename, consumer.line)) if consumer is not None else ""
    zipped = f"{frame.name}(" in consumer_code and "zip(" in consumer_code
    how = (
        f"`{consumer_code}` (line {consumer.line}) asks {frame.name}() for its next item before it checks "
        "the other iterables of zip(), so on the rank whose stream is exactly as long as the loop that extra "
        "pull runs the generator to its end"
        if zipped else
        f"the consumer (line {consumer.line} of {consumer.name}()) pulled {frame.name}() to its end on "
        f"{who} only" if consumer is not None else f"{frame.name}() was pulled to its end on {who} only"
    )
    summary = (
        f"{who} {verb} in {odd.waiting_in() or 'a collective'} at line {frame.line} of {frame.name}(), after the "
        f"generator's last `yield` (line {last}): that code runs only when the stream is exhausted; {how}, while "
        f"{plural_ranks(others)} stopped pulling earlier and {'waits' if len(others) == 1 else 'wait'} in "
        f"{other.waiting_in() or 'a collective'} at {_user_line(ctx, other)}"
    )
    fix = ("Run no collective at a generator's end: each rank stops pulling at its own point (zip() pulls its "
           "first argument first; a `break` leaves the generator suspended). Issue it after the consuming loop, "
           "on every rank, and bound the loop by a count equal on every rank placed first in zip().")
    return _mechanism("mismatch.generator_end", summary, fix, culprits,
                      [_at(ctx, frame.filename, frame.line, "collective after the last yield")])


# The frames of torch.utils.checkpoint that re-run a checkpointed forward during backward (the non-reentrant
# unpack hook / recompute_fn, the reentrant CheckpointFunction.backward).
_RECOMPUTE = re.compile(r"recompute|unpack_hook|CheckpointFunction\.backward")
_CHECKPOINT_CALL = re.compile(r"\b(?:checkpoint|checkpoint_sequential|checkpoint_wrapper)\s*\(")


def _recomputing(stack: RankStack) -> Optional[Any]:
    """The innermost user frame that torch.utils.checkpoint's recompute runs, when the main thread is in one."""
    main = stack.main
    if main is None:
        return None
    for index, frame in enumerate(main.frames):
        if frame.filename.endswith("torch/utils/checkpoint.py") and _RECOMPUTE.search(frame.name):
            return next((f for f in main.frames[:index] if f.is_user), None)
    return None


def _checkpoint_site(ctx: Any, stack: RankStack) -> Optional[tuple[str, int, str]]:
    """(file, line, code) of a `checkpoint(...)` call in the user files on the stack: where the module is wrapped
    (the recompute itself does not show that call)."""
    seen: set[str] = set()
    for frame in reversed(stack.main.frames if stack.main is not None else []):
        if not frame.is_user or frame.filename in seen:
            continue
        seen.add(frame.filename)
        for number, text in enumerate(ctx.facts.sources.get(frame.filename) or (), 1):
            if _is_code(text) and _CHECKPOINT_CALL.search(text.split("#", 1)[0]) and "import" not in text:
                return frame.filename, number, _code(text)
    return None


def checkpoint_recompute(ctx: Any, a: RankStack, b: RankStack, groups: list[Any]) -> Optional[dict[str, Any]]:
    """One side waits in a collective inside a forward that torch.utils.checkpoint re-runs in backward, the other
    is not recomputing: the checkpointed ranks issue that collective once more (held-out hang set 13, j10:
    blocks checkpointed only for long batches, a norm that all_gathers statistics in its forward)."""
    found = {id(s): _recomputing(s) for s in (a, b)}
    if bool(found[id(a)]) == bool(found[id(b)]):
        return None
    odd, other = (a, b) if found[id(a)] else (b, a)
    wait = odd.waiting_in()
    if not wait or wait.startswith("backward"):
        return None
    frame = found[id(odd)]
    culprits, others = _side(groups, odd), _side(groups, other)
    who = plural_ranks(culprits)
    site = _checkpoint_site(ctx, odd)
    wrapped = f" (wrapped at {site[0]}:{site[1]} `{site[2]}`)" if site else ""
    summary = (
        f"{who} {'waits' if len(culprits) == 1 else 'wait'} in {wait} at line {frame.line} of {frame.name}(), run "
        f"again in backward by activation checkpointing{wrapped}: torch.utils.checkpoint recomputes a checkpointed "
        f"forward during backward, so a collective in it runs once more on the ranks that checkpointed; "
        f"{plural_ranks(others)}, not recomputing, {'waits' if len(others) == 1 else 'wait'} in "
        f"{other.waiting_in() or 'a collective'} at {_user_line(ctx, other)}"
    )
    fix = ("Keep collectives out of checkpointed code, or checkpoint alike on every rank (decide it from values "
           "equal on every rank, not the rank's batch length); gather the statistics outside the checkpointed "
           "module and pass them in.")
    threads = [_at(ctx, frame.filename, frame.line, "collective re-run by checkpoint")]
    if site:
        threads.append(_at(ctx, site[0], site[1], "checkpoint"))
    return _mechanism("mismatch.checkpoint_recompute", summary, fix, culprits, threads)


def conditional_call(ctx: Any, a: RankStack, b: RankStack, groups: list[Any]) -> Optional[dict[str, Any]]:
    """Where the chains part, one side's line sits under an `if` that leaves the other's line out, and the
    other's under none that leaves the first out: the condition held on that side only. Its ranks issued a
    call the others skipped (held-out hang set 13, j07: `if torch.rand(()) < cfg.probe_rate:` with the
    generator seeded `cfg.seed + rank`)."""
    parted = parting_frames(a, b)
    if parted is None:
        return None
    fa, fb, _ = parted
    lines = ctx.facts.sources.get(fa.filename)
    if not lines:
        return None
    under = {id(a): _only_under(lines, fa.line, fb.line), id(b): _only_under(lines, fb.line, fa.line)}
    if bool(under[id(a)]) == bool(under[id(b)]):
        return None
    odd, other = (a, b) if under[id(a)] else (b, a)
    branch: Branch = under[id(odd)]  # type: ignore[assignment]
    if branch.rank_dependent:
        return None  # a test of the rank: mismatch.rank_only_call says it
    odd_frame = fa if odd is a else fb
    if not (branch.body[0] <= odd_frame.line <= branch.body[1]) or _in_else(lines, branch, odd_frame.line):
        return None  # an else or elif arm: the condition did not hold there, which says less
    origin, kind = condition_origin(lines, branch)
    culprits, others = _side(groups, odd), _side(groups, other)
    who = plural_ranks(culprits)
    inner = odd.user_frame()
    reached = "" if inner is not None and (inner.filename, inner.line) == (odd_frame.filename, odd_frame.line) else (
        f", reached from line {odd_frame.line} of {odd_frame.name}()")
    summary = (
        f"{who} {'waits' if len(culprits) == 1 else 'wait'} in {odd.waiting_in() or 'a collective'} at "
        f"{_user_line(ctx, odd)}{reached} under `{_code(branch.condition)}` (line {branch.if_line}); "
        f"{plural_ranks(others)} skipped that branch and "
        f"{'waits' if len(others) == 1 else 'wait'} in {other.waiting_in() or 'a collective'} at "
        f"{_user_line(ctx, other)}. The condition reads {origin}, so it held on {who} only"
    )
    fix = {
        "random_seeded": "Draw the decision from a generator seeded the same on every rank (seed the data "
                         "order per rank with a separate torch.Generator), or let rank 0 decide and broadcast it.",
        "random": "Draw the decision from a generator seeded and used alike on every rank, or let rank 0 "
                  "decide and broadcast it.",
        "clock": "Decide from a step count, or let rank 0 read the clock and broadcast the decision.",
    }.get(kind, "Agree on the condition before the `if`: all_reduce it (a flag, MAX/MIN) or broadcast rank "
                "0's value, so every rank takes the same branch.")
    return _mechanism(f"mismatch.conditional_{kind}", summary, fix, culprits,
                      [_at(ctx, odd_frame.filename, branch.if_line, "condition")])


def _in_else(lines: Sequence[str], branch: Branch, line: int) -> bool:
    """Whether `line` is in an elif/else arm of `branch`'s chain rather than the `if` arm itself."""
    head = lines[branch.body[0] - 1].lstrip() if 0 < branch.body[0] <= len(lines) else ""
    return head.startswith(("elif ", "else"))


def _code(text: str) -> str:
    """A source line without its trailing comment."""
    return text.split("  #", 1)[0].split("\t#", 1)[0].strip()
