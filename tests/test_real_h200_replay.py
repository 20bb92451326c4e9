"""Real NCCL Flight Recorder dumps of the lent H200 node (tests/fixtures/flight_recorder/README.md),
replayed on any machine: NCCL's own recorder's dumps are read and aligned, and empty dumps are not taken
for agreement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FR = Path(__file__).parent / "fixtures" / "flight_recorder" / "h200-nccl-2026-11-28"


def _hang(*args: str, cwd: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "hang", *args, "--no-ras", "--no-stacks", "--json", "--timeout", "10"],
        capture_output=True, timeout=120, cwd=cwd, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_nccl_recorder_dump_is_read_with_its_collectives(tmp_path: Path) -> None:
    for dump in ("fr_rank_0", "fr_rank_0.json"):
        report = _hang("--fr", str(FR / "idle" / dump), cwd=tmp_path)
        fr = report["flight_recorder"]
        assert fr["ranks"] == [0] and fr["errors"] == [], (dump, fr)
        assert [seq for per_rank in fr["last_enqueued"].values() for seq in per_rank.values()] == [3], (dump, fr)
        summary = next(f for f in report["findings"] if f["id"] == "hang.flight_recorder")["summary"]
        assert "all ranks agree on every recorded collective" in summary, summary


def test_empty_dumps_of_a_job_before_its_first_communicator_are_not_agreement(tmp_path: Path) -> None:
    report = _hang("--fr", str(FR / "late-peer" / "fr_rank_"), cwd=tmp_path)
    assert report["flight_recorder"]["ranks"] == [0, 1]
    summary = next(f for f in report["findings"] if f["id"] == "hang.flight_recorder")["summary"]
    assert "none records a collective or a process group" in summary and "agree" not in summary, summary
    recorded = json.loads((FR / "late-peer" / "hang-report.json").read_text())
    assert recorded["verdict"]["culprit_ranks"] == [1] and recorded["exit_code"] == 1


GPU = Path(__file__).parent / "fixtures" / "gpu" / "real-h200"


def test_nvidia_smi_outputs_of_the_h200_parse() -> None:
    from ddpdoctor.parsers.nvidia_smi import parse_nvidia_smi_q
    from ddpdoctor.parsers.nvidia_smi_table import parse_nvidia_smi_table

    q = parse_nvidia_smi_q((GPU / "nvidia-smi-q.txt").read_text())
    assert q["driver_version"] == "580.159.04" and q["cuda_version"] == "13.0" and q["errors"] == []
    gpu = q["gpus"][0]
    assert (gpu["name"], gpu["architecture"], gpu["memory"]["total_mib"]) == ("NVIDIA H200", "Hopper", 143771)
    assert gpu["ecc_mode"]["current"] is True and gpu["remapped_rows"]["failure"] is False
    assert [p["pid"] for p in gpu["processes"]] == [1064, 1109]
    table = parse_nvidia_smi_table((GPU / "nvidia-smi.txt").read_text())
    assert table["gpus"][0]["memory_total_mib"] == 143771 and len(table["processes"]) == 2
