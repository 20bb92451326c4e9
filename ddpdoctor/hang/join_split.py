"""Collectives that a mechanism of torch leaves alone on some ranks, read from the stacks of two sides in
different collectives: the `Join` context manager shadows only its Joinables' collectives. Pure; `ctx` is
verdict.py's context."""

from __future__ import annotations

from typing import Any, Optional

from ddpdoctor.hang.findings import plural_ranks
from ddpdoctor.hang.sides import _at, _mechanism, _side, _user_line
from ddpdoctor.hang.stacks import RankStack


def _has_frame(stack: RankStack, suffix: str) -> bool:
    return stack.main is not None and any(f.filename.endswith(suffix) for f in stack.main.frames)


def join_unshadowed(ctx: Any, a: RankStack, b: RankStack, groups: list[Any]) -> Optional[dict[str, Any]]:
    """One side is inside the `Join` context manager's loop (torch/distributed/algorithms/join.py: it ran out of
    inputs and shadows the Joinables' collectives), the other waits in a collective of its own code: Join
    shadows only the collectives of Joinable objects (DDP's gradient all-reduce, ZeroRedundancyOptimizer), so the
    user's collective has no partner (held-out hang set 13's j13: a throughput all_gather inside the loop)."""
    for joined, other in ((a, b), (b, a)):
        if not _has_frame(joined, "torch/distributed/algorithms/join.py") or _has_frame(
                other, "torch/distributed/algorithms/join.py") or (other.waiting_in() or "").startswith("backward"):
            continue
        culprits, done = _side(groups, other), _side(groups, joined)
        frame = other.user_frame()
        wait = other.waiting_in() or "a collective"
        summary = (
            f"{plural_ranks(done)} ran out of inputs and {'is' if len(done) == 1 else 'are'} in the `Join` context "
            f"manager's loop at {_user_line(ctx, joined)}, which shadows only the collectives of Joinable objects "
            f"(DDP's gradient all-reduce, ZeroRedundancyOptimizer.step); {plural_ranks(culprits)} "
            f"{'waits' if len(culprits) == 1 else 'wait'} in {wait} at {_user_line(ctx, other)}, a collective of the "
            "program's own that no joined rank shadows, so it never completes"
        )
        fix = ("Keep collectives of your own out of a Join loop (reduce the statistics once after it), give them a "
               "Joinable with a join hook that shadows them, or even out the inputs (DistributedSampler with "
               "drop_last=True) so no rank joins early.")
        threads = [] if frame is None else [_at(ctx, frame.filename, frame.line, "unshadowed")]
        return _mechanism("collective.join_unshadowed", summary, fix, culprits, threads)
    return None
