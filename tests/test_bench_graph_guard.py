"""bench-nccl timing choice (CUDA graph or eager), in-place marking, the implausible-number guard, the
world-size-1 wording and gate refusal (issue #14); the nccl-tests comparison is in
test_bench_vs_nccl_tests.py.

Pure functions are fed the real H100 outputs in tests/fixtures/bench/h100-nproc1/ (provenance in
tests/fixtures/bench/README.md); CLI tests run real gloo ranks on CPU, faking only the launch facts
(nvidia-smi, torch build) and the NVML memory readings at the edge.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from test_bench_cli_edges import LAUNCH_VARS
from typer.testing import CliRunner

import ddpdoctor.bench.external as external
import ddpdoctor.bench.launcher as launcher
import ddpdoctor.bench.preflight as preflight
from ddpdoctor.bench.compare import (
    BINARIES,
    nccl_tests_column,
)
from ddpdoctor.bench.limits import (
    WORLD_SIZE_ONE_HEADING,
    MemoryBandwidth,
    bandwidth_ceiling,
    flag_implausible,
    implausible_note,
    memory_bandwidth_for_model,
    memory_bandwidth_from_nvml,
    one_rank_gate_refusal,
    plausible,
    world_size_one_heading,
)
from ddpdoctor.bench.results import compare_baseline, summarize
from ddpdoctor.bench.timing import EAGER, GRAPH, eager_fallbacks, is_inplace, select_timing
from ddpdoctor.cli import app
from ddpdoctor.edge.nvml import read_memory_specs
from ddpdoctor.parsers.nccl_tests import parse_nccl_tests
from ddpdoctor.render.bench import bench_header_lines, bench_table_lines, summary_lines

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "tests" / "fixtures" / "bench" / "h100-nproc1"
SCHEMA = json.loads((REPO / "docs" / "schemas" / "bench.schema.json").read_text())
H100_NAME = "NVIDIA H100 80GB HBM3"
# H100 SXM5: 5120-bit HBM3 bus (datasheet); 2619 MHz is `Max Clocks / Memory` in the real nvidia-smi -q.
H100_BUS_BITS, H100_MEM_MHZ = 5120, 2619
ALL_OPS = tuple(BINARIES)


def _h100_rows() -> list[dict[str, Any]]:
    return json.loads((H100 / "bench-nccl-nproc1.json").read_text())["rows"]


# ---------------------------------------------------------------------------------------------
# Timing choice and in-place marking (pure).


def test_graph_timing_chosen_on_gpus_with_the_api() -> None:
    assert select_timing(True, "cuda", True) == select_timing(True, "cuda", True, None)
    assert select_timing(True, "cuda", True).mode == GRAPH
    assert select_timing(True, "cuda", True).note == ""


@pytest.mark.parametrize(
    ("requested", "device", "api", "error", "note_has"),
    [
        (False, "cuda", True, None, "--no-graph"),
        (True, "cpu", True, None, ""),  # gloo on CPU: eager, as it always was, nothing to say
        (False, "cpu", False, None, "--no-graph"),
        (True, "cuda", False, None, "no torch.cuda.CUDAGraph"),
        (
            True,
            "cuda",
            True,
            "RuntimeError: operation not permitted when stream is capturing",
            "capture failed",
        ),
    ],
)
def test_eager_fallbacks_say_why(requested: bool, device: str, api: bool, error: Any, note_has: str) -> None:
    choice = select_timing(requested, device, api, error)
    assert choice.mode == EAGER
    assert note_has in choice.note
    if error:
        assert error in choice.note


def test_eager_fallbacks_per_op_ignore_no_graph_and_graph_rows() -> None:
    rows = [
        {"op": "all_reduce", "timing": GRAPH},
        {"op": "sendrecv", "timing": EAGER, "timing_note": "CUDA graph capture failed (X): timed eagerly"},
        {"op": "sendrecv", "timing": EAGER, "timing_note": "CUDA graph capture failed (X): timed eagerly"},
        {"op": "broadcast", "timing": EAGER, "timing_note": "--no-graph"},
    ]
    assert eager_fallbacks(rows) == {"sendrecv": "CUDA graph capture failed (X): timed eagerly"}


def test_in_place_ops_are_the_ones_torch_has_no_out_of_place_form_of() -> None:
    assert {op for op in ALL_OPS if is_inplace(op)} == {"all_reduce", "broadcast", "reduce"}
    assert nccl_tests_column("all_reduce") == "in_place"
    assert nccl_tests_column("all_gather") == "out_of_place"


# ---------------------------------------------------------------------------------------------
# The memory-bandwidth ceiling and implausible rows (pure, real H100 rows).


def test_memory_bandwidth_from_nvml_readings() -> None:
    bw = memory_bandwidth_from_nvml(H100_BUS_BITS, H100_MEM_MHZ)
    assert bw is not None and bw.gbps == pytest.approx(3352.3, abs=0.1)
    assert "5120-bit" in bw.source and "2619 MHz" in bw.source
    assert memory_bandwidth_from_nvml(None, H100_MEM_MHZ) is None
    assert memory_bandwidth_from_nvml(H100_BUS_BITS, 0) is None


@pytest.mark.parametrize(
    ("name", "gbps"),
    [
        (H100_NAME, 3350.0),
        ("NVIDIA H100 PCIe", 2000.0),
        ("NVIDIA H100 NVL", 3900.0),
        ("NVIDIA GH200 480GB", 4900.0),
        ("NVIDIA H200", 4800.0),
        ("NVIDIA A100-SXM4-80GB", 2039.0),
        ("NVIDIA A100-SXM4-40GB", 1555.0),
        ("Tesla V100-SXM2-32GB", 900.0),
        ("NVIDIA GeForce RTX 2080 Ti", 616.0),
    ],
)
def test_datasheet_table(name: str, gbps: float) -> None:
    bw = memory_bandwidth_for_model(name)
    assert bw is not None and bw.gbps == gbps and "datasheet" in bw.source


def test_ceiling_prefers_nvml_and_takes_the_slowest_gpu() -> None:
    assert memory_bandwidth_for_model("Some Future GPU") is None
    assert bandwidth_ceiling([("Some Future GPU", None, None)]) is None
    ceiling = bandwidth_ceiling(
        [(H100_NAME, H100_BUS_BITS, H100_MEM_MHZ), ("NVIDIA A100-SXM4-40GB", None, None)]
    )
    assert ceiling is not None and ceiling.gbps == 1555.0
    nvml = bandwidth_ceiling([(H100_NAME, H100_BUS_BITS, H100_MEM_MHZ)])
    assert nvml is not None and nvml.source.startswith("NVML")


def test_real_h100_world_size_one_in_place_rows_are_flagged_and_leave_peaks() -> None:
    ceiling = bandwidth_ceiling([(H100_NAME, H100_BUS_BITS, H100_MEM_MHZ)])
    rows = flag_implausible(_h100_rows(), ceiling)
    flagged = {(r["op"], r["size"]) for r in rows if r["implausible"]}
    # The impossible numbers: all_reduce algbw 35305 GB/s and broadcast 69227 GB/s at 1 GiB.
    assert ("all_reduce", 1 << 30) in flagged and ("broadcast", 1 << 30) in flagged
    assert {op for op, _ in flagged} <= {"all_reduce", "broadcast", "reduce"}  # the in-place ops only
    # Out-of-place ops really copied: 715 us for 1 GiB, ~1500 GB/s, under the ceiling.
    assert not any(
        r["implausible"] for r in rows if r["op"] in ("all_gather", "reduce_scatter", "all_to_all")
    )
    assert all(r["implausible"] is None for r in rows if r.get("skipped"))  # sendrecv at one rank
    before = {s.op: s.peak_busbw for s in summarize(_h100_rows(), ALL_OPS)}
    after = {s.op: s.peak_busbw for s in summarize(rows, ALL_OPS)}
    assert before["broadcast"] == pytest.approx(69227.22, abs=0.01)
    assert after["broadcast"] is not None and after["broadcast"] <= ceiling.gbps
    assert all(r["algbw"] <= ceiling.gbps for r in plausible(rows) if r.get("algbw") is not None)
    # No impossible number survives anywhere: flagged rows keep their (real) time, not their bandwidth.
    assert all(r["algbw"] is None or r["algbw"] <= ceiling.gbps for r in rows)
    big = next(r for r in rows if r["op"] == "all_reduce" and r["size"] == 1 << 30)
    assert big["algbw"] is None and big["busbw"] is None and big["time_us"] == pytest.approx(30.41, abs=0.01)
    assert flag_implausible(rows, ceiling) == rows  # flagging twice changes nothing
    note = implausible_note(rows, ceiling)
    assert note is not None and f"{len(flagged)} row(s)" in note and "3352 GB/s" in note


def test_no_ceiling_judges_nothing() -> None:
    rows = flag_implausible(_h100_rows(), None)
    assert {r["implausible"] for r in rows} == {None}
    assert implausible_note(rows, None) is None


def test_one_rank_summary_has_no_peaks_but_keeps_wrong() -> None:
    summaries = summarize(_h100_rows(), ALL_OPS, bandwidth=False)
    assert all(s.peak_busbw is None and s.avg_busbw is None for s in summaries)
    assert next(s for s in summaries if s.op == "all_gather").wrong == 0
    lines = summary_lines(summaries)
    assert lines and not any("peak busbw" in line for line in lines)
    assert any(line.startswith("# all_gather") and "#wrong 0" in line for line in lines)


def test_baseline_comparison_ignores_implausible_rows() -> None:
    ceiling = MemoryBandwidth(3352.3, "test")
    rows = flag_implausible(_h100_rows(), ceiling)
    ratios = {r.op: r for r in compare_baseline(rows, rows, ("broadcast", "reduce"))}
    unguarded = {r.op: r for r in compare_baseline(_h100_rows(), _h100_rows(), ("broadcast",))}
    assert unguarded["broadcast"].busbw == pytest.approx(69227.22, abs=0.01)
    for op in ("broadcast", "reduce"):
        assert ratios[op].busbw is not None and ratios[op].busbw <= 3352.3
        assert ratios[op].ratio == pytest.approx(1.0)
        assert ratios[op].sizes < 28  # the flagged sizes are compared with nothing


def test_gate_refusal_only_at_one_rank_with_a_gate() -> None:
    assert one_rank_gate_refusal(2, 100.0, True, True) is None
    assert one_rank_gate_refusal(1, None, False, False) is None
    refusal = one_rank_gate_refusal(1, 100.0, True, False)
    assert refusal is not None and refusal.id == "bench.one_rank.not_judged"
    assert "--min-busbw and --baseline" in refusal.summary and WORLD_SIZE_ONE_HEADING in refusal.summary
    # QA pass: the summary read "--min-busbw judge the interconnect, but this run has one rank: one rank: ...".
    single = one_rank_gate_refusal(1, 100.0, False, False)
    assert single is not None and "--min-busbw judges the interconnect" in single.summary
    assert "one rank: one rank" not in single.summary and "one rank: one rank" not in refusal.summary



def test_one_rank_heading_names_gpus_only_for_nccl() -> None:
    # QA pass: gloo on CPU said "collectives move no data between GPUs".
    gloo = bench_header_lines({}, {"backend": "gloo", "world_size": 1})
    nccl = bench_header_lines({}, {"backend": "nccl", "world_size": 1})
    assert any("move no data between ranks" in line for line in gloo)
    assert not any("GPU" in line for line in gloo)
    assert any("move no data between GPUs" in line for line in nccl)
    refusal = one_rank_gate_refusal(1, 100.0, False, False, backend="gloo")
    assert refusal is not None and "between ranks" in refusal.summary and "GPU" not in refusal.summary


# ---------------------------------------------------------------------------------------------
# Rendering: the table still reads like (and parses as) nccl-tests.


def test_table_marks_in_place_fallback_and_implausible_and_still_parses() -> None:
    ceiling = MemoryBandwidth(3352.3, "test")
    rows = flag_implausible(_h100_rows(), ceiling)
    rows = [
        {**r, "inplace": is_inplace(r["op"]), "timing": EAGER if r["op"] == "sendrecv" else GRAPH}
        | ({"timing_note": "CUDA graph capture failed (X): timed eagerly"} if r["op"] == "reduce" else {})
        for r in rows
    ]
    for r in rows:
        if r["op"] == "reduce":
            r["timing"] = EAGER
    lines = bench_table_lines(rows, ALL_OPS)
    text = "\n".join(lines)
    assert "#   in place: torch's all_reduce writes into its input" in text
    assert "#   in place: torch's all_gather" not in text
    assert "#   timing: eager, CUDA graph capture failed (X)" in text
    assert text.count("# implausible: size / time is above the GPU memory bandwidth") == sum(
        1 for r in rows if r["implausible"]
    )
    parsed = parse_nccl_tests(text)
    assert len(parsed.rows) == len(rows)
    assert parsed.rows[-1]["out_of_place"]["time_us"] is None or parsed.rows[0]["size"] == 8


def test_header_at_one_rank_says_no_interconnect_is_measured() -> None:
    config = {
        "backend": "nccl",
        "world_size": 1,
        "timing": "graph",
        "memory_bandwidth": {"gbps": 3352.3, "source": "NVML: x"},
    }
    lines = bench_header_lines({}, config)
    assert "graph: 1" in lines[0]
    assert any(WORLD_SIZE_ONE_HEADING in line for line in lines)
    assert any("3352 GB/s" in line and "implausible" in line for line in lines)
    assert not any(
        WORLD_SIZE_ONE_HEADING in line for line in bench_header_lines({}, {**config, "world_size": 2})
    )


# ---------------------------------------------------------------------------------------------
# NVML edge: bus width and memory clock through a fake pynvml fed the real H100 values.


class _FakeNvml:
    def __init__(self, lost: bool = False, init_error: bool = False) -> None:
        self.lost, self.init_error = lost, init_error

    def nvmlInit(self) -> None:
        if self.init_error:
            raise OSError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return H100_NAME.encode()

    def nvmlDeviceGetMemoryBusWidth(self, handle: str) -> int:
        if self.lost:
            err = RuntimeError("GPU is lost")
            err.value = 15  # type: ignore[attr-defined]
            raise err
        return H100_BUS_BITS

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:
        assert clock == 2  # NVML_CLOCK_MEM
        return H100_MEM_MHZ

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        # free_mib 81079 of the real H100 snapshot (/work/shared/fixtures/real-h100, nvml.json).
        return SimpleNamespace(total=81559 * 2**20, free=81079 * 2**20, used=480 * 2**20)


def test_read_memory_specs_through_nvml() -> None:
    specs = read_memory_specs(None, lib=_FakeNvml())
    assert specs == [
        {
            "index": 0,
            "name": H100_NAME,
            "bus_width_bits": 5120,
            "max_memory_clock_mhz": 2619,
            "free_memory_bytes": 81079 * 2**20,
        }
    ]
    assert read_memory_specs([0], lib=_FakeNvml(init_error=True)) == []
    lost = read_memory_specs([0], lib=_FakeNvml(lost=True))
    assert lost[0]["bus_width_bits"] is None  # a lost GPU: no ceiling from it, no exception


# ---------------------------------------------------------------------------------------------
# CLI on CPU: world size 1 wording, gate refusal, implausible rows out of gates.


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")


def _no_launch(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append("launched")
        raise AssertionError("launched although a gate was refused")

    monkeypatch.setattr(launcher, "launch_local", refuse)
    return calls


def _one_h100_facts(runner: Any, env: Any) -> preflight.LaunchFacts:
    """What gather_launch_facts reads on the real one-H100 node (nvidia-smi values from its fixtures)."""
    gpu = preflight.GpuInfo(
        0, "GPU-00000000-0000-0000-0000-000000000000", H100_NAME, "Default", 5, 16, "580.159.04"
    )
    return preflight.LaunchFacts(gpus=[gpu], torch_version="2.11.0+cu130", torch_cuda="13.0")


@pytest.mark.parametrize(
    "gate", [("--min-busbw", "100"), ("--baseline", str(H100 / "bench-nccl-nproc1.json"))]
)
def test_gates_refused_at_one_nccl_rank(
    gate: tuple[str, str], monkeypatch: pytest.MonkeyPatch, clean_env: None, tmp_path: Path
) -> None:
    calls = _no_launch(monkeypatch)
    monkeypatch.setattr(preflight, "gather_launch_facts", _one_h100_facts)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["bench-nccl", "--backend", "nccl", *gate, "--json", str(out)])
    assert result.exit_code == 2, result.output
    assert calls == []
    assert "refused before launch: Bandwidth gate asked for at world size 1" in result.output
    assert WORLD_SIZE_ONE_HEADING in result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert [r["id"] for r in data["refusals"]] == ["bench.one_rank.not_judged"]


def test_gate_refused_at_one_gloo_rank_too(monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    calls = _no_launch(monkeypatch)
    result = CliRunner().invoke(app, ["bench-nccl", "--backend", "gloo", "--nproc", "1", "--min-busbw", "1"])
    assert result.exit_code == 2 and calls == []


def test_one_gloo_rank_run_says_so_and_summarises_no_peak(clean_env: None, tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    args = ["--backend", "gloo", "--nproc", "1", "--ops", "all_reduce,all_gather,broadcast,sendrecv"]
    args += ["--min-bytes", "1K", "--max-bytes", "4K", "--step-factor", "4", "--iters", "2", "--warmup", "1"]
    result = CliRunner().invoke(app, ["bench-nccl", *args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert f"# == {world_size_one_heading('gloo')} ==" in result.output and "between ranks" in result.output
    assert "peak busbw" not in result.output
    assert "#   in place: torch's all_reduce writes into its input" in result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert world_size_one_heading("gloo") in data["notes"]
    assert all(s["peak_busbw"] is None for s in data["summary"])
    assert data["config"]["timing"] == "eager"  # gloo on CPU: no CUDA graphs
    measured = [r for r in data["rows"] if not r.get("skipped")]
    assert measured and all(r["timing"] == "eager" and r["wrong"] == 0 for r in measured)
    assert {r["op"]: r["inplace"] for r in data["rows"]} == {
        "all_reduce": True,
        "all_gather": False,
        "broadcast": True,
        "sendrecv": False,
    }
    assert all(r["implausible"] is None for r in data["rows"])  # no GPU: no ceiling to judge by


def test_implausible_rows_leave_gates(
    monkeypatch: pytest.MonkeyPatch, clean_env: None, tmp_path: Path
) -> None:
    # The edge fact faked: a memory bandwidth so low that every measured row is above it.
    monkeypatch.setattr(preflight, "read_memory_ceiling", lambda *a: MemoryBandwidth(1e-9, "test ceiling"))
    out = tmp_path / "b.json"
    args = [
        "--backend",
        "gloo",
        "--nproc",
        "2",
        "--ops",
        "all_reduce",
        "--min-bytes",
        "1K",
        "--max-bytes",
        "1K",
    ]
    args += ["--iters", "2", "--warmup", "0", "--min-busbw", "0"]
    result = CliRunner().invoke(app, ["bench-nccl", *args, "--json", str(out)])
    assert result.exit_code == 1, result.output  # --min-busbw 0 cannot pass on no plausible row
    assert "# implausible: size / time is above the GPU memory bandwidth" in result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert all(r["implausible"] is True for r in data["rows"])
    assert data["summary"][0]["peak_busbw"] is None
    verdict = next(v for v in data["verdicts"] if v["id"] == "bench.min_busbw")
    assert verdict["failed"] and "no all_reduce bandwidth" in verdict["summary"]
    assert any("flagged implausible" in n for n in data["notes"])
    assert data["config"]["memory_bandwidth"] == {"gbps": 1e-9, "source": "test ceiling"}


def test_no_graph_flag_is_accepted_and_recorded(clean_env: None, tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    args = [
        "--backend",
        "gloo",
        "--nproc",
        "2",
        "--ops",
        "all_gather",
        "--min-bytes",
        "1K",
        "--max-bytes",
        "1K",
    ]
    result = CliRunner().invoke(app, ["bench-nccl", *args, "--iters", "1", "--no-graph", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["config"]["timing"] == "eager" and data["rows"][0]["timing"] == "eager"
    assert os.path.exists(out)


def test_single_gpu_expectation_holds_for_the_real_h100_copy() -> None:
    from ddpdoctor.bench.expected import SINGLE_GPU_METRIC, expected_single_gpu

    assert expected_single_gpu(None) is None
    rng = expected_single_gpu(memory_bandwidth_from_nvml(H100_BUS_BITS, H100_MEM_MHZ).gbps)
    assert rng is not None and rng.metric == SINGLE_GPU_METRIC
    assert WORLD_SIZE_ONE_HEADING in rng.note and "busbw is 0" in rng.note
    big = [
        r
        for r in _h100_rows()
        if r["size"] == 1 << 30 and r["op"] in ("all_gather", "reduce_scatter", "all_to_all")
    ]
    assert len(big) == 3 and all(rng.low <= r["algbw"] <= rng.high for r in big)
    assert rng.to_dict()["metric"] == SINGLE_GPU_METRIC


def test_files_written_before_these_fields_still_validate() -> None:
    data = json.loads((H100 / "bench-nccl-nproc1.json").read_text())
    jsonschema.validate(data, SCHEMA)
    assert "timing" not in data["rows"][0] and "implausible" not in data["rows"][0]


def test_ci_formats_say_why_no_peak_at_one_rank(clean_env: None) -> None:
    args = ["--backend", "gloo", "--nproc", "1", "--ops", "all_gather,sendrecv", "--min-bytes", "1K"]
    result = CliRunner().invoke(
        app, ["bench-nccl", *args, "--max-bytes", "1K", "--iters", "1", "--format", "markdown"]
    )
    assert result.exit_code == 0, result.output
    assert f"all_gather bus bandwidth | no busbw peak: {world_size_one_heading('gloo')}" in result.output
    assert "sendrecv bus bandwidth | not measured" in result.output


def test_report_bench_section_marks_implausible_rows_and_notes() -> None:
    from types import SimpleNamespace

    from ddpdoctor.render.report import _bench_section

    rows = flag_implausible(_h100_rows(), MemoryBandwidth(3352.3, "test"))
    data = {"rows": rows, "notes": [WORLD_SIZE_ONE_HEADING]}
    lines = _bench_section(SimpleNamespace(bench_error="", bench=data))  # type: ignore[arg-type]
    flagged = [line for line in lines if "(implausible)" in line]
    assert len(flagged) == sum(1 for r in rows if r["implausible"])
    assert any(line.startswith("| all_reduce | 1073741824 |") for line in flagged)
    assert lines[-2:] == ["", f"Note: {WORLD_SIZE_ONE_HEADING}"]


# ---------------------------------------------------------------------------------------------
# The worker's fallback bookkeeping, on a real one-rank gloo group. CUDA graphs cannot run on CPU, so
# the capture boundary is faked: "this is a GPU" for the timing choice, and a capture that fails.


def test_worker_falls_back_per_op_and_remembers_the_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch
    import torch.distributed as dist

    from ddpdoctor.bench import graphs, worker
    from ddpdoctor.bench.plan import BenchPlan

    calls: list[tuple[str, int]] = []

    def failing_prepare(run: Any, iters: int, warmup: int, with_check: bool, device: Any, group: Any) -> Any:
        calls.append(("prepare", iters))
        run()  # the warm-up really runs the collective
        return None, "RuntimeError: operation not permitted when stream is capturing"

    real_select = worker.select_timing
    monkeypatch.setattr(
        worker, "select_timing", lambda req, _dev, _api, err=None: real_select(req, "cuda", True, err)
    )
    monkeypatch.setattr(graphs, "prepare", failing_prepare)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        plan = BenchPlan(
            ops=("all_gather", "broadcast"), sizes=(8, 1024, 4096), iters=2, warmup=1, graph=True
        )
        rows = worker.run_benchmark(plan, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    # all_gather at 8 B is size 0 (chunk alignment): its failure is not remembered, the 1 KiB one is.
    assert [(r["op"], r["size"]) for r in rows][:3] == [
        ("all_gather", 0),
        ("all_gather", 1024),
        ("all_gather", 4096),
    ]
    assert len(calls) == 3  # all_gather at 0 and 1 KiB, broadcast at 8 B; then both ops stay eager
    assert all(r["timing"] == EAGER and "capture failed" in r["timing_note"] for r in rows)
    assert all(r["wrong"] == 0 for r in rows)
    assert eager_fallbacks(rows).keys() == {"all_gather", "broadcast"}


def test_gate_refused_for_a_one_rank_torchrun_job(
    monkeypatch: pytest.MonkeyPatch, clean_env: None, tmp_path: Path
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("joined the job although the gate was refused")

    monkeypatch.setattr(external, "join_as_rank", refuse)
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ):
        monkeypatch.setenv(name, value)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app, ["bench-nccl", "--backend", "gloo", "--min-busbw", "10", "--json", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert "Bandwidth gate asked for at world size 1" in result.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert [r["id"] for r in data["refusals"]] == ["bench.one_rank.not_judged"] and data["exit_code"] == 2
