"""How each op is timed (CUDA graph or eager) and whether torch runs it in place. Pure, no torch.

Why CUDA graphs: one eager `dist.all_gather_into_tensor` costs ~27-32 us of Python and c10d on the host
(measured on an H100, issue #14), more than a small NCCL kernel, so an eager loop times the CPU, not the
GPU. nccl-tests' `-G 1` captures the timed loop in a CUDA graph and replays it; so do we, where we can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

GRAPH = "graph"
EAGER = "eager"

# torch.distributed has no out-of-place form of these: all_reduce, broadcast and reduce write into
# their input. nccl-tests prints them in its in-place columns; the other ops have separate buffers
# (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, send/recv), as nccl-tests'
# out-of-place columns.
INPLACE_OPS = frozenset({"all_reduce", "broadcast", "reduce"})


def is_inplace(op: str) -> bool:
    return op in INPLACE_OPS


@dataclass(frozen=True)
class TimingChoice:
    """`mode` is GRAPH or EAGER; `note` says why eager when a graph was asked for ("" otherwise)."""

    mode: str
    note: str = ""


def select_timing(
    requested: bool, device_type: str, graph_api: bool, capture_error: Optional[str] = None
) -> TimingChoice:
    """CUDA-graph timing when asked for, on a GPU, with torch's CUDAGraph API, and capture has not failed
    for this op; eager otherwise, with the reason (the gloo/CPU path is eager, as it always was)."""
    if not requested:
        return TimingChoice(EAGER, "--no-graph")
    if device_type != "cuda":
        return TimingChoice(EAGER, "")  # CPU ranks (gloo): no CUDA graphs, nothing to say
    if not graph_api:
        return TimingChoice(EAGER, "this torch has no torch.cuda.CUDAGraph: timed eagerly")
    if capture_error:
        return TimingChoice(EAGER, f"CUDA graph capture failed ({capture_error}): timed eagerly")
    return TimingChoice(GRAPH)


def eager_fallbacks(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """op -> why it was timed eagerly although a graph was asked for (first note per op)."""
    out: dict[str, str] = {}
    for r in rows:
        note = r.get("timing_note")
        if r.get("timing") == EAGER and note and note != "--no-graph":
            out.setdefault(str(r.get("op")), str(note))
    return out
