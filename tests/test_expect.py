"""Expectations per node type: a replayed snapshot of a mismatching node is caught, unavailable facts are
errors (never passes), the file format is strict, and `expect --write` round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.ci.expect import judge_bench, judge_node
from ddpdoctor.ci.expectations import (
    Expectations,
    ExpectationsError,
    load_expectations,
    parse_expectations,
    parse_size,
    parse_version,
)
from ddpdoctor.ci.node_facts import NodeFacts, Observed
from ddpdoctor.cli import app
from ddpdoctor.core.model import Severity

ROOT = Path(__file__).resolve().parent.parent
CI = Path(__file__).parent / "fixtures" / "ci"
HEALTHY = CI / "healthy-cpu-node"
MISMATCHED = CI / "mismatched-gpu-node"
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.toml"))
H100 = ROOT / "docs" / "examples" / "8xh100-sxm-ndr400.toml"


def _check_json(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(app, ["check", "--format", "json", *args])
    return res.exit_code, json.loads(res.stdout)


def _expect_findings(data: dict) -> dict[str, dict]:
    return {f["id"]: f for f in data["findings"] if f["area"] == "expect"}


def test_mismatched_snapshot_is_caught_naming_expected_and_found() -> None:
    code, data = _check_json("--replay", str(MISMATCHED), "--expect", str(H100))
    assert code == 1
    got = _expect_findings(data)
    fails = {i for i, f in got.items() if f["severity"] == "fail"}
    assert fails == {
        "expect.gpu.count",
        "expect.gpu.model",
        "expect.gpu.driver",
        "expect.gpu.cuda",
        "expect.gpu.nvlink",
        "expect.rdma.ports",
        "expect.kernel.modules",
        "expect.system.shm",
    }
    assert got["expect.gpu.count"]["summary"] == "Expected 8 GPUs, found 1 (8 attached)"
    assert got["expect.gpu.count"]["data"] == {"expected": 8, "found": 1}
    assert "GPU 0 is NVIDIA H800" in got["expect.gpu.model"]["summary"]
    assert got["expect.gpu.driver"]["summary"] == "Driver 525.105.17 is older than the minimum 535.104.05"
    assert "GPU 0 has 8" in got["expect.gpu.nvlink"]["summary"]
    assert "mlx5_0 port 1 runs at 200 Gb/s" in got["expect.rdma.ports"]["summary"]
    assert got["expect.system.shm"]["summary"] == "/dev/shm is 1 GiB (expected >= 16 GiB)"
    # 8 InfiniBand HCAs are there: that expectation holds.
    assert got["expect.rdma.hca_count"]["severity"] == "ok"
    # The snapshot's torch is a CPU build: the NCCL minimum cannot be judged -> error, not a pass.
    assert got["expect.nccl.version"]["severity"] == "error"
    # Bandwidth is bench-nccl's to judge: a skip in check, never a pass.
    assert got["expect.busbw.all_reduce"]["severity"] == "skip"
    # Evidence names where each fact came from.
    assert got["expect.gpu.count"]["evidence"][0]["source"] == "nvidia-smi -q"


def test_missing_outputs_are_errors_never_passes() -> None:
    # The healthy CPU node has no nvidia-smi, no nvlink output and no RDMA: every GPU expectation
    # is unavailable.
    code, data = _check_json("--replay", str(HEALTHY), "--expect", str(H100))
    got = _expect_findings(data)
    for fid in ("expect.gpu.count", "expect.gpu.model", "expect.gpu.driver", "expect.gpu.nvlink"):
        assert got[fid]["severity"] == "error", fid
        assert got[fid]["fix"]
    # RDMA was readable (sysfs: no devices): 0 HCAs is a fact, so that is a fail.
    assert got["expect.rdma.hca_count"]["severity"] == "fail"
    assert "found 0" in got["expect.rdma.hca_count"]["summary"]
    assert not any(f["severity"] == "ok" for i, f in got.items() if i.startswith("expect.gpu"))
    assert code == 1


def test_unavailable_gpu_facts_from_pure_judge() -> None:
    exp = Expectations(gpu_count=8, gpu_model="H100", driver_min="535", cuda_min="12.2")
    facts = NodeFacts(gpu=Observed(missing="nvidia-smi: command not found"))
    found = judge_node(exp, facts)
    gpu = [f for f in found if f.id.startswith("expect.gpu")]
    assert len(gpu) == 4 and all(f.severity == Severity.ERROR for f in gpu)
    assert all("nvidia-smi: command not found" in f.summary for f in gpu)


def test_expect_write_round_trips_on_a_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "node.toml"
    res = CliRunner().invoke(
        app, ["expect", "--replay", str(MISMATCHED), "--write", str(out), "--name", "h800"]
    )
    assert res.exit_code == 0, res.output
    exp = load_expectations(out)
    assert exp.name == "h800"
    assert (exp.gpu_model, exp.gpu_count, exp.driver_min, exp.cuda_min) == (
        "NVIDIA H800",
        1,
        "525.105.17",
        "12.0",
    )
    assert exp.nvlink_active_links_min == 8
    assert (exp.hca_count, exp.hca_rate_gbps, exp.hca_link_layer) == (8, 200.0, "InfiniBand")
    assert exp.shm_min_bytes == 1024**3
    text = out.read_text()
    assert "# [nccl] not written: torch reports no NCCL" in text
    # The node passes its own file: every judged expectation ok.
    code, data = _check_json("--replay", str(MISMATCHED), "--expect", str(out), "--only", "system")
    got = _expect_findings(data)
    judged = {i: f["severity"] for i, f in got.items() if i != "expect.file"}
    assert judged and set(judged.values()) == {"ok"}, judged
    # Refuses to overwrite without --force.
    again = CliRunner().invoke(app, ["expect", "--replay", str(MISMATCHED), "--write", str(out)])
    assert again.exit_code == 2
    forced = CliRunner().invoke(app, ["expect", "--replay", str(MISMATCHED), "--write", str(out), "--force"])
    assert forced.exit_code == 0


def test_expect_write_to_stdout_loads_back(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["expect", "--replay", str(HEALTHY), "--write", "-"])
    assert res.exit_code == 0
    path = tmp_path / "n.toml"
    path.write_text(res.stdout)
    exp = load_expectations(path)
    assert exp.gpu_count is None and exp.shm_min_bytes is not None
    assert "# [gpu] not written:" in res.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_load_and_cite_sources(path: Path) -> None:
    exp = load_expectations(path)
    assert exp.name and exp.gpu_count and exp.busbw_min_gbps
    text = path.read_text()
    assert "Sources" in text and "https://" in text and "ESTIMATE" in text


@pytest.mark.parametrize(
    "text, message",
    [
        ("[gpu]\ncuont = 8\n", "gpu.cuont: unknown key"),
        ("[gpus]\ncount = 8\n", "gpus: unknown key"),
        ("[gpu]\ncount = '8'\n", "gpu.count must be a whole number"),
        ("[gpu]\ncount = true\n", "gpu.count must be a whole number"),
        ("[gpu]\ndriver_min = 'latest'\n", "gpu.driver_min must be a version"),
        ("[rdma]\nlink_layer = 'omnipath'\n", "rdma.link_layer must be one of"),
        ("[busbw_min_gbps]\nallreduce = 100\n", "busbw_min_gbps.allreduce: unknown op"),
        ("[busbw_min_gbps]\nall_reduce = -1\n", "busbw_min_gbps.all_reduce must be a number > 0"),
        ("[system]\nshm_min = 'lots'\n", "system.shm_min not a size"),
        ("format = 2\n", "this ddpdoctor reads format 1"),
        ("[gpu\n", "not valid TOML"),
    ],
)
def test_bad_files_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ExpectationsError, match=message.replace("(", r"\(")):
        load_expectations(path)
    res = CliRunner().invoke(app, ["check", "--replay", str(HEALTHY), "--expect", str(path)])
    assert res.exit_code == 2


def test_versions_and_sizes() -> None:
    assert parse_version("535.104.05") == (535, 104, 5)
    assert parse_version((2, 21, 5)) == (2, 21, 5)
    assert parse_version(21905) == (2, 19, 5) and parse_version(2708) == (2, 7, 8)
    assert parse_version("2.19.3+cuda12.2") == (2, 19, 3)
    assert parse_version(None) is None and parse_version("N/A") is None
    assert parse_version("535.104.05") > parse_version("535.54")
    assert parse_size("16G") == parse_size("16GiB") == 16 * 1024**3
    assert parse_size("512M") == 512 * 1024**2 and parse_size(4096) == 4096
    with pytest.raises(ValueError):
        parse_size(True)


def test_judge_bench_peak_per_op_and_unmeasured_op_is_skip() -> None:
    exp = parse_expectations({"busbw_min_gbps": {"all_reduce": 360, "all_gather": 300}})
    rows = [
        {"op": "all_reduce", "size": 1 << 20, "busbw": 120.0},
        {"op": "all_reduce", "size": 1 << 30, "busbw": 370.5},
    ]
    by_id = {f.id: f for f in judge_bench(exp, rows)}
    assert by_id["expect.busbw.all_reduce"].severity == Severity.OK
    assert by_id["expect.busbw.all_reduce"].data == {"expected": 360.0, "found": 370.5}
    assert by_id["expect.busbw.all_gather"].severity == Severity.SKIP
    slow = {f.id: f for f in judge_bench(exp, [{"op": "all_reduce", "busbw": 200.0}])}
    assert slow["expect.busbw.all_reduce"].severity == Severity.FAIL
    assert "200.00 GB/s is below the minimum 360" in slow["expect.busbw.all_reduce"].summary
