"""RDMA: InfiniBand / RoCE ports and NCCL's IB settings; the area also runs rdma_gpudirect.py (GPUDirect
RDMA, memlock) and rdma_pcie.py (ACS, PCIe links). ~900 lines kept as one module: every check here judges
the same RdmaSummary of the node's HCAs and ports.

Multi-node jobs that crawl are very often a port that is Down, a rate that negotiated lower than its
peers, NCCL silently falling back to TCP sockets, or GPUDirect RDMA missing. Sysfs is preferred (it is
what the tools read); ibstat, ibv_devinfo and ibstatus fill what it lacks (or stand in for it in a
snapshot built from pasted outputs). Everything read is recorded in snapshots.

Reusable by other areas: `RdmaSummary` / `Hca` / `HcaPort` (model, firmware, rate, link layer per port),
built by `summarize_rdma(facts)` or gathered with `collect_rdma_summary(sources)`; the same summary is
in the data of the `rdma.hca.inventory` finding (`Hca.from_dict` reads it back from a JSON report).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpdoctor.checks.rdma_gpudirect import (
    KERNEL_MODULES_SHAPE,
    LSMOD,
    MODULES_FACT,
    check_gpudirect,
    check_memlock,
    loaded_modules,
    read_kernel_modules,
)
from ddpdoctor.checks.rdma_pcie import (
    LSPCI_VVV,
    check_pcie,
)
from ddpdoctor.checks.system import ULIMIT_A
from ddpdoctor.core.engine import Area, Context
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.edge.json_shape import conform_fact
from ddpdoctor.edge.runner import CommandResult, define_command
from ddpdoctor.edge.sources import Sources, fact_or_none
from ddpdoctor.edge.sysfs_ib import IB_SYSFS_FACT, load_infiniband_sysfs, read_infiniband_sysfs, to_ib_status
from ddpdoctor.parsers import to_jsonable
from ddpdoctor.parsers.ibstat import IbStatus, Number, parse_ibstat
from ddpdoctor.parsers.ibstatus import parse_ibstatus
from ddpdoctor.parsers.ibv_devinfo import parse_board_ids, parse_ibv_devinfo
from ddpdoctor.parsers.lspci import PciDevice

IBSTAT = define_command(
    "ibstat", ("ibstat",), "RDMA devices: CA type, firmware, port state, physical state, rate, link layer"
)
IBV_DEVINFO = define_command(
    "ibv_devinfo",
    ("ibv_devinfo", "-v"),
    "RDMA devices as libibverbs (and so NCCL) sees them: firmware, board id, port state, width x speed",
)
IBSTATUS = define_command(
    "ibstatus", ("ibstatus",), "Port state, physical state, rate and link layer per RDMA port"
)
SOCKETS = "multi-node NCCL traffic will use TCP sockets"

NO_RDMA = define(
    "rdma.devices.absent",
    "RDMA devices",
    "Without an InfiniBand/RoCE device NCCL uses TCP sockets between nodes: it works, at a fraction of "
    "the bandwidth.",
    "If the node has InfiniBand/RoCE adapters: load the drivers (`modprobe mlx5_ib`, or install "
    "MOFED/rdma-core), and in containers pass `--device=/dev/infiniband` and add the IPC_LOCK capability.",
)
ADAPTER_WITHOUT_RDMA = define(
    "rdma.adapter.no_rdma_device",
    "RDMA adapter without RDMA device",
    "An InfiniBand/RoCE-capable adapter is on the PCI bus but no RDMA device exists: its RDMA driver "
    "(mlx5_ib, ib_core) is not loaded, or this container cannot see /sys/class/infiniband. NCCL will use "
    "TCP sockets.",
    "Load the RDMA driver (`modprobe mlx5_ib`; install MOFED/DOCA-OFED or rdma-core), and run containers "
    "with `--device=/dev/infiniband --cap-add=IPC_LOCK` (Kubernetes: the RDMA device plugin).",
)
INVENTORY = define(
    "rdma.hca.inventory",
    "RDMA adapters",
    "The RDMA adapters (HCAs) of this node, with model, firmware, rate and link layer per port: nodes of "
    "one job should match.",
)
PORT_STATE = define(
    "rdma.port.state",
    "RDMA port state",
    "A port that is not Active/LinkUp carries no traffic. NCCL skips it, so ranks on this node get fewer "
    "NICs than their peers (slow), or none (TCP sockets); a listed HCA that is down makes NCCL fail. A "
    "port switched off (physical state Disabled) with NCCL_IB_HCA unset is only reported, unless it is one "
    "of the node's rails (same model and firmware as the active ports) and the node is not known to keep an "
    "active rail for every GPU (fewer active rails than GPUs, or the GPU count unknown): then a warning.",
    "Polling: no link; reseat or replace the cable/transceiver and check the switch port. LinkUp but "
    "Down/Init/Armed: the subnet manager has not configured the port; check opensm (`sminfo`). Disabled: "
    "enable the port. RoCE: bring the Ethernet interface up (`ip link set DEV up`).",
)
PORT_RATE = define(
    "rdma.port.rate_mismatch",
    "RDMA port rate",
    "A port that negotiated a lower rate than the other ports of the same adapter model drags every "
    "collective down to its speed (rings are as fast as their slowest link).",
    "Check the cable/transceiver and the switch port of the slow port (`sudo mlxlink -d DEV -p PORT` shows "
    "the negotiated speed and errors); replace a bad cable, or reseat it.",
)
FIRMWARE = define(
    "rdma.firmware.mismatch",
    "RDMA firmware",
    "Adapters of the same model running different firmware behave differently (and some versions have "
    "known RDMA bugs): mixed versions usually mean an interrupted or partial update.",
    "Update every adapter of the model to one firmware version (`sudo mlxfwmanager --query`, then "
    "`sudo mlxfwmanager -u`), then reboot or reset the adapters (`sudo mlxfwreset -d DEV reset`).",
)
ROCE = define(
    "rdma.roce.gid_index",
    "RoCE ports",
    "On RoCE (RDMA over Ethernet) NCCL must pick the right GID: RoCE v2 over the routed IPv4/IPv6 "
    "address. A wrong NCCL_IB_GID_INDEX, or nodes picking different ones, ends in hangs or timeouts.",
    "Find the RoCE v2 GID index of each port with `show_gids` and set `NCCL_IB_GID_INDEX` to it on every "
    "node if NCCL does not pick it by itself (recent NCCL does: see NCCL_IB_ROCE_VERSION_NUM).",
)
NCCL_IB_HCA = define(
    "rdma.nccl_ib_hca.no_match",
    "NCCL_IB_HCA",
    "NCCL_IB_HCA selects the adapters NCCL uses (`mlx5_0:1,mlx5_1:1`; `^` excludes, `=` asks for exact "
    "names, otherwise names are prefixes). An entry naming no device or port selects nothing: with all "
    "entries wrong NCCL falls back to TCP sockets.",
    "Set NCCL_IB_HCA to devices and ports that exist here (`ibstat -l`, `ibv_devinfo -l`), e.g. "
    "`NCCL_IB_HCA==mlx5_0:1,mlx5_1:1`, or unset it to use every active port.",
)
NCCL_IB_DISABLED = define(
    "rdma.nccl_ib_disable",
    "NCCL_IB_DISABLE",
    "NCCL_IB_DISABLE=1 (or NCCL_NET=Socket) makes NCCL ignore the RDMA adapters: all inter-node traffic "
    "goes over TCP sockets, many times slower.",
    "Unset NCCL_IB_DISABLE (and NCCL_NET) unless you mean to test sockets.",
)
TOOL_ERRORS = define(
    "rdma.tools.errors",
    "RDMA tool errors",
    "An IB tool failed on a device while listing them (e.g. `ibpanic: stat of IB device 'mlx5_8' failed`): "
    "a device that vanished or whose driver is resetting.",
    "Check `dmesg` for mlx5/PCIe errors on that device and `ibstat DEV`; a device that keeps failing needs a "
    "driver reload or a node drain.",
)
UVERBS = define(
    "rdma.uverbs.missing",
    "RDMA device nodes",
    "RDMA devices exist in sysfs but /dev/infiniband (uverbs nodes) is missing: processes here cannot open "
    "them, so NCCL falls back to TCP sockets. Typical in a container started without the devices.",
    "Run the container with `--device=/dev/infiniband` (or `--privileged`) and `--cap-add=IPC_LOCK`; in "
    "Kubernetes use the RDMA shared device plugin.",
)
# ---------------------------------------------------------------------------------------------------------
# The typed summary other areas reuse


@dataclass(frozen=True)
class HcaPort:
    port: int
    state: Optional[str] = None  # Active, Down, Init, Armed (ibstat's words)
    physical_state: Optional[str] = None  # LinkUp, Polling, Disabled, ...; None when no source had it
    rate_gbps: Optional[Number] = None
    link_layer: Optional[str] = None  # InfiniBand or Ethernet (RoCE)
    source: str = ""  # where the state was read: "sysfs", "ibstat", "ibv_devinfo", "ibstatus"

    @property
    def active(self) -> bool:
        return self.state == "Active" and self.physical_state in (None, "LinkUp")

    @property
    def is_roce(self) -> bool:
        return self.link_layer == "Ethernet"

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)


@dataclass(frozen=True)
class Hca:
    name: str
    model: Optional[str] = None  # CA type / hca_type, e.g. MT4129 (ConnectX-7)
    firmware: Optional[str] = None
    board_id: Optional[str] = None
    numa_node: Optional[int] = None
    pci_slot: Optional[str] = None
    ports: tuple[HcaPort, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hca:
        """Read back `to_dict()` (e.g. from the data of rdma.hca.inventory in a JSON report)."""
        ports = tuple(
            HcaPort(
                port=int(p["port"]),
                state=p.get("state"),
                physical_state=p.get("physical_state"),
                rate_gbps=p.get("rate_gbps"),
                link_layer=p.get("link_layer"),
                source=p.get("source") or "",
            )
            for p in data.get("ports") or []
        )
        return cls(
            name=str(data["name"]),
            model=data.get("model"),
            firmware=data.get("firmware"),
            board_id=data.get("board_id"),
            numa_node=data.get("numa_node"),
            pci_slot=data.get("pci_slot"),
            ports=ports,
        )


@dataclass
class RdmaSummary:
    hcas: list[Hca] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # which sources listed devices
    errors: list[tuple[str, str]] = field(default_factory=list)  # (tool, error line)

    @property
    def ports(self) -> list[tuple[Hca, HcaPort]]:
        return [(h, p) for h in self.hcas for p in h.ports]

    @property
    def active_ports(self) -> list[tuple[Hca, HcaPort]]:
        return [(h, p) for h, p in self.ports if p.active]

    def to_dict(self) -> dict[str, Any]:
        return {
            "hcas": [h.to_dict() for h in self.hcas],
            "sources": list(self.sources),
            "errors": [{"tool": t, "line": line} for t, line in self.errors],
        }


# ---------------------------------------------------------------------------------------------------------
# Collect (the I/O edge)


@dataclass
class RdmaFacts:
    sysfs: Optional[Mapping[str, Any]] = None
    ibstat: Optional[CommandResult] = None
    ibv_devinfo: Optional[CommandResult] = None
    ibstatus: Optional[CommandResult] = None
    lspci: Optional[CommandResult] = None
    modules: Optional[Mapping[str, Any]] = None
    lsmod: Optional[CommandResult] = None
    ulimit: Optional[CommandResult] = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_count: Optional[int] = None  # GPUs of the node (NVML or nvidia-smi -q); None when unknown

    def __post_init__(self) -> None:
        # Facts may come from a hand-edited snapshot: conformed once, here, for every judge and caller.
        self.sysfs = load_infiniband_sysfs(self.sysfs)
        self.modules = conform_fact(self.modules, KERNEL_MODULES_SHAPE)


def collect_rdma(ctx: Context) -> RdmaFacts:
    """The rdma area's collect: devices (sysfs and tools), lspci, kernel modules, memlock, NCCL settings."""
    sources = ctx.sources
    facts = RdmaFacts(
        sysfs=fact_or_none(sources, IB_SYSFS_FACT, read_infiniband_sysfs),
        ibstat=sources.run(IBSTAT),
        ibv_devinfo=sources.run(IBV_DEVINFO),
        ibstatus=sources.run(IBSTATUS),
        lspci=sources.run(LSPCI_VVV),
        modules=fact_or_none(sources, MODULES_FACT, read_kernel_modules),
        ulimit=sources.run(ULIMIT_A),
        # A hand-written env.json may hold numbers or nulls: NCCL reads strings.
        env={k: str(v) for k, v in ctx.env.items() if k.startswith("NCCL_") and v is not None},
    )
    if not (facts.modules and (facts.modules["proc_modules"] or facts.modules["sys_module"])):
        facts.lsmod = sources.run(LSMOD)
    if (facts.sysfs and facts.sysfs.get("devices")) or (facts.ibstat is not None and facts.ibstat.ok):
        # How many rails the node needs: one per GPU (read once per Sources, shared with the gpu area).
        from ddpdoctor.checks.gpu.collect import read_gpu_facts

        facts.gpu_count = read_gpu_facts(sources).count or None
    return facts


