"""`lspci -vvv` parser: ACS control, link capability vs status, bridge bus ranges."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.parsers.lspci import parse_lspci, to_json

RDMA = Path(__file__).parent / "fixtures" / "rdma"
SWITCH = RDMA / "lspci-vvv__h100-node-pex890xx-switch-downstream-port-acs-disabled-link-downgraded.txt"
SWITCH_ACS_ON = (
    RDMA / "lspci-vvv__h100-node-pex890xx-switch-downstream-port-CONSTRUCTED-acsctl-srcvalid-plus.txt"
)
GREP_47 = RDMA / "lspci-acsctl__amd-epyc-genoa-4x-rtx6000ada-all-acs-disabled-47-ports.txt"


def test_switch_downstream_port_record() -> None:
    (d,) = parse_lspci(SWITCH.read_text())
    assert d.slot == "17:00.0" and d.class_name == "PCI bridge" and d.kind == "bridge"
    assert d.port_type == "Downstream Port" and d.kernel_driver == "pcieport" and d.numa_node == 0
    assert (d.secondary_bus, d.subordinate_bus) == (0x18, 0x18)
    assert d.acs_capability is not None and d.acs_capability["SrcValid"] is True
    assert d.acs_control is not None and not any(d.acs_control.values()) and len(d.acs_control) == 7
    assert d.acs_redirecting == []
    assert d.link_capability is not None and (d.link_capability.speed_gts, d.link_capability.width) == (
        32.0,
        4,
    )
    sta = d.link_status
    assert sta is not None and (sta.speed_gts, sta.width) == (16.0, 4)
    assert (sta.speed_downgraded, sta.width_downgraded) == (True, False)
    assert d.capabilities_readable


def test_flipped_srcvalid_is_redirecting() -> None:
    (d,) = parse_lspci(SWITCH_ACS_ON.read_text())
    assert d.acs_redirecting == ["SrcValid"]


def test_bare_grep_acsctl_form() -> None:
    devices = parse_lspci(GREP_47.read_text())
    assert len(devices) == 47
    assert all(d.slot is None and d.acs_control is not None for d in devices)
    assert not any(d.acs_redirecting for d in devices)
    flipped = GREP_47.read_text().replace("SrcValid-", "SrcValid+", 1)
    assert sum(1 for d in parse_lspci(flipped) if d.acs_redirecting) == 1


def test_old_lspci_without_annotations_compares_cap_and_status() -> None:
    # lspci < 3.6 prints no "(downgraded)"/"(ok)": the same real record with the notes removed.
    text = SWITCH.read_text().replace(" (downgraded)", "").replace(" (ok)", "")
    sta = parse_lspci(text)[0].link_status
    assert sta is not None and (sta.speed_downgraded, sta.width_downgraded) == (True, False)


def test_access_denied_and_bridge_membership() -> None:
    # Record headers as lspci prints them; the NIC and GPU sit on bus 0x18, behind the real bridge.
    text = (
        SWITCH.read_text()
        + "18:00.0 Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
        + "\tCapabilities: <access denied>\n"
        + "\tKernel driver in use: mlx5_core\n\n"
        + "0000:19:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n"
    )
    bridge, nic, gpu = parse_lspci(text)
    assert (nic.kind, nic.capabilities_readable, nic.kernel_driver) == ("nic", False, "mlx5_core")
    assert gpu.kind == "gpu" and gpu.slot == "0000:19:00.0"
    assert bridge.is_above(nic) and not bridge.is_above(gpu)


def test_json_shape_and_cli() -> None:
    (rec,) = to_json(SWITCH.read_text())["devices"]
    assert rec["slot"] == "17:00.0" and rec["class"] == "PCI bridge" and rec["kind"] == "bridge"
    assert rec["link_status"]["speed_downgraded"] is True and rec["acs_control"]["SrcValid"] is False
    res = CliRunner().invoke(app, ["parse", "lspci", str(GREP_47)])
    assert res.exit_code == 0 and len(json.loads(res.output)["devices"]) == 47


LINES = sorted(set(SWITCH.read_text().splitlines()) | {"18:00.0 Infiniband controller: x", "zz:zz.9 bad: x"})


@settings(max_examples=150, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=400),
        st.lists(st.one_of(st.sampled_from(LINES), st.text(max_size=50)), max_size=40).map("\n".join),
    )
)
def test_lspci_parser_never_raises(text: str) -> None:
    json.dumps(to_json(text))


# Twelve whole records of the same real H100 node's `lspci -vvv` (tests/fixtures/rdma/README.md): the PCIe
# switch path of GPU 19:00.0, ConnectX-7 1a:00.0 and ConnectX-6 Dx 1b:00.0, and the path of an NVSwitch
# (83:00.0) whose downstream port 82:00.0 has ACS redirection on.
NODE = RDMA / "lspci-vvv__h100-node-12-records-gpu-cx7-cx6dx-switch-path-and-acs-on-nvswitch-port-excerpt.txt"


def test_h100_node_records() -> None:
    devices = parse_lspci(NODE.read_text())
    by = {d.slot: d for d in devices}
    assert len(devices) == 12
    assert [s for s, d in by.items() if d.kind == "gpu"] == ["19:00.0"]
    assert [s for s, d in by.items() if d.kind == "nic"] == ["1a:00.0", "1b:00.0"]
    # The NVSwitch is class "Bridge" but a PCIe Endpoint: not a PCI bridge.
    nvswitch = by["83:00.0"]
    assert (nvswitch.class_name, nvswitch.port_type, nvswitch.kind) == ("Bridge", "Endpoint", "other")
    assert nvswitch.kernel_driver == "nvidia-nvswitch" and nvswitch.numa_node == 1
    # Which bridges each device sits behind, from the bridges' secondary..subordinate bus ranges.
    above = {s: [b.slot for b in devices if b.kind == "bridge" and b.is_above(d)] for s, d in by.items()}
    assert above["19:00.0"] == ["15:01.0", "16:00.0", "17:01.0"]
    assert above["1a:00.0"] == ["15:01.0", "16:00.0", "17:02.0"]
    assert above["1b:00.0"] == ["15:01.0", "16:00.0", "17:03.0"]
    assert above["83:00.0"] == ["80:01.0", "81:00.0", "82:00.0"]
    assert [s for s, d in by.items() if d.acs_redirecting] == ["82:00.0"]
    assert by["82:00.0"].acs_redirecting == ["SrcValid", "ReqRedir", "CmpltRedir"]


def test_h100_node_links() -> None:
    by = {d.slot: d for d in parse_lspci(NODE.read_text())}

    def link(slot: str) -> tuple:
        cap, sta = by[slot].link_capability, by[slot].link_status
        assert cap is not None and sta is not None
        return (
            cap.speed_gts,
            cap.width,
            sta.speed_gts,
            sta.width,
            sta.speed_downgraded,
            sta.width_downgraded,
        )

    assert link("19:00.0") == (32.0, 16, 32.0, 16, False, False)  # H100, Gen5 x16
    assert link("1a:00.0") == (32.0, 16, 32.0, 16, False, False)  # ConnectX-7
    assert link("1b:00.0") == (16.0, 16, 16.0, 16, False, False)  # ConnectX-6 Dx is Gen4
    # The switch port above the Gen4 NIC trains at 16GT/s: lspci says "(downgraded)" for the port.
    assert link("17:03.0") == (32.0, 16, 16.0, 16, True, False)
    assert link("80:01.0") == (16.0, 16, 16.0, 2, False, True)
