"""CUDA-graph timing on an NCCL rank, as nccl-tests' `-G 1`: the timed loop captured once, replayed.

Runs inside a rank (imports torch). What capturing NCCL collectives from torch needs, and why:

- NCCL >= 2.9 and CUDA >= 11.3 support capturing collectives and P2P (NCCL user guide, "Using NCCL
  with CUDA Graphs"); whether an operation is captured must be the same on every rank, so a failed
  capture on any rank makes every rank fall back to eager for that op (`agree`).
- The communicator must exist and P2P connections be set up before capture (their lazy setup
  allocates memory, which capture forbids): every op is warmed up eagerly first, on the capture
  stream, as torch's CUDA-graph notes do ("warm up on a side stream before capture").
- `capture_error_mode="thread_local"`, as nccl-tests captures: ProcessGroupNCCL's watchdog thread
  queries events of earlier work while we capture, which the default "global" mode turns into a
  failed capture on some torch versions (pytorch/pytorch#104487, #104555). torch >= 2.1 also stops
  handing captured work to the watchdog (pytorch/pytorch#102542).
- Buffers are allocated before capture and only refilled in place (`copy_`) afterwards: a graph
  replays fixed addresses.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist

CAPTURE_MODE = "thread_local"


def graph_api_available() -> bool:
    """torch has CUDAGraph and the `graph` capture context, and CUDA is usable."""
    return hasattr(torch.cuda, "CUDAGraph") and hasattr(torch.cuda, "graph") and torch.cuda.is_available()


def capture(
    run: Callable[[], None], times: int, stream: torch.cuda.Stream, device: torch.device
) -> tuple[Optional[torch.cuda.CUDAGraph], Optional[str]]:
    """`run` called `times` times, captured in one graph on `stream`; (None, why) when capture fails."""
    previous = torch.cuda.current_stream(device)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode=CAPTURE_MODE):
            for _ in range(times):
                run()
    except Exception as exc:  # noqa: BLE001 - any failure means: time this op eagerly
        # A failing capture_end leaves graph()'s stream context entered: restore the stream we had.
        torch.cuda.set_stream(previous)
        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001, S110 - the failure above is the one worth reporting
            pass
        text = str(exc).strip()
        first = text.splitlines()[0][:200] if text else ""
        return None, f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return graph, None


def agree(ok: bool, device: torch.device, group: Optional[dist.ProcessGroup]) -> bool:
    """True when every rank's capture succeeded (an eager MIN all_reduce of the flags)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(int(flag.item()))


def warm_up(run: Callable[[], None], times: int, stream: torch.cuda.Stream, device: torch.device) -> None:
    """Eager calls on the capture stream: creates the communicator and P2P connections before capture."""
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        for _ in range(times):
            run()
    current.wait_stream(stream)
    torch.cuda.synchronize(device)


def time_replay(graph: torch.cuda.CUDAGraph, iters: int, device: torch.device) -> float:
    """Mean seconds per op over one replay of a graph of `iters` ops, timed with CUDA events.

    One untimed replay first: the first launch of a graph also uploads it to the GPU.
    """
    graph.replay()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def release(*graphs: Optional[torch.cuda.CUDAGraph]) -> None:
    """Free the graphs' resources now rather than at garbage collection (sizes up to 1 GiB follow)."""
    for g in graphs:
        if g is not None:
            try:
                g.reset()
            except Exception:  # noqa: BLE001, S110 - freeing is best effort
                pass


class GraphedCase:
    """The timed graph (`iters` ops) and, for the correctness check, a one-op graph of the same call."""

    def __init__(self, timed: torch.cuda.CUDAGraph, check: Optional[torch.cuda.CUDAGraph]) -> None:
        self.timed, self.check = timed, check


def prepare(
    run: Callable[[], None],
    iters: int,
    warmup: int,
    with_check: bool,
    device: torch.device,
    group: Optional[dist.ProcessGroup],
) -> tuple[Optional[GraphedCase], Optional[str]]:
    """Warm up, capture on every rank, agree; (graphs, None), or (None, why) to fall back to eager."""
    stream = torch.cuda.Stream(device)
    # At least one eager call, whatever --warmup says: capture cannot create connections.
    warm_up(run, max(warmup, 1), stream, device)
    timed, error = capture(run, iters, stream, device)
    check = None
    if timed is not None and with_check:
        check, error = capture(run, 1, stream, device)
    if not agree(error is None, device, group):
        release(timed, check)
        return None, error or "capture failed on another rank"
    assert timed is not None  # agree() is True only when this rank's capture succeeded
    return GraphedCase(timed, check), None
