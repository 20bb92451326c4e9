"""nvidia-smi parsers (-q, --query-gpu csv, topo -m, topo -p2p, nvlink -s/-e) on real captured outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.parsers.nvidia_smi import (
    parse_gpu_section,
    parse_nvidia_smi_csv,
    parse_nvidia_smi_q,
    parse_tree,
    to_bool,
    to_int,
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
        and to_int("-8 C") == -8
        and to_int("0x1900") == 6400
    )
    assert to_int("67.74 W") is None and to_int("N/A") is None
    assert to_bool("Not Active") is False and to_bool("Active") is True and to_bool("maybe") is None


def test_gpu_header_with_colons_is_not_split() -> None:
    tree = parse_tree("GPU 00000000:19:00.0\n    Product Name : X\nTimestamp : Wed Jul 31 11:22:39 2024\n")
    assert tree.children[0].key == "GPU 00000000:19:00.0"
    assert tree.get("Timestamp") == "Wed Jul 31 11:22:39 2024"
    assert parse_gpu_section(tree.children[0], 0)["name"] == "X"


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


# --- the `ddpdoctor parse` contract on every fixture --------------------------------------------------

CONTRACT_TOOLS = {
    "nvidia-smi-q": sorted(GPU.glob("nvidia-smi-q__*.txt")),
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
        assert data["gpus"] and all(g["links"] for g in data["gpus"])
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
