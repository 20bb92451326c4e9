"""Kernel-log parser: Xid events, fallen off the bus (both forms), PCIe "limited by" lines."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.parsers.dmesg import XID_TABLE, normalize_bus_id, parse_dmesg

GPU = Path(__file__).parent / "fixtures" / "gpu"
PCIE = GPU / "dmesg-pcie__h100-bandwidth-limited-by-gen4-x16-link.txt"

# Kernel-log lines as quoted in shared/reference/signatures.md (S48, S49): the Xid 79 line, the
# multi-line "fallen off the bus" form without an Xid token (NVSentinel#155) and Xid 63.
XID_79 = "[ 5123.456789] NVRM: Xid (PCI:0000:44:00): 79, pid=0, GPU has fallen off the bus."
MULTI_LINE = (
    "[ 7001.000001] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    "[ 7001.000002] NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    "[ 7001.000003] NVRM: fallen off the bus and is not responding to commands.\n"
)
XID_63 = (
    "Jun  7 19:30:01 node12 kernel: NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row "
    "marked for remapping, reset gpu to activate."
)


def test_pcie_limited_by_lines_from_real_sample() -> None:
    out = parse_dmesg(PCIE.read_text())
    assert out["xids"] == [] and out["fallen_off_bus"] == []
    first, last = out["pcie_limited"]
    assert first["device"] == "0000:04:00.0" and last["device"] == "0000:8b:00.0"
    assert first["available_gbps"] == 252.048 and first["capable_gbps"] == 504.112
    assert (first["limited_speed_gts"], first["limited_width"]) == (16.0, 16)
    assert (first["capable_speed_gts"], first["capable_width"]) == (32.0, 16)
    assert first["limited_at"] == "0000:01:00.0" and first["timestamp"] == 10.735323


def test_xid_79_and_meaning() -> None:
    (x,) = parse_dmesg(XID_79)["xids"]
    assert x["code"] == 79 and x["bus_id"] == "0000:44:00" and x["timestamp"] == 5123.456789
    assert (
        x["meaning"] == "GPU has fallen off the bus" and x["severity"] == "fail" and x["cause"] == "hardware"
    )
    assert parse_dmesg(XID_79)["fallen_off_bus"][0]["bus_id"] == "0000:44:00"


def test_fallen_off_bus_multi_line_form_without_xid() -> None:
    out = parse_dmesg(MULTI_LINE)
    assert out["xids"] == []
    (f,) = out["fallen_off_bus"]
    assert f["bus_id"] == "0000:b3:00" and f["timestamp"] == 7001.000003


def test_xid_in_journal_format_and_unknown_code() -> None:
    out = parse_dmesg(XID_63 + "\n[1.0] NVRM: Xid (PCI:0000:01:00): 9999, something new\n")
    x63, unknown = out["xids"]
    assert x63["code"] == 63 and x63["timestamp"] is None and "Row Remapper" in x63["detail"]
    assert x63["severity"] == "warn"
    assert unknown["code"] == 9999 and unknown["meaning"] is None and unknown["severity"] == "warn"


def test_same_gpu_reported_once_per_fall() -> None:
    text = XID_79 + "\n[ 5123.5] NVRM: GPU 0000:44:00.0: GPU has fallen off the bus.\n"
    assert len(parse_dmesg(text)["fallen_off_bus"]) == 1


def test_xid_table_covers_the_common_codes() -> None:
    for code in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119):
        info = XID_TABLE[code]
        assert info.meaning and info.action and info.severity in ("info", "warn", "fail")
    assert XID_TABLE[13].cause == "application" and XID_TABLE[48].severity == "fail"


def test_normalize_bus_id() -> None:
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00"
    assert normalize_bus_id("PCI:0000:3b:00") == "0000:3b:00"
    assert normalize_bus_id("garbage") is None and normalize_bus_id(None) is None


def test_parse_cli() -> None:
    res = CliRunner().invoke(app, ["parse", "dmesg", str(PCIE), "--json"])
    assert res.exit_code == 0
    assert len(json.loads(res.output)["pcie_limited"]) == 2


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(
                [XID_79, XID_63, *MULTI_LINE.splitlines(), PCIE.read_text(), "NVRM: fallen off the bus", ""]
            ),
            max_size=10,
        ).map("\n".join),
    )
)
def test_parse_dmesg_never_raises(text: str) -> None:
    json.dumps(parse_dmesg(text))


def test_malformed_numbers_in_a_limited_line_are_ignored() -> None:
    # `[\d.]+` once matched "1.2.3" and float() raised; a malformed number now leaves the line unparsed.
    line = (
        "pci 0000:01:00.0: 1.2.3 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x16 link at "
        "0000:00:01.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)"
    )
    assert parse_dmesg(line)["pcie_limited"] == []
    assert parse_dmesg(line.replace("1.2.3", "126.024"))["pcie_limited"][0]["available_gbps"] == 126.024
    assert parse_dmesg("NVRM: Xid (PCI:0000:19:00): " + "7" * 5000 + ", pid=1")["xids"] == []
