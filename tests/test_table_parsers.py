"""`ddpdoctor parse nvidia-smi` (the default table) and `parse p2pBandwidthLatencyTest` on real outputs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.parsers import load_parse_tools, recognised_nothing
from ddpdoctor.parsers.cuda_samples import MATRICES, parse_p2p_bandwidth_latency
from ddpdoctor.parsers.nvidia_smi_table import parse_nvidia_smi_table

GPU = Path(__file__).parent / "fixtures" / "gpu"
TABLES = sorted(GPU.glob("nvidia-smi__*.txt"))
P2P = sorted(GPU.glob("p2pBandwidthLatencyTest__*.txt"))


def smi(name: str) -> dict:
    return parse_nvidia_smi_table((GPU / f"nvidia-smi__{name}.txt").read_text())


def p2p(name: str) -> dict:
    return parse_p2p_bandwidth_latency((GPU / f"p2pBandwidthLatencyTest__{name}.txt").read_text())


# --- nvidia-smi (default table) ----------------------------------------------------------------------


def test_h100_r550_wide_layout_idle_no_processes() -> None:
    out = smi("8xh100-80gb-hbm3-550.90.07-idle")
    assert (out["driver_version"], out["cuda_version"], out["errors"]) == ("550.90.07", "12.4", [])
    assert [g["index"] for g in out["gpus"]] == list(range(8))
    assert [g["bus_id"] for g in out["gpus"]][:2] == ["00000000:19:00.0", "00000000:3B:00.0"]
    assert out["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "persistence_mode": True,
        "bus_id": "00000000:19:00.0",
        "display_active": False,
        "ecc_uncorrectable": 0,
        "fan_percent": None,  # `N/A`: no fan on SXM boards
        "temperature_c": 27,
        "perf_state": "P0",
        "power_draw_w": 72.0,
        "power_cap_w": 700.0,
        "memory_used_mib": 1,
        "memory_total_mib": 81559,
        "utilization_percent": 0,
        "compute_mode": "Default",
        "mig_mode": False,
        "mig_mode_pending_reset": False,
    }
    assert [g["temperature_c"] for g in out["gpus"]] == [27, 24, 23, 23, 27, 22, 24, 23]
    assert out["gpus"][5]["power_draw_w"] == 74.0
    assert out["processes"] == []  # `No running processes found`
    assert out["mig_devices"] is None


def test_r525_79_columns_fan_err_exclusive_process_truncated_name() -> None:
    out = smi("rtx-geforce-fan-ERR-exclusive-process-525")
    assert (out["driver_version"], out["cuda_version"]) == ("525.125.06", "12.0")
    (g,) = out["gpus"]
    assert g["name"] == "NVIDIA GeForce ..."  # kept as nvidia-smi cut it
    assert g["fan_percent"] is None  # `ERR!`
    assert (g["temperature_c"], g["perf_state"], g["power_draw_w"], g["power_cap_w"]) == (
        38,
        "P5",
        49.0,
        450.0,
    )
    assert (g["memory_used_mib"], g["memory_total_mib"]) == (2021, 23028)
    assert g["compute_mode"] == "Exclusive_Process"  # `E. Process`, normalised like the -q parser
    assert g["mig_mode"] is None and g["ecc_uncorrectable"] == 0
    assert out["processes"] is None  # no process table in the file


def test_r396_old_layout_processes_with_truncated_names_no_cuda_version() -> None:
    out = smi("gtx1080ti-396-old-79col-processes-truncated-names")
    assert (out["driver_version"], out["cuda_version"]) == ("396.45", None)
    (g,) = out["gpus"]
    assert g["name"] == "GeForce GTX 108..."
    assert g["display_active"] is True and g["persistence_mode"] is False
    assert (g["fan_percent"], g["temperature_c"], g["power_draw_w"], g["utilization_percent"]) == (
        0,
        59,
        26.0,
        3,
    )
    assert g["ecc_uncorrectable"] is None  # `N/A` on GeForce
    assert g["mig_mode"] is None  # two rows per GPU before R450: no MIG column
    assert len(out["processes"]) == 7
    assert out["processes"][0] == {
        "gpu": 0,
        "gi_id": None,
        "ci_id": None,
        "pid": 625,
        "type": "G",
        "name": "/usr/lib/xorg-server/Xorg",
        "used_memory_mib": 370,
    }
    assert out["processes"][4]["name"] == "...-token=3E0EB0339C426519FCEB41A77A4FE74E"
    assert [p["pid"] for p in out["processes"]][-2:] == [9846, 13026]
    assert sum(p["used_memory_mib"] for p in out["processes"]) == 370 + 53 + 2 + 99 + 75 + 28 + 40


def test_r390_indented_paste_power_na_processes_not_supported() -> None:
    out = smi("gtx560ti-390-power-NA-processes-not-supported-indented")
    assert out["driver_version"] == "390.116" and out["cuda_version"] is None
    (g,) = out["gpus"]
    assert g["name"] == "GeForce GTX 560 Ti" and g["bus_id"] == "00000000:01:00.0"
    assert g["display_active"] is None  # Disp.A `N/A`
    assert (g["fan_percent"], g["temperature_c"], g["perf_state"]) == (40, 46, "P8")
    assert (g["power_draw_w"], g["power_cap_w"], g["utilization_percent"]) == (None, None, None)
    assert (g["memory_used_mib"], g["memory_total_mib"]) == (790, 1217)
    assert out["processes"] is None  # `Not Supported`: unknown, not "none running"


def test_r450_mig_enabled_a100_with_mig_devices_block() -> None:
    out = smi("8xa100-450-mig-enabled-mig-devices-block")
    assert (out["driver_version"], out["cuda_version"]) == ("450.80.02", "11.0")
    assert len(out["gpus"]) == 8
    assert [g["mig_mode"] for g in out["gpus"]] == [False] + [True] * 7
    g0, g1 = out["gpus"][0], out["gpus"][1]
    assert g0["name"] == "A100-SXM4-40GB" and g0["utilization_percent"] == 0 and g0["ecc_uncorrectable"] == 0
    # With MIG on, utilization is `N/A` and the ECC column shows `On`, not a count.
    assert g1["utilization_percent"] is None and g1["ecc_uncorrectable"] is None
    assert out["gpus"][7]["bus_id"] == "00000000:DA:00.0" and out["gpus"][7]["memory_used_mib"] == 3
    assert out["mig_devices"] == [
        {
            "gpu": 7,
            "gi_id": 13,
            "ci_id": 0,
            "mig_dev": 0,
            "memory_used_mib": 3,
            "memory_total_mib": 4864,
            "bar1_used_mib": 0,
            "bar1_total_mib": 8191,
            "sm_count": 14,
            "ecc_uncorrectable": 0,
        }
    ]
    # The R450 process table already has GI/CI columns, at the old 79-column width.
    assert out["processes"] == []


def test_r535_87_columns_ddp_processes_new_layout() -> None:
    out = smi("4xp100-535-87col-ddp-python3-processes")
    assert (out["driver_version"], out["cuda_version"]) == ("535.129.03", "12.2")
    assert [g["utilization_percent"] for g in out["gpus"]] == [47, 82, 0, 0]
    assert [g["power_draw_w"] for g in out["gpus"]] == [56.0, 214.0, 52.0, 55.0]
    assert all(g["mig_mode"] is None for g in out["gpus"])  # `N/A` on Pascal
    assert out["processes"] == [
        {
            "gpu": i,
            "gi_id": None,
            "ci_id": None,
            "pid": 280080,
            "type": "C",
            "name": "python3",
            "used_memory_mib": m,
        }
        for i, m in enumerate([3030, 3904, 3904, 4562])
    ]


@pytest.mark.parametrize(
    ("name", "errors"),
    [
        (
            "nvml-driver-library-version-mismatch",
            ["Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 570.124"],
        ),
        (
            "unable-to-determine-device-handle-unknown-error",
            ["Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error"],
        ),
    ],
)
def test_error_outputs_go_to_errors(name: str, errors: list[str]) -> None:
    out = smi(name)
    assert out["errors"] == errors
    assert out["gpus"] == [] and out["driver_version"] is None and out["processes"] is None


def test_every_table_fixture_parses_and_the_q_parser_sees_no_gpus_in_it() -> None:
    from ddpdoctor.parsers.nvidia_smi import parse_nvidia_smi_q

    assert len(TABLES) >= 7
    for path in TABLES:
        out = parse_nvidia_smi_table(path.read_text())
        assert out["gpus"] or out["errors"], path.name
        assert parse_nvidia_smi_q(path.read_text())["gpus"] == [], path.name


def test_second_snapshot_in_one_file_is_ignored() -> None:
    text = (GPU / "nvidia-smi__4xp100-535-87col-ddp-python3-processes.txt").read_text()
    other = (GPU / "nvidia-smi__8xh100-80gb-hbm3-550.90.07-idle.txt").read_text()
    out = parse_nvidia_smi_table(text + "\n" + other)
    assert out["driver_version"] == "535.129.03" and len(out["gpus"]) == 4


# --- p2pBandwidthLatencyTest -------------------------------------------------------------------------


def test_p2p_2x_2080ti_cannot_access_peer() -> None:
    out = p2p("2x-rtx2080ti-cannot-access-peer")
    assert out["devices"] == [
        {"index": 0, "name": "NVIDIA GeForce RTX 2080 Ti", "pci": "0000:b4:00"},
        {"index": 1, "name": "NVIDIA GeForce RTX 2080 Ti", "pci": "0000:b5:00"},
    ]
    assert out["peer_access"] == {"0": {"1": False}, "1": {"0": False}}
    assert out["connectivity"] == {"0": {"0": True, "1": False}, "1": {"0": False, "1": True}}
    m = out["matrices"]
    assert m["unidirectional_p2p_disabled_gbps"] == {
        "0": {"0": 541.84, "1": 5.71},
        "1": {"0": 5.70, "1": 543.05},
    }
    assert m["unidirectional_p2p_enabled_gbps"]["0"]["1"] == 5.72
    assert m["bidirectional_p2p_disabled_gbps"]["1"] == {"0": 6.10, "1": 533.91}
    assert m["bidirectional_p2p_enabled_gbps"]["0"] == {"0": 533.34, "1": 6.10}
    assert m["latency_gpu_p2p_disabled_us"] == {"0": {"0": 1.33, "1": 14.76}, "1": {"0": 13.95, "1": 1.26}}
    assert m["latency_cpu_p2p_disabled_us"] == {"0": {"0": 3.55, "1": 11.08}, "1": {"0": 10.48, "1": 3.32}}
    assert m["latency_gpu_p2p_enabled_us"]["1"]["0"] == 13.63
    assert m["latency_cpu_p2p_enabled_us"]["1"] == {"0": 10.47, "1": 3.27}
    assert out["errors"] == []


def test_p2p_8x_h100_nvlink_all_peers() -> None:
    out = p2p("8xh100-nvlink-all-peers-775GBps-bidir")
    assert [d["pci"] for d in out["devices"]] == [
        "0000:19:00", "0000:3b:00", "0000:4c:00", "0000:5d:00",
        "0000:9b:00", "0000:bb:00", "0000:cb:00", "0000:db:00",
    ]  # fmt: skip
    assert all(d["name"] == "NVIDIA H100 80GB HBM3" for d in out["devices"])
    assert all(len(row) == 7 and all(row.values()) for row in out["peer_access"].values())
    assert len(out["peer_access"]) == 8
    assert all(all(row.values()) and len(row) == 8 for row in out["connectivity"].values())
    m = out["matrices"]
    assert all(len(m[key]) == 8 and all(len(r) == 8 for r in m[key].values()) for key in MATRICES)
    assert m["bidirectional_p2p_enabled_gbps"]["1"]["0"] == 774.45
    assert m["bidirectional_p2p_enabled_gbps"]["7"]["7"] == 2945.94
    assert m["unidirectional_p2p_disabled_gbps"]["4"]["1"] == 38.27
    assert m["unidirectional_p2p_enabled_gbps"]["2"]["1"] == 393.28
    assert m["latency_gpu_p2p_enabled_us"]["0"]["1"] == 3.34
    assert m["latency_cpu_p2p_enabled_us"]["7"]["7"] == 2.09
    # NVLink: every off-diagonal P2P write is an order of magnitude above the P2P-disabled copy.
    uni_on, uni_off = m["unidirectional_p2p_enabled_gbps"], m["unidirectional_p2p_disabled_gbps"]
    assert all(uni_on[a][b] > 9 * uni_off[a][b] for a in uni_on for b in uni_on[a] if a != b)


def test_p2p_4x_a100_pcie_bridged_pairs_tabs_and_trailing_spaces() -> None:
    out = p2p("4xa100-pcie-nvlink-bridge-pairs-tabs-trailing-spaces")
    assert [d["pci"] for d in out["devices"]] == ["0001:00:00", "0002:00:00", "0003:00:00", "0004:00:00"]
    assert out["peer_access"]["0"] == {"1": True, "2": False, "3": False}
    assert out["peer_access"]["3"] == {"0": False, "1": False, "2": True}
    # Tab-separated connectivity rows.
    assert out["connectivity"]["2"] == {"0": False, "1": False, "2": True, "3": True}
    m = out["matrices"]
    assert m["unidirectional_p2p_enabled_gbps"]["0"] == {"0": 1502.40, "1": 275.07, "2": 21.62, "3": 21.60}
    assert m["bidirectional_p2p_enabled_gbps"]["3"]["2"] == 515.35
    assert m["latency_gpu_p2p_enabled_us"]["2"]["3"] == 2.32
    assert m["latency_cpu_p2p_disabled_us"]["3"] == {"0": 6.64, "1": 6.49, "2": 5.61, "3": 2.30}


def test_p2p_4x_3090_no_peer_access_with_shell_prompt() -> None:
    out = p2p("4xrtx3090-pcie-no-peer-access-prompt-line")
    assert [d["index"] for d in out["devices"]] == [0, 1, 2, 3]
    assert out["devices"][3] == {"index": 3, "name": "GeForce RTX 3090", "pci": "0000:c7:00"}
    assert not any(v for row in out["peer_access"].values() for v in row.values())
    assert out["connectivity"]["1"] == {"0": False, "1": True, "2": False, "3": False}
    m = out["matrices"]
    assert m["unidirectional_p2p_enabled_gbps"]["2"]["3"] == 5.90
    assert m["bidirectional_p2p_disabled_gbps"]["0"]["1"] == 8.76
    assert m["latency_gpu_p2p_disabled_us"]["0"]["2"] == 18.49
    assert m["latency_cpu_p2p_enabled_us"]["3"] == {"0": 5.88, "1": 5.81, "2": 5.71, "3": 1.78}


def test_p2p_first_run_kept_when_two_are_pasted_and_absent_matrices_are_null() -> None:
    a = (GPU / "p2pBandwidthLatencyTest__4xrtx3090-pcie-no-peer-access-prompt-line.txt").read_text()
    b = (GPU / "p2pBandwidthLatencyTest__2x-rtx2080ti-cannot-access-peer.txt").read_text()
    out = parse_p2p_bandwidth_latency(a + "\n" + b)
    assert out["matrices"]["unidirectional_p2p_disabled_gbps"]["0"]["0"] == 831.56
    assert out["connectivity"]["0"] == {"0": True, "1": False, "2": False, "3": False}
    head = parse_p2p_bandwidth_latency(b.split("Unidirectional P2P=Disabled")[0])
    assert head["connectivity"] is not None and len(head["devices"]) == 2
    assert all(head["matrices"][key] is None for key in MATRICES)


# --- never raise ---------------------------------------------------------------------------------------

_LINES = sorted({line for path in TABLES + P2P for line in path.read_text().splitlines()})


@st.composite
def _mutated_fixture(draw: st.DrawFn) -> str:
    """Real lines, shuffled, cut and sprinkled with the tokens nvidia-smi prints when it cannot read."""
    lines = draw(st.lists(st.sampled_from(_LINES), max_size=40))
    rng = random.Random(draw(st.integers(0, 2**32)))
    out = []
    for line in lines:
        cut = rng.randrange(len(line) + 1)
        junk = rng.choice(["", "N/A", "ERR!", "[N/A]", "Unknown Error", "|", "+", "-", "=", "\t", "1", "²"])
        out.append(line[:cut] + junk + line[cut:] if rng.random() < 0.5 else line)
    return "\n".join(out)


_TOKENS = st.lists(
    st.sampled_from(
        list("|+-=/ \t\n0123456789%CWMiBPNA!.:,xD\\") + ["GPU", "MIG", "Device=", "CAN", "Processes:"]
    ),
    max_size=200,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=400), _TOKENS, _mutated_fixture()))
def test_table_parsers_never_raise(text: str) -> None:
    out = parse_nvidia_smi_table(text)
    json.dumps(out)
    assert set(out) == {"driver_version", "cuda_version", "gpus", "processes", "mig_devices", "errors"}
    out = parse_p2p_bandwidth_latency(text)
    json.dumps(out)
    assert set(MATRICES) <= set(out["matrices"])


# --- CLI -----------------------------------------------------------------------------------------------


def test_tools_are_registered() -> None:
    tools = load_parse_tools()
    assert tools["nvidia-smi"] is parse_nvidia_smi_table
    assert tools["p2pBandwidthLatencyTest"] is parse_p2p_bandwidth_latency
    result = CliRunner().invoke(app, ["parse", "list"])
    assert result.exit_code == 0
    assert {"nvidia-smi", "p2pBandwidthLatencyTest"} <= set(result.output.split())


def test_cli_end_to_end_json() -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["parse", "nvidia-smi", str(GPU / "nvidia-smi__8xh100-80gb-hbm3-550.90.07-idle.txt"), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["driver_version"] == "550.90.07" and len(data["gpus"]) == 8
    path = GPU / "p2pBandwidthLatencyTest__2x-rtx2080ti-cannot-access-peer.txt"
    result = runner.invoke(app, ["parse", "p2pBandwidthLatencyTest", "-", "--json"], input=path.read_text())
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["peer_access"] == {"0": {"1": False}, "1": {"0": False}}



@pytest.mark.parametrize("tool", ["ibstat", "nccl-tests", "nvidia-smi-q", "lspci", "ulimit"])
def test_another_tools_output_is_nothing_recognised_exit_3(tool: str) -> None:
    # QA pass: `parse ibstat /etc/passwd` printed empty structures with exit 0. A real nvidia-smi
    # table is not any of these tools' output.
    path = GPU / "nvidia-smi__8xh100-80gb-hbm3-550.90.07-idle.txt"
    result = CliRunner().invoke(app, ["parse", tool, str(path)])
    assert result.exit_code == 3, result.output
    assert f"nothing recognised as {tool} output in {path}" in result.stderr
    assert recognised_nothing(json.loads(result.stdout))  # the empty structure is still printed
    empty = CliRunner().invoke(app, ["parse", tool, "-"], input="")
    assert empty.exit_code == 3 and "the input is empty" in empty.stderr


def test_recognised_nothing_counts_false_zero_and_errors_as_data() -> None:
    assert recognised_nothing({"devices": [], "errors": [], "params": {}, "version": None, "x": ""})
    assert not recognised_nothing({"devices": [], "errors": ["No IB devices found"]})
    assert not recognised_nothing({"limits": {"n": {"value": 0}}})
    assert not recognised_nothing({"ok": False})


def test_double_spaced_and_crlf_pastes_parse_the_same() -> None:
    text = (GPU / "nvidia-smi__8xa100-450-mig-enabled-mig-devices-block.txt").read_text()
    expected = parse_nvidia_smi_table(text)
    assert parse_nvidia_smi_table(text.replace("\n", "\n\n")) == expected
    assert parse_nvidia_smi_table(text.replace("\n", "\r\n")) == expected
    text = (GPU / "p2pBandwidthLatencyTest__4xrtx3090-pcie-no-peer-access-prompt-line.txt").read_text()
    assert parse_p2p_bandwidth_latency(text.replace("\n", "\r\n\r\n")) == parse_p2p_bandwidth_latency(text)
