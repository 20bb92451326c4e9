"""What the gpu area reads (the I/O edge): commands, snapshot facts, collection and the typed summary.

NVML comes first (`ddpdoctor.edge.nvml`, stored as the `nvml` fact); `nvidia-smi -q` is the fallback when
NVML cannot be used and the replay source. Both give per-GPU dicts of one shape (`nvml.GPU_SHAPE`,
docs/parse.md); facts read back from a snapshot are conformed to their shape here, so the judges never
meet a value of the wrong type.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ddpdoctor.core.engine import Context
from ddpdoctor.edge.json_shape import ListOf, Record, conform_fact
from ddpdoctor.edge.nvml import NVML_IMPOSSIBLE, gather_nvml, load_nvml_fact
from ddpdoctor.edge.procfs import read_parent_pid
from ddpdoctor.edge.runner import CommandResult, define_command
from ddpdoctor.edge.sources import Sources, define_fact, fact_or_none
from ddpdoctor.parsers.dmesg import normalize_bus_id
from ddpdoctor.parsers.nvidia_smi import parse_nvidia_smi_q
from ddpdoctor.parsers.nvidia_smi_nvlink import parse_nvlink
from ddpdoctor.parsers.nvidia_smi_topo import parse_topo_matrix, parse_topo_p2p

NVIDIA_SMI_Q = define_command(
    "nvidia-smi-q",
    ("nvidia-smi", "-q"),
    "Full state of every GPU (ECC, remapped rows, PCIe link, clocks, processes); the GPU checks' "
    "fallback when NVML cannot be used, and enough on its own for `check --replay`",
    timeout_s=30.0,
)
TOPO_M = define_command(
    "nvidia-smi-topo-m",
    ("nvidia-smi", "topo", "-m"),
    "GPU/NIC topology matrix (NV#, PIX, PXB, PHB, NODE, SYS) with CPU and NUMA affinity",
    timeout_s=15.0,
)
TOPO_P2P = define_command(
    "nvidia-smi-topo-p2p",
    ("nvidia-smi", "topo", "-p2p", "r"),
    "Peer-to-peer read capability between GPU pairs (fallback when NVML cannot be used)",
    timeout_s=15.0,
)
NVLINK_S = define_command(
    "nvidia-smi-nvlink-s",
    ("nvidia-smi", "nvlink", "-s"),
    "NVLink link speeds and inactive links (fallback when NVML cannot be used)",
    timeout_s=15.0,
)
NVLINK_E = define_command(
    "nvidia-smi-nvlink-e",
    ("nvidia-smi", "nvlink", "-e"),
    "NVLink replay/recovery/CRC error counters (fallback when NVML cannot be used)",
    timeout_s=15.0,
)
DMESG = define_command(
    "dmesg",
    ("dmesg",),
    "Kernel log: NVIDIA Xid events, GPUs fallen off the bus, PCIe links limited by a slower link",
    timeout_s=10.0,
)

NVML_FACT = define_fact(
    "nvml",
    "NVML readings: driver and CUDA driver version, per-GPU health (ECC, remapped rows, PCIe, clocks, "
    "compute mode, MIG, processes, NVLink, fabric) and GPU-pair P2P status",
    # Impossible readings (negative memory) are refused at the edge; the other fields are conformed
    # by load_nvml_fact.
    NVML_IMPOSSIBLE,
)
_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
GPU_PCI_FACT = define_fact(
    "gpu-pci",
    "NVIDIA display/3D PCI devices listed in /sys/bus/pci/devices (GPUs present with or without a driver)",
    list,  # the items are conformed by load_gpu_pci
)
GPU_PCI_SHAPE = ListOf(
    Record(
        {
            "bus_id": str,
            "class": str,
            "driver": str,
            "width_max": int,  # the GPU's own link capability (sysfs max_link_width)
            "width_current": int,
            "upstream_bus_id": str,  # the port above it: a root port or a switch downstream port
            "upstream_width_max": int,  # that port's capability: the slot's width
        }
    )
)


@dataclass(frozen=True)
class GpuInfo:
    """The facts about one GPU other areas need (benchmark expectations, CI, launch checks)."""

    index: int
    name: Optional[str]
    uuid: Optional[str]
    bus_id: Optional[str]
    compute_mode: Optional[str]
    mig_enabled: Optional[bool]
    persistence_mode: Optional[bool]
    memory_total_mib: Optional[int]
    pcie_gen_current: Optional[int]
    pcie_gen_max: Optional[int]
    pcie_width_current: Optional[int]
    pcie_width_max: Optional[int]
    nvlink_active: Optional[int]  # active links; None when unknown, 0 on a PCIe-only GPU
    nvlink_total: Optional[int]
    nvlink_version: Optional[int]
    nvlink_speed_gbps: Optional[float]  # per link, when nvidia-smi nvlink -s said
    lost: bool = False


@dataclass(frozen=True)
class GpuFacts:
    """A typed summary of the node's GPUs. `source` is "nvml", "nvidia-smi" or "none"."""

    source: str
    driver_version: Optional[str]
    cuda_driver_version: Optional[str]
    gpus: tuple[GpuInfo, ...] = ()
    topology: Optional[Mapping[str, Any]] = None
    p2p: Optional[Mapping[str, Any]] = None
    error: Optional[str] = None

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def models(self) -> list[str]:
        """Distinct GPU model names, in index order."""
        seen: list[str] = []
        for g in self.gpus:
            if g.name and g.name not in seen:
                seen.append(g.name)
        return seen

    @property
    def compute_modes(self) -> dict[int, Optional[str]]:
        return {g.index: g.compute_mode for g in self.gpus}

    @property
    def has_nvlink(self) -> bool:
        return any((g.nvlink_active or 0) > 0 for g in self.gpus)

    @property
    def exclusive_gpus(self) -> list[int]:
        """GPUs on which several processes cannot share a CUDA context (Exclusive_Process, Prohibited)."""
        return [g.index for g in self.gpus if g.compute_mode in ("Exclusive_Process", "Prohibited")]