def collect_rdma_summary(sources: Sources) -> RdmaSummary:
    """The HCA summary of this node (or snapshot): sysfs first, ibstat/ibv_devinfo/ibstatus for the rest."""
    return summarize_rdma(
        RdmaFacts(
            sysfs=fact_or_none(sources, IB_SYSFS_FACT, read_infiniband_sysfs),
            ibstat=sources.run(IBSTAT),
            ibv_devinfo=sources.run(IBV_DEVINFO),
            ibstatus=sources.run(IBSTATUS),
        )
    )


# ---------------------------------------------------------------------------------------------------------
# Judge (pure)


def _tool_text(result: Optional[CommandResult]) -> str:
    if result is None or not result.found:
        return ""
    # ibstat's ibpanic and ibv_devinfo's errors go to stderr: parse both.
    return result.stdout + ("\n" + result.stderr if result.stderr else "")


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


# The IB tools in the order their readings are trusted (after sysfs): RdmaFacts attribute and parser.
TOOL_PARSERS: tuple[tuple[str, Callable[[str], IbStatus]], ...] = (
    ("ibstat", parse_ibstat),
    ("ibv_devinfo", parse_ibv_devinfo),
    ("ibstatus", parse_ibstatus),
)


def parse_tools(facts: RdmaFacts) -> list[tuple[str, IbStatus]]:
    """What each IB tool reported, by tool name (empty for a tool that did not run)."""
    return [(tool, parse(_tool_text(getattr(facts, tool)))) for tool, parse in TOOL_PARSERS]


