"""Runs inside each rank: the only code that calls torch.distributed collectives.

`run_benchmark` needs nothing but an initialized process group, so it serves the spawned ranks of
`bench-nccl`, ranks joined under torchrun/srun, and any caller with its own group.
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable, Optional, Protocol

import torch
import torch.distributed as dist

from ddpdoctor.bench import graphs
from ddpdoctor.bench.math import (
    DTYPE_LABELS,
    bandwidths,
    coll_counts,
    redop_label,
    root_of,
)
from ddpdoctor.bench.plan import (
    FAULT_ENV,
    BenchPlan,
    FaultHook,
    Job,
    RankSpec,
    SmokePlan,
    parse_fault_hook,
)
from ddpdoctor.bench.timing import GRAPH, is_inplace, select_timing

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Largest integer below which every integer is exact: sums of the 0/1/2 test pattern stay exact
# up to this, so correctness can be checked with ==.
EXACT_INT_LIMIT = {"float32": 2**24, "float16": 2048, "bfloat16": 256}
PR_SET_PDEATHSIG = 1


class Reporter(Protocol):
    """Where a rank reports progress; the launcher's watchdog reads it."""

    def step(self, op: str, size: int) -> None: ...

    def row(self, row: dict[str, Any]) -> None: ...

    def wait(self, label: str, timeout_s: float) -> None:
        """A step spent waiting for other ranks' work (not a collective of this rank's own), which
        may legitimately take up to `timeout_s` rather than the per-step limit."""
        ...


class NullReporter:
    def step(self, op: str, size: int) -> None:
        pass

    def row(self, row: dict[str, Any]) -> None:
        pass

    def wait(self, label: str, timeout_s: float) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Test pattern: rank r holds (r + j) % 3 at element j. Every rank can compute every result.


def _index(start: int, count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + count, device=device, dtype=torch.int64)


def pattern(start: int, count: int, shift: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return ((_index(start, count, device) + shift) % 3).to(dtype)


def summed_pattern(
    start: int, count: int, nranks: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """sum over r < nranks of (r + j) % 3: each full cycle of 3 ranks adds 0+1+2."""
    idx = _index(start, count, device)
    full, rest = divmod(nranks, 3)
    total = torch.full_like(idx, 3 * full)
    for t in range(rest):
        total += (idx + t) % 3
    return total.to(dtype)


def count_wrong(got: torch.Tensor, expected: torch.Tensor, dtype_name: str, nranks: int) -> int:
    if got.numel() == 0:
        return 0
    if nranks + 2 <= EXACT_INT_LIMIT[dtype_name]:
        return int((got != expected).sum().item())
    # Sums too large to be exact in this dtype: allow rounding of the final value.
    rel = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}[dtype_name]
    diff = (got.double() - expected.double()).abs()
    return int((diff > rel * expected.double().abs() + 1e-12).sum().item())


# ---------------------------------------------------------------------------------------------
# One op at one size.


class _Case:
    """Buffers and the call for one op; `reset` refills inputs, `expected` is this rank's answer."""

    def __init__(
        self,
        op: str,
        count: int,
        nranks: int,
        rank: int,
        dtype: torch.dtype,
        device: torch.device,
        group: Optional[dist.ProcessGroup],
    ) -> None:
        self.op, self.count, self.n, self.rank = op, count, nranks, rank
        self.dtype, self.device, self.group = dtype, device, group
        c, n = count, nranks
        if op in ("all_reduce", "broadcast", "reduce"):
            self.inp = torch.empty(c, dtype=dtype, device=device)
            self.out = self.inp
        elif op == "all_gather":
            self.inp = torch.empty(c, dtype=dtype, device=device)
            self.out = torch.empty(c * n, dtype=dtype, device=device)
        elif op in ("reduce_scatter",):
            self.inp = torch.empty(c * n, dtype=dtype, device=device)
            self.out = torch.empty(c, dtype=dtype, device=device)
        elif op == "all_to_all":
            self.inp = torch.empty(c * n, dtype=dtype, device=device)
            self.out = torch.empty(c * n, dtype=dtype, device=device)
        elif op == "sendrecv":
            self.inp = torch.empty(c, dtype=dtype, device=device)
            self.out = torch.empty(c, dtype=dtype, device=device)
        else:
            raise ValueError(f"unknown op {op!r}")
        self.root = self._global(0)
        self.reset()

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def reset(self) -> None:
        self.inp.copy_(pattern(0, self.inp.numel(), self.rank, self.dtype, self.device))

    def run(self) -> None:
        g, op = self.group, self.op
        if op == "all_reduce":
            dist.all_reduce(self.inp, op=dist.ReduceOp.SUM, group=g)
        elif op == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp, group=g)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp, op=dist.ReduceOp.SUM, group=g)
        elif op == "broadcast":
            dist.broadcast(self.inp, src=self.root, group=g)
        elif op == "reduce":
            dist.reduce(self.inp, dst=self.root, op=dist.ReduceOp.SUM, group=g)
        elif op == "all_to_all":
            dist.all_to_all_single(self.out, self.inp, group=g)
        elif op == "sendrecv":
            # A ring, as nccl-tests: send to the next rank, receive from the previous one.
            nxt, prev = self._global((self.rank + 1) % self.n), self._global((self.rank - 1) % self.n)
            reqs = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, self.inp, nxt, g), dist.P2POp(dist.irecv, self.out, prev, g)]
            )
            for req in reqs:
                req.wait()

    def expected(self) -> Optional[torch.Tensor]:
        """What this rank's output must hold; None where the op defines no result here (reduce off-root)."""
        c, n, r, dt, dev = self.count, self.n, self.rank, self.dtype, self.device
        op = self.op
        if op == "all_reduce":
            return summed_pattern(0, c, n, dt, dev)
        if op == "reduce":
            return summed_pattern(0, c, n, dt, dev) if r == 0 else None
        if op == "broadcast":
            return pattern(0, c, 0, dt, dev)
        if op == "all_gather":
            return torch.cat([pattern(0, c, src, dt, dev) for src in range(n)]) if c else self.out[:0]
        if op == "reduce_scatter":
            return summed_pattern(r * c, c, n, dt, dev)
        if op == "all_to_all":
            # Chunk `src` of my output is chunk `r` of rank src's input: (src + r*c + i) % 3.
            return torch.cat([pattern(r * c, c, src, dt, dev) for src in range(n)]) if c else self.out[:0]
        if op == "sendrecv":
            return pattern(0, c, (r - 1) % n, dt, dev)
        raise ValueError(op)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ops(run: Callable[[], None], iters: int, device: torch.device) -> float:
    """Mean seconds per op: CUDA events on a GPU, the monotonic clock on the CPU."""
    if iters <= 0:
        return 0.0
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    return (time.perf_counter() - t0) / iters