@dataclass
class GpuCollected:
    """What the gpu area gathered, for the pure judges."""

    source: str = "none"  # "nvml", "nvidia-smi" or "none"
    nvml: Optional[Mapping[str, Any]] = None  # the nvml fact in nvml.NVML_SHAPE
    smi: Optional[CommandResult] = None
    smi_parsed: Optional[Mapping[str, Any]] = None
    gpus: list[dict[str, Any]] = field(default_factory=list)  # in nvml.GPU_SHAPE
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    pci_devices: Optional[list[dict[str, Any]]] = None
    topo: Optional[CommandResult] = None
    topo_parsed: Optional[Mapping[str, Any]] = None
    p2p: Optional[Mapping[str, Any]] = None
    p2p_source: str = ""
    nvlink_source: str = ""
    dmesg: Optional[CommandResult] = None
    torch: Optional[Mapping[str, Any]] = None  # the torch-info JSON (ddpdoctor.edge.torch_info)
    torch_result: Optional[CommandResult] = None
    env: Mapping[str, str] = field(default_factory=dict)
    replay: bool = False
    nproc_per_node: Optional[int] = None  # `check --nproc-per-node N`: ranks per node for a preflight
    job_pids: Optional[frozenset[int]] = None  # this job's processes (live only): others hold GPUs


def read_job_pids(proc: str = "/proc") -> frozenset[int]:
    """This process, its ancestors and every descendant of its parent (under torchrun: the agent and all
    of this node's workers), so that a GPU process outside the set belongs to another job.

    Equivalent: ps -o pid= --ppid $PPID; ps -o ppid= -p $$ (up to init)."""
    me = os.getpid()
    pids = {me}
    pid: Optional[int] = me
    for _ in range(64):  # bounded walk up; a loop in /proc cannot happen, a very deep tree can
        pid = read_parent_pid(pid, proc) if pid else None
        if not pid or pid in pids:
            break
        pids.add(pid)
    parent = read_parent_pid(me, proc)
    children: dict[int, list[int]] = {}
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()][:100000]
    except OSError:
        entries = []
    for name in entries:
        ppid = read_parent_pid(int(name), proc)
        if ppid is not None:
            children.setdefault(ppid, []).append(int(name))
    stack = [parent] if parent else []
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in pids:
                pids.add(child)
                stack.append(child)
    return frozenset(pids)