def summarize_rdma(facts: RdmaFacts) -> RdmaSummary:
    """Merge what sysfs and the tools said into one summary; for each field the first source that has it
    wins, in the order sysfs, ibstat, ibv_devinfo, ibstatus."""
    parsed: list[tuple[str, IbStatus]] = []
    if facts.sysfs is not None:
        parsed.append(("sysfs", to_ib_status(facts.sysfs)))
    parsed += parse_tools(facts)
    boards = parse_board_ids(_tool_text(facts.ibv_devinfo))
    sys_devices = {d["name"]: d for d in (facts.sysfs or {}).get("devices", [])}

    summary = RdmaSummary()
    names: list[str] = []
    for source, status in parsed:
        summary.errors.extend((source, line) for line in status.errors)
        if status.devices:
            summary.sources.append(source)
        for d in status.devices:
            if d.name not in names:
                names.append(d.name)
    for name in names:
        devs = [(src, d) for src, st in parsed for d in st.devices if d.name == name]
        port_numbers = sorted({p.port for _, d in devs for p in d.ports})
        ports = []
        for number in port_numbers:
            found = [(src, p) for src, d in devs for p in d.ports if p.port == number]
            state_src = next((src for src, p in found if p.state is not None), found[0][0])
            ports.append(
                HcaPort(
                    port=number,
                    state=_first(*(p.state for _, p in found)),
                    physical_state=_first(*(p.physical_state for _, p in found)),
                    rate_gbps=_first(*(p.rate_gbps for _, p in found)),
                    link_layer=_first(*(p.link_layer for _, p in found)),
                    source=state_src,
                )
            )
        raw = sys_devices.get(name) or {}
        summary.hcas.append(
            Hca(
                name=name,
                model=_first(*(d.type for _, d in devs)),
                firmware=_first(*(d.firmware for _, d in devs)),
                board_id=_first(raw.get("board_id"), boards.get(name)),
                numa_node=raw.get("numa_node"),
                pci_slot=raw.get("pci_slot"),
                ports=tuple(ports),
            )
        )
    return summary


