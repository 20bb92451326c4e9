"""The rdma area: fake sysfs trees, replays of real tool outputs, NCCL settings, memlock, PCIe ACS."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.checks.rdma import (
    AREA,
    Hca,
    RdmaFacts,
    check_rdma,
    collect_rdma_summary,
    parse_nccl_ib_hca,
    summarize_rdma,
)
from ddpdoctor.cli import app
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import Finding, Severity
from ddpdoctor.edge.runner import CommandResult
from ddpdoctor.edge.sources import RecordingSources, ReplaySources
from ddpdoctor.edge.sysfs_ib import load_infiniband_sysfs, read_infiniband_sysfs, to_ib_status

RDMA = Path(__file__).parent / "fixtures" / "rdma"
IBSTAT_DOWN = RDMA / "ibstat__cx7-ib-port-down-polling-redacted-guids.txt"
IBSTAT_8X = RDMA / "ibstat__a100-8x-hdr-ib-active-then-ibpanic-mlx5_8-missing.txt"
IBSTAT_ROCE = RDMA / "ibstat__connectx6dx-2port-roce-100g-active.txt"
LSPCI_ACS_ON = (
    RDMA / "lspci-vvv__h100-node-pex890xx-switch-downstream-port-CONSTRUCTED-acsctl-srcvalid-plus.txt"
)
LSPCI_ACS_OFF = RDMA / "lspci-vvv__h100-node-pex890xx-switch-downstream-port-acs-disabled-link-downgraded.txt"
LSPCI_GREP = RDMA / "lspci-acsctl__amd-epyc-genoa-4x-rtx6000ada-all-acs-disabled-47-ports.txt"
ULIMIT_64K = RDMA / "ulimit-a__bash4-memlock-64k-openfiles-1024-default.txt"
ULIMIT_5G = RDMA / "ulimit-a__bash5-with-R-line-memlock-5128731.txt"
ULIMIT_UNLIMITED = ULIMIT_5G.read_text().replace("(kbytes, -l) 5128731", "(kbytes, -l) unlimited")

ACTIVE_400 = ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
ACTIVE_200 = ("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", "InfiniBand")
DOWN_POLLING = ("1: DOWN", "2: Polling", "10 Gb/sec (4X SDR)", "InfiniBand")
INIT_LINKUP = ("2: INIT", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
ROCE_100 = ("4: ACTIVE", "5: LinkUp", "100 Gb/sec (2X HDR)", "Ethernet")


# --- fake sysfs trees (built by hand: the kernel's file names and value formats) -------------------------


def make_ib_tree(root: Path, devices: dict[str, dict[str, Any]], uverbs: bool = True) -> Path:
    for i, (name, spec) in enumerate(devices.items()):
        d = root / "sys/class/infiniband" / name
        d.mkdir(parents=True)
        (d / "hca_type").write_text(spec.get("type", "MT4129") + "\n")
        (d / "fw_ver").write_text(spec.get("fw", "28.39.1002") + "\n")
        (d / "board_id").write_text("MT_0000000838\n")
        (d / "node_type").write_text("1: CA\n")
        pci = root / "sys/devices/pci0000:00" / f"0000:{0x3B + i:02x}:00.0"
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{spec.get('numa', 0)}\n")
        (d / "device").symlink_to(pci)
        for port, (state, phys, rate, layer) in spec["ports"].items():
            p = d / "ports" / str(port)
            p.mkdir(parents=True)
            for fname, value in (
                ("state", state),
                ("phys_state", phys),
                ("rate", rate),
                ("link_layer", layer),
            ):
                (p / fname).write_text(value + "\n")
    (root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
    if uverbs:
        for i in range(len(devices)):
            (root / "dev/infiniband" / f"uverbs{i}").write_text("")
    return root


def snapshot_dir(
    tmp_path: Path,
    sysfs_root: Optional[Path] = None,
    *,
    ulimit: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
    modules: Optional[str] = None,
    files: Optional[dict[str, Path]] = None,
) -> Path:
    """A snapshot DIR as `ddpdoctor snapshot` writes it (facts as JSON, commands as <id>.txt)."""
    snap = tmp_path / "snap"
    snap.mkdir()
    if sysfs_root is not None:
        (snap / "infiniband-sysfs.json").write_text(json.dumps(read_infiniband_sysfs(sysfs_root)))
    if ulimit is not None:
        (snap / "ulimit-a.txt").write_text(ulimit)
    if env is not None:
        (snap / "env.json").write_text(json.dumps(env))
    if modules is not None:
        (snap / "kernel-modules.json").write_text(json.dumps({"proc_modules": modules, "sys_module": None}))
    for name, src in (files or {}).items():
        shutil.copy(src, snap / name)
    return snap


def run_rdma(snap: Path) -> list[Finding]:
    report = run_checks(ReplaySources(snap), [AREA], timeout_s=20)
    assert all(f.area == "rdma" for f in report.findings)
    return report.findings


def by_id(findings: list[Finding], fid: str) -> list[Finding]:
    return [f for f in findings if f.id == fid]


PEERMEM = "nvidia_peermem 16384 0 - Live 0x0\nnvidia 54292480 63 nvidia_peermem, Live 0x0\nmlx5_ib 483328 0 - Live 0x0\n"


# --- sysfs reader ---------------------------------------------------------------------------------------


def test_sysfs_reader_reads_devices_ports_numa_and_dev_nodes(tmp_path: Path) -> None:
    root = make_ib_tree(
        tmp_path, {"mlx5_0": {"ports": {1: ACTIVE_400}, "numa": 1}, "mlx5_1": {"ports": {1: DOWN_POLLING}}}
    )
    fact = read_infiniband_sysfs(tmp_path)
    json.dumps(fact)  # JSON-able: it is stored as a snapshot fact
    assert fact["class_dir_present"] and fact["dev_infiniband"] == ["uverbs0", "uverbs1"]
    d0 = fact["devices"][0]
    assert (d0["name"], d0["hca_type"], d0["fw_ver"], d0["numa_node"], d0["pci_slot"]) == (
        "mlx5_0",
        "MT4129",
        "28.39.1002",
        1,
        "0000:3b:00.0",
    )
    assert d0["ports"] == [
        {
            "port": 1,
            "state": "4: ACTIVE",
            "phys_state": "5: LinkUp",
            "rate": "400 Gb/sec (4X NDR)",
            "link_layer": "InfiniBand",
        }
    ]
    status = to_ib_status(fact)
    p = status.devices[1].ports[0]
    assert (p.state, p.physical_state, p.rate_gbps) == ("Down", "Polling", 10)
    assert root == tmp_path


def test_sysfs_reader_without_infiniband(tmp_path: Path) -> None:
    fact = read_infiniband_sysfs(tmp_path)
    assert fact["class_dir_present"] is False and fact["devices"] == [] and fact["dev_infiniband"] is None


@settings(max_examples=100, deadline=None)
@given(
    fact=st.recursive(
        st.none() | st.integers() | st.text(max_size=10),
        lambda c: (
            st.lists(c, max_size=4)
            | st.dictionaries(
                st.sampled_from(["devices", "ports", "name", "port", "state", "rate", "x"]), c, max_size=4
            )
        ),
        max_leaves=20,
    )
)
def test_sysfs_fact_normalizer_never_raises(fact: Any) -> None:
    json.dumps(to_ib_status(fact).to_json())


# --- ports: Active / Down / Polling / mixed rates -------------------------------------------------------


def test_all_active_ports_pass(tmp_path: Path) -> None:
    make_ib_tree(tmp_path / "root", {f"mlx5_{i}": {"ports": {1: ACTIVE_400}} for i in range(4)})
    findings = run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED, modules=PEERMEM))
    (port,) = by_id(findings, "rdma.port.state")
    assert port.severity == Severity.OK and "All 4" in port.summary
    (inv,) = by_id(findings, "rdma.hca.inventory")
    assert inv.severity == Severity.INFO and len(inv.data["hcas"]) == 4
    assert inv.data["hcas"][0]["ports"][0]["rate_gbps"] == 400
    assert by_id(findings, "rdma.memlock")[0].severity == Severity.OK
    assert by_id(findings, "rdma.gpudirect.module")[0].severity == Severity.OK
    assert max(f.severity for f in findings) <= Severity.SKIP  # lspci-vvv.txt is not in this snapshot


def test_down_polling_port_fails_naming_device_and_port(tmp_path: Path) -> None:
    make_ib_tree(
        tmp_path / "root", {"mlx5_0": {"ports": {1: ACTIVE_400}}, "mlx5_1": {"ports": {1: DOWN_POLLING}}}
    )
    findings = run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED))
    (bad,) = by_id(findings, "rdma.port.state")
    assert bad.severity == Severity.FAIL
    assert "mlx5_1 port 1" in bad.summary and "Down / Polling" in bad.summary
    assert "cable" in bad.fix and bad.evidence[0].source == "/sys/class/infiniband/mlx5_1/ports/1"
    assert bad.data["used_by_nccl"] is True


def test_init_with_link_up_points_at_the_subnet_manager(tmp_path: Path) -> None:
    make_ib_tree(tmp_path / "root", {"mlx5_0": {"ports": {1: INIT_LINKUP}}})
    (bad,) = by_id(
        run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED)), "rdma.port.state"
    )
    assert bad.severity == Severity.FAIL and "Init / LinkUp" in bad.summary and "opensm" in bad.fix


def test_mixed_rate_warns_negotiated_lower(tmp_path: Path) -> None:
    make_ib_tree(
        tmp_path / "root",
        {
            "mlx5_0": {"ports": {1: ACTIVE_400}},
            "mlx5_1": {"ports": {1: ACTIVE_200}},
            "mlx5_2": {"ports": {1: ACTIVE_400}},
        },
    )
    findings = run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED))
    (rate,) = by_id(findings, "rdma.port.rate_mismatch")
    assert rate.severity == Severity.WARN and "mlx5_1 port 1 negotiated 200 of 400" in rate.summary
    assert rate.data == {"device": "mlx5_1", "port": 1, "rate_gbps": 200, "expected_gbps": 400.0}


def test_firmware_mismatch_same_model(tmp_path: Path) -> None:
    make_ib_tree(
        tmp_path / "root",
        {"mlx5_0": {"ports": {1: ACTIVE_400}}, "mlx5_1": {"ports": {1: ACTIVE_400}, "fw": "28.36.1010"}},
    )
    (fw,) = by_id(
        run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED)), "rdma.firmware.mismatch"
    )
    assert (
        fw.severity == Severity.WARN
        and "28.36.1010 on mlx5_1" in fw.summary
        and "28.39.1002 on mlx5_0" in fw.summary
    )


def test_missing_dev_infiniband_in_container(tmp_path: Path) -> None:
    make_ib_tree(tmp_path / "root", {"mlx5_0": {"ports": {1: ACTIVE_400}}}, uverbs=False)
    (f,) = by_id(
        run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED)), "rdma.uverbs.missing"
    )
    assert f.severity == Severity.WARN and "--device=/dev/infiniband" in f.fix


# --- NCCL settings --------------------------------------------------------------------------------------


def test_parse_nccl_ib_hca_syntax() -> None:
    f = parse_nccl_ib_hca("^=mlx5_0:1,mlx5_1")
    assert f is not None and f.exclude and f.exact and f.entries == (("mlx5_0", 1), ("mlx5_1", None))
    assert not f.selects("mlx5_0", 1) and f.selects("mlx5_0", 2) and f.selects("mlx5_10", 1)
    g = parse_nccl_ib_hca("mlx5_1:x,mlx5_1")
    assert g is not None and g.invalid == ("mlx5_1:x",) and g.selects("mlx5_10", 1)  # prefix match
    assert parse_nccl_ib_hca("") is None and parse_nccl_ib_hca(None) is None


def _two_hcas(
    tmp_path: Path, env: dict[str, str], second: tuple[str, str, str, str] = DOWN_POLLING
) -> list[Finding]:
    make_ib_tree(tmp_path / "root", {"mlx5_0": {"ports": {1: ACTIVE_400}}, "mlx5_1": {"ports": {1: second}}})
    return run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED, env=env))


def test_down_port_excluded_by_nccl_ib_hca_only_warns(tmp_path: Path) -> None:
    findings = _two_hcas(tmp_path, {"NCCL_IB_HCA": "=mlx5_0:1"})
    (port,) = by_id(findings, "rdma.port.state")
    assert port.severity == Severity.WARN and "not used by NCCL" in port.summary
    assert by_id(findings, "rdma.nccl_ib_hca.no_match")[0].severity == Severity.OK


def test_nccl_ib_hca_naming_nothing_fails(tmp_path: Path) -> None:
    findings = _two_hcas(tmp_path, {"NCCL_IB_HCA": "mlx5_0:2,mlx4_0"}, second=ACTIVE_400)
    (f,) = by_id(findings, "rdma.nccl_ib_hca.no_match")
    assert f.severity == Severity.FAIL
    assert "'mlx5_0:2': mlx5_0 has no port 2" in f.summary and "'mlx4_0' names no device" in f.summary


def test_nccl_ib_hca_exclusion_of_nothing_warns(tmp_path: Path) -> None:
    (f,) = by_id(
        _two_hcas(tmp_path, {"NCCL_IB_HCA": "^mlx5_7"}, second=ACTIVE_400), "rdma.nccl_ib_hca.no_match"
    )
    assert f.severity == Severity.WARN and "excludes nothing" in f.summary


def test_nccl_ib_hca_prefix_match_warns(tmp_path: Path) -> None:
    make_ib_tree(
        tmp_path / "root", {"mlx5_1": {"ports": {1: ACTIVE_400}}, "mlx5_10": {"ports": {1: ACTIVE_400}}}
    )
    findings = run_rdma(
        snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED, env={"NCCL_IB_HCA": "mlx5_1"})
    )
    (f,) = by_id(findings, "rdma.nccl_ib_hca.no_match")
    assert f.severity == Severity.WARN and "'mlx5_1' also selects mlx5_10" in f.summary and "==" in f.fix


def test_nccl_ib_disable_with_healthy_hcas_warns(tmp_path: Path) -> None:
    findings = _two_hcas(tmp_path, {"NCCL_IB_DISABLE": "1"})
    (f,) = by_id(findings, "rdma.nccl_ib_disable")
    assert f.severity == Severity.WARN and "TCP sockets" in f.summary
    # With IB disabled the down port is not used: a warning, not a failure.
    assert by_id(findings, "rdma.port.state")[0].severity == Severity.WARN


def test_roce_ports_mention_gid_index(tmp_path: Path) -> None:
    snap = snapshot_dir(
        tmp_path, ulimit=ULIMIT_UNLIMITED, env={"NCCL_IB_GID_INDEX": "3"}, files={"ibstat.txt": IBSTAT_ROCE}
    )
    (f,) = by_id(run_rdma(snap), "rdma.roce.gid_index")
    assert (
        f.severity == Severity.INFO
        and "NCCL_IB_GID_INDEX=3" in f.summary
        and "mlx5_0:1, mlx5_1:1" in f.summary
    )


# --- replays of real captured outputs -------------------------------------------------------------------


def test_replay_real_ibstat_down_polling_fails_via_cli(tmp_path: Path) -> None:
    snap = snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, files={"ibstat.txt": IBSTAT_DOWN})
    res = CliRunner().invoke(app, ["check", "--replay", str(snap), "--only", "rdma", "--json"])
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    (port,) = [f for f in report["findings"] if f["id"] == "rdma.port.state"]
    assert port["severity"] == "fail" and "mlx5_10 port 1" in port["summary"]
    assert port["evidence"][0]["source"] == "ibstat" and "Polling" in port["evidence"][0]["excerpt"]
    assert port["fix"]


def test_replay_lspci_srcvalid_plus_warns_about_acs(tmp_path: Path) -> None:
    snap = snapshot_dir(tmp_path, files={"lspci-vvv.txt": LSPCI_ACS_ON})
    (acs,) = by_id(run_rdma(snap), "rdma.pcie.acs")
    assert acs.severity == Severity.WARN and "17:00.0" in acs.summary
    assert "setpci -s 17:00.0 ECAP_ACS+0x6.w=0000" in acs.fix and "iommu=pt" in acs.fix
    assert acs.data["bridges"] == ["17:00.0"]


def test_replay_lspci_acs_off_is_ok(tmp_path: Path) -> None:
    for src in (LSPCI_ACS_OFF, LSPCI_GREP):
        sub = tmp_path / src.stem
        sub.mkdir()
        (acs,) = by_id(run_rdma(snapshot_dir(sub, files={"lspci-vvv.txt": src})), "rdma.pcie.acs")
        assert acs.severity == Severity.OK


def test_acs_only_counts_bridges_above_gpus_and_nics(tmp_path: Path) -> None:
    nic = "18:00.0 Infiniband controller: Mellanox Technologies MT2910 Family [ConnectX-7]\n"
    gpu_elsewhere = "0000:9a:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n"
    results = []
    for name, extra in (("above", nic), ("elsewhere", gpu_elsewhere)):
        sub = tmp_path / name
        sub.mkdir()
        (sub / "lspci.txt").write_text(LSPCI_ACS_ON.read_text() + extra)
        (acs,) = by_id(
            run_rdma(snapshot_dir(sub, files={"lspci-vvv.txt": sub / "lspci.txt"})), "rdma.pcie.acs"
        )
        results.append(acs)
    above, elsewhere = results
    assert above.severity == Severity.WARN
    assert elsewhere.severity == Severity.OK and "none of them above a GPU" in elsewhere.summary


def test_replay_memlock_64k_with_rdma_fails_with_exact_fix(tmp_path: Path) -> None:
    snap = snapshot_dir(tmp_path, files={"ibstat.txt": IBSTAT_8X, "ulimit-a.txt": ULIMIT_64K})
    (mem,) = by_id(run_rdma(snap), "rdma.memlock")
    assert mem.severity == Severity.FAIL and "64 KiB" in mem.summary and mem.data["memlock_bytes"] == 65536
    for exact in (
        "ulimit -l unlimited",
        "docker run --ulimit memlock=-1",
        "LimitMEMLOCK=infinity",
        "slurmd",
        "containerd",
    ):
        assert exact in mem.fix


def test_memlock_large_is_info_and_unread_is_skip(tmp_path: Path) -> None:
    snap = snapshot_dir(tmp_path, files={"ibstat.txt": IBSTAT_8X, "ulimit-a.txt": ULIMIT_5G})
    (mem,) = by_id(run_rdma(snap), "rdma.memlock")
    assert mem.severity == Severity.INFO and "4.9 GiB" in mem.summary
    (snap / "ulimit-a.txt").unlink()
    assert by_id(run_rdma(snap), "rdma.memlock")[0].severity == Severity.SKIP


def test_real_ibpanic_is_reported_and_other_ports_pass(tmp_path: Path) -> None:
    findings = run_rdma(snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, files={"ibstat.txt": IBSTAT_8X}))
    (err,) = by_id(findings, "rdma.tools.errors")
    assert err.severity == Severity.WARN and "mlx5_8" in err.summary
    assert by_id(findings, "rdma.port.state")[0].severity == Severity.OK


def test_gpudirect_module_missing_with_nvidia_driver_warns(tmp_path: Path) -> None:
    mods = "nvidia 54292480 63 - Live 0x0\nmlx5_ib 483328 0 - Live 0x0\n"
    snap = snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, modules=mods, files={"ibstat.txt": IBSTAT_8X})
    (gdr,) = by_id(run_rdma(snap), "rdma.gpudirect.module")
    assert gdr.severity == Severity.WARN and "modprobe nvidia_peermem" in gdr.fix
    (snap / "kernel-modules.json").unlink()
    (snap / "lsmod.txt").write_text(
        "Module                  Size  Used by\nnvidia_peermem         16384  0\n"
    )
    assert by_id(run_rdma(snap), "rdma.gpudirect.module")[0].severity == Severity.OK


# --- no RDMA at all -------------------------------------------------------------------------------------


def test_no_rdma_is_a_clean_skip(tmp_path: Path) -> None:
    snap = snapshot_dir(
        tmp_path,
        tmp_path / "empty-root",
        ulimit=ULIMIT_64K.read_text(),
        files={"lspci-vvv.txt": LSPCI_ACS_OFF},
    )
    findings = run_rdma(snap)
    (skip,) = by_id(findings, "rdma.devices.absent")
    assert skip.severity == Severity.SKIP and "TCP sockets" in skip.summary
    assert not by_id(findings, "rdma.memlock")  # memlock only matters with RDMA
    assert max(f.severity for f in findings) == Severity.SKIP


def test_adapter_without_rdma_device_warns(tmp_path: Path) -> None:
    lspci = tmp_path / "lspci.txt"
    lspci.write_text("3b:00.0 Infiniband controller: Mellanox Technologies MT28908 Family [ConnectX-6]\n")
    findings = run_rdma(snapshot_dir(tmp_path, tmp_path / "empty-root", files={"lspci-vvv.txt": lspci}))
    (f,) = by_id(findings, "rdma.adapter.no_rdma_device")
    assert f.severity == Severity.WARN and "3b:00.0" in f.summary and "mlx5_ib" in f.fix


def test_missing_and_timed_out_tools_fall_back_to_sysfs(tmp_path: Path) -> None:
    make_ib_tree(tmp_path, {"mlx5_0": {"ports": {1: ACTIVE_400}}})
    facts = RdmaFacts(
        sysfs=read_infiniband_sysfs(tmp_path),
        ibstat=CommandResult(argv=("ibstat",), timed_out=True, returncode=None),
        ibv_devinfo=CommandResult(
            argv=("ibv_devinfo", "-v"), found=False, error="ibv_devinfo: command not found"
        ),
        ibstatus=CommandResult(argv=("ibstatus",), returncode=255, stdout="Fatal error:  No devices\n"),
        ulimit=CommandResult(argv=("bash",), returncode=0, stdout=ULIMIT_UNLIMITED),
    )
    findings = check_rdma(facts)
    assert by_id(findings, "rdma.port.state")[0].severity == Severity.OK
    # The tool that disagrees with sysfs is still shown.
    assert "Fatal error" in by_id(findings, "rdma.tools.errors")[0].summary
    nothing = check_rdma(RdmaFacts(ibstat=CommandResult(argv=("ibstat",), found=False)))
    assert [(f.id, f.severity) for f in nothing if f.id == "rdma.devices.absent"] == [
        ("rdma.devices.absent", Severity.SKIP)
    ]
    assert "not checked" in by_id(nothing, "rdma.devices.absent")[0].summary


def test_every_problem_finding_has_evidence_and_fix(tmp_path: Path) -> None:
    make_ib_tree(
        tmp_path / "root",
        {"mlx5_0": {"ports": {1: ACTIVE_400}}, "mlx5_1": {"ports": {1: DOWN_POLLING}, "fw": "28.35.1012"}},
        uverbs=False,
    )
    snap = snapshot_dir(
        tmp_path,
        tmp_path / "root",
        ulimit=ULIMIT_64K.read_text(),
        env={"NCCL_IB_HCA": "mlx5_9", "NCCL_IB_DISABLE": "1"},
        modules="nvidia 1 0 - Live 0x0\n",
        files={"lspci-vvv.txt": LSPCI_ACS_ON},
    )
    findings = run_rdma(snap)
    assert {f.id for f in findings if f.severity >= Severity.WARN} >= {
        "rdma.port.state",
        "rdma.firmware.mismatch",
        "rdma.uverbs.missing",
        "rdma.nccl_ib_hca.no_match",
        "rdma.gpudirect.module",
        "rdma.memlock",
        "rdma.pcie.acs",
    }
    for f in findings:
        assert f.id and f.title and f.summary and f.evidence
        if f.severity >= Severity.WARN:
            assert f.fix


# --- summary for other areas, snapshots -----------------------------------------------------------------


def test_summary_merges_sysfs_first_then_tools(tmp_path: Path) -> None:
    make_ib_tree(tmp_path, {"mlx5_10": {"ports": {1: ACTIVE_400}, "fw": "28.40.1000"}})
    facts = RdmaFacts(
        sysfs=read_infiniband_sysfs(tmp_path),
        ibstat=CommandResult(argv=("ibstat",), returncode=0, stdout=IBSTAT_DOWN.read_text()),
    )
    (hca,) = summarize_rdma(facts).hcas
    assert (hca.firmware, hca.ports[0].state, hca.ports[0].source, hca.pci_slot) == (
        "28.40.1000",
        "Active",
        "sysfs",
        "0000:3b:00.0",
    )
    assert Hca.from_dict(json.loads(json.dumps(hca.to_dict()))) == hca
    only_tool = summarize_rdma(
        RdmaFacts(ibstat=CommandResult(argv=("ibstat",), returncode=0, stdout=IBSTAT_DOWN.read_text()))
    )
    assert only_tool.hcas[0].model == "MT4129" and only_tool.sources == ["ibstat"]


def test_collect_rdma_summary_from_a_snapshot(tmp_path: Path) -> None:
    snap = snapshot_dir(tmp_path, files={"ibstat.txt": IBSTAT_8X})
    summary = collect_rdma_summary(ReplaySources(snap))
    assert [h.model for h in summary.hcas] == ["MT4124"] * 8 and len(summary.active_ports) == 8


def test_snapshot_then_replay_gives_the_same_findings(tmp_path: Path) -> None:
    rec = RecordingSources()
    live = run_checks(rec, [AREA], timeout_s=30)
    rec.write(tmp_path / "snap")
    assert (tmp_path / "snap" / "infiniband-sysfs.json").is_file()
    assert (tmp_path / "snap" / "kernel-modules.json").is_file()
    replay = run_checks(ReplaySources(tmp_path / "snap"), [AREA], timeout_s=30)
    assert [(f.id, f.severity, f.summary) for f in live.findings] == [
        (f.id, f.severity, f.summary) for f in replay.findings
    ]


@pytest.mark.parametrize("name", ["ibstat", "ibv_devinfo", "ibstatus", "lspci-vvv", "lsmod"])
def test_commands_are_declared(name: str) -> None:
    from ddpdoctor.edge.runner import all_commands

    assert name in all_commands()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "devices",
                    "ports",
                    "name",
                    "port",
                    "state",
                    "dev_infiniband",
                    "gdr_markers",
                    "proc_modules",
                    "sys_module",
                    "numa_node",
                    "board_id",
                ]
            ),
            c,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=100, deadline=None)
@given(sysfs=JSON, modules=JSON, hca=st.text(max_size=20))
def test_judge_never_raises_on_odd_snapshot_facts(sysfs: Any, modules: Any, hca: str) -> None:
    # A snapshot directory can be edited by hand: whatever its JSON holds, the judge returns findings.
    facts = RdmaFacts(
        sysfs=sysfs,
        modules=modules,
        ibstat=CommandResult(argv=("ibstat",), returncode=0, stdout=IBSTAT_DOWN.read_text()),
        env={"NCCL_IB_HCA": hca},
    )
    for f in check_rdma(facts):
        json.dumps(f.to_dict())


def test_mlx5_core_without_mlx5_ib_warns(tmp_path: Path) -> None:
    mods = "mlx5_core 2064384 0 - Live 0x0\nmlxfw 36864 1 mlx5_core, Live 0x0\n"
    findings = run_rdma(snapshot_dir(tmp_path, tmp_path / "empty-root", modules=mods))
    (f,) = by_id(findings, "rdma.adapter.no_rdma_device")
    assert f.severity == Severity.WARN and "mlx5_ib is not" in f.summary
    assert by_id(findings, "rdma.devices.absent")[0].severity == Severity.SKIP


@settings(max_examples=200, deadline=None)
@given(value=st.text(max_size=40))
def test_nccl_ib_hca_parser_never_raises(value: str) -> None:
    f = parse_nccl_ib_hca(value)
    if f is not None:
        assert isinstance(f.selects("mlx5_0", 1), bool)


# --- second pass: inconclusive readings never read as a pass; fixes name the port ------------------------


def test_port_whose_state_no_source_could_read_is_an_error_not_a_fail(tmp_path: Path) -> None:
    root = make_ib_tree(tmp_path / "root", {"mlx5_0": {"ports": {1: ACTIVE_400}}})
    (root / "sys/class/infiniband/mlx5_0/ports/1/state").unlink()  # unreadable: read as null
    (port,) = by_id(run_rdma(snapshot_dir(tmp_path, root, ulimit=ULIMIT_UNLIMITED)), "rdma.port.state")
    assert port.severity == Severity.ERROR and "mlx5_0 port 1: state could not be read" in port.summary
    assert "ibstat mlx5_0 1" in port.fix


def test_unreadable_tool_output_without_sysfs_is_not_a_clean_no_rdma_skip(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("<html>502 Bad Gateway</html>\n")
    (f,) = by_id(run_rdma(snapshot_dir(tmp_path, files={"ibstat.txt": garbage})), "rdma.devices.absent")
    assert f.severity == Severity.ERROR and "ibstat" in f.summary and f.fix
    # The real "no devices" outputs stay a clean skip.
    sub = tmp_path / "none"
    sub.mkdir()
    files = {"ibstatus.txt": RDMA / "ibstatus__debian-infiniband-diags-44.0-no-devices.txt"}
    (f,) = by_id(run_rdma(snapshot_dir(sub, files=files)), "rdma.devices.absent")
    assert f.severity == Severity.SKIP


def test_lspci_without_capabilities_skips_instead_of_passing(tmp_path: Path) -> None:
    plain = tmp_path / "lspci.txt"
    plain.write_text(
        "00:00.0 Host bridge: Intel Corporation 440FX - 82441FX PMC [Natoma] (rev 02)\n"
        "00:01.0 ISA bridge: Intel Corporation 82371SB PIIX3 ISA [Natoma/Triton II]\n"
    )
    findings = run_rdma(snapshot_dir(tmp_path, files={"lspci-vvv.txt": plain}))
    assert not by_id(findings, "rdma.pcie.acs")
    (skip,) = by_id(findings, "rdma.pcie.unreadable")
    assert skip.severity == Severity.SKIP and "without any capability lines" in skip.summary


def test_rate_mismatch_fix_and_memlock_evidence_name_what_was_seen(tmp_path: Path) -> None:
    root = make_ib_tree(
        tmp_path / "root", {"mlx5_0": {"ports": {1: ACTIVE_400}}, "mlx5_1": {"ports": {1: ACTIVE_200}}}
    )
    findings = run_rdma(snapshot_dir(tmp_path, root, ulimit=ULIMIT_64K.read_text()))
    (rate,) = by_id(findings, "rdma.port.rate_mismatch")
    assert "mlx5_1 port 1 negotiated 200 of 400" in rate.summary and "mlxlink -d mlx5_1 -p 1" in rate.fix
    assert [e.source for e in rate.evidence] == [
        "/sys/class/infiniband/mlx5_0/ports/1",
        "/sys/class/infiniband/mlx5_1/ports/1",
    ]
    (mem,) = by_id(findings, "rdma.memlock")
    assert mem.evidence[0].excerpt == "max locked memory       (kbytes, -l) 64"


def test_wrong_typed_sysfs_fact_is_conformed_not_crashed_on(tmp_path: Path) -> None:
    fact = {
        "class_dir_present": "yes",
        "devices": [
            {"name": ["mlx5_0"], "ports": [{"port": 1, "state": "4: ACTIVE"}]},  # unusable name: dropped
            {"name": "mlx5_1", "numa_node": "1", "ports": {"1": {}}},  # ports not a list: none
            {"name": "mlx5_2", "hca_type": 4129, "ports": [{"port": "1"}, {"port": 1, "state": 4}, 7]},
            "mlx5_3",
        ],
        "dev_infiniband": "uverbs0",
        "gdr_markers": [None, "sys/module/nvidia_peermem/version"],
    }
    loaded = load_infiniband_sysfs(fact)
    assert [d["name"] for d in loaded["devices"]] == ["mlx5_1", "mlx5_2"]
    assert loaded["devices"][0]["numa_node"] is None and loaded["devices"][0]["ports"] == []
    assert loaded["devices"][1]["hca_type"] is None and [
        p["port"] for p in loaded["devices"][1]["ports"]
    ] == [1]
    assert loaded["devices"][1]["ports"][0]["state"] is None
    assert loaded["dev_infiniband"] is None and loaded["gdr_markers"] == ["sys/module/nvidia_peermem/version"]
    assert load_infiniband_sysfs(["not", "an", "object"]) is None
    (snap := tmp_path / "snap").mkdir()
    (snap / "infiniband-sysfs.json").write_text(json.dumps(fact))
    ids = {f.id: f for f in run_rdma(snap)}
    assert ids["rdma.hca.inventory"].data["hcas"][0]["name"] == "mlx5_1"
    assert ids["rdma.port.state"].severity == Severity.ERROR  # mlx5_2 port 1: state unreadable


def test_tool_error_fix_names_the_vanished_device(tmp_path: Path) -> None:
    (err,) = by_id(run_rdma(snapshot_dir(tmp_path, files={"ibstat.txt": IBSTAT_8X})), "rdma.tools.errors")
    assert "mlx5_8" in err.summary and "`ibstat mlx5_8`" in err.fix


def test_switched_off_ports_next_to_active_rails_are_info(tmp_path: Path) -> None:
    # Real 8x H100 node: eight active NDR IB ports, one active RoCE port, three RoCE ports Down/Disabled.
    ibstat = RDMA / "ibstat__h100-8x-cx7-ndr400-ib-4x-cx6dx-roce-3-down-disabled-tabs.txt"
    findings = run_rdma(snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, files={"ibstat.txt": ibstat}))
    ports = by_id(findings, "rdma.port.state")
    assert sorted(f.data["device"] for f in ports) == ["mlx5_2", "mlx5_7", "mlx5_8"]
    assert {f.severity for f in ports} == {Severity.INFO}
    assert all("switched off, NCCL skips it" in f.summary for f in ports)


H100_8X_Q = (
    Path(__file__).parent
    / "fixtures"
    / "gpu"
    / ("nvidia-smi-q__8xh100-sxm-565.57.01-recovery-action-none-gpu0-7-replays.txt")
)


def _two_rails_down(text: str) -> str:
    """The real 12-CA H100 ibstat with two of its eight ConnectX-7 ports taken down in memory, as on the
    node of issue #15 (6 ConnectX-7 Active, one Polling, one Disabled; the ConnectX-6 Dx as they were)."""
    blocks = text.split("CA '")
    for i, block in enumerate(blocks):
        if block.startswith("mlx5_10'"):
            blocks[i] = block.replace("State: Active", "State: Down").replace("LinkUp", "Polling")
        if block.startswith("mlx5_11'"):
            blocks[i] = block.replace("State: Active", "State: Down").replace("LinkUp", "Disabled")
    return "CA '".join(blocks)