def _read_width(path: Path) -> Optional[int]:
    """A sysfs link width (`16`; some kernels print `x16`), None when absent or unreadable."""
    try:
        text = path.read_text().strip().lstrip("xX")
    except OSError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) <= 32 else None


def read_nvidia_pci(root: str = "/sys/bus/pci/devices") -> list[dict[str, Any]]:
    """NVIDIA GPUs (vendor 0x10de, class display/3D) on the PCI bus, with or without a driver, with their
    link width and the width of the port above them.

    Equivalent: lspci -d 10de: -nn | grep -E '\\[03'; lspci -vv -s BDF | grep LnkCap (GPU and upstream port).
    """
    devices: list[dict[str, Any]] = []
    try:
        entries = sorted(Path(root).iterdir())
    except OSError:
        return devices
    for dev in entries:
        try:
            vendor = (dev / "vendor").read_text().strip()
            klass = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor.lower() != "0x10de" or not klass.startswith("0x03"):
            continue
        driver = None
        try:
            driver = os.path.basename(os.readlink(dev / "driver"))
        except OSError:
            pass
        # The device's sysfs directory sits inside its upstream port's: /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0
        upstream = Path(os.path.realpath(dev)).parent
        has_port = _BDF.match(upstream.name) is not None
        devices.append(
            {
                "bus_id": dev.name,
                "class": klass,
                "driver": driver,
                "width_max": _read_width(dev / "max_link_width"),
                "width_current": _read_width(dev / "current_link_width"),
                "upstream_bus_id": upstream.name if has_port else None,
                "upstream_width_max": _read_width(upstream / "max_link_width") if has_port else None,
            }
        )
    return devices


def attach_slot_widths(gpus: list[dict[str, Any]], pci: Optional[list[dict[str, Any]]]) -> None:
    """Give each GPU's `pcie` record the width of the port above it (`slot_width_max`, `slot_bus_id`).

    nvidia-smi's and NVML's "max" width is the GPU's own: a x16 GPU in a slot wired x8 looks like a
    degraded link unless the slot's capability is known.
    """
    by_bus = {normalize_bus_id(d.get("bus_id")): d for d in pci or []}
    for g in gpus:
        d = by_bus.get(normalize_bus_id(g.get("bus_id")))
        if d is not None and d.get("upstream_width_max") is not None:
            g["pcie"] = {
                **(g.get("pcie") or {}),
                "slot_width_max": d["upstream_width_max"],
                "slot_bus_id": d.get("upstream_bus_id"),
            }


def load_gpu_pci(value: Any) -> Optional[list[dict[str, Any]]]:
    """The `gpu-pci` fact in its shape; entries without a bus id say nothing and are dropped."""
    devices = conform_fact(value, GPU_PCI_SHAPE)
    return None if devices is None else [d for d in devices if d["bus_id"]]


def _parsed(result: Optional[CommandResult], parse: Callable[[str], Any]) -> Any:
    if result is None or not result.found or result.timed_out or not result.stdout.strip():
        return None
    return parse(result.stdout)


def _merge_nvlink(gpus: list[dict[str, Any]], parsed_s: Any, parsed_e: Any) -> None:
    """Attach `nvidia-smi nvlink -s/-e` links to the GPU dicts, by index."""
    by_index: dict[int, dict[str, Any]] = {}
    for parsed in (parsed_s, parsed_e):
        for g in (parsed or {}).get("gpus") or []:
            target = by_index.setdefault(g["index"], {"links": {}})
            for num, link in (g.get("links") or {}).items():
                merged = target["links"].setdefault(num, {"active": None, "speed_gbps": None, "errors": {}})
                if link.get("active") is not None:
                    merged["active"] = link["active"]
                if link.get("speed_gbps") is not None:
                    merged["speed_gbps"] = link["speed_gbps"]
                merged["errors"].update(link.get("errors") or {})
    for gpu in gpus:
        if gpu.get("nvlink") is None and gpu.get("index") in by_index:
            gpu["nvlink"] = by_index[gpu["index"]]


