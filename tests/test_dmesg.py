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
                [
                    XID_79,
                    XID_63,
                    *MULTI_LINE.splitlines(),
                    PCIE.read_text(),
                    "NVRM: fallen off the bus",
                    "",
                    "<4>[ 1.5] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x",
                    "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 45, Ch 1 caused by previous Xid ",
                    "kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000:38:00): 13",
                    "               NVRM: fallen off the bus and is not responding to commands.",
                ]
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


# --- real-output sweep: dmesg -T, --decode --time-format=iso, journal, Xid 154, SXid ------------------


def sample(name: str) -> dict:
    return parse_dmesg((GPU / name).read_text())


def test_dmesg_ctime_xid_119_gsp_timeouts() -> None:
    out = sample("dmesg-T__h100-xid-119-gsp-rpc-timeout-rpc-history.txt")
    # Five Xid 119 lines among 43 lines of GSP RPC history; the history lines are not Xids.
    assert [x["code"] for x in out["xids"]] == [119] * 5
    first = out["xids"][0]
    assert first["bus_id"] == "0000:9b:00" and first["severity"] == "fail" and first["cause"] == "hardware"
    assert first["timestamp"] is None and first["time"] == "Sun Feb 23 16:24:18 2025"
    assert out["xids"][-1]["time"] == "Sun Feb 23 16:30:13 2025" and "name=gpud" in out["xids"][-1]["detail"]
    assert out["fallen_off_bus"] == []


def test_dmesg_decode_iso_xid_13_burst_then_43() -> None:
    out = sample("dmesg-decode-iso__xid-13-graphics-exceptions-burst.txt")
    codes = [x["code"] for x in out["xids"]]
    assert codes == [13] * 16 + [43]
    assert {x["bus_id"] for x in out["xids"]} == {"0000:38:00"}
    assert out["xids"][0]["time"] == "2025-01-21T04:41:44,283302+00:00"
    assert out["xids"][-1]["detail"] == "pid=2924364, name=pt_main_thread, Ch 00000008"
    assert all(x["severity"] == "info" and x["cause"] == "application" for x in out["xids"])


def test_dmesg_ctime_xid_13_and_109() -> None:
    out = sample("dmesg-ctime__xid-13-and-109-ctx-switch-timeout-peermem.txt")
    assert [(x["code"], x["time"]) for x in out["xids"]] == [
        (13, "Fri Aug 30 11:43:09 2024"),
        (13, "Fri Aug 30 11:43:09 2024"),
        (13, "Fri Aug 30 11:43:09 2024"),
        (109, "Fri Aug 30 11:43:14 2024"),
    ]
    assert out["xids"][3]["meaning"] == "Context switch timeout"


def test_journal_xid_45_names_its_cause() -> None:
    out = sample("dmesg-journal__8gpu-xid-45-caused-by-previous-xid-149-145-excerpt.txt")
    assert [x["code"] for x in out["xids"]] == [45] * 7
    assert [x["caused_by"] for x in out["xids"]] == [149, 145, 145, 145, 149, 145, 145]
    assert [x["bus_id"] for x in out["xids"][:4]] == ["0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00"]
    assert all(x["time"] is None and x["timestamp"] is None for x in out["xids"])


def test_xid_154_recovery_action_whatever_the_wording() -> None:
    reboot = sample("dmesg__xid-79-then-xid-154-recovery-action-os-reboot-excerpt.txt")
    assert [(x["code"], x["recovery_action"]) for x in reboot["xids"]] == [(79, None), (154, "reboot")]
    # The Xid 79 line and `NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.` are one event.
    assert [f["bus_id"] for f in reboot["fallen_off_bus"]] == ["0000:01:00"]
    reset = sample("dmesg__xid-51-bad-tsg-then-xid-154-pf-flr-excerpt.txt")
    assert [(x["code"], x["recovery_action"]) for x in reset["xids"]] == [(51, None), (154, "reset")]
    assert reset["xids"][0]["meaning"] is None and reset["xids"][0]["severity"] == "warn"
    for text, action in [
        ("to 0x1 (GPU Reset Required)", "reset"),
        ("to 0x2 (Node Reboot Required)", "reboot"),
        ("to 0x4 (Drain and Reset)", "drain_and_reset"),
        ("to 0x9 (Something New)", "unknown_9"),
    ]:
        line = f"NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) {text}"
        (x,) = parse_dmesg(line)["xids"]
        assert x["recovery_action"] == action and x["bus_id"] == "0008:01:00"


def test_fallen_off_bus_continuation_lines_take_the_first_lines_time() -> None:
    out = sample("dmesg__h100-fallen-off-bus-multiline-no-xid-570.158.01.txt")
    assert out["xids"] == []
    (f,) = out["fallen_off_bus"]
    assert f["bus_id"] == "0000:b3:00" and f["timestamp"] == 1843.308145


def test_nvswitch_sxid_is_not_an_xid() -> None:
    out = sample("dmesg__nvswitch-sxid-22013-not-an-xid-570.195.03-excerpt.txt")
    assert out == {"xids": [], "fallen_off_bus": [], "pcie_limited": []}


def test_old_driver_channel_format() -> None:
    out = sample("dmesg__laptop-xid-32-31-old-driver-channel-format.txt")
    assert [(x["code"], x["timestamp"]) for x in out["xids"]] == [
        (32, 24128.828315),
        (32, 24128.828608),
        (31, 24128.834365),
    ]
    assert out["xids"][2]["detail"] == "Ch 00000003, engmask 00000101, intr 10000000"


def test_prefixes_of_other_log_readers() -> None:
    raw = "<4>[ 1126.635824] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
    (x,) = parse_dmesg(raw)["xids"]
    assert x["timestamp"] == 1126.635824 and x["time"] is None
    (j,) = parse_dmesg(XID_63)["xids"]
    assert j["time"] == "Jun  7 19:30:01" and j["timestamp"] is None
    iso = "2026-09-14T20:30:27-0400 host kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus."
    assert parse_dmesg(iso)["xids"][0]["time"] == "2026-09-14T20:30:27-0400"


def test_nvlink_xid_family_is_in_the_table() -> None:
    for code in (144, 145, 146, 147, 148, 149, 150):
        assert "NVLink" in XID_TABLE[code].meaning and XID_TABLE[code].cause == "hardware"
