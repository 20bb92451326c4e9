"""Outputs of a real one-GPU H100 node (tests/fixtures/gpu/real-h100/, provenance in its README):
the parsers, a replay of the node as a snapshot directory, and the text report drawing the topology once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.checks.gpu.models import describe_architecture
from ddpdoctor.cli import app
from ddpdoctor.edge.nvml import load_nvml_fact
from ddpdoctor.parsers.nvidia_smi import parse_nvidia_smi_csv, parse_nvidia_smi_q
from ddpdoctor.parsers.nvidia_smi_nvlink import parse_nvlink
from ddpdoctor.parsers.nvidia_smi_topo import parse_topo_matrix

NODE = Path(__file__).parent / "fixtures" / "gpu" / "real-h100"


def test_nvidia_smi_q_r580_single_gpu() -> None:
    out = parse_nvidia_smi_q((NODE / "nvidia-smi-q.txt").read_text())
    assert (out["driver_version"], out["cuda_version"]) == ("580.159.04", "13.0")
    (gpu,) = out["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["architecture"] == "Hopper"
    assert gpu["bus_id"] == "00000000:00:06.0"


def test_topo_m_with_ansi_header_and_empty_nvlink() -> None:
    topo = parse_topo_matrix((NODE / "nvidia-smi-topo-m.txt").read_text())
    assert topo["gpus"] == ["GPU0"] and topo["nics"] == []
    assert topo["matrix"]["GPU0"]["GPU0"] == "X"
    assert topo["affinity"]["GPU0"]["cpu"] == "0-15"
    # A GPU without NVLink: `nvidia-smi nvlink -s` prints nothing at all.
    assert (NODE / "nvidia-smi-nvlink-s.txt").read_text() == ""
    assert not any(g.get("links") for g in parse_nvlink("").get("gpus") or [])


def test_query_gpu_csv() -> None:
    out = parse_nvidia_smi_csv((NODE / "nvidia-smi-query-gpu.csv").read_text())
    (row,) = out["records"]
    assert row["name"] == "NVIDIA H100 80GB HBM3" and row["pcie.link.width.max"] == "16"


def test_nvml_fact_from_the_node() -> None:
    fact = load_nvml_fact(json.loads((NODE / "nvml.json").read_text()))
    assert fact is not None and fact["available"] and fact["driver_version"] == "580.159.04"
    (gpu,) = fact["gpus"]
    # Recorded before nvml.py read nvmlDeviceGetArchitecture: null here, "unknown architecture" in text.
    assert gpu["architecture"] is None and gpu["name"] == "NVIDIA H100 80GB HBM3"


def _replay(tmp_path: Path, *args: str) -> str:
    snap = tmp_path / "snap"
    shutil.copytree(NODE, snap)
    result = CliRunner().invoke(app, ["check", "--replay", str(snap), "--only", "gpu,torch", *args])
    assert result.exit_code in (0, 1), result.output
    return result.output


def test_replay_of_the_node_is_healthy(tmp_path: Path) -> None:
    report = json.loads(_replay(tmp_path, "--json"))
    by_id = {f["id"]: f for f in report["findings"]}
    assert not [f for f in report["findings"] if f["severity"] in ("warn", "fail", "error")], report
    inventory = by_id["gpu.inventory"]
    assert inventory["summary"].startswith(
        "1x NVIDIA H100 80GB HBM3 (Hopper, from the name); driver 580.159.04"
    )
    # nvml.json predates the architecture reading: the name tells it, and the text says so.
    assert inventory["data"]["architectures"] == ["Hopper, from the name"]
    assert by_id["torch.nccl"]["summary"] == "NCCL 2.28.9"
    assert by_id["gpu.topology"]["data"]["topology"]["gpus"] == ["GPU0"]
    assert by_id["gpu.topology"]["evidence"][0]["excerpt"].lstrip().startswith("GPU0\tCPU Affinity")


def test_check_verbose_draws_the_topology_once(tmp_path: Path) -> None:
    text = _replay(tmp_path, "-v")
    section = text.split("GPU topology:", 1)[1].split("id: gpu.topology", 1)
    assert "drawn below" in section[0]
    # The matrix appears once: the table below the finding, not again as evidence.
    assert text.count("G0  X") == 1
    assert "GPU0\tCPU Affinity" not in text and "CPU Affinity" not in text


def test_healthy_nccl_info_log_has_no_failure_signature() -> None:
    result = CliRunner().invoke(app, ["explain", str(NODE / "nccl_info.log"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["root_cause"] is None and report["consequences"] == [], report


@pytest.mark.parametrize(
    ("architecture", "name", "shown"),
    [
        ("Hopper", "NVIDIA H100 80GB HBM3", "Hopper"),
        (None, "NVIDIA H100 80GB HBM3", "Hopper, from the name"),
        (None, "NVIDIA A100-SXM4-80GB", "Ampere, from the name"),
        (None, "NVIDIA GeForce GTX 1080", "unknown architecture"),
        (None, None, "unknown architecture"),
    ],
)
def test_architecture_is_never_null(architecture: str | None, name: str | None, shown: str) -> None:
    assert describe_architecture(architecture, name) == shown
