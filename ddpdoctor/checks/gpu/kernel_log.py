"""Judges of the kernel log: NVIDIA Xid events, GPUs that fell off the bus, and GPUs whose PCIe bandwidth
the kernel found limited by a slower link upstream."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ddpdoctor.checks.gpu.collect import DMESG, GpuCollected
from ddpdoctor.checks.gpu.per_gpu import gpu_fix, gpu_label
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.parsers.dmesg import XID_TABLE, normalize_bus_id, parse_dmesg

XID = define(
    "gpu.xid",
    "Xid events",
    "Xid events are the NVIDIA driver's error reports in the kernel log. Some are application faults "
    "(13, 31, 43, 45); others mean failing hardware (48, 63, 64, 74, 79, 92, 94, 95, 119...).",
    "Act on the meaning listed with each code; hardware Xids mean draining the node and resetting the GPU.",
)
FALLEN_OFF_BUS = define(
    "gpu.fallen_off_bus",
    "GPU fell off the bus",
    "The kernel lost the GPU's PCIe link ('GPU has fallen off the bus', Xid 79): it is unusable until a "
    "reboot.",
    "Drain the node; check power delivery, thermals, the riser/slot and SBIOS; reboot; RMA if it recurs.",
)
DMESG_UNREADABLE = define(
    "gpu.dmesg",
    "Kernel log",
    "The kernel log holds Xid events and PCIe link warnings; reading it needs root when "
    "kernel.dmesg_restrict=1.",
    "Run `sudo dmesg | grep -E 'NVRM|Xid|limited by'` by hand, or run ddpdoctor as root.",
)
PCIE_LIMITED = define(
    "gpu.pcie.limited",
    "PCIe bandwidth limited (kernel)",
    "The kernel found at boot that a device's PCIe bandwidth is limited by a slower link upstream (a Gen4 "
    "switch in front of a Gen5 GPU, a narrow slot).",
    "Review the platform: slot, switch and riser generations and widths; reseat; update BIOS/firmware.",
)


def _unreadable(result: Any) -> Optional[Finding]:
    """A skip saying why the kernel log could not be read (never a clean bill)."""
    if result.found and not result.timed_out and (result.returncode in (0, None) or result.stdout.strip()):
        return None
    why = result.describe_failure() or "no output"
    if "not permitted" in (result.stderr + why).lower() or "permission" in (result.stderr + why).lower():
        why = f"not permitted (kernel.dmesg_restrict=1?): {why}"
    return DMESG_UNREADABLE.finding(
        Severity.SKIP,
        f"Kernel log not readable, Xid events not checked: {why}"[:300],
        evidence=[Evidence(DMESG.display, (result.stderr.strip() or why)[:400])],
    )


def _table_severity(code: Optional[int]) -> Severity:
    info = XID_TABLE.get(code) if code is not None else None
    return Severity.parse(info.severity) if info else Severity.WARN


def judge_xid_events(code: int, events: list[Mapping[str, Any]]) -> tuple[Severity, str]:
    """How bad a run of one Xid code on one GPU is, and what to add to the summary.

    Xid 154 reports a change of the GPU's recovery action: the latest line says where it stands now (a
    change back to "none" means the GPU recovered). An Xid 43/45 that names the Xid it follows ("caused
    by previous Xid 149") is as bad as that cause, which may have rotated out of the log.
    """
    if code == 154:
        action = events[-1].get("recovery_action")
        if action == "none":
            return Severity.INFO, " (latest: recovery action back to none)"
        return _table_severity(code), f" (latest: recovery action {action})" if action else ""
    severity = _table_severity(code)
    causes = sorted({e["caused_by"] for e in events if isinstance(e.get("caused_by"), int)})
    for cause in causes:
        severity = max(severity, _table_severity(cause))
    return severity, f" (caused by Xid {', '.join(map(str, causes))})" if causes else ""


def judge_dmesg(c: GpuCollected) -> tuple[list[Finding], list[Mapping[str, Any]]]:
    """Xid and fallen-off-the-bus findings, and the PCIe "limited by" entries for judge_pcie_limited."""
    result = c.dmesg
    if result is None:
        return [], []
    unreadable = _unreadable(result)
    if unreadable is not None:
        return [unreadable], []
    parsed = parse_dmesg(result.stdout)
    findings: list[Finding] = []
    by_bus = {normalize_bus_id(g.get("bus_id")): g for g in c.gpus}
    groups: dict[tuple[int, Optional[str]], list[Mapping[str, Any]]] = {}
    for x in parsed["xids"]:
        groups.setdefault((x["code"], x["bus_id"]), []).append(x)
    for (code, bus), events in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        info = XID_TABLE.get(code)
        gpu = by_bus.get(bus)
        who = gpu_label(gpu) if gpu else f"GPU at {bus}"
        meaning = info.meaning if info else "unlisted Xid (see NVIDIA's Xid table)"
        severity, detail = judge_xid_events(code, events)
        findings.append(
            XID.finding(
                severity,
                f"{who}: Xid {code} x{len(events)}: {meaning}{detail}"[:300],
                evidence=[Evidence(DMESG.display, "\n".join(str(e["line"]) for e in events[-3:]))],
                fix=(gpu_fix(info.action, gpu) if gpu else info.action) if info else None,
                data={
                    "code": code,
                    "bus_id": bus,
                    "count": len(events),
                    "cause": info.cause if info else None,
                },
            )
        )
    for f in parsed["fallen_off_bus"]:
        gpu = by_bus.get(f["bus_id"])
        who = gpu_label(gpu) if gpu else f"GPU at {f['bus_id'] or 'unknown bus'}"
        findings.append(
            FALLEN_OFF_BUS.finding(
                Severity.FAIL,
                f"{who} fell off the bus (kernel log)",
                evidence=[Evidence(DMESG.display, str(f["line"]))],
                data={"bus_id": f["bus_id"], "timestamp": f["timestamp"]},
            )
        )
    if not findings:
        findings.append(
            XID.finding(Severity.OK, "No Xid events in the kernel log", evidence=[Evidence(DMESG.display)])
        )
    return findings, parsed["pcie_limited"]


def judge_pcie_limited(c: GpuCollected, limited: list[Mapping[str, Any]]) -> list[Finding]:
    """The kernel's "limited by ... link" lines for the GPUs (NICs and drives are other areas' business)."""
    findings = []
    gpu_buses = {normalize_bus_id(g.get("bus_id")): g for g in c.gpus}
    for entry in limited:
        gpu = gpu_buses.get(normalize_bus_id(entry.get("device")))
        if gpu is None and c.gpus:
            continue  # another device (a NIC, an NVMe drive): the network/storage areas judge those
        who = gpu_label(gpu) if gpu else f"PCI device {entry.get('device')}"
        findings.append(
            PCIE_LIMITED.finding(
                Severity.WARN,
                f"{who}: {entry.get('available_gbps')} Gb/s available, limited by a {entry.get('limited_speed_gts')} GT/s "
                f"x{entry.get('limited_width')} link at {entry.get('limited_at')} (capable of {entry.get('capable_gbps')} Gb/s)",
                evidence=[Evidence(DMESG.display, str(entry.get("line") or entry))],
                data=dict(entry),
            )
        )
    return findings
