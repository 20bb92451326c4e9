"""nvidia-smi parsers (-q, --query-gpu csv, topo -m, topo -p2p, nvlink -s/-e) on real captured outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.checks import gpu as gpu_area
from ddpdoctor.cli import app
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import Severity
from ddpdoctor.edge.sources import ReplaySources
from ddpdoctor.parsers.nvidia_smi import (
    parse_gpu_section,
    parse_nvidia_smi_csv,
    parse_nvidia_smi_q,
    parse_tree,
    to_bool,
    to_int,
    to_recovery_action,
    to_signed_int,
    value_or_none,
)
from ddpdoctor.parsers.nvidia_smi_nvlink import link_summary, parse_nvlink
from ddpdoctor.parsers.nvidia_smi_topo import closest_nics, link_rank, parse_topo_matrix, parse_topo_p2p

GPU = Path(__file__).parent / "fixtures" / "gpu"


def read(name: str) -> str:
    return (GPU / name).read_text()


def q(name: str) -> dict:
    return parse_nvidia_smi_q(read(f"nvidia-smi-q__{name}.txt"))


# --- nvidia-smi -q -----------------------------------------------------------------------------------


def test_h100_r535_event_reasons_power_brake_and_replays() -> None:
    out = q("8xh100-535.161.08-gpu0-section-hw-power-brake-active-pcie-replays")
    assert (out["driver_version"], out["cuda_version"], out["attached_gpus"]) == ("535.161.08", "12.2", 8)
    (g,) = out["gpus"]
    assert g["bus_id"] == "00000000:19:00.0"
    assert g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["uuid"] == "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"
    assert g["compute_mode"] == "Default" and g["persistence_mode"] is True
    assert g["mig_mode"] == {"current": False, "pending": False}
    # `Clocks Event Reasons` (R535) with the nested HW Slowdown block.
    assert g["throttle_reasons"]["hw_slowdown"] is True
    assert g["throttle_reasons"]["hw_power_brake_slowdown"] is True
    assert g["throttle_reasons"]["hw_thermal_slowdown"] is False
    assert g["throttle_reasons"]["idle"] is False
    assert g["pcie"] == {
        "gen_current": 5,
        "gen_max": 5,
        "gen_device_max": 5,
        "gen_host_max": 5,
        "width_current": 16,
        "width_max": 16,
        "replays": 67,
        "replay_rollovers": 0,
    }
    # R535 SRAM parity / SEC-DED split sums into sram_uncorrectable.
    assert g["ecc"]["volatile"]["sram_uncorrectable"] == 0
    assert g["ecc"]["aggregate"]["uncorrectable"] == 0
    assert g["ecc"]["sram_threshold_exceeded"] is False
    assert g["retired_pages"] == {"single_bit": None, "double_bit": None, "pending": None}
    assert g["remapped_rows"]["pending"] is False and g["remapped_rows"]["banks_max"] == 2560
    assert g["reset_required"] is False and g["drain_and_reset_recommended"] is False
    assert g["power"]["draw_w"] == 67.74 and g["power"]["limit_w"] == 700.0
    # R535 T.Limit temperatures are headroom, not absolute limits: never mistaken for a slowdown at -2 C.
    assert g["temperature"]["slowdown_c"] is None and g["temperature"]["slowdown_t_limit_c"] == -2
    assert g["temperature"]["t_limit_c"] == 56 and g["temperature"]["gpu_c"] == 29
    assert g["fabric"] == {"state": "Completed", "status": "Success"}
    assert g["processes"] == []
    assert g["memory"]["total_mib"] == 81559


def test_h800_r525_throttle_reasons_ecc_disabled() -> None:
    out = q("h800-hopper-single-gpu-remapped-rows-ecc-disabled")
    assert (out["driver_version"], out["cuda_version"]) == ("525.105.17", "12.0")
    (g,) = out["gpus"]
    assert g["name"] == "NVIDIA H800"
    # `Ecc Mode` spelled in mixed case on this driver.
    assert g["ecc_mode"] == {"current": False, "pending": False}
    # ECC disabled: counters are N/A -> None, not 0.
    assert g["ecc"]["volatile"]["uncorrectable"] is None and g["ecc"]["volatile"]["correctable"] is None
    assert g["throttle_reasons"]["idle"] is True and g["throttle_reasons"]["hw_slowdown"] is False
    assert g["remapped_rows"] == {
        "pending": False,
        "failure": False,
        "uncorrectable": 0,
        "correctable": 0,
        "banks_max": 2560,
        "banks_none": 0,
    }
    assert g["temperature"]["slowdown_c"] == 89 and g["temperature"]["shutdown_c"] == 92
    assert g["power"]["limit_w"] == 700.0 and g["power"]["default_limit_w"] == 700.0


def test_a100_remap_pending_with_dram_correctable() -> None:
    out = q("a100-sxm4-80gb-xid63-dram-correctable-remap-pending-excerpt")
    assert out["driver_version"] == "510.73.08" and out["cuda_version"] == "11.6"
    (g,) = out["gpus"]
    assert g["bus_id"] == "00000000:10:1C.0"
    assert g["ecc"]["volatile"]["dram_correctable"] == 177
    assert g["ecc"]["volatile"]["correctable"] == 177
    assert g["ecc"]["aggregate"]["correctable"] == 177
    assert g["ecc"]["volatile"]["uncorrectable"] == 0
    assert g["remapped_rows"]["pending"] is True
    assert g["remapped_rows"]["failure"] is False
    assert g["remapped_rows"]["correctable"] == 1
    assert g["remapped_rows"]["banks_max"] == 639
    # `Pending Page Blacklist : N/A` -> None.
    assert g["retired_pages"]["pending"] is None
    # The excerpt elides other sections: their fields are None, not invented.
    assert g["pcie"]["width_current"] is None and g["uuid"] is None


def test_old_driver_without_cuda_version_line() -> None:
    out = q("gtx1080-driver-396-no-cuda-version-line-excerpt")
    assert out["driver_version"] == "396.54"
    assert out["cuda_version"] is None
    (g,) = out["gpus"]
    assert g["name"] == "GeForce GTX 1080"
    assert g["persistence_mode"] is False
    assert g["serial"] is None  # N/A


def test_narrow_32_char_key_column() -> None:
    out = q("v100-sxm2-old-driver-narrow-key-column-excerpt")
    (g,) = out["gpus"]
    assert g["name"] == "Tesla V100-SXM2-16GB"
    assert g["uuid"] == "GPU-a8adca3f-8b20-1970-1626-2c5aa039f544"
    assert g["minor_number"] == 3
    assert g["persistence_mode"] is True
    assert g["bus_id"] == "00000000:0B:00.0"


def test_legacy_single_double_bit_ecc_and_pending_retirement() -> None:
    # The pre-Ampere layout (Single Bit / Double Bit blocks with a Total, `Pending : Yes`), with the
    # 32-character key column; no fixture of this block is in shared/fixtures, so it is written here
    # in the layout of nvidia-smi 4xx (see nvidia-smi -q documentation).
    text = (
        "GPU 00000000:3B:00.0\n"
        "    Product Name                    : Tesla V100-SXM2-32GB\n"
        "    ECC Errors\n"
        "        Volatile\n"
        "            Single Bit            \n"
        "                Device Memory       : 3\n"
        "                Register File       : 0\n"
        "                Texture Memory      : N/A\n"
        "                Total               : 3\n"
        "            Double Bit            \n"
        "                Device Memory       : 1\n"
        "                Total               : 1\n"
        "        Aggregate\n"
        "            Single Bit            \n"
        "                Total               : 12\n"
        "            Double Bit            \n"
        "                Total               : 2\n"
        "    Retired Pages\n"
        "        Single Bit ECC              : 2\n"
        "        Double Bit ECC              : 1\n"
        "        Pending                     : Yes\n"
        "    Compute Mode                    : Exclusive_Process\n"
        "    Processes\n"
        "        Process ID                  : 4242\n"
        "            Type                    : C\n"
        "            Name                    : python\n"
        "            Used GPU Memory         : 2047 MiB\n"
    )
    (g,) = parse_nvidia_smi_q(text)["gpus"]
    assert g["ecc"]["volatile"]["correctable"] == 3
    assert g["ecc"]["volatile"]["uncorrectable"] == 1
    assert g["ecc"]["volatile"]["dram_uncorrectable"] == 1
    assert g["ecc"]["aggregate"]["uncorrectable"] == 2
    assert g["retired_pages"] == {"single_bit": 2, "double_bit": 1, "pending": True}
    assert g["compute_mode"] == "Exclusive_Process"
    assert g["processes"] == [{"pid": 4242, "type": "C", "name": "python", "used_memory_mib": 2047}]


def test_new_process_block_with_instance_ids_and_unreadable_values() -> None:
    text = (
        "Driver Version                            : 550.54.15\n"
        "GPU 00000000:01:00.0\n"
        "    Product Name                          : Unknown Error\n"
        "    Fan Speed                             : ERR!\n"
        "    Compute Mode                          : [N/A]\n"
        "    Processes\n"
        "        GPU instance ID                   : N/A\n"
        "        Compute instance ID               : N/A\n"
        "        Process ID                        : 10\n"
        "            Type                          : C\n"
        "            Name                          : /usr/bin/python3\n"
        "            Used GPU Memory               : 500 MiB\n"
        "        GPU instance ID                   : N/A\n"
        "        Compute instance ID               : N/A\n"
        "        Process ID                        : 11\n"
        "            Type                          : G\n"
        "            Name                          : Xorg\n"
        "            Used GPU Memory               : [N/A]\n"
    )
    (g,) = parse_nvidia_smi_q(text)["gpus"]
    assert g["name"] is None and g["compute_mode"] is None
    assert [p["pid"] for p in g["processes"]] == [10, 11]
    assert g["processes"][0]["name"] == "/usr/bin/python3" and g["processes"][0]["used_memory_mib"] == 500
    assert g["processes"][1]["used_memory_mib"] is None
    assert g["processes"][0]["gpu_instance_id"] is None


@pytest.mark.parametrize(
    ("fixture", "needle"),
    [
        ("nvidia-smi__nvml-driver-library-version-mismatch.txt", "Driver/library version mismatch"),
        (
            "nvidia-smi__unable-to-determine-device-handle-unknown-error.txt",
            "Unable to determine the device handle",
        ),
    ],
)
def test_failure_messages_become_errors(fixture: str, needle: str) -> None:
    out = parse_nvidia_smi_q(read(fixture))
    assert out["gpus"] == []
    assert any(needle in e for e in out["errors"])


def test_default_table_output_is_not_mistaken_for_q() -> None:
    for name in (
        "nvidia-smi__8xh100-80gb-hbm3-550.90.07-idle.txt",
        "nvidia-smi__rtx-geforce-fan-ERR-exclusive-process-525.txt",
    ):
        out = parse_nvidia_smi_q(read(name))
        assert out["gpus"] == [] and out["driver_version"] is None


def test_value_helpers() -> None:
    assert (
        value_or_none("[N/A]") is None
        and value_or_none("ERR!") is None
        and value_or_none("Unknown Error") is None
    )
    assert (
        to_int("16x") == 16
        and to_int("2560 bank(s)") == 2560
        and to_int("0x1900") == 6400
    )
    # Counts and sizes are never negative, nor written in another script's digits (parsers/numbers.py);
    # temperatures (T.Limit margins) may be below zero.
    assert to_int("-8 C") is None and to_signed_int("-8 C") == -8
    assert to_int("\u0668") is None and to_int("9" * 400) is None and to_signed_int("\u0668 C") is None
    assert to_int("67.74 W") is None and to_int("N/A") is None
    assert to_bool("Not Active") is False and to_bool("Active") is True and to_bool("maybe") is None


def test_gpu_header_with_colons_is_not_split() -> None:
    tree = parse_tree("GPU 00000000:19:00.0\n    Product Name : X\nTimestamp : Wed Jul 31 11:22:39 2024\n")
    assert tree.children[0].key == "GPU 00000000:19:00.0"
    assert tree.get("Timestamp") == "Wed Jul 31 11:22:39 2024"
    assert parse_gpu_section(tree.children[0], 0)["name"] == "X"


# --- real-output sweep: R550-R580, multi-GPU data-centre nodes, Windows, Kepler ---------------------


@pytest.mark.parametrize(
    ("name", "driver", "cuda", "count", "gpu0"),
    [
        (
            "8xh100-sxm-565.57.01-recovery-action-none-gpu0-7-replays",
            "565.57.01",
            "12.7",
            8,
            {"name": "NVIDIA H100 80GB HBM3", "bus_id": "00000000:18:00.0", "recovery_action": "none"},
        ),
        (
            "4xa100-sxm4-555.42.02-gpu1-remap-pending-353-dram-correctable",
            "555.42.02",
            "12.5",
            4,
            {"name": "NVIDIA A100-SXM4-80GB", "bus_id": "00000000:68:00.0", "recovery_action": None},
        ),
        (
            "gh200-550.127.05-module-power-capped-aggregate-dram-uncorrectable",
            "550.127.05",
            "12.4",
            1,
            {"name": "NVIDIA GH200 480GB", "architecture": "Hopper", "recovery_action": None},
        ),
        (
            "rtx5090-570.124.06-reset-status-deprecated-x8-link",
            "570.124.06",
            "12.8",
            1,
            {"name": "NVIDIA GeForce RTX 5090", "architecture": "Blackwell", "recovery_action": "none"},
        ),
        (
            "rtx3050-laptop-580.119.02-51-char-key-column-no-reset-status-process",
            "580.119.02",
            "13.0",
            1,
            {
                "name": "NVIDIA GeForce RTX 3050 6GB Laptop GPU",
                "uuid": "GPU-c2511218-82b7-8df6-6091-4dda966d3868",
            },
        ),
        (
            "8xv100-sxm2-550.127.05-single-double-bit-ecc-blocks",
            "550.127.05",
            "12.4",
            8,
            {"name": "Tesla V100-SXM2-16GB", "bus_id": "00000000:00:04.0", "architecture": "Volta"},
        ),
        (
            "l4-550.90.07-x8-of-x16-link-gen1-idle",
            "550.90.07",
            "12.4",
            1,
            {"name": "NVIDIA L4", "architecture": "Ada Lovelace", "compute_mode": "Default"},
        ),
        (
            "rtx-a6000-windows-wddm-537.99-remapped-rows",
            "537.99",
            "12.2",
            1,
            {"name": "NVIDIA RTX A6000", "minor_number": None, "persistence_mode": None},
        ),
        (
            "gtx680-470.256.02-throttle-reasons-NA-leaf",
            "470.256.02",
            "11.4",
            1,
            {"name": "NVIDIA GeForce GTX 680", "architecture": None, "reset_required": None},
        ),
    ],
)
def test_sweep_header_and_first_gpu(name: str, driver: str, cuda: str, count: int, gpu0: dict) -> None:
    out = q(name)
    assert (out["driver_version"], out["cuda_version"], out["attached_gpus"]) == (driver, cuda, count)
    assert len(out["gpus"]) == count and out["errors"] == []
    assert [g["index"] for g in out["gpus"]] == list(range(count))
    for key, value in gpu0.items():
        assert out["gpus"][0][key] == value, key


def test_r580_wide_key_column_without_reset_status() -> None:
    # R580: 51-character key column, no `GPU Reset Status` block at all (only `GPU Recovery Action`), and
    # a Processes block still printed with the 42-character column of older drivers.
    (g,) = q("rtx3050-laptop-580.119.02-51-char-key-column-no-reset-status-process")["gpus"]
    assert g["recovery_action"] == "none"
    assert g["reset_required"] is None and g["drain_and_reset_recommended"] is None
    assert g["pcie"]["width_current"] == 8 and g["pcie"]["width_max"] == 16
    assert (g["pcie"]["gen_current"], g["pcie"]["gen_max"], g["pcie"]["gen_host_max"]) == (4, 4, 5)
    assert g["processes"] == [
        {
            "pid": 2355,
            "type": "G",
            "name": "/usr/bin/gnome-shell",
            "used_memory_mib": 1,
            "gpu_instance_id": None,
            "compute_instance_id": None,
        }
    ]
    # `Average Power Draw` is preferred; this laptop's `Instantaneous Power Draw : 749.67 W` is garbage.
    assert (
        g["power"]["draw_w"] == 1.0
        and g["power"]["limit_w"] == 95.0
        and g["power"]["default_limit_w"] == 60.0
    )
    # `Clocks Event Reasons Counters` (microseconds) is a separate section, not read as reasons.
    assert g["throttle_reasons"]["idle"] is True and "sw_power_capping" not in g["throttle_reasons"]
    # ECC on a GeForce part: every counter N/A, `Remapped Rows : N/A` as a leaf.
    assert g["ecc"]["volatile"]["uncorrectable"] is None and g["remapped_rows"]["pending"] is None
    assert g["memory"] == {"total_mib": 6144, "used_mib": 12, "free_mib": 5793}


def test_r570_deprecated_reset_status_reads_none() -> None:
    (g,) = q("rtx5090-570.124.06-reset-status-deprecated-x8-link")["gpus"]
    # `Reset Required : Requested functionality has been deprecated` is not a yes/no.
    assert g["reset_required"] is None and g["drain_and_reset_recommended"] is None
    assert g["recovery_action"] == "none"
    assert (g["pcie"]["gen_current"], g["pcie"]["width_current"], g["pcie"]["width_max"]) == (1, 8, 16)
    assert g["power"]["draw_w"] == 24.05 and g["power"]["limit_w"] == 575.0
    assert g["temperature"]["t_limit_c"] == 65 and g["temperature"]["slowdown_t_limit_c"] == -2
    assert g["throttle_reasons"]["sw_power_cap"] is True
    assert g["processes"] == []


def test_r565_eight_h100_every_gpu() -> None:
    out = q("8xh100-sxm-565.57.01-recovery-action-none-gpu0-7-replays")
    assert out["timestamp"] == "Thu Nov 14 07:00:14 2024"
    gpus = out["gpus"]
    assert [g["pcie"]["replays"] for g in gpus] == [7, 0, 0, 0, 0, 4, 15, 0]
    assert {g["recovery_action"] for g in gpus} == {"none"}
    assert {g["reset_required"] for g in gpus} == {False}
    assert gpus[1]["uuid"] == "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd" and gpus[1]["minor_number"] == 1
    assert all(g["fabric"] == {"state": "Completed", "status": "Success"} for g in gpus)
    assert all(g["ecc"]["aggregate"]["uncorrectable"] == 0 for g in gpus)
    # `GPU Memory Power Readings ` (trailing space) must not shadow `GPU Power Readings`.
    assert gpus[0]["power"]["draw_w"] == 100.89


def test_a100_node_one_gpu_with_remap_pending() -> None:
    gpus = q("4xa100-sxm4-555.42.02-gpu1-remap-pending-353-dram-correctable")["gpus"]
    bad = [g for g in gpus if g["remapped_rows"]["pending"]]
    assert [g["bus_id"] for g in bad] == ["00000000:9E:00.0"]
    (g1,) = bad
    assert g1["ecc"]["volatile"]["dram_correctable"] == 353 and g1["ecc"]["aggregate"]["correctable"] == 353
    assert g1["ecc"]["volatile"]["uncorrectable"] == 0
    assert g1["remapped_rows"]["correctable"] == 1 and g1["remapped_rows"]["failure"] is False
    # GPU 2 remapped a row earlier and applied it: not pending.
    assert gpus[2]["remapped_rows"]["correctable"] == 1 and gpus[2]["remapped_rows"]["pending"] is False


def test_gh200_c2c_link_and_module_power() -> None:
    (g,) = q("gh200-550.127.05-module-power-capped-aggregate-dram-uncorrectable")["gpus"]
    # Grace Hopper: the PCIe link is a x1 management link; C2C carries the traffic.
    assert (g["pcie"]["width_current"], g["pcie"]["width_max"]) == (1, 1)
    assert g["ecc"]["aggregate"]["dram_uncorrectable"] == 1 and g["ecc"]["volatile"]["uncorrectable"] == 0
    assert g["remapped_rows"]["uncorrectable"] == 1 and g["remapped_rows"]["banks_max"] == 3071
    # `GPU Power Readings` (700 W enforced, 900 W default), not `Module Power Readings` (1000 W).
    assert g["power"] == {
        "draw_w": 87.88,
        "limit_w": 700.0,
        "default_limit_w": 900.0,
        "max_limit_w": 900.0,
        "requested_limit_w": 900.0,
        "module_limit_w": 1000.0,
    }
    assert g["memory"]["total_mib"] == 97871


def test_legacy_ecc_blocks_on_a_current_driver() -> None:
    gpus = q("8xv100-sxm2-550.127.05-single-double-bit-ecc-blocks")["gpus"]
    for g in gpus:
        # Volta keeps the Single Bit / Double Bit layout even on R550.
        assert g["ecc"]["volatile"]["correctable"] == 0 and g["ecc"]["aggregate"]["uncorrectable"] == 0
        assert g["ecc"]["volatile"]["sram_correctable"] is None
        assert g["retired_pages"]["double_bit"] == 0 and g["retired_pages"]["pending"] is False
        assert g["remapped_rows"]["pending"] is None  # Volta has no row remapping
    # GPU 4 once retired a page for single-bit errors (`Single Bit ECC : 1`), nothing pending.
    assert [g["retired_pages"]["single_bit"] for g in gpus] == [0, 0, 0, 0, 1, 0, 0, 0]
    # ... after 4 corrected errors in its lifetime (Aggregate > Single Bit > Total).
    assert [g["ecc"]["aggregate"]["correctable"] for g in gpus] == [0, 0, 0, 0, 4, 0, 0, 0]
    assert [g["bus_id"][-7:] for g in gpus] == [f"00:0{c}.0" for c in "456789AB"]


def test_windows_wddm_sample() -> None:
    (g,) = q("rtx-a6000-windows-wddm-537.99-remapped-rows")["gpus"]
    assert g["ecc_mode"] == {"current": False, "pending": False}
    assert g["remapped_rows"]["banks_max"] == 192 and g["remapped_rows"]["pending"] is False
    assert g["reset_required"] is False and g["drain_and_reset_recommended"] is None
    assert g["utilization"] == {"gpu_percent": 0, "memory_percent": 0}


def test_kepler_r470_na_sections() -> None:
    (g,) = q("gtx680-470.256.02-throttle-reasons-NA-leaf")["gpus"]
    # `Clocks Throttle Reasons : N/A` is a leaf: no reasons, no exception.
    assert g["throttle_reasons"] == {}
    assert set(g["power"].values()) == {None}
    assert g["pcie"]["width_current"] is None and g["pcie"]["replays"] == 0
    assert g["temperature"]["gpu_c"] == 35 and g["memory"]["total_mib"] == 2000


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("None", "none"),
        ("Reset", "reset"),
        ("Reboot", "reboot"),
        ("Drain P2P", "drain_p2p"),
        ("Drain and Reset", "drain_and_reset"),
        ("GPU_RESET", "reset"),
        ("N/A", None),
        ("Requested functionality has been deprecated", None),
    ],
)
def test_recovery_action_values(text: str, action: str | None) -> None:
    assert to_recovery_action(text) == action
    # The same value in a real R580 section (51-character column) reads the same.
    sample = read("nvidia-smi-q__rtx3050-laptop-580.119.02-51-char-key-column-no-reset-status-process.txt")
    line = "    GPU Recovery Action                                : None"
    assert line in sample
    (g,) = parse_nvidia_smi_q(sample.replace(line, line.replace("None", text)))["gpus"]
    assert g["recovery_action"] == action


def replay_gpu_area(tmp_path: Path, files: dict[str, str]) -> dict[str, list]:
    """The gpu area run offline on a snapshot directory holding the given fixtures."""
    for target, fixture in files.items():
        shutil.copy(GPU / fixture, tmp_path / target)
    report = run_checks(ReplaySources(tmp_path), [gpu_area.AREA], timeout_s=20)
    found: dict[str, list] = {}
    for f in report.findings:
        found.setdefault(f.id, []).append(f)
    return found


@pytest.mark.parametrize(
    "name",
    [
        "8xh100-sxm-565.57.01-recovery-action-none-gpu0-7-replays",
        "8xv100-sxm2-550.127.05-single-double-bit-ecc-blocks",
        "rtx-a6000-windows-wddm-537.99-remapped-rows",
        "gtx680-470.256.02-throttle-reasons-NA-leaf",
    ],
)
def test_sweep_healthy_samples_replay_without_failures(tmp_path: Path, name: str) -> None:
    found = replay_gpu_area(tmp_path, {"nvidia-smi-q.txt": f"nvidia-smi-q__{name}.txt"})
    bad = [(fid, f.summary) for fid, fs in found.items() for f in fs if f.severity >= Severity.FAIL]
    assert not bad, bad
    assert "gpu.inventory" in found


def test_sweep_a100_node_replay_fails_only_the_pending_gpu(tmp_path: Path) -> None:
    found = replay_gpu_area(
        tmp_path,
        {
            "nvidia-smi-q.txt": "nvidia-smi-q__4xa100-sxm4-555.42.02-gpu1-remap-pending-353-dram-correctable.txt"
        },
    )
    (pending,) = [f for f in found["gpu.remapped_rows.pending"] if f.severity == Severity.FAIL]
    assert "00000000:9E:00.0" in pending.summary


def test_sweep_glued_topology_and_xid_154_replay(tmp_path: Path) -> None:
    found = replay_gpu_area(
        tmp_path,
        {
            "nvidia-smi-q.txt": "nvidia-smi-q__rtx3050-laptop-580.119.02-51-char-key-column-no-reset-status-process.txt",
            "nvidia-smi-topo-m.txt": "nvidia-smi-topo-m__2gpu-nv12-2nic-ansi-underlined-header.txt",
            "dmesg.txt": "dmesg__xid-79-then-xid-154-recovery-action-os-reboot-excerpt.txt",
        },
    )
    assert "1 NV" in found["gpu.topology"][0].summary
    xids = {f.data["code"]: f.severity for f in found["gpu.xid"]}
    assert xids == {79: Severity.FAIL, 154: Severity.FAIL}
    assert found["gpu.fallen_off_bus"][0].severity == Severity.FAIL


# --- --query-gpu csv --------------------------------------------------------------------------------


def test_csv_header_elided_rows() -> None:
    out = parse_nvidia_smi_csv(read("nvidia-smi-query-gpu__h100-name-busid-vbios-csv-elided.txt"))
    assert out["fields"] == ["name", "pci.bus_id", "vbios_version"]
    assert [r["pci.bus_id"] for r in out["records"]] == ["00000000:04:00.0", "00000000:8B:00.0"]
    assert out["records"][0]["vbios_version"] == "96.00.89.00.01"


def test_csv_units_in_header_and_values() -> None:
    out = parse_nvidia_smi_csv(read("nvidia-smi-query-gpu__rtx2060-csv-with-units-header.txt"))
    (rec,) = out["records"]
    assert out["units"]["memory.total"] == "MiB"
    assert rec["memory.total"] == 5934 and rec["utilization.gpu"] == 20 and rec["clocks.max.graphics"] == 2160
    # A version string is never turned into a number.
    assert rec["driver_version"] == "460.91.03" and rec["name"] == "GeForce RTX 2060"


def test_csv_noheader_nounits_with_na() -> None:
    text = read("nvidia-smi-query-gpu__rtx2080-csv-noheader-nounits-NA-field.txt")
    out = parse_nvidia_smi_csv(text)
    assert out["header"] is None and out["records"] is None
    (row,) = out["rows"]
    assert len(row) == 19 and row[6] == "GeForce RTX 2080" and row[10] is None and row[5] == "440.64"
    named = parse_nvidia_smi_csv(text, fields=[f"f{i}" for i in range(19)])
    assert named["records"][0]["f7"] == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"


# --- topo -m / -p2p -----------------------------------------------------------------------------------


def topo(name: str) -> dict:
    return parse_topo_matrix(read(f"nvidia-smi-topo-m__{name}.txt"))


def test_topo_new_layout_nic_legend_affinity() -> None:
    t = topo("4x-rtx6000ada-pcie-only-2numa-4nic-node-sys")
    assert t["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert t["nics"] == ["NIC0", "NIC1", "NIC2", "NIC3"]
    assert t["nic_names"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    assert t["matrix"]["GPU0"]["GPU2"] == "SYS" and t["matrix"]["GPU0"]["GPU1"] == "NODE"
    assert t["matrix"]["NIC0"]["NIC1"] == "PIX"
    assert t["affinity"]["GPU2"] == {"cpu": "32-63", "numa": "1", "gpu_numa_id": None}
    assert closest_nics(t)["GPU3"] == {
        "nics": ["NIC2", "NIC3"],
        "names": ["mlx5_2", "mlx5_3"],
        "link": "NODE",
    }


def test_topo_clipped_at_terminal_width() -> None:
    t = topo("8xh800-nv8-4nic-truncated-legend")
    assert len(t["gpus"]) == 8 and t["matrix"]["GPU0"]["GPU7"] == "NV8"
    # The header lost the NIC columns, the rows are still there; the cut affinity is kept as printed.
    assert t["nics"] == ["NIC0", "NIC1", "NIC2", "NIC3"]
    assert t["matrix"]["NIC0"]["GPU1"] == "PIX"
    assert t["affinity"]["GPU0"] == {"cpu": "-31,64-95", "numa": "0"}
    assert t["nic_names"]["NIC3"] == "mlx5_3"
    near = closest_nics(t)
    assert near["GPU1"]["nics"] == ["NIC0"] and near["GPU7"]["link"] == "PIX"


def test_topo_old_mlx5_columns_tab_separated() -> None:
    t = topo("dgx-a100-old-format-mlx5-columns-no-NV-links-shown-excerpt")
    assert len(t["gpus"]) == 8 and len(t["nics"]) == 12 and t["nics"][0] == "mlx5_0"
    assert t["nic_names"]["mlx5_11"] == "mlx5_11"
    assert t["matrix"]["GPU0"]["GPU1"] == "PXB" and t["matrix"]["GPU0"]["mlx5_0"] == "PXB"
    assert t["affinity"]["GPU0"] == {"cpu": "112-127,240-255", "numa": "6-7"}
    assert closest_nics(t)["GPU2"]["nics"] == ["mlx5_2", "mlx5_3"]


def test_topo_dgx2_no_numa_column() -> None:
    t = topo("dgx2-16x-v100-nv6-10-mlx5-excerpt")
    assert len(t["gpus"]) == 16 and t["matrix"]["GPU3"]["GPU15"] == "NV6"
    assert list(t["matrix"]) == ["GPU0", "GPU1", "GPU2", "GPU3"]  # the excerpt stops after GPU3
    assert t["affinity"]["GPU0"] == {"cpu": "0-23,48-71"}


@pytest.mark.parametrize(
    ("name", "code", "numa"),
    [
        ("2x-gtx1080ti-consumer-board-phb", "PHB", None),
        ("2x-rtx2080ti-autodl-container-pix", "PIX", "1"),
        ("2x-rtx5090-consumer-phb-tab-separated", "PHB", "0"),
    ],
)
def test_topo_two_gpu_boards(name: str, code: str, numa: str | None) -> None:
    t = topo(name)
    assert t["gpus"] == ["GPU0", "GPU1"] and t["nics"] == []
    assert t["matrix"]["GPU0"]["GPU1"] == code == t["matrix"]["GPU1"]["GPU0"]
    assert t["affinity"]["GPU1"]["numa"] == numa
    assert "PIX" in t["legend"]


def test_topo_p2p_matrices() -> None:
    ns = parse_topo_p2p(read("nvidia-smi-topo-p2p-p__2x-rtx2080ti-NS-not-supported.txt"))
    assert ns["matrix"]["GPU0"]["GPU1"] == "NS" and "DR" not in ns["legend"]
    gns = parse_topo_p2p(read("nvidia-smi-topo-p2p-rw__2x-rtx5090-GNS-p2p-not-supported.txt"))
    assert gns["matrix"]["GPU1"]["GPU0"] == "GNS" and gns["legend"]["DR"] == "Disabled by regkey"


def test_topo_ansi_underlined_header() -> None:
    t = topo("2gpu-nv12-2nic-ansi-underlined-header")
    assert t["gpus"] == ["GPU0", "GPU1"] and t["nics"] == ["NIC0", "NIC1"]
    assert t["matrix"]["GPU0"]["GPU1"] == "NV12" and t["matrix"]["NIC1"]["GPU1"] == "SYS"
    assert t["affinity"]["GPU1"] == {"cpu": "64-127", "numa": "1", "gpu_numa_id": None}
    assert closest_nics(t)["GPU0"]["nics"] == ["NIC0", "NIC1"]


def test_topo_36_nics_with_glued_cells() -> None:
    t = topo("8xh20-nv18-36nic-glued-cells-excerpt")
    assert len(t["gpus"]) == 8 and len(t["nics"]) == 36
    # `NODENODE` / `NODEPIX` / `SYSSYS` are two cells each: the columns after them stay aligned.
    assert t["matrix"]["GPU0"]["NIC12"] == "NODE" and t["matrix"]["GPU0"]["NIC13"] == "NODE"
    assert t["matrix"]["GPU0"]["NIC34"] == "NODE" and t["matrix"]["GPU0"]["NIC35"] == "PIX"
    assert t["affinity"]["GPU0"] == {"cpu": "0-55,112-167", "numa": "0", "gpu_numa_id": None}
    assert t["affinity"]["GPU7"] == {"cpu": "70-99,102-107", "numa": "1", "gpu_numa_id": None}
    # Every row present has one cell per column, and the matrix is symmetric.
    columns = t["gpus"] + t["nics"]
    for row, cells in t["matrix"].items():
        assert list(cells) == columns, row
        for col in t["matrix"]:
            assert cells[col] == t["matrix"][col][row], (row, col)
    assert t["matrix"]["NIC12"]["NIC12"] == "X" and t["matrix"]["NIC35"]["NIC35"] == "X"
    assert t["nic_names"]["NIC35"] == "mlx5_bond_3"
    near = closest_nics(t)
    assert near["GPU4"]["nics"] == [f"NIC{i}" for i in range(16, 24)] + ["NIC32"]
    assert near["GPU0"]["names"][-1] == "mlx5_bond_3" and near["GPU0"]["link"] == "PIX"


def test_link_rank_order() -> None:
    assert (
        link_rank("NV18")
        < link_rank("PIX")
        < link_rank("PXB")
        < link_rank("PHB")
        < link_rank("NODE")
        < link_rank("SYS")
    )


# --- nvlink -s / -e -----------------------------------------------------------------------------------


def test_nvlink_status_integer_and_decimal_speeds() -> None:
    a100 = parse_nvlink(read("nvidia-smi-nvlink-s__8xa100-sxm4-80gb-12-links-25GBps.txt"))
    assert len(a100["gpus"]) == 8
    assert link_summary(a100["gpus"][7]) == {"total": 12, "active": 12, "inactive": 0}
    assert a100["gpus"][0]["links"]["11"]["speed_gbps"] == 25.0
    h800 = parse_nvlink(read("nvidia-smi-nvlink-s__8xh800-all-links-26GBps-elided.txt"))
    assert [g["index"] for g in h800["gpus"]] == [0, 1, 7]  # `...` elision of GPUs 2-6 is the author's
    assert h800["gpus"][2]["links"]["7"]["speed_gbps"] == 26.562
    assert h800["gpus"][0]["uuid"] == "GPU-34bf77d1-c686-6821-79a8-32d326c5039c"


def test_nvlink_inactive_and_errors() -> None:
    out = parse_nvlink(
        "GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-x)\n\t Link 0: <inactive>\n\t Link 1: 25.781 GB/s\n"
    )
    assert link_summary(out["gpus"][0]) == {"total": 2, "active": 1, "inactive": 1}
    e = parse_nvlink(read("nvidia-smi-nvlink-e__h100-error-counters-zero-elided.txt"))
    assert e["gpus"][0]["links"]["17"]["errors"] == {"replay": 0, "recovery": 0, "crc": 0}
    assert sorted(e["gpus"][0]["links"], key=int) == ["0", "1", "17"]


def test_nvlink_status_and_capabilities_concatenated() -> None:
    out = parse_nvlink(read("nvidia-smi-nvlink-s-c__h100-18-links-status-then-capabilities.txt"))
    # `-s` then `-c`, each with its own `GPU 0:` header: one record.
    (g,) = out["gpus"]
    assert g["uuid"] == "GPU-5a10e6e5-95f7-2785-ed63-6f6147f304f7"
    assert link_summary(g) == {"total": 18, "active": 18, "inactive": 0}
    assert {link["speed_gbps"] for link in g["links"].values()} == {26.562}
    assert g["links"]["17"]["capabilities"] == {
        "p2p": True,
        "access_to_system_memory": True,
        "p2p_atomics": True,
        "system_memory_atomics": True,
        "sli": True,
        "link": True,
    }


def test_nvlink_status_then_errors_merge_per_link() -> None:
    status = read("nvidia-smi-nvlink-s__8xh800-all-links-26GBps-elided.txt")
    errors = read("nvidia-smi-nvlink-e__h100-error-counters-zero-elided.txt")
    merged = parse_nvlink(status + errors)
    assert [g["index"] for g in merged["gpus"]] == [0, 1, 7]
    link0 = merged["gpus"][0]["links"]["0"]
    assert link0["active"] is True and link0["errors"] == {"replay": 0, "recovery": 0, "crc": 0}


def test_nvlink_bridge_pair_and_gpu_without_links() -> None:
    out = parse_nvlink(read("nvidia-smi-nvlink-s__3x-rtx-a6000-bridge-pair-third-gpu-all-links-inactive.txt"))
    assert [link_summary(g)["active"] for g in out["gpus"]] == [4, 4, 0]
    assert out["gpus"][0]["links"]["3"]["speed_gbps"] == 14.062
    assert out["gpus"][2]["links"] == {}
    assert out["notes"] == ["NVML: Unable to retrieve NVLink information as all links are inActive"]


# --- the `ddpdoctor parse` contract on every fixture --------------------------------------------------

CONTRACT_TOOLS = {
    "nvidia-smi-q": sorted(GPU.glob("nvidia-smi-q__*.txt")) + sorted(GPU.glob("nvidia-smi-q-section__*.txt")),
    "nvidia-smi-topo": sorted(GPU.glob("nvidia-smi-topo-m__*.txt")),
    "nvidia-smi-topo-p2p": sorted(GPU.glob("nvidia-smi-topo-p2p*.txt")),
    "nvidia-smi-nvlink": sorted(GPU.glob("nvidia-smi-nvlink*.txt")),
    "nvidia-smi-csv": sorted(GPU.glob("nvidia-smi-query-gpu__*.txt")),
}
Q_GPU_KEYS = {"bus_id", "name", "uuid", "ecc", "remapped_rows", "retired_pages", "pcie", "throttle_reasons"}


def _check_contract(tool: str, data: dict) -> None:
    if tool == "nvidia-smi-q":
        assert {"driver_version", "cuda_version", "gpus"} <= set(data)
        for g in data["gpus"]:
            assert Q_GPU_KEYS <= set(g)
            assert set(g["remapped_rows"]) >= {"pending", "failure", "uncorrectable", "correctable"}
            assert set(g["pcie"]) >= {"gen_current", "gen_max", "width_current", "width_max", "replays"}
            assert all(isinstance(v, (bool, type(None))) for v in g["throttle_reasons"].values())
    elif tool == "nvidia-smi-topo":
        assert {"gpus", "nics", "matrix", "affinity", "nic_names"} <= set(data)
        assert data["gpus"] and all(isinstance(v, dict) for v in data["matrix"].values())
        for gpu, aff in data["affinity"].items():
            assert gpu in data["gpus"] and set(aff) <= {"cpu", "numa", "gpu_numa_id"}
    elif tool == "nvidia-smi-topo-p2p":
        assert data["gpus"] and data["matrix"]
    elif tool == "nvidia-smi-nvlink":
        # A GPU without NVLink (bridge on the other two) is listed with no links.
        assert data["gpus"] and any(g["links"] for g in data["gpus"])
    elif tool == "nvidia-smi-csv":
        assert data["rows"]


@pytest.mark.parametrize(
    ("tool", "path"),
    [(tool, p) for tool, paths in CONTRACT_TOOLS.items() for p in paths],
    ids=lambda x: getattr(x, "name", x),
)
def test_parse_cli_meets_contract(tool: str, path: Path) -> None:
    res = CliRunner().invoke(app, ["parse", tool, str(path), "--json"])
    assert res.exit_code == 0, res.output
    _check_contract(tool, json.loads(res.output))


def test_every_gpu_fixture_is_covered() -> None:
    covered = {p for paths in CONTRACT_TOOLS.values() for p in paths}
    others = {p.name for p in GPU.glob("*.txt")} - {p.name for p in covered}
    # The rest are inputs of other tests: default-table nvidia-smi, dmesg and the CUDA sample.
    assert all(n.startswith(("nvidia-smi__", "dmesg", "p2pBandwidthLatencyTest")) for n in others), others


# --- property tests: any text in, no exception out ------------------------------------------------

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400)
LINES = st.lists(
    st.sampled_from(
        [
            "GPU 00000000:19:00.0",
            "    Product Name : X",
            "    ECC Errors",
            "        Volatile",
            "            Single Bit",
            "                Total : 3",
            "            SRAM Uncorrectable Parity : ERR!",
            "    Remapped Rows",
            "        Pending : Yes",
            "    Processes",
            "        Process ID : 1",
            "            Used GPU Memory : [N/A]",
            "\tGPU0\tGPU1\tCPU Affinity",
            "GPU0\t X \tNV4\t0-3",
            "NIC Legend:",
            "  NIC0: mlx5_0",
            "GPU 0: A (UUID: GPU-1)",
            "\t Link 0: <inactive>",
            "         Link 0, P2P is supported: true",
            "\x1b[4mGPU0\tGPU1\tNIC0\x1b[0m",
            "GPU0\t X \tNV18NV18\tNODEPIX\tSYSSYS\t0-7",
            "\t Link 1: Replay Errors: x",
            "name, memory.total [MiB]",
            "N/A, 5 MiB",
            ":",
            " : ",
            "",
        ]
    ),
    max_size=30,
).map("\n".join)


@settings(max_examples=150, deadline=None)
@given(st.one_of(TEXT, LINES))
def test_parsers_never_raise(text: str) -> None:
    parse_nvidia_smi_q(text)
    parse_nvidia_smi_csv(text)
    t = parse_topo_matrix(text)
    closest_nics(t)
    parse_topo_p2p(text)
    for g in parse_nvlink(text)["gpus"]:
        link_summary(g)
    json.dumps(parse_nvidia_smi_q(text))
