"""bench-nccl rows next to nccl-tests tables: per-op, per-size time ratios (pure).

Used by bench/bench_vs_nccl_tests.py. The pairing follows what each side measures: an op torch runs
in place (all_reduce, broadcast, reduce) is compared with nccl-tests' in-place columns, the others with
its out-of-place columns; sizes are matched on the buffer size in bytes (both tools print the same
`size`, rounded the same way, see bench/math.py). A ratio is ddpdoctor's time / nccl-tests' time:
1.0 is the same speed, 3.0 three times slower.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpdoctor.bench.timing import is_inplace
from ddpdoctor.parsers.nccl_tests import PerfTable

# nccl-tests binary per ddpdoctor op name.
BINARIES: dict[str, str] = {
    "all_reduce": "all_reduce_perf",
    "all_gather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf",
    "broadcast": "broadcast_perf",
    "reduce": "reduce_perf",
    "all_to_all": "alltoall_perf",
    "sendrecv": "sendrecv_perf",
}
GOAL_LOW, GOAL_HIGH = 0.90, 1.10
GOAL_MIN_BYTES, GOAL_MAX_BYTES = 1024, 1 << 30


@dataclass(frozen=True)
class TimeRatio:
    op: str
    size: int
    column: str  # nccl-tests' "out_of_place" or "in_place"
    ours_us: Optional[float]
    theirs_us: Optional[float]

    @property
    def ratio(self) -> Optional[float]:
        if self.ours_us is None or not self.theirs_us:
            return None
        return self.ours_us / self.theirs_us

    @property
    def in_goal_range(self) -> bool:
        """Inside the sizes the goal covers (1 KiB..1 GiB) and compared out of place."""
        return self.column == "out_of_place" and GOAL_MIN_BYTES <= self.size <= GOAL_MAX_BYTES

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "size": self.size,
            "column": self.column,
            "ours_us": self.ours_us,
            "nccl_tests_us": self.theirs_us,
            "ratio": self.ratio,
            "goal": self.in_goal_range,
        }


def nccl_tests_column(op: str) -> str:
    return "in_place" if is_inplace(op) else "out_of_place"


def nccl_tests_times(table: PerfTable, column: str) -> dict[int, float]:
    """size (bytes) -> time (us) of one column group of an nccl-tests table; N/A cells left out."""
    out: dict[int, float] = {}
    for row in table.rows:
        group = row.get(column)
        size = row.get("size")
        if (
            isinstance(size, int)
            and isinstance(group, Mapping)
            and isinstance(group.get("time_us"), (int, float))
        ):
            out[size] = float(group["time_us"])
    return out


def our_times(rows: Iterable[Mapping[str, Any]], op: str) -> dict[int, float]:
    """size (bytes) -> time (us) of one op's measured whole-world bench-nccl rows (skipped rows left out)."""
    out: dict[int, float] = {}
    for r in rows:
        if r.get("op") != op or (r.get("scope") or "world") != "world" or r.get("skipped"):
            continue
        if isinstance(r.get("size"), int) and isinstance(r.get("time_us"), (int, float)):
            out[int(r["size"])] = float(r["time_us"])
    return out


def compare_op(op: str, rows: Iterable[Mapping[str, Any]], table: PerfTable) -> list[TimeRatio]:
    """One ratio per size either side measured, smallest size first (a side's missing time is None)."""
    column = nccl_tests_column(op)
    ours = our_times(rows, op)
    theirs = nccl_tests_times(table, column)
    return [
        TimeRatio(op, size, column, ours.get(size), theirs.get(size))
        for size in sorted(set(ours) | set(theirs))
    ]


def median_times(runs: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """Per size, the median over alternating rounds (sizes measured in every round only)."""
    if not runs:
        return {}
    common = set(runs[0]).intersection(*runs[1:])
    return {size: statistics.median(run[size] for run in runs) for size in sorted(common)}


def goal_misses(
    ratios: Iterable[TimeRatio], low: float = GOAL_LOW, high: float = GOAL_HIGH
) -> list[TimeRatio]:
    """Ratios the goal covers (out of place, 1 KiB..1 GiB) that fall outside [low, high] or were not
    measured on one side."""
    return [r for r in ratios if r.in_goal_range and (r.ratio is None or not low <= r.ratio <= high)]


def ratio_table_lines(ratios: Sequence[TimeRatio], mode: str) -> list[str]:
    """A plain table: op, size, nccl-tests column, both times, the ratio, and whether it meets the goal."""
    lines = [
        f"# timing: {mode} (ddpdoctor {'--graph' if mode == 'graph' else '--no-graph'} vs nccl-tests "
        f"{'-G 1' if mode == 'graph' else 'default'}); ratio = ddpdoctor time / nccl-tests time",
        f"# {'op':<15} {'size (B)':>12} {'column':<13} {'ddpdoctor us':>13} {'nccl-tests us':>14} {'ratio':>7}",
    ]
    for r in ratios:
        ours = "N/A" if r.ours_us is None else f"{r.ours_us:.2f}"
        theirs = "N/A" if r.theirs_us is None else f"{r.theirs_us:.2f}"
        ratio = "N/A" if r.ratio is None else f"{r.ratio:.2f}"
        mark = ""
        if r.in_goal_range:
            mark = "  ok" if r.ratio is not None and GOAL_LOW <= r.ratio <= GOAL_HIGH else "  MISS"
        lines.append(f"  {r.op:<15} {r.size:>12} {r.column:<13} {ours:>13} {theirs:>14} {ratio:>7}{mark}")
    return lines