def test_disabled_rail_on_a_node_short_of_rails_is_a_warning(tmp_path: Path) -> None:
    real = RDMA / "ibstat__h100-8x-cx7-ndr400-ib-4x-cx6dx-roce-3-down-disabled-tabs.txt"
    (tmp_path / "ibstat.txt").write_text(_two_rails_down(real.read_text()))
    files = {"ibstat.txt": tmp_path / "ibstat.txt", "nvidia-smi-q.txt": H100_8X_Q}
    findings = run_rdma(snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, files=files))
    ports = {f.data["device"]: f for f in by_id(findings, "rdma.port.state")}
    assert ports["mlx5_10"].severity == Severity.FAIL  # Polling: no link
    rail = ports["mlx5_11"]
    assert rail.severity == Severity.WARN
    assert "this node has 6 rails of 8 for 8 GPUs" in rail.summary and "MT4129" in rail.summary
    # The ConnectX-6 Dx RoCE ports switched off are evident spares: another model than the rails.
    for spare in ("mlx5_2", "mlx5_7", "mlx5_8"):
        assert (
            ports[spare].severity == Severity.INFO and "switched off, NCCL skips it" in ports[spare].summary
        )


def test_disabled_rail_is_a_warning_when_the_gpu_count_is_unknown(tmp_path: Path) -> None:
    # Same ports (6 ConnectX-7 Active, 1 Polling, 1 Disabled), but the node's GPU count is unknown (no GPU
    # readings, e.g. an ibstat pasted alone): nothing shows the Disabled one is a spare, so it is a rail.
    real = RDMA / "ibstat__h100-8x-cx7-ndr400-ib-4x-cx6dx-roce-3-down-disabled-tabs.txt"
    (tmp_path / "ibstat.txt").write_text(_two_rails_down(real.read_text()))
    findings = run_rdma(
        snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, files={"ibstat.txt": tmp_path / "ibstat.txt"})
    )
    ports = {f.data["device"]: f for f in by_id(findings, "rdma.port.state")}
    rail = ports["mlx5_11"]
    assert rail.severity == Severity.WARN and "it is a rail" in rail.summary
    assert "6 active rails of 8 (GPU count unknown)" in rail.summary
    # The ConnectX-6 Dx RoCE ports switched off are another model than the rails: spares either way.
    assert all(ports[s].severity == Severity.INFO for s in ("mlx5_2", "mlx5_7", "mlx5_8"))


