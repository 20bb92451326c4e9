"""Judging benchmark rows: peak/average busbw, wrong elements, --min-busbw, --baseline. Pure functions.

Rows carry a `scope`: the whole world (untagged, or "world"), or, when the ranks of a torchrun/srun
job span nodes, "intra-node" (one node's ranks; `node` names it) and "inter-node" (one rank per node).
Bandwidth summaries and verdicts (--min-busbw, --baseline, --expect) judge the whole-world rows only,
the run users compare with nccl-tests and with their training job; wrong elements fail in any scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpdoctor.core.model import ExitCode

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
    "timing",  # "graph" (CUDA graph, as nccl-tests -G 1) or "eager"; null for a skipped row
    "inplace",  # torch runs this op in place (nccl-tests' in-place columns)
    "implausible",  # algbw above the GPU memory bandwidth: left out of peaks and gates
    "scope",
    "node",
)
WORLD_SCOPE = "world"
SCOPE_ORDER = (WORLD_SCOPE, "intra-node", "inter-node")
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


def row_scope(row: Mapping[str, Any]) -> str:
    """ "world" for a whole-world row (untagged, as in files written before scopes existed)."""
    return str(row.get("scope") or WORLD_SCOPE)


def world_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of the whole-world run (every rank), without the intra-/inter-node ones."""
    return [r for r in rows if row_scope(r) == WORLD_SCOPE]


def split_scopes(
    rows: Iterable[Mapping[str, Any]],
) -> list[tuple[str, Optional[str], list[Mapping[str, Any]]]]:
    """(scope, node, rows) per table: the whole world first, then each node's intra-node run in the
    order the rows came, then the inter-node run."""
    groups: dict[tuple[str, Optional[str]], list[Mapping[str, Any]]] = {}
    for r in rows:
        scope = row_scope(r)
        node = None if scope == WORLD_SCOPE else (str(r["node"]) if r.get("node") is not None else None)
        groups.setdefault((scope, node), []).append(r)

    def rank(key: tuple[str, Optional[str]]) -> int:
        return SCOPE_ORDER.index(key[0]) if key[0] in SCOPE_ORDER else len(SCOPE_ORDER)

    ordered = sorted(groups, key=rank)  # stable: nodes keep the order they came in
    return [(scope, node, groups[(scope, node)]) for scope, node in ordered]


def output_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as written to --json and --csv: every ROW_FIELDS key, the scope spelled out."""
    out = {k: row.get(k) for k in ROW_FIELDS}
    out["scope"] = row_scope(row)
    return out


def summarize(
    rows: Iterable[Mapping[str, Any]],
    ops: Sequence[str],
    whole_world: bool = True,
    bandwidth: bool = True,
) -> list[OpSummary]:
    """Peak and average busbw per op, in the order asked (nccl-tests' 'Avg bus bandwidth' is the mean).

    Only whole-world rows count unless `whole_world` is False (then `rows` are one scope's table).
    Rows flagged `implausible` never make a peak or an average; with `bandwidth` False (one rank: no
    interconnect measured) no busbw is summarised at all, only the wrong elements.
    """
    out = []
    rows = world_rows(rows) if whole_world else list(rows)
    for op in ops:
        mine = [r for r in rows if r.get("op") == op]
        timed = [
            r
            for r in mine
            if bandwidth and isinstance(r.get("busbw"), (int, float)) and r.get("implausible") is not True
        ]
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


@dataclass(frozen=True)
class ScopeSummary:
    """One intra-node or inter-node table: its ranks and its own peak/average busbw per op."""

    scope: str
    node: Optional[str]
    nranks: Optional[int]
    ops: tuple[OpSummary, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "node": self.node,
            "nranks": self.nranks,
            "summary": [s.to_dict() for s in self.ops],
        }


def summarize_scopes(rows: Iterable[Mapping[str, Any]], ops: Sequence[str]) -> list[ScopeSummary]:
    """Per intra-node and inter-node table (not the whole world: see `summarize`), in table order."""
    out = []
    for scope, node, mine in split_scopes(rows):
        if scope == WORLD_SCOPE:
            continue
        nranks = next((r["nranks"] for r in mine if isinstance(r.get("nranks"), int)), None)
        out.append(ScopeSummary(scope, node, nranks, tuple(summarize(mine, ops, whole_world=False))))
    return out


def judge_correctness(rows: Iterable[Mapping[str, Any]]) -> Optional[Verdict]:
    """Wrong elements in any checked row fail the run; None when no row was checked (nothing was
    measured, e.g. the ranks died or were stopped first): a run that verified nothing claims nothing."""
    checked = [r for r in rows if isinstance(r.get("wrong"), int)]
    if not checked:
        return None
    bad = [r for r in checked if r["wrong"] > 0]
    if not bad:
        return Verdict(
            "bench.correctness",
            False,
            f"every measured result matched the expected values ({len(checked)} checked)",
            {"wrong": 0, "results": len(checked)},
        )

    def where_of(r: Mapping[str, Any]) -> str:
        scope = row_scope(r)
        if scope == WORLD_SCOPE:
            return ""
        return f" ({scope}, {r['node']})" if r.get("node") and scope != "inter-node" else f" ({scope})"

    where = ", ".join(f"{r['op']} {r['size']} B{where_of(r)}: {r['wrong']}" for r in bad[:5])
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
    """Per op: peak busbw over the (size, dtype) points both runs measured, now / then (whole-world
    rows of both runs, implausible ones left out)."""

    def key(r: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        return (r.get("op"), r.get("size"), r.get("dtype"))

    def bw(r: Mapping[str, Any]) -> Optional[float]:
        v = r.get("busbw")
        return float(v) if isinstance(v, (int, float)) else None

    # Implausible rows (this run's or the baseline's) are no measurement: they are compared with nothing.
    then = {key(r): bw(r) for r in world_rows(baseline_rows) if r.get("implausible") is not True}
    rows = [r for r in world_rows(rows) if r.get("implausible") is not True]
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


INTERRUPT_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal number, as a shell reports it


def exit_code_for(
    verdicts: Iterable[Verdict], launch_failed: bool, interrupted: bool = False, interrupted_by: str = ""
) -> int:
    """0 all good; 1 a rank failed or hung, wrong data, or a busbw verdict failed; 130 on Ctrl-C
    (SIGINT), 143 on SIGTERM."""
    if interrupted:
        return INTERRUPT_EXIT_CODES.get(interrupted_by, 130)
    if launch_failed or any(v.failed for v in verdicts):
        return int(ExitCode.FAILED)
    return int(ExitCode.HEALTHY)


def csv_rows(rows: Iterable[Mapping[str, Any]], env: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows flattened with the environment columns repeated, so each CSV line stands alone."""
    flat_env = {f"env_{k}": _flat(env.get(k)) for k in ENV_FIELDS}
    return [{**output_row(r), **flat_env} for r in rows]


def _flat(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    return value
