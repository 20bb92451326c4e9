"""What the ranks are asked to run: plain picklable data, no torch (the parent never imports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple, Union

# Test-only: makes one rank misbehave at one step, so the fault tests exercise real ranks.
# Format: "rank=1,op=all_reduce,size=1024,action=kill" (action: kill, stop, raise, hang, corrupt; size optional;
# op "init" fires before the process group is created).
FAULT_ENV = "DDPDOCTOR_BENCH_FAULT"


@dataclass(frozen=True)
class BenchPlan:
    """One benchmark run: every op at every size."""

    ops: Tuple[str, ...]
    sizes: Tuple[int, ...]
    dtype: str = "float32"
    iters: int = 20
    warmup: int = 5
    check: bool = True
    graph: bool = False  # CUDA-graph timing (nccl-tests -G 1) where the ranks are on GPUs

    @property
    def steps(self) -> int:
        return len(self.ops) * len(self.sizes)


@dataclass(frozen=True)
class SmokePlan:
    """The `check` smoke test: one small all_reduce and one broadcast, values verified."""

    count: int = 1024


Job = Union[BenchPlan, SmokePlan]


@dataclass(frozen=True)
class RankSpec:
    """Everything one spawned rank needs; sent to it by the launcher."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    master_addr: str
    master_port: int
    pg_timeout_s: float
    job: Job
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: str = ""
    stack_path: str = ""
    device_index: Optional[int] = None  # CUDA device for NCCL ranks


@dataclass(frozen=True)
class FaultHook:
    rank: int
    op: str
    action: str
    size: Optional[int] = None

    def matches(self, rank: int, op: str, size: int) -> bool:
        return rank == self.rank and op == self.op and (self.size is None or self.size == size)


def parse_fault_hook(text: Optional[str]) -> Optional[FaultHook]:
    """Parse FAULT_ENV; None when unset or malformed (a typo must not break a real run)."""
    if not text:
        return None
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return FaultHook(
            rank=int(fields["rank"]),
            op=fields["op"],
            action=fields.get("action", "raise"),
            size=int(fields["size"]) if "size" in fields else None,
        )
    except (KeyError, ValueError):
        return None