@dataclass(frozen=True)
class HcaFilter:
    """NCCL_IB_HCA parsed: `[^][=]dev[:port],dev[:port],...`."""

    raw: str
    exclude: bool = False
    exact: bool = False
    entries: tuple[tuple[str, Optional[int]], ...] = ()
    invalid: tuple[str, ...] = ()  # entries whose port is not a number

    def entry_matches(self, entry: tuple[str, Optional[int]], device: str, port: Optional[int]) -> bool:
        name, want_port = entry
        named = device == name if self.exact else device.startswith(name)
        return named and (want_port is None or port is None or want_port == port)

    def selects(self, device: str, port: int) -> bool:
        """Whether NCCL would use this device port under this filter."""
        hit = any(self.entry_matches(e, device, port) for e in self.entries)
        return not hit if self.exclude else hit


def parse_nccl_ib_hca(value: Optional[str]) -> Optional[HcaFilter]:
    """`mlx5_0:1,mlx5_1`, `^mlx5_2`, `=mlx5_1:1`, `^=mlx5_3` -> HcaFilter; None when unset or empty."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries: list[tuple[str, Optional[int]]] = []
    invalid: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, port = item.partition(":")
        if sep and not port.strip().isdigit():
            invalid.append(item)
            continue
        entries.append((name.strip(), int(port) if sep else None))
    return HcaFilter(raw=value, exclude=exclude, exact=exact, entries=tuple(entries), invalid=tuple(invalid))


def _ib_disabled(env: Mapping[str, str]) -> Optional[str]:
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return "NCCL_IB_DISABLE=1"
    if env.get("NCCL_NET", "").strip().lower() == "socket":
        return f"NCCL_NET={env['NCCL_NET']}"
    return None


def _rate(value: Optional[Number]) -> str:
    return "?" if value is None else f"{value:g}"


def _port_text(p: HcaPort) -> str:
    return f"State: {p.state or '?'}, Physical state: {p.physical_state or '?'}, Rate: {_rate(p.rate_gbps)}, Link layer: {p.link_layer or '?'}"


SOURCE_DISPLAY = {
    "sysfs": "/sys/class/infiniband",
    "ibstat": "ibstat",
    "ibv_devinfo": "ibv_devinfo -v",
    "ibstatus": "ibstatus",
}


def _source_label(source: str, hca: Hca, port: Optional[HcaPort] = None) -> str:
    if source == "sysfs":
        return f"/sys/class/infiniband/{hca.name}" + (f"/ports/{port.port}" if port else "")
    return SOURCE_DISPLAY.get(source, source)


def _tool_evidence(facts: RdmaFacts) -> list[Evidence]:
    out = []
    for result in (facts.ibstat, facts.ibv_devinfo, facts.ibstatus):
        if result is None:
            continue
        why = result.describe_failure()
        out.append(Evidence(result.display, result.excerpt(6) or why or "(no output)"))
    return out


def check_no_rdma(facts: RdmaFacts, pci: Sequence[PciDevice]) -> list[Finding]:
    """No RDMA device was found: a skip saying traffic will use sockets, unless that cannot be told."""
    sysfs = facts.sysfs
    evidence = []
    if sysfs is not None:
        where = sysfs.get("class_dir") or "/sys/class/infiniband"
        state = "has no devices" if sysfs.get("class_dir_present") else "does not exist"
        evidence.append(Evidence(str(where), f"{where} {state}"))
    evidence += _tool_evidence(facts)
    nothing_read = sysfs is None and all(
        r is None or not r.found for r in (facts.ibstat, facts.ibv_devinfo, facts.ibstatus)
    )
    # Without sysfs the tools are the only witnesses: output that is neither a device list nor an error
    # message ("No IB devices found") proves nothing, and must not read as "no RDMA here".
    unreadable = [
        tool
        for tool, status in parse_tools(facts)
        if _tool_text(getattr(facts, tool)).strip() and not status.devices and not status.errors
    ]
    severity = Severity.SKIP
    if nothing_read:
        summary = f"RDMA not checked: no sysfs reading and no ibstat/ibv_devinfo/ibstatus output; {SOCKETS} if it has none"
    elif sysfs is None and unreadable:
        severity = Severity.ERROR
        summary = (
            f"Could not tell whether this node has RDMA devices: no sysfs reading, and the output of "
            f"{', '.join(unreadable)} lists no device and no error"
        )
    else:
        summary = f"No RDMA (InfiniBand/RoCE) devices: {SOCKETS}"
    fix = "Run `ibstat` and `ls /sys/class/infiniband` by hand." if severity == Severity.ERROR else None
    findings = [NO_RDMA.finding(severity, summary, evidence=evidence, fix=fix)]
    adapters = [d for d in pci if d.kind == "nic"]
    if adapters:
        listed = ", ".join(f"{d.slot} {d.description[:60]}" for d in adapters[:4])
        findings.append(
            ADAPTER_WITHOUT_RDMA.finding(
                Severity.WARN,
                f"{len(adapters)} InfiniBand/RoCE-capable adapter(s) on the PCI bus ({listed}) but no RDMA device: {SOCKETS}",
                evidence=[
                    Evidence(
                        "lspci -vvv",
                        "\n".join(f"{d.slot} {d.class_name}: {d.description}" for d in adapters[:8]),
                    )
                ],
                data={"adapters": [d.slot for d in adapters]},
            )
        )
    else:
        names, where = loaded_modules(facts)
        if names is not None and "mlx5_core" in names and "mlx5_ib" not in names:
            findings.append(
                ADAPTER_WITHOUT_RDMA.finding(
                    Severity.WARN,
                    f"mlx5_core (the ConnectX Ethernet driver) is loaded but mlx5_ib is not: no RDMA device, {SOCKETS}",
                    evidence=[
                        Evidence(
                            where,
                            "mlx5_core loaded; mlx5_ib, ib_core: "
                            + ("ib_core loaded" if "ib_core" in names else "not loaded"),
                        )
                    ],
                    data={"modules": sorted(n for n in names if n.startswith(("mlx5", "ib_")))},
                )
            )
    return findings


def _group_text(summary: RdmaSummary) -> str:
    groups: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for h in summary.hcas:
        for p in h.ports or (HcaPort(port=0),):
            key = (h.model or "?", h.firmware or "?", p.state or "?", _rate(p.rate_gbps), p.link_layer or "?")
            groups[key].append(f"{h.name}:{p.port}" if len(h.ports) > 1 else h.name)
    parts = []
    for (model, fw, state, rate, layer), names in groups.items():
        shown = ", ".join(names[:6]) + (f" (+{len(names) - 6})" if len(names) > 6 else "")
        parts.append(f"{shown}: {model} fw {fw}, {state}, {rate} Gb/s {layer}")
    return "; ".join(parts)


def check_inventory(summary: RdmaSummary) -> Finding:
    n_ports, n_active = len(summary.ports), len(summary.active_ports)
    return INVENTORY.finding(
        Severity.INFO,
        f"{len(summary.hcas)} RDMA device(s), {n_active} of {n_ports} port(s) Active ({_group_text(summary)})",
        evidence=[
            Evidence(SOURCE_DISPLAY.get(s, s), ", ".join(h.name for h in summary.hcas[:16]))
            for s in summary.sources
        ],
        data=summary.to_dict(),
    )


def _port_fix(hca: Hca, p: HcaPort) -> str:
    where = f"{hca.name} port {p.port}"
    if p.state is None:
        return f"Read the port by hand: `ibstat {hca.name} {p.port}` and `cat /sys/class/infiniband/{hca.name}/ports/{p.port}/state`."
    if p.is_roce:
        return (
            f"Bring the Ethernet interface of {where} up: find it with `ibdev2netdev | grep '{where}'`, then "
            "`sudo ip link set <interface> up`; check the cable and the switch port."
        )
    if p.physical_state in ("Polling", "Sleep"):
        return (
            f"No physical link on {where}: reseat or replace the cable/transceiver and check that the switch "
            f"port is up (`sudo mlxlink -d {hca.name} -p {p.port}` shows the cable and errors)."
        )
    if p.physical_state == "Disabled":
        return f"{where} is disabled: enable it (`sudo mlxlink -d {hca.name} -p {p.port} --port_state UP`, or on the switch)."
    if p.physical_state == "LinkUp":
        return (
            f"The link of {where} is up but the subnet manager has not configured it ({p.state}): check that "
            "opensm (or the UFM/switch SM) runs on this fabric (`sminfo`), then `ibstat` again."
        )
    return PORT_STATE.fix


def rail_group(summary: RdmaSummary) -> Optional[tuple[tuple[Any, Any, Any], int, int]]:
    """The node's rails: (model, firmware, link layer) of the most numerous active ports, with how many of
    that kind are active and how many exist in all; None without an active port."""
    active: dict[tuple[Any, Any, Any], int] = defaultdict(int)
    total: dict[tuple[Any, Any, Any], int] = defaultdict(int)
    for hca, p in summary.ports:
        key = (hca.model, hca.firmware, p.link_layer)
        total[key] += 1
        active[key] += int(p.active)
    if not any(active.values()):
        return None
    key = max(active, key=lambda k: active[k])
    return key, active[key], total[key]


def _disabled_rail_note(
    hca: Hca, p: HcaPort, rails: Optional[tuple[tuple[Any, Any, Any], int, int]], gpus: Optional[int]
) -> tuple[Severity, str]:
    """A port switched off is a spare (info) unless it is one of the node's rails, missing: same model and
    firmware as the active rails (warn), except on a node whose GPU count is known and already has an
    active rail for every GPU. With the GPU count unknown nothing shows it is a spare, so it is a rail."""
    if rails is not None and (hca.model, hca.firmware, p.link_layer) == rails[0]:
        _, active, total = rails
        like = (
            f"; switched off, but it is a rail ({hca.model or 'same model'}, firmware "
            f"{hca.firmware or '?'}, like the {active} active ones)"
        )
        if gpus and active < gpus:
            return Severity.WARN, f"{like}: this node has {active} rails of {total} for {gpus} GPUs, and NCCL skips it"
        if not gpus:
            return Severity.WARN, (
                f"{like}: this node has {active} active rails of {total} (GPU count unknown), and NCCL skips it"
            )
    return Severity.INFO, "; switched off, NCCL skips it"


def check_ports(
    summary: RdmaSummary,
    hca_filter: Optional[HcaFilter],
    disabled_by: Optional[str],
    gpu_count: Optional[int] = None,
) -> list[Finding]:
    findings = []
    rails = rail_group(summary)
    active_layers = {p.link_layer for _, p in summary.ports if p.active}
    for hca, p in summary.ports:
        if p.active:
            continue
        used = disabled_by is None and (hca_filter is None or hca_filter.selects(hca.name, p.port))
        severity = Severity.FAIL if used else Severity.WARN
        if disabled_by:
            note = f"; not used by NCCL ({disabled_by})"
        elif not used:
            note = f"; not used by NCCL (NCCL_IB_HCA={hca_filter.raw if hca_filter else ''})"
        elif hca_filter is not None:
            note = "; selected by NCCL_IB_HCA"
        # NCCL_IB_HCA unset: NCCL skips ports that are not active, so what a dead port costs depends on
        # what else is up.
        elif p.physical_state == "Disabled":
            severity, note = _disabled_rail_note(hca, p, rails, gpu_count)
        elif p.link_layer in active_layers:
            note = "; NCCL skips it, so this node has one rail fewer than its peers"
        elif active_layers:
            severity = Severity.WARN
            note = f"; NCCL skips it and uses the active {'/'.join(sorted(x or '?' for x in active_layers))} ports"
        else:
            note = "; no RDMA port is active, NCCL falls back to TCP sockets"
        layer = " (RoCE)" if p.is_roce else ""
        if p.state is None:
            # No source could read the port state: unchecked, which is neither a pass nor a fault.
            severity = Severity.ERROR
            text = f"{hca.name} port {p.port}{layer}: state could not be read (physical state {p.physical_state or '?'}){note}"
        else:
            text = f"{hca.name} port {p.port}{layer} is {p.state} / {p.physical_state or '?'} (expected Active / LinkUp){note}"
        findings.append(
            PORT_STATE.finding(
                severity,
                text,
                evidence=[
                    Evidence(_source_label(p.source, hca, p), f"{hca.name} port {p.port}: {_port_text(p)}")
                ],
                fix=_port_fix(hca, p),
                data={
                    "device": hca.name,
                    "port": p.port,
                    "state": p.state,
                    "physical_state": p.physical_state,
                    "used_by_nccl": used,
                },
            )
        )
    if not findings and summary.ports:
        findings.append(
            PORT_STATE.finding(
                Severity.OK,
                f"All {len(summary.ports)} RDMA port(s) are Active / LinkUp",
                evidence=[
                    Evidence(_source_label(p.source, h, p), f"{h.name} port {p.port}: {_port_text(p)}")
                    for h, p in summary.ports[:8]
                ],
            )
        )
    return findings


def check_rates(summary: RdmaSummary) -> list[Finding]:
    groups: dict[tuple[Optional[str], Optional[str]], list[tuple[Hca, HcaPort]]] = defaultdict(list)
    for h, p in summary.active_ports:
        if p.rate_gbps is not None:
            groups[(h.model, p.link_layer)].append((h, p))
    findings = []
    for (model, layer), members in groups.items():
        best = max(float(p.rate_gbps or 0) for _, p in members)
        for h, p in members:
            if float(p.rate_gbps or 0) < best:
                findings.append(
                    PORT_RATE.finding(
                        Severity.WARN,
                        f"{h.name} port {p.port} negotiated {_rate(p.rate_gbps)} of {best:g} Gb/s "
                        f"(other {' '.join(x for x in (model, layer) if x) or 'same-model'} ports run at {best:g})",
                        evidence=[
                            Evidence(
                                _source_label(p2.source, h2, p2),
                                f"{h2.name} port {p2.port}: Rate {_rate(p2.rate_gbps)}",
                            )
                            for h2, p2 in members[:8]
                        ],
                        fix=f"Check the cable and switch port of {h.name} port {p.port}: `sudo mlxlink -d {h.name} "
                        f"-p {p.port}` shows the negotiated speed, the cable and its errors; reseat or replace the "
                        "cable/transceiver, or fix the speed the switch port allows.",
                        data={
                            "device": h.name,
                            "port": p.port,
                            "rate_gbps": p.rate_gbps,
                            "expected_gbps": best,
                        },
                    )
                )
    return findings


def check_firmware(summary: RdmaSummary) -> list[Finding]:
    # Adapters of one model and firmware family (the major version: 22.x ConnectX-6 Dx, 28.x ConnectX-7)
    # should run one version. Virtual functions all report one generic id (MT4126) whatever the physical
    # adapter, so the family, not the id alone, says which adapters are alike.
    by_model: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for h in summary.hcas:
        if h.model and h.firmware:
            by_model[(h.model, h.firmware.split(".", 1)[0])][h.firmware].append(h.name)
    findings = []
    for (model, family), versions in by_model.items():
        if len(versions) > 1:
            text = "; ".join(f"{fw} on {', '.join(names)}" for fw, names in sorted(versions.items()))
            findings.append(
                FIRMWARE.finding(
                    Severity.WARN,
                    f"{model} adapters (firmware {family}.x) run {len(versions)} firmware versions: {text}",
                    evidence=[Evidence("ibstat / /sys/class/infiniband/*/fw_ver", text)],
                    data={
                        "model": model,
                        "family": family,
                        "versions": {fw: names for fw, names in versions.items()},
                    },
                )
            )
    return findings


def check_roce(summary: RdmaSummary, env: Mapping[str, str]) -> list[Finding]:
    roce = [(h, p) for h, p in summary.ports if p.is_roce]
    if not roce:
        return []
    names = ", ".join(f"{h.name}:{p.port}" for h, p in roce[:8]) + (
        f" (+{len(roce) - 8})" if len(roce) > 8 else ""
    )
    gid = env.get("NCCL_IB_GID_INDEX")
    gid_text = (
        f"NCCL_IB_GID_INDEX={gid}; make sure it is the RoCE v2 index on every node (`show_gids`)"
        if gid
        else "NCCL_IB_GID_INDEX is unset: NCCL picks the GID; if nodes pick differently, set it to the RoCE v2 index from `show_gids`"
    )
    return [
        ROCE.finding(
            Severity.INFO,
            f"{len(roce)} RoCE port(s) (link layer Ethernet): {names}. {gid_text}",
            evidence=[
                Evidence(_source_label(p.source, h, p), f"{h.name} port {p.port}: Link layer: {p.link_layer}")
                for h, p in roce[:8]
            ],
            data={"ports": [f"{h.name}:{p.port}" for h, p in roce], "nccl_ib_gid_index": gid},
        )
    ]


def check_nccl_ib_hca(
    summary: RdmaSummary, hca_filter: Optional[HcaFilter], disabled_by: Optional[str] = None
) -> list[Finding]:
    if hca_filter is None:
        return []
    evidence = [Evidence("environment NCCL_IB_HCA", hca_filter.raw)] + [
        Evidence(
            "devices",
            ", ".join(
                f"{h.name} (ports {', '.join(str(p.port) for p in h.ports) or '?'})" for h in summary.hcas
            ),
        )
    ]
    problems: list[str] = [f"'{item}' has a port that is not a number" for item in hca_filter.invalid]
    prefix_wide: list[str] = []
    for name, port in hca_filter.entries:
        named = [h for h in summary.hcas if (h.name == name if hca_filter.exact else h.name.startswith(name))]
        label = f"{name}:{port}" if port is not None else name
        if not named:
            problems.append(f"'{label}' names no device")
        elif port is not None and not any(p.port == port for h in named for p in h.ports):
            problems.append(f"'{label}': {', '.join(h.name for h in named)} has no port {port}")
        elif not hca_filter.exact and len(named) > 1 and not hca_filter.exclude:
            prefix_wide.append(f"'{name}' also selects {', '.join(h.name for h in named if h.name != name)}")
    active = ",".join(f"{h.name}:{p.port}" for h, p in summary.active_ports) or "mlx5_0:1"
    findings = []
    if problems:
        # An exclusion of nothing, or a filter NCCL ignores because IB is off, does not break the job.
        sev = Severity.WARN if hca_filter.exclude or disabled_by else Severity.FAIL
        what = "excludes nothing" if hca_filter.exclude else "selects nothing"
        findings.append(
            NCCL_IB_HCA.finding(
                sev,
                f"NCCL_IB_HCA={hca_filter.raw}: " + "; ".join(problems) + f" (that entry {what})",
                evidence=evidence,
                fix=f"Name devices and ports that exist here (`ibstat -l`), e.g. the Active ones: "
                f"`NCCL_IB_HCA=={active}`, or unset NCCL_IB_HCA to use every active port.",
                data={"problems": problems},
            )
        )
    if prefix_wide:
        findings.append(
            NCCL_IB_HCA.finding(
                Severity.WARN,
                f"NCCL_IB_HCA={hca_filter.raw} matches names as prefixes: "
                + "; ".join(prefix_wide)
                + " (prefix with '=' for exact names)",
                evidence=evidence,
                fix=f"Use exact names, e.g. `NCCL_IB_HCA=={active}` (the leading '=' turns off prefix matching).",
            )
        )
    if not findings:
        selected = [f"{h.name}:{p.port}" for h, p in summary.ports if hca_filter.selects(h.name, p.port)]
        findings.append(
            NCCL_IB_HCA.finding(
                Severity.OK,
                f"NCCL_IB_HCA={hca_filter.raw} selects {', '.join(selected) or 'no port'}",
                evidence=evidence,
            )
        )
    return findings


def check_ib_disabled(summary: RdmaSummary, disabled_by: Optional[str]) -> list[Finding]:
    active = summary.active_ports
    if disabled_by is None or not active:
        return []
    return [
        NCCL_IB_DISABLED.finding(
            Severity.WARN,
            f"{disabled_by} while {len(active)} RDMA port(s) are Active: {SOCKETS}",
            evidence=[Evidence(f"environment {disabled_by.split('=')[0]}", disabled_by)],
        )
    ]


def check_tool_errors(summary: RdmaSummary) -> list[Finding]:
    lines = [(tool, line) for tool, line in summary.errors if tool != "sysfs"]
    if not lines:
        return []
    # ibpanic names the device in quotes: "stat of IB device 'mlx5_8' failed".
    named = sorted({m.group(1) for _, line in lines for m in re.finditer(r"device '([^']+)'", line)})
    fix = None
    if named:
        fix = (
            f"Check `sudo dmesg | grep -i -e mlx5 -e pcie` for errors on {', '.join(named)} and run "
            + ", ".join(f"`ibstat {n}`" for n in named)
            + "; a device that keeps failing needs a driver reload (`sudo systemctl restart openibd`) or a "
            "node drain."
        )
    return [
        TOOL_ERRORS.finding(
            Severity.WARN,
            f"{lines[0][0]}: {lines[0][1]}" + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""),
            evidence=[Evidence(tool, line) for tool, line in lines[:8]],
            fix=fix,
            data={"errors": [{"tool": t, "line": line} for t, line in lines]},
        )
    ]


def check_uverbs(sysfs: Optional[Mapping[str, Any]], summary: RdmaSummary) -> list[Finding]:
    if not sysfs or not sysfs["devices"]:
        return []
    nodes = sysfs["dev_infiniband"]
    if nodes and any(n.startswith("uverbs") for n in nodes):
        return []
    seen = "absent" if nodes is None else f"has no uverbs nodes ({', '.join(nodes) or 'empty'})"
    return [
        UVERBS.finding(
            Severity.WARN,
            f"{len(summary.hcas)} RDMA device(s) in sysfs but /dev/infiniband is {seen}: {SOCKETS}",
            evidence=[Evidence("ls /dev/infiniband", str(nodes))],
        )
    ]


def check_rdma(facts: RdmaFacts) -> list[Finding]:
    pcie_findings, pci = check_pcie(facts.lspci)
    summary = summarize_rdma(facts)
    if not summary.hcas:
        return check_no_rdma(facts, pci) + pcie_findings
    env = facts.env or {}
    hca_filter = parse_nccl_ib_hca(env.get("NCCL_IB_HCA"))
    disabled_by = _ib_disabled(env)
    findings = [check_inventory(summary)]
    gpus = facts.gpu_count or sum(1 for d in pci if d.kind == "gpu" and "nvidia" in d.description.lower())
    findings += check_ports(summary, hca_filter, disabled_by, gpus or None)
    findings += check_rates(summary)
    findings += check_firmware(summary)
    findings += check_roce(summary, env)
    findings += check_nccl_ib_hca(summary, hca_filter, disabled_by)
    findings += check_ib_disabled(summary, disabled_by)
    findings += check_tool_errors(summary)
    findings += check_uverbs(facts.sysfs, summary)
    findings += check_gpudirect(facts, pci)
    findings += check_memlock(facts.ulimit, disabled_by)
    return findings + pcie_findings


AREA = Area(name="rdma", title="RDMA and PCIe fabric", collect=collect_rdma, judge=check_rdma, order=70)