def test_down_port_next_to_active_ports_of_its_layer_is_a_missing_rail(tmp_path: Path) -> None:
    make_ib_tree(
        tmp_path / "root", {"mlx5_0": {"ports": {1: ACTIVE_400}}, "mlx5_1": {"ports": {1: DOWN_POLLING}}}
    )
    (port,) = by_id(
        run_rdma(snapshot_dir(tmp_path, tmp_path / "root", ulimit=ULIMIT_UNLIMITED)), "rdma.port.state"
    )
    assert port.severity == Severity.FAIL and "one rail fewer than its peers" in port.summary


def test_virtual_functions_of_different_adapter_families_are_no_firmware_mismatch(tmp_path: Path) -> None:
    # Real node: nine VFs all reporting MT4126, one on 22.x firmware (ConnectX-6 Dx), eight on 28.x (ConnectX-7).
    ibstat = RDMA / "ibstat__a100-9x-mt4126-vf-roce-fw22-plus-8-ib-fw28-tabs.txt"
    findings = run_rdma(snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, files={"ibstat.txt": ibstat}))
    assert not [f for f in findings if f.id == "rdma.firmware.mismatch"]


def test_missing_tools_replay_as_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node without lspci/ibstat/lsmod: the replay must name the missing tools as the live run did,
    not report their files as absent from the snapshot (seen on a GPU node without pciutils)."""
    from ddpdoctor.edge.runner import Command

    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no tool is found: every one is missing
    rec = RecordingSources()
    live = run_checks(rec, [AREA], timeout_s=30)
    missing = Command("no-such-tool", ("ddpdoctor-no-such-tool", "-v"), "a tool that is not installed")
    assert not rec.run(missing).found
    rec.write(tmp_path / "snap")
    assert not (tmp_path / "snap" / "lspci-vvv.txt").exists()
    assert (tmp_path / "snap" / "lspci-vvv.meta.json").is_file()
    replay_sources = ReplaySources(tmp_path / "snap")
    replayed = replay_sources.run(missing)
    assert (replayed.found, replayed.captured, replayed.error) == (
        False,
        True,
        "ddpdoctor-no-such-tool: command not found",
    )
    replay = run_checks(replay_sources, [AREA], timeout_s=30)
    assert [(f.id, f.severity, f.summary) for f in live.findings] == [
        (f.id, f.severity, f.summary) for f in replay.findings
    ]
    assert not any("not in snapshot" in f.summary for f in replay.findings)


def test_disabled_rail_is_info_when_the_rails_left_cover_the_gpus(tmp_path: Path) -> None:
    # One ConnectX-7 of eight switched off, on a node with four GPUs (the real 4x A100 nvidia-smi -q):
    # seven rails still give every GPU its own, so the port is a spare here.
    real = RDMA / "ibstat__h100-8x-cx7-ndr400-ib-4x-cx6dx-roce-3-down-disabled-tabs.txt"
    blocks = real.read_text().split("CA '")
    blocks = [
        b.replace("State: Active", "State: Down").replace("LinkUp", "Disabled")
        if b.startswith("mlx5_11'")
        else b
        for b in blocks
    ]
    (tmp_path / "ibstat.txt").write_text("CA '".join(blocks))
    a100 = (
        Path(__file__).parent
        / "fixtures"
        / "gpu"
        / ("nvidia-smi-q__4xa100-sxm4-555.42.02-gpu1-remap-pending-353-dram-correctable.txt")
    )
    files = {"ibstat.txt": tmp_path / "ibstat.txt", "nvidia-smi-q.txt": a100}
    ports = {
        f.data["device"]: f
        for f in by_id(
            run_rdma(snapshot_dir(tmp_path, ulimit=ULIMIT_UNLIMITED, files=files)), "rdma.port.state"
        )
    }
    assert ports["mlx5_11"].severity == Severity.INFO
    # The same port on the 8-GPU node is a missing rail: 7 of 8.
    (tmp_path / "snap8").mkdir()
    files["nvidia-smi-q.txt"] = H100_8X_Q
    ports = {
        f.data["device"]: f
        for f in by_id(
            run_rdma(snapshot_dir(tmp_path / "snap8", ulimit=ULIMIT_UNLIMITED, files=files)),
            "rdma.port.state",
        )
    }
    assert (
        ports["mlx5_11"].severity == Severity.WARN and "7 rails of 8 for 8 GPUs" in ports["mlx5_11"].summary
    )
