"""bench-nccl on real GPUs (skipped without /dev/nvidia0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app

pytestmark = pytest.mark.gpu


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_nccl_world_size_one(tmp_path: Path) -> None:
    if _gpu_count() < 1:
        pytest.skip("torch sees no CUDA device")
    out = tmp_path / "b.json"
    result = CliRunner().invoke(
        app,
        [
            "bench-nccl",
            "--backend",
            "nccl",
            "--nproc",
            "1",
            "--ops",
            "all_reduce,broadcast,all_gather",
            "--min-bytes",
            "1K",
            "--max-bytes",
            "1M",
            "--step-factor",
            "32",
            "--iters",
            "3",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["environment"]["backend"] == "nccl" and data["environment"]["nccl"]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in data["rows"])


def test_two_ranks_on_one_gpu_refused_before_launch() -> None:
    if _gpu_count() != 1:
        pytest.skip("needs exactly one visible GPU")
    result = CliRunner().invoke(app, ["bench-nccl", "--backend", "nccl", "--nproc", "2"])
    assert result.exit_code == 2
    # The one ranks-per-node judgement (core/placement) words it; the title changed with it (seen on the
    # H100 node, 2026-11-27, where this test still expected the older wording).
    assert "refused before launch: Ranks per node and GPUs" in result.output, result.output
    assert "2 rank(s) per node (--nproc 2) but 1 GPU(s) visible" in result.output, result.output


def test_two_ranks_refused_with_one_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if _gpu_count() < 1:
        pytest.skip("torch sees no CUDA device")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result = CliRunner().invoke(app, ["bench-nccl", "--backend", "nccl", "--nproc", "2", "--timeout", "20"])
    assert result.exit_code == 2
    # The one ranks-per-node judgement (core/placement) words it; the title changed with it (seen on the
    # H100 node, 2026-11-27, where this test still expected the older wording).
    assert "refused before launch: Ranks per node and GPUs" in result.output, result.output
    assert "2 rank(s) per node (--nproc 2) but 1 GPU(s) visible" in result.output, result.output


def _bench_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "g.json"
    result = CliRunner().invoke(app, ["bench-nccl", "--backend", "nccl", *args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def _assert_plausible(data: dict) -> None:
    ceiling = (data["config"].get("memory_bandwidth") or {}).get("gbps")
    assert ceiling, "no GPU memory bandwidth found for this GPU (NVML or the datasheet table)"
    for r in data["rows"]:  # flagged rows carry no bandwidth: no number above the limit anywhere
        assert r.get("algbw") is None or r["algbw"] <= ceiling, r
        assert r.get("busbw") is None or r["busbw"] <= ceiling, r
    for s in data["summary"]:
        assert s["peak_busbw"] is None or s["peak_busbw"] <= ceiling


@pytest.mark.parametrize("nproc", [1, 2])
def test_graphed_timing_runs_correct_and_plausible(tmp_path: Path, nproc: int) -> None:
    """#14: CUDA-graph timing (nccl-tests -G 1) on every op, checked on the graphed path."""
    if _gpu_count() < nproc:
        pytest.skip(f"needs {nproc} GPU(s)")
    data = _bench_json(
        tmp_path,
        "--nproc", str(nproc), "--min-bytes", "1K", "--max-bytes", "64M", "--step-factor", "8",
        "--iters", "20", "--graph",
    )  # fmt: skip
    measured = [r for r in data["rows"] if not r.get("skipped")]
    assert measured and all(r["wrong"] == 0 and r["time_us"] > 0 for r in measured)
    assert data["config"]["timing"] == "graph"
    fallbacks = {r["op"]: r.get("timing_note") for r in measured if r["timing"] != "graph"}
    assert fallbacks == {}, f"capture fell back to eager: {fallbacks}"
    _assert_plausible(data)
    if nproc == 1:
        assert all(s["peak_busbw"] is None for s in data["summary"])
        assert any("one rank" in n for n in data["notes"])


def test_eager_timing_with_no_graph(tmp_path: Path) -> None:
    if _gpu_count() < 1:
        pytest.skip("torch sees no CUDA device")
    data = _bench_json(
        tmp_path,
        "--nproc", "1", "--ops", "all_reduce,all_gather", "--min-bytes", "1K", "--max-bytes", "1G",
        "--step-factor", "1024", "--iters", "5", "--no-graph",
    )  # fmt: skip
    assert data["config"]["timing"] == "eager"
    assert all(r["timing"] == "eager" and r["wrong"] == 0 for r in data["rows"])
    # torch's all_reduce at one rank moves no data: its 1 GiB row is above the memory bandwidth.
    big = next(r for r in data["rows"] if r["op"] == "all_reduce" and r["size"] == 1 << 30)
    assert big["inplace"] is True and big["implausible"] is True and big["algbw"] is None
    _assert_plausible(data)