def run_one(
    op: str,
    size: int,
    plan: BenchPlan,
    device: torch.device,
    group: Optional[dist.ProcessGroup] = None,
    corrupt: bool = False,
    capture_errors: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """Benchmark one op at one requested size; every rank returns the same (reduced) row.

    `capture_errors` (op -> why) remembers ops whose CUDA-graph capture failed: they stay eager for
    the remaining sizes.
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    dtype = DTYPES[plan.dtype]
    counts = coll_counts(op, size, dtype.itemsize, n)
    capture_errors = {} if capture_errors is None else capture_errors
    row: dict[str, Any] = {
        "op": op,
        "size": counts.size_bytes,
        "requested_bytes": size,
        "count": counts.count,
        "dtype": plan.dtype,
        "type": DTYPE_LABELS[plan.dtype],
        "redop": redop_label(op),
        "root": root_of(op),
        "nranks": n,
        "inplace": is_inplace(op),
    }
    if op == "sendrecv" and n < 2:
        row.update(
            time_us=None,
            time_us_avg=None,
            algbw=None,
            busbw=None,
            wrong=None,
            timing=None,
            skipped="sendrecv needs at least 2 ranks",
        )
        return row
    case = _Case(op, counts.count, n, rank, dtype, device, group)
    choice = select_timing(plan.graph, device.type, _graph_api(device), capture_errors.get(op))
    graphed = None
    if choice.mode == GRAPH:
        graphed, error = graphs.prepare(case.run, plan.iters, plan.warmup, plan.check, device, group)
        if graphed is None:
            choice = select_timing(plan.graph, device.type, True, error or "unknown")
            if counts.count:  # an empty buffer (size 0) may capture nothing: no verdict on the op
                capture_errors[op] = error or "unknown"
    else:
        for _ in range(plan.warmup):
            case.run()
    _sync(device)
    dist.barrier(group=group)
    if graphed is not None:
        seconds = graphs.time_replay(graphed.timed, plan.iters, device)
    else:
        seconds = _time_ops(case.run, plan.iters, device)
    wrong = 0.0
    if plan.check:
        case.reset()
        _sync(device)
        if graphed is not None and graphed.check is not None:
            graphed.check.replay()  # the check runs on the graphed path too
        else:
            case.run()
        _sync(device)
        if corrupt and case.out.numel():
            case.out.view(-1)[0] += 1  # test-only (FAULT_ENV action=corrupt): a flipped element
        expected = case.expected()
        if expected is not None:
            wrong = float(count_wrong(case.out, expected, plan.dtype, n))
    if graphed is not None:
        graphs.release(graphed.timed, graphed.check)
    # As nccl-tests, one time for all ranks; we report the slowest rank's (and keep the mean).
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    totals = torch.tensor([seconds, wrong], dtype=torch.float64, device=device)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=group)
    t_max, t_sum, wrong_sum = float(slowest[0].item()), float(totals[0].item()), int(totals[1].item())
    algbw, busbw = bandwidths(counts, t_max)
    row.update(
        time_us=t_max * 1e6,
        time_us_avg=t_sum / n * 1e6,
        algbw=algbw,
        busbw=busbw,
        wrong=wrong_sum if plan.check else None,
        timing=choice.mode,
    )
    if choice.note:
        row["timing_note"] = choice.note
    return row


def _graph_api(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    return graphs.graph_api_available()


def run_benchmark(
    plan: BenchPlan,
    device: torch.device,
    reporter: Optional[Reporter] = None,
    group: Optional[dist.ProcessGroup] = None,
    fault: Optional[FaultHook] = None,
) -> list[dict[str, Any]]:
    """Every op at every size on an already initialized process group (or `group`)."""
    reporter = reporter or NullReporter()
    rank = dist.get_rank(group)
    rows = []
    capture_errors: dict[str, str] = {}  # an op whose capture failed stays eager at every size
    for op in plan.ops:
        for size in plan.sizes:
            reporter.step(op, size)
            corrupt = fault is not None and fault.action == "corrupt" and fault.matches(rank, op, size)
            if not corrupt:
                _maybe_fault(fault, rank, op, size)
            row = run_one(op, size, plan, device, group, corrupt=corrupt, capture_errors=capture_errors)
            reporter.row(row)
            rows.append(row)
    return rows


def run_smoke(
    plan: SmokePlan,
    device: torch.device,
    reporter: Optional[Reporter] = None,
    fault: Optional[FaultHook] = None,
) -> dict[str, Any]:
    """One small all_reduce and one broadcast, values verified on this rank."""
    reporter = reporter or NullReporter()
    n, rank = dist.get_world_size(), dist.get_rank()
    c = plan.count
    result: dict[str, Any] = {"rank": rank, "host": socket.gethostname(), "device": describe_device(device)}
    reporter.step("all_reduce", c * 4)
    _maybe_fault(fault, rank, "all_reduce", c * 4)
    x = torch.full((c,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(x)
    want = n * (n + 1) / 2
    result["all_reduce"] = {"expected": want, "wrong": int((x != want).sum().item())}
    reporter.step("broadcast", c * 4)
    _maybe_fault(fault, rank, "broadcast", c * 4)
    y = torch.full((c,), float(rank + 7), dtype=torch.float32, device=device)
    dist.broadcast(y, src=0)
    result["broadcast"] = {"expected": 7.0, "wrong": int((y != 7.0).sum().item())}
    _sync(device)
    return result


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index} {torch.cuda.get_device_name(device)}"
    return "cpu"


def describe_environment(backend: str, device: torch.device) -> dict[str, Any]:
    """Versions and devices as this rank sees them (sent by rank 0 for the report)."""
    env: dict[str, Any] = {
        "torch": str(torch.__version__),
        "torch_cuda": str(torch.version.cuda) if torch.version.cuda else None,
        "backend": backend,
        "world_size": dist.get_world_size() if dist.is_initialized() else None,
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "nccl": None,
        "devices": [],
    }
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            env["nccl"] = ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - a build without NCCL
            env["nccl"] = None
        env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return env


def _maybe_fault(fault: Optional[FaultHook], rank: int, op: str, size: int) -> None:
    if fault is None or not fault.matches(rank, op, size):
        return
    sys.stderr.flush()
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault.action == "hang":
        while True:
            time.sleep(3600)
    else:
        raise RuntimeError(f"injected fault ({FAULT_ENV}) at {op} size {size} on rank {rank}")


# ---------------------------------------------------------------------------------------------
# Process setup shared by spawned and joined ranks.


def select_device(backend: str, local_rank: int) -> torch.device:
    """The device this rank works on; NCCL ranks pin one GPU each before any CUDA work (the index as
    the placement judgement sees it: under srun's per-task binding, the task's own GPU)."""
    if backend == "nccl":
        from ddpdoctor.core.placement import choose_cuda_index

        index = choose_cuda_index(local_rank, torch.cuda.device_count(), os.environ)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_group(
    backend: str,
    rank: int,
    world_size: int,
    timeout_s: float,
    device: torch.device,
    init_method: Optional[str] = None,
) -> None:
    """init_process_group with an explicit short timeout (the default is 10-30 minutes: a hang to a user)."""
    kwargs: dict[str, Any] = {
        "backend": backend,
        "rank": rank,
        "world_size": world_size,
        "timeout": datetime.timedelta(seconds=timeout_s),
    }
    if init_method:
        kwargs["init_method"] = init_method
    if device.type == "cuda":
        kwargs["device_id"] = device  # eager NCCL init: failures surface here, not in the first op
    dist.init_process_group(**kwargs)


def run_job(
    job: Job, backend: str, device: torch.device, reporter: Reporter, fault: Optional[FaultHook]
) -> Any:
    if isinstance(job, BenchPlan):
        return run_benchmark(job, device, reporter, fault=fault)
    if isinstance(job, SmokePlan):
        return run_smoke(job, device, reporter, fault=fault)
    raise TypeError(f"unknown job {job!r}")


class PipeReporter:
    """Sends progress to the launcher over this rank's own pipe."""

    def __init__(self, conn: Any, rank: int) -> None:
        self.conn, self.rank, self.n = conn, rank, 0

    def send(self, kind: str, **data: Any) -> None:
        self.conn.send({"kind": kind, "rank": self.rank, "t": time.time(), **data})

    def step(self, op: str, size: int) -> None:
        self.n += 1
        self.send("step", step=self.n, op=op, size=size)

    def row(self, row: dict[str, Any]) -> None:
        if self.rank == 0:
            self.send("row", row=row)

    def wait(self, label: str, timeout_s: float) -> None:
        self.n += 1
        self.send("step", step=self.n, op=label, size=0, timeout_s=timeout_s)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this rank when its parent dies: no orphan survives a killed launcher."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


def _redirect_output(path: str) -> None:
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def acknowledge_stack_dumps(done_path: str) -> None:
    """After each SIGUSR1 stack dump, append one byte to `done_path`: the launcher's signal that the dump
    is complete, so it reads whole stacks and never waits a fixed time.

    faulthandler dumps from its C signal handler (it works while the rank is blocked inside a collective,
    where a Python handler would never run); registered with chain=True it then calls the previous
    handler, Python's own C handler, which writes the signal number to the wakeup fd before returning.
    The Python-level handler below runs later, if ever, and does nothing. Any other signal with a Python
    handler writes its byte too: the launcher counts bytes from before its request, never "non-empty".
    """
    fd = os.open(done_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o600)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    signal.set_wakeup_fd(fd, warn_on_full_buffer=False)


def rank_main(spec: RankSpec, conn: Any) -> None:
    """Entry point of a spawned rank (forked by the zygote); never returns."""
    # The launcher owns Ctrl-C and SIGTERM (scancel signals every process of the step): it stops every
    # rank itself with SIGKILL, so ranks do not race it with tracebacks or look like the root cause.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()
    os.environ.update(spec.env)
    _redirect_output(spec.log_path)
    stack_file = open(spec.stack_path, "w") if spec.stack_path else sys.stderr  # noqa: SIM115
    if spec.stack_path:
        acknowledge_stack_dumps(spec.stack_path + ".done")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=bool(spec.stack_path))
    reporter = PipeReporter(conn, spec.rank)
    fault = parse_fault_hook(os.environ.get(FAULT_ENV))
    code = 0
    try:
        reporter.send("hello", pid=os.getpid(), host=socket.gethostname())
        reporter.step("init", 0)
        _maybe_fault(fault, spec.rank, "init", 0)
        device = select_device(spec.backend, spec.local_rank)
        init_group(
            spec.backend,
            spec.rank,
            spec.world_size,
            spec.pg_timeout_s,
            device,
            init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
        )
        if spec.rank == 0:
            reporter.send("env", env=describe_environment(spec.backend, device))
        result = run_job(spec.job, spec.backend, device, reporter, fault)
        _sync(device)
        reporter.send("done", result=result)
        # Every rank past its last collective before anyone closes its sockets; then exit without
        # destroy_process_group (slow, and nothing is left to tear down cleanly in a process that
        # ends here). A failure after "done" is ignored by the launcher.
        dist.barrier()
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which decides
        code = 1
        try:
            reporter.send(
                "error",
                exc_type=type(exc).__name__,
                message=str(exc)[:4000],
                traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-6000:],
            )
        except (OSError, EOFError, BrokenPipeError):
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # Skip interpreter teardown: NCCL/gloo destructors can block on a dead peer.
    os._exit(code)
