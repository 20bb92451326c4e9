"""Replays of the real H100 run of 2026-11-27 (issue #29's items, docs/validation.md): nccl-tests and
bench-nccl outputs side by side, the plan against torch.cuda.max_memory_allocated, and the Flight Recorder
dump and `hang` report of a real one-rank NCCL job. Provenance: tests/fixtures/bench/README.md,
tests/fixtures/plan/README.md, tests/fixtures/flight_recorder/README.md.

Each test feeds the captured output back through the code that judged it on the node and checks that the
judgement is the one made there, so a change that would have judged the real GPU differently fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from ddpdoctor.bench.compare import (
    TimeRatio,
    goal_misses,
    nccl_tests_column,
    nccl_tests_times,
    our_times,
    ratio_table_lines,
)
from ddpdoctor.bench.limits import flag_implausible, memory_bandwidth_for_model
from ddpdoctor.parsers.nccl_tests import parse_nccl_tests

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures"
BENCH = FIX / "bench" / "h100-2026-11-27"
PLAN = FIX / "plan" / "h100-cuda-2026-11-27" / "plan-vs-measured-cuda.json"
FR = FIX / "flight_recorder" / "h100-nccl-idle-2026-11-27"
OPS = ("all_reduce", "all_gather", "reduce_scatter")
# bench/bench_vs_nccl_tests.py --raw numbered the files in the order it ran them: graph mode first.
FILES = {
    ("graph", "all_reduce"): ("001-bench-nccl-all_reduce-graph.json", "002-all_reduce_perf-G1.txt"),
    ("graph", "all_gather"): ("003-bench-nccl-all_gather-graph.json", "004-all_gather_perf-G1.txt"),
    ("graph", "reduce_scatter"): ("005-bench-nccl-reduce_scatter-graph.json", "006-reduce_scatter_perf-G1.txt"),
    ("eager", "all_reduce"): ("007-bench-nccl-all_reduce.json", "008-all_reduce_perf.txt"),
    ("eager", "all_gather"): ("009-bench-nccl-all_gather.json", "010-all_gather_perf.txt"),
    ("eager", "reduce_scatter"): ("011-bench-nccl-reduce_scatter.json", "012-reduce_scatter_perf.txt"),
}


def _ratios(mode: str) -> list[TimeRatio]:
    out: list[TimeRatio] = []
    for op in OPS:
        ours_file, theirs_file = FILES[(mode, op)]
        rows = json.loads((BENCH / ours_file).read_text())["rows"]
        mine = our_times(rows, op)
        theirs = nccl_tests_times(parse_nccl_tests((BENCH / theirs_file).read_text()), nccl_tests_column(op))
        out += [
            TimeRatio(op, s, nccl_tests_column(op), mine.get(s), theirs.get(s)) for s in sorted(set(mine) | set(theirs))
        ]
    return out


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_ratio_table_is_the_one_printed_on_the_node(mode: str) -> None:
    printed = (BENCH / "vs-nccl-tests-table.txt").read_text().splitlines()
    start = printed.index(f"== {mode} ==") + 1
    lines = ratio_table_lines(_ratios(mode), mode)
    assert printed[start : start + len(lines)] == lines
    # 1 KiB..16 MiB of all_gather and reduce_scatter miss in both modes (15 sizes x 2 ops): the floor
    # documented in docs/validation.md; from 32 MiB (graph) / 64 MiB (eager) up they are within 0.9-1.1.
    misses = goal_misses(_ratios(mode))
    assert len(misses) == 30
    assert all(m.size <= (16 << 20 if mode == "graph" else 32 << 20) for m in misses)


@pytest.mark.parametrize("key", sorted(FILES))
def test_bench_json_is_valid_and_no_bandwidth_above_hbm(key: tuple[str, str]) -> None:
    data = json.loads((BENCH / FILES[key][0]).read_text())
    jsonschema.validate(data, json.loads((REPO / "docs" / "schemas" / "bench.schema.json").read_text()))
    assert data["environment"]["gpus"] == ["NVIDIA H100 80GB HBM3"] and data["environment"]["nccl"] == "2.28.9"
    assert {r["timing"] for r in data["rows"]} == {key[0]}
    ceiling = memory_bandwidth_for_model("NVIDIA H100 80GB HBM3")
    assert ceiling is not None
    assert all(r["algbw"] is None or r["algbw"] <= ceiling.gbps for r in data["rows"])
    # Re-judged from the raw times, the rows flagged on the node are flagged again: an in-place
    # all_reduce at one rank moves no data, so its "bandwidth" would be far above the memory's.
    raw = [
        {**r, "implausible": None, "algbw": r["size"] / r["time_us"] / 1e3, "busbw": 0.0} for r in data["rows"]
    ]
    again = flag_implausible(raw, ceiling)
    assert [r["implausible"] for r in again] == [r["implausible"] for r in data["rows"]]
    if key[1] == "all_reduce":
        assert data["rows"][-1]["implausible"] is True  # 1 GiB "reduced" in 1-20 us
    else:  # out of place: a real copy, at most the memory's speed
        assert not any(r["implausible"] for r in data["rows"])


def test_nccl_tests_outputs_parse_whole() -> None:
    for (mode, op), (_, theirs) in FILES.items():
        table = parse_nccl_tests((BENCH / theirs).read_text())
        sizes = [r["size"] for r in table.rows]
        assert len(sizes) == 28 and sizes[-1] == 1 << 30, (mode, op)


def _planned_rows() -> list[dict]:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import plan_vs_measured as pvm
    finally:
        sys.path.remove(str(REPO / "bench"))
    rows = json.loads(PLAN.read_text())
    out = []
    for r in rows:
        case = pvm.Case(**r["case"])
        out.append({"case": case, "measured": r["measured"], "plan": pvm.planned(case, 1024, 4)})
    return out


def test_plan_against_max_memory_allocated_on_the_h100() -> None:
    """Issue #25's bar on real GPU steps (DDP over NCCL, seq 1024, batch 4, 16 cases): model states within
    5%, peak within 15% of torch.cuda.max_memory_allocated over the second step."""
    rows = _planned_rows()
    assert len(rows) == 16
    for r in rows:
        m, p = r["measured"], r["plan"]
        assert abs(p["model_states"] / m["model_states"] - 1) < 0.05, r["case"]
        assert abs(p["peak"] / m["peak"] - 1) < 0.15, (r["case"], p["peak"] / m["peak"])
        assert p["buckets"] == m["buckets"], r["case"]  # DDP's own bucket sizes


def test_real_nccl_flight_recorder_dump_is_read(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "hang", "--fr", str(FR / "fr_rank_"), "--no-ras", "--no-stacks",
         "--json", "--timeout", "10"],
        capture_output=True, timeout=120, cwd=tmp_path, text=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    fr = report["flight_recorder"]
    assert fr["ranks"] == [0] and fr["errors"] == [], fr
    recorded = json.loads((FR / "hang-report.json").read_text())
    assert recorded["flight_recorder"]["ranks"] == [0] and recorded["exit_code"] == 0
    assert next(f for f in recorded["findings"] if f["id"] == "hang.ras")["summary"].startswith("NCCL 2.28.9")
