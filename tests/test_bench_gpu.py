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
    assert "More NCCL ranks than visible GPUs" in result.output


def test_two_ranks_refused_with_one_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if _gpu_count() < 1:
        pytest.skip("torch sees no CUDA device")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    result = CliRunner().invoke(app, ["bench-nccl", "--backend", "nccl", "--nproc", "2", "--timeout", "20"])
    assert result.exit_code == 2
    assert "More NCCL ranks than visible GPUs" in result.output
