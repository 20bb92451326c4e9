"""Joining a launch someone else started (torchrun, srun): nothing is spawned, this process runs the job
as its rank under the same step watchdog (faulthandler) and failure reporting as a local launch."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.bench.launcher import default_pg_timeout
from ddpdoctor.bench.outcome import EventCallback, LaunchResult, RankFailure, RankState, is_peer_failure
from ddpdoctor.bench.plan import FAULT_ENV, BenchPlan, Job, parse_fault_hook
from ddpdoctor.core.launchenv import read_launch_env
from ddpdoctor.parsers.numbers import parse_int

# cluster.topology.run_scoped_benchmark's shape: (plan, device, backend, reporter, *, step_timeout_s, fault) -> rows
ScopedRun = Callable[..., list[dict[str, Any]]]


@dataclass(frozen=True)
class ExternalRank:
    """This process's place in a launch started by someone else."""

    launcher: str  # "torchrun" or "slurm"
    rank: int
    world_size: int
    local_rank: int
    master_addr: Optional[str]
    master_port: Optional[int]


def detect_external_launch(env: Mapping[str, str]) -> Optional[ExternalRank]:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; srun sets SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID.

    A Slurm allocation alone (sbatch script, salloc shell) has SLURM_JOB_ID but no SLURM_PROCID
    with SLURM_NTASKS > 1 for a single task: that is not a multi-rank launch.
    """

    launch = read_launch_env(env)
    # The port's range is judged by the caller, which names a bad MASTER_PORT in its refusal.
    port = parse_int(env.get("MASTER_PORT"))
    addr = launch.master_addr or None
    rank, world, local = launch.rank, launch.world_size, launch.local_rank or 0
    if rank is None or world is None:
        return None
    if launch.launcher in ("torchrun", "env"):
        return ExternalRank("torchrun", rank, world, local, addr, port)
    if launch.launcher == "slurm" and world > 1 and env.get("SLURM_STEP_ID") is not None:
        return ExternalRank("slurm", rank, world, local, addr, port)
    return None


class _JoinedReporter:
    """Progress for a joined rank: re-arms the in-process watchdog at every step."""

    def __init__(
        self, step_timeout_s: float, on_event: Optional[EventCallback], state: RankState, result: LaunchResult
    ) -> None:
        self.timeout, self.on_event, self.state, self.result = step_timeout_s, on_event, state, result

    def step(self, op: str, size: int) -> None:
        self._arm(op, size, self.timeout)

    def wait(self, label: str, timeout_s: float) -> None:
        self._arm(label, 0, timeout_s)

    def _arm(self, op: str, size: int, timeout_s: float) -> None:
        import faulthandler

        self.state.op, self.state.size, self.state.since = op, size, time.monotonic()
        self.state.limit = timeout_s
        faulthandler.cancel_dump_traceback_later()
        # On expiry: every thread's stack to stderr, then exit 1; the external launcher tears down the rest.
        faulthandler.dump_traceback_later(timeout_s, exit=True)
        if self.on_event:
            self.on_event(self.state.rank, {"kind": "step", "op": op, "size": size})

    def row(self, row: dict[str, Any]) -> None:
        # Rows of the intra-/inter-node runs (tagged with a scope) come back gathered from every node
        # by run_scoped_benchmark; here they only move the progress bar.
        if not row.get("scope"):
            self.result.rows.append(row)
        if self.on_event:
            self.on_event(self.state.rank, {"kind": "row", "row": row})


def join_as_rank(
    job: Job,
    ext: ExternalRank,
    *,
    backend: str,
    step_timeout_s: float,
    on_event: Optional[EventCallback] = None,
    scoped: Optional[ScopedRun] = None,
) -> LaunchResult:
    """Run `job` in this process as rank `ext.rank` of an external launch (imports torch).

    `scoped` runs a benchmark plan again within each node and between nodes on the initialized world
    (cluster.topology.run_scoped_benchmark, passed in by the caller so that bench never imports cluster).
    """
    import faulthandler

    from ddpdoctor.bench import worker

    result = LaunchResult(world_size=ext.world_size, backend=backend, timeout_s=step_timeout_s)
    state = RankState(rank=ext.rank, pid=os.getpid(), host=socket.gethostname(), since=time.monotonic())
    result.ranks[ext.rank] = state
    reporter = _JoinedReporter(step_timeout_s, on_event, state, result)
    fault = parse_fault_hook(os.environ.get(FAULT_ENV))
    start = time.monotonic()
    try:
        reporter.step("init", 0)
        device = worker.select_device(backend, ext.local_rank)
        worker.init_group(backend, ext.rank, ext.world_size, default_pg_timeout(step_timeout_s), device)
        result.env = worker.describe_environment(backend, device)
        state.result = worker.run_job(job, backend, device, reporter, fault)
        if isinstance(job, BenchPlan) and scoped is not None:
            # When the ranks span nodes: the same plan within each node, then between nodes (one rank
            # per node), every step armed by the same watchdog; [] on one node.
            rows = scoped(job, device, backend, reporter, step_timeout_s=step_timeout_s, fault=fault)
            result.rows.extend(rows)
            state.result = [*state.result, *rows]
        state.done = True
        faulthandler.cancel_dump_traceback_later()
        worker.dist.barrier()
        worker.dist.destroy_process_group()
    except KeyboardInterrupt:
        result.interrupted = True
    except Exception as exc:  # noqa: BLE001 - reported, never a traceback
        import traceback as tb

        message = str(exc)
        result.failures.append(
            RankFailure(
                rank=ext.rank,
                kind="exception",
                op=state.op,
                size=state.size,
                host=state.host,
                pid=state.pid,
                exc_type=type(exc).__name__,
                message=message[:4000],
                traceback="".join(tb.format_exception(type(exc), exc, exc.__traceback__))[-6000:],
                peer_failure=is_peer_failure(message),
            )
        )
        result.root_cause = result.failures[0]
    finally:
        faulthandler.cancel_dump_traceback_later()
    result.duration_s = time.monotonic() - start
    return result
