"""Judging benchmark rows: peak/average busbw, wrong elements, --min-busbw, --baseline. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpdoctor.model import ExitCode

JSON_SCHEMA = "ddpdoctor.bench/1"
DEFAULT_BASELINE_TOLERANCE = 0.10
# Columns of the CSV (and the order of keys in each JSON row).
ROW_FIELDS = (
    "op",
    "size",
    "requested_bytes",
    "count",
    "dtype",
    "type",
    "redop",
    "root",
    "nranks",
    "time_us",
    "time_us_avg",
    "algbw",
    "busbw",
    "wrong",
)
ENV_FIELDS = ("host", "backend", "world_size", "torch", "torch_cuda", "nccl", "driver", "gpus")


@dataclass(frozen=True)
class OpSummary:
    op: str
    peak_busbw: Optional[float]
    avg_busbw: Optional[float]
    peak_size: Optional[int]
    wrong: Optional[int]
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Verdict:
    """One pass/fail judgement on the run; `failed` ones make the exit code 1."""

    id: str
    failed: bool
    summary: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "failed": self.failed, "summary": self.summary, "data": dict(self.data)}


@dataclass(frozen=True)
class BaselineRatio:
    op: str
    baseline_busbw: Optional[float]
    busbw: Optional[float]
    ratio: Optional[float]
    regressed: bool
    sizes: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(rows: Iterable[Mapping[str, Any]], ops: Sequence[str]) -> list[OpSummary]:
    """Peak and average busbw per op, in the order asked (nccl-tests' 'Avg bus bandwidth' is the mean)."""
    out = []
    rows = list(rows)
    for op in ops:
        mine = [r for r in rows if r.get("op") == op]
        timed = [r for r in mine if isinstance(r.get("busbw"), (int, float))]
        peak_row = max(timed, key=lambda r: r["busbw"], default=None)
        wrongs = [r["wrong"] for r in mine if isinstance(r.get("wrong"), int)]
        out.append(
            OpSummary(
                op=op,
                peak_busbw=peak_row["busbw"] if peak_row else None,
                avg_busbw=sum(r["busbw"] for r in timed) / len(timed) if timed else None,
                peak_size=peak_row["size"] if peak_row else None,
                wrong=sum(wrongs) if wrongs else None,
                rows=len(mine),
            )
        )
    return out


def judge_correctness(rows: Iterable[Mapping[str, Any]]) -> Verdict:
    bad = [r for r in rows if isinstance(r.get("wrong"), int) and r["wrong"] > 0]
    if not bad:
        return Verdict("bench.correctness", False, "every measured result matched the expected values")
    where = ", ".join(f"{r['op']} {r['size']} B: {r['wrong']}" for r in bad[:5])
    total = sum(r["wrong"] for r in bad)
    return Verdict(
        "bench.correctness",
        True,
        f"{total} wrong elements in {len(bad)} results ({where}): data is corrupted in transit, whatever the bandwidth",
        {"wrong": total, "results": len(bad)},
    )


def judge_min_busbw(summaries: Sequence[OpSummary], min_busbw: float) -> Verdict:
    ar = next((s for s in summaries if s.op == "all_reduce"), None)
    peak = ar.peak_busbw if ar else None
    if peak is None:
        return Verdict(
            "bench.min_busbw", True, "no all_reduce bandwidth was measured to compare with --min-busbw"
        )
    failed = peak < min_busbw
    word = "below" if failed else "at or above"
    return Verdict(
        "bench.min_busbw",
        failed,
        f"all_reduce peak busbw {peak:.2f} GB/s is {word} --min-busbw {min_busbw:g} GB/s",
        {"peak_busbw": peak, "min_busbw": min_busbw},
    )


def load_baseline_rows(data: Any) -> list[dict[str, Any]]:
    """Rows of an earlier `--json` file; raises ValueError when it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError("not a bench-nccl --json file (no 'rows' list)")
    return [r for r in data["rows"] if isinstance(r, dict) and "op" in r and "size" in r]


def compare_baseline(
    rows: Iterable[Mapping[str, Any]],
    baseline_rows: Iterable[Mapping[str, Any]],
    ops: Sequence[str],
    tolerance: float = DEFAULT_BASELINE_TOLERANCE,
) -> list[BaselineRatio]:
    """Per op: peak busbw over the (size, dtype) points both runs measured, now / then."""

    def key(r: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        return (r.get("op"), r.get("size"), r.get("dtype"))

    def bw(r: Mapping[str, Any]) -> Optional[float]:
        v = r.get("busbw")
        return float(v) if isinstance(v, (int, float)) else None

    then = {key(r): bw(r) for r in baseline_rows}
    out = []
    for op in ops:
        pairs = [(bw(r), then[key(r)]) for r in rows if r.get("op") == op and key(r) in then]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not pairs:
            out.append(BaselineRatio(op, None, None, None, False, 0))
            continue
        now_peak = max(a for a, _ in pairs)
        then_peak = max(b for _, b in pairs)
        ratio = now_peak / then_peak if then_peak > 0 else None
        regressed = ratio is not None and ratio < 1.0 - tolerance
        out.append(BaselineRatio(op, then_peak, now_peak, ratio, regressed, len(pairs)))
    return out


def judge_baseline(ratios: Sequence[BaselineRatio], tolerance: float) -> Verdict:
    compared = [r for r in ratios if r.ratio is not None]
    if not compared:
        return Verdict("bench.baseline", True, "the baseline has no op/size/dtype in common with this run")
    bad = [r for r in compared if r.regressed]
    if bad:
        text = ", ".join(f"{r.op} {r.ratio:.2f}x" for r in bad)
        return Verdict(
            "bench.baseline",
            True,
            f"busbw regressed beyond {tolerance:.0%} of the baseline: {text}",
            {"regressed": [r.op for r in bad]},
        )
    return Verdict(
        "bench.baseline",
        False,
        f"no op regressed beyond {tolerance:.0%} of the baseline ({len(compared)} compared)",
    )


def exit_code_for(verdicts: Iterable[Verdict], launch_failed: bool, interrupted: bool = False) -> int:
    """0 all good; 1 a rank failed or hung, wrong data, or a busbw verdict failed; 130 on Ctrl-C."""
    if interrupted:
        return 130
    if launch_failed or any(v.failed for v in verdicts):
        return int(ExitCode.FAILED)
    return int(ExitCode.HEALTHY)


def csv_rows(rows: Iterable[Mapping[str, Any]], env: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows flattened with the environment columns repeated, so each CSV line stands alone."""
    flat_env = {f"env_{k}": _flat(env.get(k)) for k in ENV_FIELDS}
    return [{**{k: r.get(k) for k in ROW_FIELDS}, **flat_env} for r in rows]


def _flat(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    return value
