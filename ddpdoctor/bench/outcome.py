"""What a launch returns: each rank's state and failure, the result, and which failure is the root cause.

The rank protocol's data, shared by the local launcher (launcher.py), joined launches (external.py) and
their renderers; no processes here."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

# Messages a rank raises when a *peer* went away or stalled: consequences, not causes.
_PEER_FAILURE = re.compile(
    r"connection (closed|reset) by peer|broken pipe|ECONNRESET|EPIPE|remote process exited|ncclRemoteError|"
    r"timed out|timeout|Connection refused|communicator was aborted|DistNetworkError|"
    r"Socket Timeout|recvBytes|sendBytes|read error|Gloo connectFullMesh failed",
    re.IGNORECASE,
)


# (rank, event): a rank's progress as it reports it (step, row, ready, ...)
EventCallback = Callable[[int, Mapping[str, Any]], None]
LAUNCHER_RANK = -1  # a failure of the zygote itself, before any rank ran


@dataclass
class RankState:
    rank: int
    pid: Optional[int] = None
    host: str = ""
    step: int = 0
    op: str = "start"
    size: int = 0
    since: float = 0.0  # monotonic time the current step began
    limit: Optional[float] = None  # this step's own limit (a wait on other ranks), else the step timeout
    done: bool = False
    result: Any = None
    exitcode: Optional[int] = None


@dataclass
class RankFailure:
    """What went wrong on one rank. `kind`: exception, signal, exit or stuck."""

    rank: int
    kind: str
    op: str
    size: int
    host: str = ""
    pid: Optional[int] = None
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    signal: str = ""
    exitcode: Optional[int] = None
    at: float = 0.0
    peer_failure: bool = False
    stack: str = ""
    stack_missing: str = ""  # a stuck rank whose stack could not be dumped: why (status, time waited)
    status: str = ""
    log_tail: str = ""
    step: int = 0

    @property
    def in_collective(self) -> bool:
        """Its dumped stack shows it waiting inside torch.distributed (i.e. on its peers)."""
        return "torch/distributed/" in self.stack

    def describe(self) -> str:
        if self.rank == LAUNCHER_RANK and self.exitcode is None:
            return f"the ranks could not be started: {self.message}"
        if self.rank == LAUNCHER_RANK:
            return (
                f"the rank launcher exited ({self.exitcode}) before the ranks ran: {first_line(self.message)}"
            )
        where = f"rank {self.rank}" + (f" on {self.host}" if self.host else "") + f" in {self.op}"
        if self.size:
            where += f" ({self.size} bytes)"
        if self.kind == "signal":
            return f"{where}: killed by {self.signal}"
        if self.kind == "exit":
            return f"{where}: exited with code {self.exitcode} without reporting an error"
        if self.kind == "stuck":
            state = f" (process {self.status})" if self.status and self.status != "running" else ""
            return f"{where}: no progress{state}"
        return f"{where}: {self.exc_type}: {first_line(self.message)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, with secrets redacted from the texts (tracebacks and logs can echo the environment)."""
        from ddpdoctor.edge.sources import redact_text

        return {k: redact_text(v) if isinstance(v, str) else v for k, v in self.__dict__.items() if k != "at"}


@dataclass
class LaunchResult:
    """Outcome of one launch, keyed by rank, root cause first."""

    world_size: int
    backend: str
    ranks: dict[int, RankState] = field(default_factory=dict)
    failures: list[RankFailure] = field(default_factory=list)
    root_cause: Optional[RankFailure] = None
    timed_out: bool = False
    timeout_s: float = 0.0
    interrupted: bool = False
    interrupted_by: str = ""  # "SIGINT" (Ctrl-C) or "SIGTERM" (kill, scancel, a Slurm time limit)
    master_port: int = 0
    port_attempts: int = 0
    env: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            not self.failures
            and not self.timed_out
            and not self.interrupted
            and all(s.done for s in self.ranks.values())
        )

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.ranks.values() if s.pid is not None]

    def results(self) -> dict[int, Any]:
        return {r: s.result for r, s in sorted(self.ranks.items()) if s.done}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "world_size": self.world_size,
            "backend": self.backend,
            "root_cause": self.root_cause.to_dict() if self.root_cause else None,
            "failures": [f.to_dict() for f in self.failures],
            "timed_out": self.timed_out,
            "timeout_s": self.timeout_s,
            "interrupted": self.interrupted,
            "interrupted_by": self.interrupted_by or None,
            "master_port": self.master_port,
        }


class LaunchRefused(Exception):
    """The launch cannot work as asked (e.g. a pinned MASTER_PORT that is taken); nothing was started."""


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def is_peer_failure(message: str) -> bool:
    """True when an exception text says a peer vanished or stalled (a consequence, not a cause)."""
    return bool(_PEER_FAILURE.search(message))


def pick_root_cause(failures: list[RankFailure]) -> Optional[RankFailure]:
    """The failure that explains the others.

    Order: a rank that died by a signal or exited without a report; a rank that raised something
    other than a lost-peer error; a stuck rank that is stopped, behind the others, or stuck outside
    any collective (its peers wait inside one for it); then the earliest failure.
    """
    stuck_steps = [f.step for f in failures if f.kind == "stuck"]
    latest = max(stuck_steps, default=0)

    def straggler(f: RankFailure) -> bool:
        return (
            f.status in ("stopped", "tracing-stop")
            or f.step < latest
            or (bool(f.stack) and not f.in_collective)
        )

    def priority(f: RankFailure) -> tuple[int, float, int]:
        if f.kind in ("signal", "exit"):
            p = 0
        elif f.kind == "exception" and not f.peer_failure:
            p = 1
        elif f.kind == "stuck" and straggler(f):
            p = 2
        elif f.kind == "exception":
            p = 3
        else:
            p = 4
        return (p, f.at, f.rank)

    return min(failures, key=priority) if failures else None


def signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"
