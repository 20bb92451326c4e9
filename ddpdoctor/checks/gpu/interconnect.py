"""Judges of how GPUs talk to each other and to the network: NVLink links and their error counters, the
NVSwitch fabric, the `nvidia-smi topo -m` topology, peer-to-peer access, and the closest NIC per GPU."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ddpdoctor.checks.gpu.collect import TOPO_M, TOPO_P2P, GpuCollected
from ddpdoctor.checks.gpu.per_gpu import PerGpuCheck, Verdict, gpu_fix, gpu_label
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.parsers.nvidia_smi_topo import ANSI, closest_nics, link_rank

NVLINK_INACTIVE = define(
    "gpu.nvlink.inactive",
    "NVLink links down",
    "An NVLink link that is down lowers GPU-to-GPU bandwidth; NCCL may fall back to PCIe for that pair.",
    "See the links with `nvidia-smi nvlink -s -i N`; reset the GPUs or reboot; on NVSwitch systems restart "
    "nvidia-fabricmanager; reseat/RMA if it persists.",
)
NVLINK_ERRORS = define(
    "gpu.nvlink.errors",
    "NVLink errors",
    "Replay, recovery and CRC errors on an NVLink link mean a noisy link; recoveries stall traffic and "
    "growing counts precede Xid 74.",
    "Watch `nvidia-smi nvlink -e -i N`; reset the GPUs; RMA if the counters keep rising.",
)
FABRIC = define(
    "gpu.fabric",
    "NVSwitch fabric",
    "On NVSwitch systems (HGX/DGX A100, H100) CUDA cannot start until nvidia-fabricmanager has set up the "
    "fabric: 'CUDA error 802: system not yet initialized'.",
    "Start and enable the fabric manager: `sudo systemctl enable --now nvidia-fabricmanager` (its version "
    "must equal the driver's).",
)
TOPOLOGY = define(
    "gpu.topology",
    "GPU topology",
    "How GPU pairs connect (NVLink, or PCIe through a switch, a host bridge, or across CPU sockets): "
    "pairs over PHB/NODE/SYS get a fraction of NVLink bandwidth.",
    "Place communicating ranks on GPUs that share NVLink or a PCIe switch; see `nvidia-smi topo -m`.",
)
NIC_AFFINITY = define(
    "gpu.nic_affinity",
    "Closest NIC per GPU",
    "Each GPU should send inter-node traffic through the NIC closest to it (same PCIe switch); NCCL "
    "usually finds it, but containers and VMs can hide the topology.",
    "If NCCL picks badly, set NCCL_IB_HCA to the listed NICs and bind ranks to the GPU's CPU affinity.",
)
P2P = define(
    "gpu.p2p",
    "GPU peer-to-peer",
    "Without P2P, NCCL copies GPU-to-GPU traffic through host memory: intra-node collectives get several "
    "times slower. Consumer GPUs (GNS) and PCIe ACS/IOMMU settings (CNS/TNS) disable it.",
    "On datacenter GPUs disable PCIe ACS / IOMMU redirection (BIOS, `setpci`), keep `iommu=pt`; consumer "
    "GPUs cannot do P2P: expect PCIe-through-host bandwidth (NCCL_P2P_DISABLE is then implied).",
)
# `nvidia-smi topo -p2p` legend, for NVML readings (which come without one).
P2P_LEGEND = {
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}


def _link_order(name: str) -> tuple[int, str]:
    """Links sort by number ('2' before '10'); a name that is not a number sorts after them."""
    return (int(name), "") if name.isascii() and name.isdigit() else (1 << 30, name)


def _links(g: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    return (g.get("nvlink") or {}).get("links") or {}


def _inactive_finding(
    g: Mapping[str, Any], links: Mapping[str, Mapping[str, Any]], src: str
) -> Optional[Finding]:
    inactive = sorted((k for k, x in links.items() if x.get("active") is False), key=_link_order)
    if not inactive:
        return None
    active = [k for k, x in links.items() if x.get("active")]
    if active:
        text = f"NVLink link(s) {', '.join(inactive)} inactive ({len(active)} of {len(links)} up)"
        excerpt = ", ".join(f"Link {k}: <inactive>" for k in inactive)
    else:
        # Every link down: on an NVLink board that is a fault; on a PCIe card NVML lists no links at all.
        text, excerpt = f"all {len(inactive)} NVLink links are inactive", f"{len(inactive)} links <inactive>"
    return NVLINK_INACTIVE.finding(
        Severity.FAIL,
        f"{gpu_label(g)}: {text}",
        evidence=[Evidence(src, excerpt)],
        fix=gpu_fix(NVLINK_INACTIVE.fix, g),
        data={"gpu": g.get("index"), "inactive": inactive, "active": len(active)},
    )


def _errors_finding(
    g: Mapping[str, Any], links: Mapping[str, Mapping[str, Any]], src: str
) -> Optional[Finding]:
    noisy = {}
    for k, x in links.items():
        errs = {name: n for name, n in (x.get("errors") or {}).items() if n}
        if errs:
            noisy[k] = errs
    if not noisy:
        return None
    recovery = any("recovery" in e for e in noisy.values())
    text = "; ".join(
        f"link {k}: " + ", ".join(f"{n} {name}" for name, n in e.items())
        for k, e in sorted(noisy.items(), key=lambda kv: _link_order(kv[0]))
    )
    return NVLINK_ERRORS.finding(
        Severity.WARN,
        f"{gpu_label(g)}: NVLink errors: {text}"[:300] + (" (recoveries stall traffic)" if recovery else ""),
        evidence=[Evidence(src, text)],
        fix=gpu_fix(NVLINK_ERRORS.fix, g),
        data={"gpu": g.get("index"), "errors": noisy},
    )


def judge_nvlink(c: GpuCollected) -> list[Finding]:
    """Inactive NVLink links and non-zero replay/recovery/CRC counters, per GPU."""
    findings: list[Finding] = []
    src = c.nvlink_source or "nvidia-smi nvlink"
    with_links = [g for g in c.gpus if _links(g)]
    # Links only `nvidia-smi nvlink -e` listed (no -s) have no known state: they prove nothing either way.
    with_state = [g for g in with_links if any(x.get("active") is not None for x in _links(g).values())]
    for g in with_links:
        for finding in (_inactive_finding(g, _links(g), src), _errors_finding(g, _links(g), src)):
            if finding is not None:
                findings.append(finding)
    if with_state and not any(f.id == NVLINK_INACTIVE.id for f in findings):
        findings.append(
            NVLINK_INACTIVE.finding(
                Severity.OK, f"All NVLink links active on {len(with_state)} GPU(s)", evidence=[Evidence(src)]
            )
        )
    # Counters NVML or nvidia-smi could not read are None: only read counters make a clean bill.
    counters_read = any(
        n is not None
        for g in with_links
        for x in _links(g).values()
        for n in (x.get("errors") or {}).values()
    )
    if counters_read and not any(f.id == NVLINK_ERRORS.id for f in findings):
        findings.append(
            NVLINK_ERRORS.finding(Severity.OK, "No NVLink error counts", evidence=[Evidence(src)])
        )
    return findings


def judge_fabric(g: Mapping[str, Any]) -> Optional[Verdict]:
    f = g.get("fabric") or {}
    state, status = f.get("state"), f.get("status")
    if state is None:
        return None
    if state.lower() != "completed":
        return Verdict(
            Severity.FAIL,
            f"NVSwitch fabric state {state!r}: CUDA fails with error 802 until it completes",
            dict(f),
        )
    if status and status.lower() != "success":
        return Verdict(Severity.FAIL, f"NVSwitch fabric registration failed: {status}", dict(f))
    return Verdict(Severity.OK, "", dict(f))


FABRIC_CHECK = PerGpuCheck(
    FABRIC,
    judge_fabric,
    "nvmlDeviceGetGpuFabricInfo",
    "Fabric",
    "NVSwitch fabric completed on {n} GPU(s)",
    lambda g: (
        f"Fabric State {(g.get('fabric') or {}).get('state')}, Status {(g.get('fabric') or {}).get('status')}"
    ),
)


def matrix_excerpt(text: str, max_lines: int = 40) -> str:
    """The matrix rows of `nvidia-smi topo -m` as printed (escape codes removed, legend left out)."""
    lines = ANSI.sub("", text).strip("\n").splitlines()
    rows: list[str] = []
    for line in lines:
        if not line.strip():
            break  # the legend follows the first blank line
        rows.append(line.rstrip())
    if len(rows) > max_lines:
        rows = rows[:max_lines] + [f"... ({len(rows) - max_lines} more rows)"]
    return "\n".join(rows)


def judge_topology(c: GpuCollected) -> list[Finding]:
    """The GPU-pair link kinds (slow pairs named), and the closest NIC of each GPU.

    The matrix itself travels as data (`data["topology"]`); the renderer draws it, once."""
    findings: list[Finding] = []
    topo = c.topo_parsed
    if topo and topo.get("gpus"):
        gpus = list(topo["gpus"])
        matrix = topo.get("matrix") or {}
        kinds: dict[str, list[str]] = {}
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                code = (matrix.get(a) or {}).get(b) or (matrix.get(b) or {}).get(a)
                if code:
                    kinds.setdefault("NV" if code.startswith("NV") else code, []).append(f"{a}-{b}")
        slow = {k: v for k, v in kinds.items() if link_rank(k) >= link_rank("PHB") and k != "NV"}
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items(), key=lambda kv: link_rank(kv[0])))
        text = f"{len(gpus)} GPU(s); pairs: {counts or 'none'}"
        if slow:
            worst = max(slow, key=link_rank)
            text += f"; {sum(len(v) for v in slow.values())} pair(s) over {'/'.join(sorted(slow, key=link_rank))} (e.g. {slow[worst][0]})"
        findings.append(
            TOPOLOGY.finding(
                Severity.INFO,
                text,
                evidence=[Evidence(TOPO_M.display, matrix_excerpt(c.topo.stdout if c.topo else ""))],
                data={"pairs": kinds, "slow_pairs": slow, "topology": dict(topo)},
            )
        )
        nearest = closest_nics(dict(topo))
        if nearest:
            parts = [f"{gpu}->{'/'.join(v['names'])} ({v['link']})" for gpu, v in nearest.items()]
            findings.append(
                NIC_AFFINITY.finding(
                    Severity.INFO,
                    "; ".join(parts)[:300],
                    evidence=[Evidence(TOPO_M.display, "\n".join(parts))],
                    data={"closest": nearest, "affinity": dict(topo.get("affinity") or {})},
                )
            )
    elif c.topo is not None and len(c.gpus) > 1 and c.topo.found:
        findings.append(
            TOPOLOGY.finding(
                Severity.INFO,
                f"Topology not available: {c.topo.describe_failure() or 'no matrix in the output'}",
                evidence=[Evidence(TOPO_M.display, c.topo.excerpt())],
            )
        )
    return findings + judge_p2p(c)


def judge_p2p(c: GpuCollected) -> list[Finding]:
    """GPU pairs without peer-to-peer access (NVML, or `nvidia-smi topo -p2p r`)."""
    p2p = c.p2p
    if not p2p or not p2p.get("gpus"):
        return []
    names = list(p2p["gpus"])
    matrix = p2p.get("matrix") or {}
    pairs = [(a, b, (matrix.get(a) or {}).get(b)) for i, a in enumerate(names) for b in names[i + 1 :]]
    read = [(a, b, code) for a, b, code in pairs if code]  # a lost GPU's pairs have no status
    bad = [(a, b, code) for a, b, code in read if code not in ("OK", "X")]
    legend = dict(p2p.get("legend") or {}) or P2P_LEGEND
    src = c.p2p_source or TOPO_P2P.display
    if bad:
        shown = "; ".join(f"{a}-{b} {code}" for a, b, code in bad[:6])
        return [
            P2P.finding(
                Severity.WARN,
                f"{len(bad)} GPU pair(s) without peer-to-peer access: {shown}"
                + (" ..." if len(bad) > 6 else ""),
                evidence=[
                    Evidence(
                        src,
                        "\n".join(f"{a}-{b}: {code} ({legend.get(code, code)})" for a, b, code in bad[:20]),
                    )
                ],
                data={"pairs": [{"a": a, "b": b, "status": code} for a, b, code in bad]},
            )
        ]
    if read:
        what = (
            "all GPU pairs" if len(read) == len(pairs) else f"the {len(read)} of {len(pairs)} GPU pairs read"
        )
        return [P2P.finding(Severity.OK, f"Peer-to-peer access OK between {what}", evidence=[Evidence(src)])]
    return []