def _read_torch(sources: Sources) -> tuple[Optional[dict[str, Any]], Optional[CommandResult]]:
    """The torch-info JSON of the torch area (run once per Sources, in a subprocess)."""
    try:
        from ddpdoctor.checks.torch import parse_torch_info, run_torch_info
    except ImportError:
        return None, None
    result = run_torch_info(sources)
    info = parse_torch_info(result.stdout) if result.stdout else None
    return info, result


def _read_nvidia_smi(c: GpuCollected, sources: Sources) -> None:
    """`nvidia-smi -q`: GPUs, driver and CUDA version, and the lines saying why it could not read them."""
    c.smi = sources.run(NVIDIA_SMI_Q)
    c.smi_parsed = _parsed(c.smi, parse_nvidia_smi_q)
    if c.smi.stderr.strip():
        # nvidia-smi prints some failures ("Unable to determine the device handle ...") on stderr.
        from_err = parse_nvidia_smi_q(c.smi.stderr)["errors"]
        if from_err:
            c.smi_parsed = dict(c.smi_parsed or parse_nvidia_smi_q(""))
            c.smi_parsed["errors"] = list(c.smi_parsed.get("errors") or []) + from_err
    if c.smi_parsed and c.smi_parsed.get("gpus"):
        c.source = "nvidia-smi"
        c.gpus = [dict(g) for g in c.smi_parsed["gpus"]]
    if c.smi_parsed:
        c.driver_version = c.smi_parsed.get("driver_version")
        c.cuda_driver_version = c.smi_parsed.get("cuda_version")


def collect_gpu_base(sources: Sources) -> GpuCollected:
    """NVML (or nvidia-smi -q), topology, P2P and NVLink: the part other areas reuse."""
    c = GpuCollected(replay=not sources.is_live)
    c.nvml = load_nvml_fact(fact_or_none(sources, NVML_FACT, gather_nvml))
    if c.nvml and c.nvml["available"] and c.nvml["gpus"]:
        c.source = "nvml"
        c.gpus = [dict(g) for g in c.nvml["gpus"]]
        c.driver_version = c.nvml["driver_version"]
        c.cuda_driver_version = c.nvml["cuda_driver_version"]
        c.p2p = c.nvml["p2p"]
        c.p2p_source = "NVML nvmlDeviceGetP2PStatus"
    else:
        _read_nvidia_smi(c, sources)
        if c.nvml and c.nvml["available"] and not c.driver_version:
            c.driver_version = c.nvml["driver_version"]
            c.cuda_driver_version = c.nvml["cuda_driver_version"]
    c.pci_devices = load_gpu_pci(fact_or_none(sources, GPU_PCI_FACT, read_nvidia_pci))
    if not c.gpus:
        return c
    attach_slot_widths(c.gpus, c.pci_devices)
    c.topo = sources.run(TOPO_M)
    c.topo_parsed = _parsed(c.topo, parse_topo_matrix)
    if c.p2p is None and len(c.gpus) > 1:
        p2p_result = sources.run(TOPO_P2P)
        c.p2p = _parsed(p2p_result, parse_topo_p2p)
        c.p2p_source = TOPO_P2P.display
    if not any(g.get("nvlink") for g in c.gpus):
        nv_s = _parsed(sources.run(NVLINK_S), parse_nvlink)
        nv_e = _parsed(sources.run(NVLINK_E), parse_nvlink)
        _merge_nvlink(c.gpus, nv_s, nv_e)
        c.nvlink_source = f"{NVLINK_S.display}; {NVLINK_E.display}"
    else:
        c.nvlink_source = "NVML nvmlDeviceGetNvLinkState/ErrorCounter"
    return c


_BASE_CACHE: weakref.WeakKeyDictionary[Any, GpuCollected] = weakref.WeakKeyDictionary()
_BASE_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()


