"""RDMA's PCIe side: ACS on bridges and the link width/speed of GPUs and NICs, from `lspci -vvv`.

Split from rdma.py (the ports and NCCL's IB settings); the rdma area runs these checks and shares the
PCI devices it finds (GPUs counted as rails, NICs without RDMA)."""

from __future__ import annotations

from typing import Iterable, Optional

from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.edge.runner import CommandResult, define_command
from ddpdoctor.parsers.lspci import PciDevice, parse_lspci

LSPCI_VVV = define_command(
    "lspci-vvv",
    ("lspci", "-vvv"),
    "PCI devices in detail: ACS control on bridges, link speed/width of GPUs and NICs (capabilities need root)",
    timeout_s=20,
)

PCIE_UNREADABLE = define(
    "rdma.pcie.unreadable",
    "PCIe fabric not readable",
    "lspci is missing or could not read PCIe capabilities, so the ACS and link-width checks did not run.",
    "Install pciutils and run `ddpdoctor check` as root (lspci shows capabilities to root only), or run "
    "`sudo lspci -vvv | grep ACSCtl` by hand.",
)
ACS = define(
    "rdma.pcie.acs",
    "PCIe ACS",
    "ACS (Access Control Services) with SrcValid+/ReqRedir+ on PCIe bridges redirects peer-to-peer traffic "
    "through the CPU root complex: GPU-to-GPU and GPUDirect RDMA get slow, and NCCL can hang. It is the "
    "classic cause of NCCL P2P hangs on PCIe machines.",
    "Disable ACS on the bridges (as root, at every boot): `setpci -s BDF ECAP_ACS+0x6.w=0000` for each "
    "bridge listed, or disable ACS in the BIOS; with the IOMMU on, boot with `iommu=pt`. In a VM, ACS is "
    "what isolates passthrough devices: ask the provider instead.",
)
PCIE_LINK = define(
    "rdma.pcie.link_downgraded",
    "PCIe link of GPUs and NICs",
    "A GPU or NIC whose PCIe link trained below its capability (fewer lanes, lower speed) caps host "
    "transfers and GPUDirect RDMA bandwidth.",
    "Reseat the card or riser, check the slot's BIOS setting (lane bifurcation, Gen speed), and check "
    "`dmesg | grep -i 'limited by'`. An idle GPU lowers its link speed to save power; check it under load "
    "with `nvidia-smi -q -d PCIE`.",
)



def _describe(d: PciDevice) -> str:
    return f"{d.slot} {d.description[:50]}".strip() if d.slot else "(slot not shown)"