def collect_gpu_base_once(sources: Sources) -> GpuCollected:
    """collect_gpu_base, once per Sources: the gpu area and the areas that read `read_gpu_facts` (rdma:
    GPUs per rail) run concurrently, and NVML is read under one lock, so a second pass would only wait."""
    with _FACTS_LOCK:
        lock = _BASE_LOCKS.setdefault(sources, threading.Lock())
    with lock:
        base = _BASE_CACHE.get(sources)
        if base is None:
            base = _BASE_CACHE[sources] = collect_gpu_base(sources)
    return dataclasses.replace(base)  # a copy: the gpu area adds its own readings to it


def collect_gpu(ctx: Context) -> GpuCollected:
    """The gpu area's collect: the base readings, the kernel log and torch's view of the GPUs."""
    c = collect_gpu_base_once(ctx.sources)
    # A hand-written env.json may hold numbers or nulls: CUDA and torchrun read strings.
    c.env = {k: str(v) for k, v in ctx.env.items() if v is not None}
    nproc = ctx.options.get("nproc_per_node")
    c.nproc_per_node = nproc if isinstance(nproc, int) and nproc > 0 else None
    if ctx.sources.is_live and c.gpus:
        c.job_pids = read_job_pids()
    gpu_evidence = bool(c.gpus) or bool(c.pci_devices) or bool((c.smi_parsed or {}).get("errors"))
    if gpu_evidence:
        c.dmesg = ctx.sources.run(DMESG)
    if c.gpus and not all(g.get("lost") for g in c.gpus):
        c.torch, c.torch_result = _read_torch(ctx.sources)
    return c


_FACTS_CACHE: weakref.WeakKeyDictionary[Any, GpuFacts] = weakref.WeakKeyDictionary()
_FACTS_LOCK = threading.Lock()


def summarize(c: GpuCollected) -> GpuFacts:
    """The typed summary of collected GPU facts."""
    infos = []
    for g in c.gpus:
        links = list(((g.get("nvlink") or {}).get("links") or {}).values())
        speeds = [x.get("speed_gbps") for x in links if x.get("speed_gbps")]
        versions = [x.get("version") for x in links if x.get("version")]
        pcie = g.get("pcie") or {}
        infos.append(
            GpuInfo(
                index=int(g.get("index") or 0),
                name=g.get("name"),
                uuid=g.get("uuid"),
                bus_id=g.get("bus_id"),
                compute_mode=g.get("compute_mode"),
                mig_enabled=(g.get("mig_mode") or {}).get("current"),
                persistence_mode=g.get("persistence_mode"),
                memory_total_mib=(g.get("memory") or {}).get("total_mib"),
                pcie_gen_current=pcie.get("gen_current"),
                pcie_gen_max=pcie.get("gen_max"),
                pcie_width_current=pcie.get("width_current"),
                pcie_width_max=pcie.get("width_max"),
                nvlink_active=sum(1 for x in links if x.get("active")) if g.get("nvlink") else None,
                nvlink_total=len(links) if g.get("nvlink") else None,
                nvlink_version=max(versions) if versions else None,
                nvlink_speed_gbps=max(speeds) if speeds else None,
                lost=bool(g.get("lost")),
            )
        )
    error = None
    if c.nvml and c.nvml["error"]:
        error = str(c.nvml["error"]["message"])
    elif c.smi is not None and not c.gpus:
        error = c.smi.describe_failure() or "; ".join((c.smi_parsed or {}).get("errors") or []) or None
    return GpuFacts(
        source=c.source,
        driver_version=c.driver_version,
        cuda_driver_version=c.cuda_driver_version,
        gpus=tuple(infos),
        topology=c.topo_parsed,
        p2p=c.p2p,
        error=error,
    )


def read_gpu_facts(sources: Sources) -> GpuFacts:
    """The node's GPUs as a typed summary, read once per Sources (NVML, else nvidia-smi -q).

    Equivalent: nvidia-smi -q; nvidia-smi topo -m.
    """
    with _FACTS_LOCK:
        cached = _FACTS_CACHE.get(sources)
    if cached is not None:
        return cached
    facts = summarize(collect_gpu_base_once(sources))
    with _FACTS_LOCK:
        _FACTS_CACHE[sources] = facts
    return facts