def check_pcie(result: Optional[CommandResult]) -> tuple[list[Finding], list[PciDevice]]:
    """ACS on bridges above GPUs/NICs and downgraded GPU/NIC links, from `lspci -vvv`."""
    if result is None or not result.found or not result.stdout.strip():
        why = (result.describe_failure() if result else "") or "no output"
        return [
            PCIE_UNREADABLE.finding(
                Severity.SKIP,
                f"ACS and PCIe link checks skipped: {why}",
                evidence=[Evidence("lspci -vvv", why)],
            )
        ], []
    devices = parse_lspci(result.stdout)
    findings: list[Finding] = []
    acs_known = [d for d in devices if d.acs_control is not None]
    acs_on = [d for d in acs_known if d.acs_redirecting and (d.kind == "bridge" or d.slot is None)]
    targets = [d for d in devices if d.kind in ("gpu", "nic")]
    partial = not any(d.slot and d.kind != "bridge" for d in devices)
    if targets:
        relevant = [b for b in acs_on if b.slot is None or any(b.is_above(t) for t in targets)]
    else:
        relevant = acs_on if partial else []
    unreadable = [d for d in devices if not d.capabilities_readable]
    if relevant:
        slots = [d.slot or "?" for d in relevant]
        setpci = "; ".join(f"setpci -s {s} ECAP_ACS+0x6.w=0000" for s in slots[:4] if s != "?")
        findings.append(
            ACS.finding(
                Severity.WARN,
                f"ACS is enabled on {len(relevant)} PCIe bridge(s)"
                + (
                    f" ({', '.join(slots[:6])}{' ...' if len(slots) > 6 else ''})"
                    if any(s != "?" for s in slots)
                    else ""
                )
                + ": GPU peer-to-peer and GPUDirect RDMA traffic goes through the root complex (slow, NCCL hangs)",
                evidence=[
                    Evidence(
                        "lspci -vvv",
                        f"{_describe(d)}: ACSCtl "
                        + " ".join(f"{k}{'+' if v else '-'}" for k, v in (d.acs_control or {}).items()),
                    )
                    for d in relevant[:6]
                ],
                fix=ACS.fix + (f" Here: `{setpci}`." if setpci else ""),
                data={"bridges": slots, "controls_on": {d.slot or "?": d.acs_redirecting for d in relevant}},
            )
        )
    elif acs_known:
        findings.append(
            ACS.finding(
                Severity.OK,
                f"ACS is on for {len(acs_on)} PCIe port(s), none of them above a GPU or RDMA NIC"
                if acs_on
                else f"ACS redirection is off on the {len(acs_known)} PCIe port(s) that report ACS controls",
                evidence=[
                    Evidence(
                        "lspci -vvv",
                        f"{len(acs_known)} ACSCtl lines, {len(acs_on)} with SrcValid+/ReqRedir+/CmpltRedir+",
                    )
                ],
            )
        )
    elif unreadable:
        findings.append(
            PCIE_UNREADABLE.finding(
                Severity.SKIP,
                f"lspci could not read PCIe capabilities ({len(unreadable)} device(s) '<access denied>'): run as root for the ACS and link checks",
                evidence=[Evidence("lspci -vvv", "Capabilities: <access denied>")],
            )
        )
    elif "Capabilities:" not in result.stdout:
        # Plain `lspci` or `lspci -v` output lists devices without capabilities: no verdict either way. (A VM
        # whose devices show capabilities but no PCIe port has nothing to judge: that is the ok below.)
        findings.append(
            PCIE_UNREADABLE.finding(
                Severity.SKIP,
                f"lspci listed {len(devices)} PCI device(s) without any capability lines (not the output of "
                "`sudo lspci -vvv`?): ACS and link checks skipped",
                evidence=[Evidence("lspci -vvv", f"{len(devices)} devices, no 'Capabilities:' lines")],
            )
        )
    else:
        findings.append(
            ACS.finding(
                Severity.OK,
                f"No PCIe port reports ACS controls ({len(devices)} PCI device(s) listed)",
                evidence=[Evidence("lspci -vvv", f"{len(devices)} devices, no ACSCtl lines")],
            )
        )
    findings += _check_links(targets)
    return findings, devices


def _link_text(d: PciDevice) -> str:
    cap, sta = d.link_capability, d.link_status
    parts = []
    if sta and sta.width is not None:
        parts.append(f"x{sta.width}" + (f" of x{cap.width}" if cap and cap.width is not None else ""))
    if sta and sta.speed_gts is not None:
        parts.append(
            f"{sta.speed_gts:g}"
            + (f" of {cap.speed_gts:g}" if cap and cap.speed_gts is not None else "")
            + " GT/s"
        )
    return ", ".join(parts)


def _links_finding(severity: Severity, lead: str, devices: list[PciDevice]) -> Finding:
    return PCIE_LINK.finding(
        severity,
        lead + "; ".join(f"{_describe(d)} ({_link_text(d)})" for d in devices[:6]),
        evidence=[Evidence("lspci -vvv", f"{d.slot} LnkSta: {_link_text(d)}") for d in devices[:6]],
        data={"devices": [d.slot for d in devices]},
    )


def _check_links(targets: Iterable[PciDevice]) -> list[Finding]:
    warn, idle, fine = [], [], 0
    for d in targets:
        sta = d.link_status
        if sta is None:
            continue
        if sta.width_downgraded or (d.kind == "nic" and sta.speed_downgraded):
            warn.append(d)
        elif sta.speed_downgraded:
            idle.append(d)  # GPUs drop link speed when idle: only a hint
        elif sta.width_downgraded is False and sta.speed_downgraded is False:
            fine += 1  # both compared with LnkCap; a link without LnkCap proves nothing
    findings = []
    if warn:
        findings.append(_links_finding(Severity.WARN, "PCIe link below capability: ", warn))
    if idle:
        findings.append(
            _links_finding(
                Severity.INFO,
                "GPU PCIe link speed below capability (normal for an idle GPU; check under load with "
                "`nvidia-smi -q -d PCIE`): ",
                idle,
            )
        )
    if not warn and not idle and fine:
        findings.append(
            PCIE_LINK.finding(
                Severity.OK,
                f"{fine} GPU/NIC PCIe link(s) at full width and speed",
                evidence=[Evidence("lspci -vvv", "LnkSta (ok)")],
            )
        )
    return findings


