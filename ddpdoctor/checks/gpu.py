"""GPUs: driver and NVML, torch's CUDA build vs the driver, per-GPU health, NVLink, topology, Xids.

Facts come from NVML first (`ddpdoctor.nvml`, stored as the `nvml` snapshot fact); `nvidia-smi -q` is
the fallback when NVML cannot be used and the replay source: a snapshot directory holding only
`nvidia-smi-q.txt` is enough for the per-GPU checks. Both give per-GPU dicts of the same shape
(docs/parse.md), judged by the same pure functions below.

Other areas reuse `read_gpu_facts(sources)` -> `GpuFacts` (model, count, driver, CUDA driver version,
compute modes, NVLink and PCIe state, topology).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from ddpdoctor.engine import Area, Context
from ddpdoctor.model import CheckSpec, Evidence, Finding, Severity, define
from ddpdoctor.nvml import gather_nvml
from ddpdoctor.parsers.dmesg import XID_TABLE, normalize_bus_id, parse_dmesg
from ddpdoctor.parsers.nvidia_smi import parse_nvidia_smi_q
from ddpdoctor.parsers.nvidia_smi_nvlink import parse_nvlink
from ddpdoctor.parsers.nvidia_smi_topo import closest_nics, link_rank, parse_topo_matrix, parse_topo_p2p
from ddpdoctor.runner import CommandResult, define_command
from ddpdoctor.sources import Sources, define_fact, fact_or_none
from ddpdoctor.visible_devices import parse_visible_devices

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
)
GPU_PCI_FACT = define_fact(
    "gpu-pci",
    "NVIDIA display/3D PCI devices listed in /sys/bus/pci/devices (GPUs present with or without a driver)",
)

# Thresholds. PCIe replays: DCGM's PCIe diagnostic fails at 80 replays over a short test; this many since
# the last reset on a node about to run a job already points at a marginal link.
PCIE_REPLAY_WARN = 50
# Corrected memory errors are harmless one by one; hundreds since the last reset mean a weakening part.
ECC_CORRECTABLE_WARN = 100
# Degrees below the slowdown temperature (or T.Limit headroom, R535+) that count as "near".
TEMP_MARGIN_C = 5
# Idle GPUs legitimately drop to PCIe gen 1; only judge the generation under load.
PCIE_GEN_LOAD_PERCENT = 50
POWER_LIMIT_LOWERED_RATIO = 0.95
# Clock event reasons that cost speed and point at hardware or cooling; idle, application clocks,
# sync boost and display settings are normal.
HARMFUL_THROTTLE = {
    "hw_slowdown": Severity.FAIL,
    "hw_thermal_slowdown": Severity.FAIL,
    "hw_power_brake_slowdown": Severity.FAIL,
    "sw_thermal_slowdown": Severity.WARN,
}

# ---------------------------------------------------------------------------------------------------
# Finding ids

DRIVER = define(
    "gpu.driver",
    "NVIDIA driver",
    "Without a loaded NVIDIA driver no CUDA program and no NCCL communicator can start on the node.",
    "Install or reload the NVIDIA driver (`nvidia-smi` must list the GPUs); on Kubernetes check the GPU "
    "operator / device plugin, in Docker run with `--gpus all`.",
)
NVML = define(
    "gpu.nvml",
    "NVML usable",
    "NVML (libnvidia-ml) is how nvidia-smi, DCGM and ddpdoctor read GPU health. 'Driver/library version "
    "mismatch' means the user-space driver was upgraded while the old kernel module is still loaded: CUDA "
    "fails too until the module is reloaded.",
    "Reboot (or unload and reload the nvidia kernel modules). Hold the driver packages so unattended "
    "upgrades cannot replace them on a running node.",
)
INVENTORY = define(
    "gpu.inventory",
    "GPUs",
    "The GPU models, count, driver and the CUDA version the driver supports, for the record.",
)
CUDA_COMPAT = define(
    "gpu.cuda_compat",
    "torch CUDA build vs driver",
    "A torch wheel built for a newer CUDA major version than the driver supports cannot use the GPUs "
    "(torch.cuda.is_available() is False, 'The NVIDIA driver on your system is too old'). Within one "
    "major version CUDA's minor-version compatibility usually works, but PTX JIT and some features fail.",
    "Install a torch wheel for a CUDA version the driver supports (e.g. `pip install torch --index-url "
    "https://download.pytorch.org/whl/cu121` on a CUDA 12.2 driver), or upgrade the driver.",
)
TORCH_COUNT = define(
    "gpu.torch_count",
    "GPUs visible to torch",
    "torch.cuda.device_count() should equal the GPUs NVML sees, narrowed by CUDA_VISIBLE_DEVICES. A "
    "difference means a broken CUDA setup, a container exposing fewer devices, or a mistyped "
    "CUDA_VISIBLE_DEVICES: ranks then fail with 'invalid device ordinal' or share a GPU.",
    "Compare `nvidia-smi -L` with `python -c 'import torch; print(torch.cuda.device_count())'`; check "
    "CUDA_VISIBLE_DEVICES and the container's device list.",
)
LOST = define(
    "gpu.lost",
    "GPU lost",
    "NVML reports the GPU as lost or needing a reset (often after Xid 79, 'fallen off the bus'). Every "
    "job using it fails or hangs.",
    "Drain the node; reset the GPU (`nvidia-smi -r -i N`) or reboot; check power, thermals and the PCIe "
    "slot/riser; RMA if it recurs.",
)
READINGS = define(
    "gpu.readings",
    "GPU readings",
    "Some NVML readings failed with an error other than 'not supported', so the checks that need them did "
    "not run for that GPU.",
    "Run `nvidia-smi -q -i N` by hand to see the failing fields; errors on many fields point to a GPU "
    "in a bad state.",
)
ECC_UNCORRECTABLE = define(
    "gpu.ecc.uncorrectable",
    "Uncorrectable ECC errors",
    "An uncorrectable memory error kills the process that hit it ('uncorrectable ECC error encountered') "
    "and, until the GPU is reset, may corrupt data. Volatile counts are since the last reset.",
    "Reset the GPU (`nvidia-smi -r -i N`) or reboot, then run `dcgmi diag -r 3`; RMA if errors recur "
    "(per field practice, if aggregate SRAM uncorrectable errors exceed 4).",
)
ECC_CORRECTABLE = define(
    "gpu.ecc.correctable",
    "Corrected ECC errors",
    "Corrected memory errors do no harm one by one, but a high count since the last reset points at "
    "weakening memory, usually followed by row remapping or retired pages.",
    "Watch the counter (`nvidia-smi -q -d ECC`); run `dcgmi diag -r 3` when it keeps rising.",
)
ECC_MODE = define(
    "gpu.ecc.mode",
    "ECC mode",
    "Whether ECC is on. A pending change only takes effect after a GPU reset or reboot.",
    "Reset the GPU or reboot to apply the pending ECC mode.",
)
RETIRED_PAGES = define(
    "gpu.retired_pages",
    "Retired pages",
    "Pre-Ampere GPUs retire memory pages that had errors; a retirement pending a reset leaves the bad page "
    "in use, and many retired pages (60+ double-bit) mean the board needs replacing.",
    "Reset the GPU (`nvidia-smi -r -i N`) or reboot to retire the pending pages; RMA the board if the "
    "count keeps growing.",
)
REMAP_PENDING = define(
    "gpu.remapped_rows.pending",
    "Row remapping pending",
    "Ampere and newer GPUs replace a failing memory row with a spare, but only after a GPU reset; until "
    "then the bad row stays in use (often after Xid 63/94).",
    "Drain the node and reset the GPU (`nvidia-smi -r -i N`) or reboot, then run `dcgmi diag -r 2`.",
)
REMAP_FAILURE = define(
    "gpu.remapped_rows.failure",
    "Row remapping failed",
    "The GPU could not remap a failing memory row (no spare left in the bank): the memory error will "
    "keep coming back.",
    "Drain the node and RMA the GPU.",
)
RESET_REQUIRED = define(
    "gpu.reset_required",
    "GPU reset required",
    "The driver says the GPU needs a reset (or a drain and reset) to recover from an error.",
    "Drain the node and reset the GPU (`nvidia-smi -r -i N`) or reboot.",
)
PCIE_WIDTH = define(
    "gpu.pcie.width",
    "PCIe link width",
    "A GPU whose PCIe link trained narrower than it can (x8 or x4 instead of x16) moves host<->device and "
    "GPUDirect RDMA traffic at a fraction of the speed: data loading and inter-node collectives slow "
    "down without any error.",
    "Reseat the GPU or riser, check the slot and cables, update the system BIOS; compare with `lspci -vvv` "
    "(LnkSta vs LnkCap).",
)
PCIE_GEN = define(
    "gpu.pcie.gen",
    "PCIe link generation",
    "Idle GPUs lower their PCIe generation to save power, so this is judged only under load; a GPU that "
    "stays below its maximum generation while busy, or a host slot slower than the GPU, caps "
    "host<->device bandwidth.",
    "Check under load (`nvidia-smi -q -d PCIE` while a job runs); review the slot, switch and BIOS PCIe "
    "settings.",
)
PCIE_REPLAYS = define(
    "gpu.pcie.replays",
    "PCIe replays",
    "PCIe replays are link-level retransmissions; a high count since the last reset points at a marginal "
    "link (riser, slot, signal integrity) that slows transfers and can end in Xid 79.",
    "Reseat the GPU/riser; run `dcgmi diag -r 2` (PCIe test); RMA or replace the riser if it keeps rising.",
)
PCIE_LIMITED = define(
    "gpu.pcie.limited",
    "PCIe bandwidth limited (kernel)",
    "The kernel found at boot that a device's PCIe bandwidth is limited by a slower link upstream (a Gen4 "
    "switch in front of a Gen5 GPU, a narrow slot).",
    "Review the platform: slot, switch and riser generations and widths; reseat; update BIOS/firmware.",
)
THROTTLE = define(
    "gpu.throttle",
    "Clock slowdown",
    "Hardware slowdown (thermal, power brake) or software thermal slowdown lowers the GPU clocks, so the "
    "slowest GPU sets the pace of every collective. Idle, application clocks and power-cap reasons are "
    "normal and not reported.",
    "Check cooling and fans, the PSU and power-brake signals (BMC logs), and `nvidia-smi -q -d PERFORMANCE`.",
)
PERSISTENCE = define(
    "gpu.persistence",
    "Persistence mode",
    "With persistence mode off the driver tears GPU state down when the last client exits, so every job "
    "start pays a re-initialisation (seconds per GPU) and first-touch latency varies.",
    "Enable it: `sudo nvidia-smi -pm 1`, or better run `nvidia-persistenced`.",
)
COMPUTE_MODE = define(
    "gpu.compute_mode",
    "Compute mode",
    "In Exclusive Process mode only one process may hold a CUDA context on the GPU, and Prohibited allows "
    "none: several ranks (or a rank plus a monitoring tool) sharing a GPU fail with 'all CUDA-capable "
    "devices are busy or unavailable'.",
    "Set Default mode: `sudo nvidia-smi -c 0 -i N` (schedulers sometimes set exclusive mode on purpose: "
    "then run one rank per GPU).",
)
MIG = define(
    "gpu.mig",
    "MIG mode",
    "With MIG enabled a process sees at most one MIG instance; NCCL cannot use NVLink or P2P between MIG "
    "instances, and multi-instance collectives are not supported. A pending MIG change needs a GPU reset.",
    "Disable MIG for distributed training (`sudo nvidia-smi -mig 0 -i N`, then reset) or run one rank per "
    "MIG instance with care.",
)
PROCESSES = define(
    "gpu.processes",
    "Processes on the GPUs",
    "Processes already holding GPU memory (a stray job, a zombie DataLoader, another user) take memory "
    "and compute from the next job and can make it fail with out-of-memory.",
    "Find them (`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`) and stop them, "
    "or ask the scheduler why the node was handed out busy.",
)
TEMPERATURE = define(
    "gpu.temperature",
    "GPU temperature",
    "A GPU close to its slowdown temperature will throttle under load, slowing every rank that waits on it.",
    "Check airflow, fans and inlet temperature; compare with the other GPUs on the node.",
)
POWER_LIMIT = define(
    "gpu.power_limit",
    "Power limit",
    "A power limit set below the default caps the clocks of that GPU, and the slowest GPU sets the pace "
    "of every collective.",
    "Restore it: `sudo nvidia-smi -pl <default W> -i N` (check whether an admin capped it on purpose).",
)
NVLINK_INACTIVE = define(
    "gpu.nvlink.inactive",
    "NVLink links down",
    "An NVLink link that is down lowers GPU-to-GPU bandwidth; NCCL may fall back to PCIe for that pair.",
    "Reset the GPUs or reboot; on NVSwitch systems restart nvidia-fabricmanager; reseat/RMA if it persists.",
)
NVLINK_ERRORS = define(
    "gpu.nvlink.errors",
    "NVLink errors",
    "Replay, recovery and CRC errors on an NVLink link mean a noisy link; recoveries stall traffic and "
    "growing counts precede Xid 74.",
    "Watch `nvidia-smi nvlink -e`; reset the GPUs; RMA if the counters keep rising.",
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

# ---------------------------------------------------------------------------------------------------
# Facts


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
    """What the gpu area gathered, for the pure judge."""

    source: str = "none"  # "nvml", "nvidia-smi" or "none"
    nvml: Optional[Mapping[str, Any]] = None
    smi: Optional[CommandResult] = None
    smi_parsed: Optional[Mapping[str, Any]] = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    pci_devices: Optional[list[dict[str, Any]]] = None
    topo: Optional[CommandResult] = None
    topo_parsed: Optional[Mapping[str, Any]] = None
    p2p: Optional[Mapping[str, Any]] = None
    p2p_source: str = ""
    nvlink_source: str = ""
    dmesg: Optional[CommandResult] = None
    torch: Optional[Mapping[str, Any]] = None  # the torch-info JSON (ddpdoctor.torch_info)
    torch_result: Optional[CommandResult] = None
    env: Mapping[str, str] = field(default_factory=dict)
    replay: bool = False


def read_nvidia_pci() -> list[dict[str, Any]]:
    """NVIDIA GPUs (vendor 0x10de, class display/3D) on the PCI bus, with or without a driver.

    Equivalent: lspci -d 10de: -nn | grep -E '\\[03'.
    """
    devices: list[dict[str, Any]] = []
    root = Path("/sys/bus/pci/devices")
    try:
        entries = sorted(root.iterdir())
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
        devices.append({"bus_id": dev.name, "class": klass, "driver": driver})
    return devices


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


def collect_gpu_base(sources: Sources) -> GpuCollected:
    """NVML (or nvidia-smi -q), topology, P2P and NVLink: the part other areas reuse."""
    c = GpuCollected(replay=not sources.is_live)
    nvml = fact_or_none(sources, NVML_FACT, gather_nvml)
    c.nvml = nvml if isinstance(nvml, dict) else None
    use_nvml = bool(c.nvml and c.nvml.get("available") and c.nvml.get("gpus"))
    if use_nvml:
        assert c.nvml is not None
        c.source = "nvml"
        c.gpus = [dict(g) for g in c.nvml.get("gpus") or []]
        c.driver_version = c.nvml.get("driver_version")
        c.cuda_driver_version = c.nvml.get("cuda_driver_version")
        c.p2p = c.nvml.get("p2p")
        c.p2p_source = "NVML nvmlDeviceGetP2PStatus"
    else:
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
        if c.nvml and c.nvml.get("available") and not c.driver_version:
            c.driver_version = c.nvml.get("driver_version")
            c.cuda_driver_version = c.nvml.get("cuda_driver_version")
    pci = fact_or_none(sources, GPU_PCI_FACT, read_nvidia_pci)
    c.pci_devices = pci if isinstance(pci, list) else None
    if not c.gpus:
        return c
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


def collect_gpu(ctx: Context) -> GpuCollected:
    c = collect_gpu_base(ctx.sources)
    c.env = dict(ctx.env)
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
        links = ((g.get("nvlink") or {}).get("links") or {}).values()
        links = list(links)
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
    if c.nvml and c.nvml.get("error"):
        error = str((c.nvml["error"] or {}).get("message"))
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
    facts = summarize(collect_gpu_base(sources))
    with _FACTS_LOCK:
        _FACTS_CACHE[sources] = facts
    return facts


# ---------------------------------------------------------------------------------------------------
# Judging (pure)


def gpu_label(gpu: Mapping[str, Any]) -> str:
    bus = gpu.get("bus_id")
    return f"GPU {gpu.get('index', '?')}" + (f" ({bus})" if bus else "")


def _source(c: GpuCollected, nvml_call: str, smi_section: str) -> str:
    if c.source == "nvml":
        return f"NVML {nvml_call}"
    return f"{NVIDIA_SMI_Q.display} ({smi_section})"


def _per_gpu(
    spec: CheckSpec,
    gpus: Iterable[Mapping[str, Any]],
    judge: Callable[[Mapping[str, Any]], Optional[tuple[Severity, str, dict[str, Any]]]],
    source: str,
    ok_text: str,
    excerpt: Callable[[Mapping[str, Any]], str],
) -> list[Finding]:
    """One finding per GPU with a problem; a single ok finding when every GPU that reported is fine."""
    findings: list[Finding] = []
    checked = 0
    for g in gpus:
        if g.get("lost"):
            continue
        verdict = judge(g)
        if verdict is None:
            continue
        checked += 1
        sev, text, data = verdict
        if sev > Severity.OK:
            findings.append(
                spec.finding(
                    sev,
                    f"{gpu_label(g)}: {text}",
                    evidence=[Evidence(source, excerpt(g))],
                    data={"gpu": g.get("index"), "bus_id": g.get("bus_id"), **data},
                )
            )
    if checked and not findings:
        findings.append(spec.finding(Severity.OK, ok_text.format(n=checked), evidence=[Evidence(source)]))
    return findings


def _version_tuple(text: Optional[str]) -> Optional[tuple[int, int]]:
    m = re.match(r"^\s*(\d+)\.(\d+)", str(text or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def judge_presence(c: GpuCollected) -> tuple[list[Finding], bool]:
    """Driver / NVML findings, and whether the per-GPU checks can go on."""
    nvml_error = (c.nvml or {}).get("error") or {}
    kind = nvml_error.get("kind")
    smi_errors = list((c.smi_parsed or {}).get("errors") or [])
    mismatch_text = next((e for e in smi_errors if "mismatch" in e.lower()), None)
    pci = c.pci_devices or []
    nvml_ev = Evidence("NVML nvmlInit", str(nvml_error.get("message") or ""))
    smi_ev = (
        Evidence(NVIDIA_SMI_Q.display, c.smi.excerpt(4) or c.smi.describe_failure())
        if c.smi is not None
        else Evidence(NVIDIA_SMI_Q.display, "not run")
    )
    if kind == "driver_mismatch" or mismatch_text:
        return [
            NVML.finding(
                Severity.FAIL,
                "NVIDIA driver/library version mismatch: the kernel module and user-space driver differ, so "
                "neither NVML nor CUDA works until the module is reloaded",
                evidence=[nvml_ev if kind == "driver_mismatch" else smi_ev],
                data={"kind": "driver_mismatch"},
            )
        ], False
    if c.gpus:
        findings = []
        if c.source == "nvidia-smi" and c.replay is False and kind:
            findings.append(
                NVML.finding(
                    Severity.WARN,
                    f"NVML cannot be used from Python ({nvml_error.get('message')}); read the GPUs with "
                    "nvidia-smi instead",
                    evidence=[nvml_ev],
                    fix="Check that libnvidia-ml.so.1 is on the loader path (ldconfig -p | grep nvidia-ml) "
                    "and readable by this user.",
                    data={"kind": kind},
                )
            )
        elif c.source == "nvml":
            findings.append(
                NVML.finding(Severity.OK, "NVML initialised", evidence=[Evidence("NVML nvmlInit")])
            )
        return findings, True
    # No GPU readings at all.
    if c.replay and c.nvml is None and (c.smi is None or not c.smi.found):
        return [
            DRIVER.finding(
                Severity.SKIP,
                "The snapshot holds neither nvml.json nor nvidia-smi-q.txt: GPU checks skipped",
                evidence=[smi_ev],
            )
        ], False
    handle_errors = [e for e in smi_errors if "device handle" in e.lower()]
    if handle_errors:
        return [
            LOST.finding(
                Severity.FAIL,
                f"nvidia-smi cannot reach a GPU: {handle_errors[0]}",
                evidence=[smi_ev],
                data={"errors": handle_errors},
            )
        ], False
    if pci:
        buses = ", ".join(d["bus_id"] for d in pci[:8])
        why = nvml_error.get("message") or (c.smi.describe_failure() if c.smi else "") or "no driver"
        return [
            DRIVER.finding(
                Severity.FAIL,
                f"{len(pci)} NVIDIA GPU(s) on the PCI bus ({buses}) but the driver cannot be used: {why}"[
                    :300
                ],
                evidence=[
                    Evidence("/sys/bus/pci/devices/*/vendor,class,driver", str(pci[:8])),
                    nvml_ev,
                    smi_ev,
                ],
                data={"pci_devices": pci, "nvml_error": nvml_error},
            )
        ], False
    if kind == "no_permission":
        return [
            NVML.finding(
                Severity.ERROR,
                f"No permission to use NVML: {nvml_error.get('message')}",
                evidence=[nvml_ev, smi_ev],
                fix="Run as a user in the group owning /dev/nvidia* (often `video`), or check the container's "
                "device cgroup.",
            )
        ], False
    no_devices = any(e.lower().startswith("no devices were found") for e in smi_errors)
    if no_devices or (c.nvml and c.nvml.get("available") and c.nvml.get("device_count") == 0):
        version = (c.nvml or {}).get("driver_version") or c.driver_version or ""
        return [
            DRIVER.finding(
                Severity.SKIP,
                f"NVIDIA driver {version} loaded but no GPU is visible: GPU checks skipped".replace(
                    "  ", " "
                ),
                evidence=[smi_ev if no_devices else Evidence("NVML nvmlDeviceGetCount", "0")],
            )
        ], False
    smi_silent = c.smi is None or not c.smi.found or not (c.smi.stdout or "").strip()
    if kind in (None, "library_not_found", "driver_not_loaded", "bindings_missing") and smi_silent:
        why = nvml_error.get("message") or "NVML not available"
        smi_why = c.smi.describe_failure() if c.smi is not None else "nvidia-smi not run"
        return [
            DRIVER.finding(
                Severity.SKIP,
                f"No NVIDIA GPU or driver on this machine ({why}; {smi_why}): GPU checks skipped",
                evidence=[nvml_ev, smi_ev, Evidence("/sys/bus/pci/devices", "no NVIDIA display/3D device")],
            )
        ], False
    output = f"{c.smi.stdout if c.smi else ''}\n{c.smi.stderr if c.smi else ''}"
    why = (
        nvml_error.get("message")
        or (c.smi.describe_failure() if c.smi else "")
        or "no GPU section in the output"
    )
    if "communicate with the nvidia driver" in output.lower():
        return [
            DRIVER.finding(
                Severity.FAIL,
                "nvidia-smi is installed but cannot communicate with the NVIDIA driver (module not loaded?)",
                evidence=[smi_ev, nvml_ev],
            )
        ], False
    return [
        DRIVER.finding(
            Severity.ERROR,
            f"Could not read the GPUs: {why}"[:300],
            evidence=[nvml_ev, smi_ev],
            fix="Run `nvidia-smi -q` by hand and look at what it says.",
        )
    ], False


def judge_inventory(c: GpuCollected) -> list[Finding]:
    names: dict[str, int] = {}
    for g in c.gpus:
        names[g.get("name") or "unknown GPU"] = names.get(g.get("name") or "unknown GPU", 0) + 1
    models = ", ".join(f"{n}x {name}" for name, n in names.items())
    text = f"{models}; driver {c.driver_version or '?'}, supports CUDA {c.cuda_driver_version or '?'}"
    src = (
        "NVML nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion"
        if c.source == "nvml"
        else NVIDIA_SMI_Q.display
    )
    return [
        INVENTORY.finding(
            Severity.INFO,
            text,
            evidence=[Evidence(src, text)],
            data={
                "count": len(c.gpus),
                "models": list(names),
                "driver_version": c.driver_version,
                "cuda_driver_version": c.cuda_driver_version,
                "source": c.source,
            },
        )
    ]


def expected_cuda_count(gpus: list[Mapping[str, Any]], raw_visible: Optional[str]) -> Optional[int]:
    """How many devices CUDA should expose given CUDA_VISIBLE_DEVICES; None when it cannot be told."""
    visible = parse_visible_devices(raw_visible)
    if not visible.is_set:
        return len(gpus)
    count = 0
    uuids = [str(g.get("uuid") or "") for g in gpus]
    for entry, kind in zip(visible.entries, visible.kinds):
        if kind == "mig":
            return None
        if kind == "index":
            if int(entry) >= len(gpus):
                break  # CUDA stops at the first entry it cannot resolve
            count += 1
        elif kind == "uuid":
            if not any(u.startswith(entry) for u in uuids):
                break
            count += 1
    return count


def judge_torch(c: GpuCollected) -> list[Finding]:
    """torch's CUDA build vs the driver's CUDA version, and torch's device count vs NVML's."""
    if c.torch is None:
        return []
    torch = c.torch.get("torch")
    if not isinstance(torch, dict):
        return []  # the torch area reports an import failure
    findings: list[Finding] = []
    build = torch.get("cuda")
    driver_cuda = c.cuda_driver_version
    src = "torch.version.cuda (python -m ddpdoctor.torch_info); driver CUDA version"
    excerpt = f"torch {torch.get('version')} built for CUDA {build}; driver {c.driver_version} supports CUDA {driver_cuda}"
    errors = c.torch.get("errors") or {}
    warning = next((str(v) for k, v in errors.items() if k.endswith(".warning")), "")
    if warning:
        excerpt += f"\n{warning}"
    data = {"torch_cuda": build, "driver_cuda": driver_cuda, "driver_version": c.driver_version}
    tb, dv = _version_tuple(build), _version_tuple(driver_cuda)
    if build is None:
        if torch.get("hip"):
            return []
        findings.append(
            CUDA_COMPAT.finding(
                Severity.FAIL,
                f"torch {torch.get('version')} is a CPU-only build on a node with {len(c.gpus)} NVIDIA GPU(s)",
                evidence=[Evidence(src, excerpt)],
                data=data,
            )
        )
    elif tb is None or dv is None:
        findings.append(
            CUDA_COMPAT.finding(
                Severity.INFO,
                f"torch built for CUDA {build}; the driver's CUDA version is unknown ({driver_cuda or 'not reported'})",
                evidence=[Evidence(src, excerpt)],
                data=data,
            )
        )
    elif tb[0] > dv[0]:
        findings.append(
            CUDA_COMPAT.finding(
                Severity.FAIL,
                f"torch is built for CUDA {build} but driver {c.driver_version} supports only CUDA {driver_cuda}: "
                "torch cannot use the GPUs",
                evidence=[Evidence(src, excerpt)],
                data=data,
            )
        )
    elif tb[0] == dv[0] and tb[1] > dv[1]:
        findings.append(
            CUDA_COMPAT.finding(
                Severity.WARN,
                f"torch is built for CUDA {build}, newer than the driver's CUDA {driver_cuda}: runs through "
                "minor-version compatibility, but PTX JIT and some features fail",
                evidence=[Evidence(src, excerpt)],
                data=data,
            )
        )
    else:
        findings.append(
            CUDA_COMPAT.finding(
                Severity.OK,
                f"torch CUDA {build} <= driver CUDA {driver_cuda}",
                evidence=[Evidence(src, excerpt)],
                data=data,
            )
        )
    if build is None:
        return findings
    if any((g.get("mig_mode") or {}).get("current") for g in c.gpus):
        return findings  # CUDA enumerates MIG instances, not GPUs: counts are not comparable
    raw = c.env.get("CUDA_VISIBLE_DEVICES")
    expected = expected_cuda_count(c.gpus, raw)
    count = torch.get("device_count")
    cvd = f"CUDA_VISIBLE_DEVICES={raw!r}" if raw is not None else "CUDA_VISIBLE_DEVICES unset"
    ev = [
        Evidence(
            "torch.cuda.device_count(); NVML device count", f"torch: {count}; GPUs: {len(c.gpus)}; {cvd}"
        )
    ]
    cdata = {
        "torch_count": count,
        "nvml_count": len(c.gpus),
        "expected": expected,
        "cuda_visible_devices": raw,
    }
    if expected is None or count is None:
        return findings
    if count != expected:
        why = f": {warning}" if warning and count == 0 else ""
        findings.append(
            TORCH_COUNT.finding(
                Severity.FAIL,
                f"torch sees {count} GPU(s) but {expected} should be visible ({len(c.gpus)} on the node, {cvd}){why}"[
                    :300
                ],
                evidence=ev,
                data=cdata,
            )
        )
    else:
        findings.append(
            TORCH_COUNT.finding(
                Severity.OK, f"torch sees {count} GPU(s), as expected ({cvd})", evidence=ev, data=cdata
            )
        )
    return findings


def judge_lost(c: GpuCollected) -> list[Finding]:
    findings = []
    for g in c.gpus:
        if g.get("lost"):
            findings.append(
                LOST.finding(
                    Severity.FAIL,
                    f"{gpu_label(g)} is lost or needs a reset: {g.get('error') or 'no readings'}",
                    evidence=[Evidence("NVML", str(g.get("error") or ""))],
                    data={"gpu": g.get("index"), "bus_id": g.get("bus_id")},
                )
            )
        elif g.get("errors"):
            errs = g["errors"]
            findings.append(
                READINGS.finding(
                    Severity.WARN,
                    f"{gpu_label(g)}: {len(errs)} reading(s) failed ({', '.join(sorted(errs)[:5])})",
                    evidence=[Evidence("NVML", "\n".join(f"{k}: {v}" for k, v in sorted(errs.items())[:10]))],
                    data={"gpu": g.get("index"), "errors": dict(errs)},
                )
            )
    return findings


def _ecc_excerpt(g: Mapping[str, Any]) -> str:
    ecc = g.get("ecc") or {}
    v, a = ecc.get("volatile") or {}, ecc.get("aggregate") or {}
    return (
        f"volatile correctable={v.get('correctable')} uncorrectable={v.get('uncorrectable')}; "
        f"aggregate correctable={a.get('correctable')} uncorrectable={a.get('uncorrectable')}"
    )


def judge_ecc(c: GpuCollected) -> list[Finding]:
    src = _source(c, "nvmlDeviceGetTotalEccErrors", "ECC Errors")

    def uncorrectable(g: Mapping[str, Any]):
        ecc = g.get("ecc") or {}
        vol = (ecc.get("volatile") or {}).get("uncorrectable")
        agg = (ecc.get("aggregate") or {}).get("uncorrectable")
        if vol is None and agg is None:
            return None
        data = {"volatile": vol, "aggregate": agg}
        if vol:
            return Severity.FAIL, f"{vol} uncorrectable ECC error(s) since the last reset", data
        if agg:
            sev = Severity.WARN
            return (
                sev,
                f"{agg} uncorrectable ECC error(s) in the GPU's lifetime (none since the last reset)",
                data,
            )
        return Severity.OK, "", data

    def correctable(g: Mapping[str, Any]):
        vol = ((g.get("ecc") or {}).get("volatile") or {}).get("correctable")
        if vol is None:
            return None
        if vol >= ECC_CORRECTABLE_WARN:
            return Severity.WARN, f"{vol} corrected ECC errors since the last reset", {"volatile": vol}
        if vol:
            return Severity.INFO, f"{vol} corrected ECC error(s) since the last reset", {"volatile": vol}
        return Severity.OK, "", {"volatile": vol}

    def mode(g: Mapping[str, Any]):
        m = g.get("ecc_mode") or {}
        cur, pend = m.get("current"), m.get("pending")
        if cur is None:
            return None
        if pend is not None and pend != cur:
            return (
                Severity.WARN,
                f"ECC is {'on' if cur else 'off'} but {'on' if pend else 'off'} is pending a reset",
                {"current": cur, "pending": pend},
            )
        if cur is False:
            return Severity.INFO, "ECC is disabled (memory errors go undetected)", {"current": cur}
        return Severity.OK, "", {"current": cur}

    findings = _per_gpu(
        ECC_UNCORRECTABLE,
        c.gpus,
        uncorrectable,
        src,
        "No uncorrectable ECC errors on {n} GPU(s)",
        _ecc_excerpt,
    )
    findings += _per_gpu(
        ECC_CORRECTABLE, c.gpus, correctable, src, "No corrected ECC errors on {n} GPU(s)", _ecc_excerpt
    )
    findings += _per_gpu(
        ECC_MODE,
        c.gpus,
        mode,
        _source(c, "nvmlDeviceGetEccMode", "ECC Mode"),
        "ECC enabled on {n} GPU(s)",
        lambda g: (
            f"current={(g.get('ecc_mode') or {}).get('current')} pending={(g.get('ecc_mode') or {}).get('pending')}"
        ),
    )
    return findings


def judge_memory_repair(c: GpuCollected) -> list[Finding]:
    def retired(g: Mapping[str, Any]):
        rp = g.get("retired_pages") or {}
        if rp.get("pending") is None and rp.get("double_bit") is None:
            return None
        if rp.get("pending"):
            return Severity.FAIL, "page retirement pending: reset the GPU to retire the bad pages", dict(rp)
        if (rp.get("double_bit") or 0) + (rp.get("single_bit") or 0) >= 60:
            return (
                Severity.WARN,
                f"{rp.get('double_bit')} double-bit and {rp.get('single_bit')} single-bit pages retired",
                dict(rp),
            )
        return Severity.OK, "", dict(rp)

    def pending(g: Mapping[str, Any]):
        rr = g.get("remapped_rows") or {}
        if rr.get("pending") is None:
            return None
        if rr["pending"]:
            return (
                Severity.FAIL,
                f"row remapping pending a GPU reset (correctable rows {rr.get('correctable')}, uncorrectable "
                f"rows {rr.get('uncorrectable')})",
                dict(rr),
            )
        return Severity.OK, "", dict(rr)

    def failure(g: Mapping[str, Any]):
        rr = g.get("remapped_rows") or {}
        if rr.get("failure") is None:
            return None
        if rr["failure"]:
            return Severity.FAIL, "row remapping failed: the memory cannot be repaired (RMA)", dict(rr)
        return Severity.OK, "", dict(rr)

    def reset(g: Mapping[str, Any]):
        req, drain = g.get("reset_required"), g.get("drain_and_reset_recommended")
        if req is None and drain is None:
            return None
        if req:
            return Severity.FAIL, "the driver says a GPU reset is required", {"reset_required": req}
        if drain:
            return Severity.WARN, "the driver recommends draining and resetting the GPU", {"drain": drain}
        return Severity.OK, "", {}

    def rr_excerpt(g: Mapping[str, Any]) -> str:
        rr = g.get("remapped_rows") or {}
        return (
            f"Remapped Rows: Correctable Error {rr.get('correctable')}, Uncorrectable Error {rr.get('uncorrectable')}, "
            f"Pending {rr.get('pending')}, Remapping Failure Occurred {rr.get('failure')}"
        )

    rr_src = _source(c, "nvmlDeviceGetRemappedRows", "Remapped Rows")
    findings = _per_gpu(
        RETIRED_PAGES,
        c.gpus,
        retired,
        _source(c, "nvmlDeviceGetRetiredPages", "Retired Pages"),
        "No page retirement pending on {n} GPU(s)",
        lambda g: str(g.get("retired_pages")),
    )
    findings += _per_gpu(
        REMAP_PENDING, c.gpus, pending, rr_src, "No row remapping pending on {n} GPU(s)", rr_excerpt
    )
    findings += _per_gpu(
        REMAP_FAILURE, c.gpus, failure, rr_src, "No row remapping failure on {n} GPU(s)", rr_excerpt
    )
    findings += _per_gpu(
        RESET_REQUIRED,
        c.gpus,
        reset,
        _source(c, "nvmlDeviceGetGpuRecoveryAction", "GPU Reset Status"),
        "No GPU reset required on {n} GPU(s)",
        lambda g: (
            f"Reset Required {g.get('reset_required')}, Drain and Reset Recommended {g.get('drain_and_reset_recommended')}"
        ),
    )
    return findings


def _bus_key(bus: Optional[str]) -> Optional[str]:
    return normalize_bus_id(bus)


def judge_pcie(c: GpuCollected, limited: list[Mapping[str, Any]]) -> list[Finding]:
    src = _source(c, "nvmlDeviceGetCurrPcieLinkWidth/MaxPcieLinkWidth", "PCI > GPU Link Info")

    def pcie_excerpt(g: Mapping[str, Any]) -> str:
        p = g.get("pcie") or {}
        return (
            f"PCIe Generation Current {p.get('gen_current')} Max {p.get('gen_max')} (device {p.get('gen_device_max')}, "
            f"host {p.get('gen_host_max')}); Link Width Current {p.get('width_current')}x Max {p.get('width_max')}x; "
            f"Replays Since Reset {p.get('replays')}"
        )

    def width(g: Mapping[str, Any]):
        p = g.get("pcie") or {}
        cur, mx = p.get("width_current"), p.get("width_max")
        if cur is None or mx is None:
            return None
        if cur < mx:
            return (
                Severity.FAIL,
                f"PCIe link runs at x{cur}, below its x{mx} maximum",
                {"current": cur, "max": mx},
            )
        return Severity.OK, "", {"current": cur, "max": mx}

    def gen(g: Mapping[str, Any]):
        p = g.get("pcie") or {}
        cur, mx = p.get("gen_current"), p.get("gen_max")
        dev, host = p.get("gen_device_max"), p.get("gen_host_max")
        util = (g.get("utilization") or {}).get("gpu_percent")
        if cur is None or mx is None:
            return None
        data = {"current": cur, "max": mx, "device_max": dev, "host_max": host, "utilization": util}
        if dev is not None and host is not None and host < dev:
            return Severity.WARN, f"the host slot supports PCIe gen {host}, below the GPU's gen {dev}", data
        if cur < mx and util is not None and util >= PCIE_GEN_LOAD_PERCENT:
            return (
                Severity.WARN,
                f"PCIe gen {cur} under load ({util}% busy), below its gen {mx} maximum",
                data,
            )
        if cur < mx:
            return Severity.OK, "", data  # idle GPUs downshift; not a finding
        return Severity.OK, "", data

    def replays(g: Mapping[str, Any]):
        p = g.get("pcie") or {}
        n, roll = p.get("replays"), p.get("replay_rollovers")
        if n is None:
            return None
        if (roll or 0) > 0 or n >= PCIE_REPLAY_WARN:
            extra = f" ({roll} counter rollovers)" if roll else ""
            return (
                Severity.WARN,
                f"{n} PCIe replays since the last reset{extra}",
                {"replays": n, "rollovers": roll},
            )
        return Severity.OK, "", {"replays": n}

    findings = _per_gpu(
        PCIE_WIDTH, c.gpus, width, src, "PCIe link width at maximum on {n} GPU(s)", pcie_excerpt
    )
    findings += _per_gpu(
        PCIE_GEN,
        c.gpus,
        gen,
        _source(c, "nvmlDeviceGetCurrPcieLinkGeneration", "PCIe Generation"),
        "PCIe generation fine on {n} GPU(s) (idle GPUs downshift; judged under load only)",
        pcie_excerpt,
    )
    findings += _per_gpu(
        PCIE_REPLAYS,
        c.gpus,
        replays,
        _source(c, "nvmlDeviceGetPcieReplayCounter", "Replays Since Reset"),
        f"Fewer than {PCIE_REPLAY_WARN} PCIe replays on {{n}} GPU(s)",
        pcie_excerpt,
    )
    gpu_buses = {_bus_key(g.get("bus_id")): g for g in c.gpus}
    for entry in limited:
        gpu = gpu_buses.get(_bus_key(entry.get("device")))
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


def judge_clocks_and_limits(c: GpuCollected) -> list[Finding]:
    def throttle(g: Mapping[str, Any]):
        reasons = g.get("throttle_reasons") or {}
        if not reasons:
            return None
        active = [r for r, on in reasons.items() if on and r in HARMFUL_THROTTLE]
        if not active:
            return Severity.OK, "", {"active": [r for r, on in reasons.items() if on]}
        sev = max(HARMFUL_THROTTLE[r] for r in active)
        return sev, "clocks slowed by " + ", ".join(r.replace("_", " ") for r in active), {"active": active}

    def temperature(g: Mapping[str, Any]):
        t = g.get("temperature") or {}
        cur, slow, headroom = t.get("gpu_c"), t.get("slowdown_c"), t.get("t_limit_c")
        if cur is None:
            return None
        data = {"gpu_c": cur, "slowdown_c": slow, "t_limit_c": headroom}
        if slow is not None and slow > 0 and cur >= slow - TEMP_MARGIN_C:
            return (
                Severity.WARN,
                f"{cur} C, within {TEMP_MARGIN_C} C of the {slow} C slowdown temperature",
                data,
            )
        if headroom is not None and headroom <= TEMP_MARGIN_C:
            return Severity.WARN, f"{cur} C, only {headroom} C below the T.Limit", data
        return Severity.OK, "", data

    def power(g: Mapping[str, Any]):
        p = g.get("power") or {}
        lim, default = p.get("limit_w"), p.get("default_limit_w")
        if lim is None or default is None or default <= 0:
            return None
        data = {"limit_w": lim, "default_limit_w": default, "draw_w": p.get("draw_w")}
        if lim < default * POWER_LIMIT_LOWERED_RATIO:
            return Severity.WARN, f"power limit {lim:g} W, below the default {default:g} W", data
        return Severity.OK, "", data

    findings = _per_gpu(
        THROTTLE,
        c.gpus,
        throttle,
        _source(c, "nvmlDeviceGetCurrentClocksEventReasons", "Clocks Event/Throttle Reasons"),
        "No hardware or thermal clock slowdown on {n} GPU(s)",
        lambda g: ", ".join(
            f"{k}={'Active' if v else 'Not Active'}" for k, v in (g.get("throttle_reasons") or {}).items()
        ),
    )
    findings += _per_gpu(
        TEMPERATURE,
        c.gpus,
        temperature,
        _source(c, "nvmlDeviceGetTemperature", "Temperature"),
        "Temperatures well below slowdown on {n} GPU(s)",
        lambda g: str(g.get("temperature")),
    )
    findings += _per_gpu(
        POWER_LIMIT,
        c.gpus,
        power,
        _source(c, "nvmlDeviceGetEnforcedPowerLimit", "Power Readings"),
        "Power limits at default on {n} GPU(s)",
        lambda g: str(g.get("power")),
    )
    off = [g for g in c.gpus if g.get("persistence_mode") is False and not g.get("lost")]
    if off:
        findings.append(
            PERSISTENCE.finding(
                Severity.INFO,
                f"Persistence mode is off on {len(off)} GPU(s): {', '.join(str(g.get('index')) for g in off)}",
                evidence=[
                    Evidence(_source(c, "nvmlDeviceGetPersistenceMode", "Persistence Mode"), "Disabled")
                ],
                data={"gpus": [g.get("index") for g in off]},
            )
        )
    elif any(g.get("persistence_mode") for g in c.gpus):
        findings.append(
            PERSISTENCE.finding(
                Severity.OK,
                "Persistence mode on",
                evidence=[Evidence(_source(c, "nvmlDeviceGetPersistenceMode", "Persistence Mode"))],
            )
        )
    return findings


def _local_world_size(env: Mapping[str, str]) -> Optional[int]:
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        try:
            value = int(str(env.get(name, "")).split("(")[0])
        except ValueError:
            continue
        if value > 0:
            return value
    return None


def judge_sharing(c: GpuCollected) -> list[Finding]:
    """Compute mode vs ranks sharing a GPU, MIG, and other processes on the GPUs."""
    findings: list[Finding] = []
    live = [g for g in c.gpus if not g.get("lost")]
    ranks = _local_world_size(c.env)
    visible = expected_cuda_count(c.gpus, c.env.get("CUDA_VISIBLE_DEVICES")) or len(live)
    sharing = ranks is not None and visible and ranks > visible
    src = _source(c, "nvmlDeviceGetComputeMode", "Compute Mode")
    for g in live:
        mode = g.get("compute_mode")
        if mode == "Prohibited":
            findings.append(
                COMPUTE_MODE.finding(
                    Severity.FAIL,
                    f"{gpu_label(g)}: compute mode Prohibited: no process can use this GPU",
                    evidence=[Evidence(src, f"Compute Mode: {mode}")],
                    data={"gpu": g.get("index"), "mode": mode},
                )
            )
        elif mode in ("Exclusive_Process", "Exclusive_Thread"):
            if sharing:
                sev = Severity.FAIL
                text = f"compute mode {mode} but {ranks} local ranks share {visible} GPU(s): all but one will fail"
            else:
                sev = Severity.WARN
                text = f"compute mode {mode}: one process per GPU only (fine for one rank per GPU; anything sharing it fails)"
            findings.append(
                COMPUTE_MODE.finding(
                    sev,
                    f"{gpu_label(g)}: {text}",
                    evidence=[Evidence(src, f"Compute Mode: {mode}; LOCAL_WORLD_SIZE={ranks}")],
                    data={"gpu": g.get("index"), "mode": mode, "local_ranks": ranks},
                )
            )
    if not findings and any(g.get("compute_mode") for g in live):
        findings.append(
            COMPUTE_MODE.finding(Severity.OK, "Compute mode Default on all GPUs", evidence=[Evidence(src)])
        )
    mig_src = _source(c, "nvmlDeviceGetMigMode", "MIG Mode")
    for g in live:
        mig = g.get("mig_mode") or {}
        if mig.get("current"):
            findings.append(
                MIG.finding(
                    Severity.WARN,
                    f"{gpu_label(g)}: MIG is enabled: NCCL cannot use NVLink/P2P between MIG instances",
                    evidence=[
                        Evidence(mig_src, f"current={mig.get('current')} pending={mig.get('pending')}")
                    ],
                    data={"gpu": g.get("index"), **mig},
                )
            )
        elif mig.get("pending"):
            findings.append(
                MIG.finding(
                    Severity.WARN,
                    f"{gpu_label(g)}: MIG is off but enabling it is pending a GPU reset",
                    evidence=[
                        Evidence(mig_src, f"current={mig.get('current')} pending={mig.get('pending')}")
                    ],
                    data={"gpu": g.get("index"), **mig},
                )
            )
    proc_src = _source(c, "nvmlDeviceGetComputeRunningProcesses", "Processes")
    own = {os.getpid()}
    busy = []
    for g in live:
        for p in g.get("processes") or []:
            if p.get("pid") in own:
                continue
            busy.append((g, p))
    if busy:
        lines = [
            f"{gpu_label(g)}: pid {p.get('pid')} {p.get('name') or '?'}"
            + (f" (user {p['user']})" if p.get("user") else "")
            + (f" {p.get('used_memory_mib')} MiB" if p.get("used_memory_mib") is not None else "")
            for g, p in busy
        ]
        findings.append(
            PROCESSES.finding(
                Severity.WARN,
                f"{len(busy)} process(es) already on the GPUs: "
                + "; ".join(lines[:4])
                + (" ..." if len(lines) > 4 else ""),
                evidence=[Evidence(proc_src, "\n".join(lines[:20]))],
                data={
                    "processes": [
                        {
                            "gpu": g.get("index"),
                            **{k: p.get(k) for k in ("pid", "name", "user", "used_memory_mib", "type")},
                        }
                        for g, p in busy
                    ]
                },
            )
        )
    elif any(g.get("processes") is not None for g in live):
        findings.append(
            PROCESSES.finding(Severity.OK, "No other process on the GPUs", evidence=[Evidence(proc_src)])
        )
    return findings


def judge_nvlink(c: GpuCollected) -> list[Finding]:
    findings: list[Finding] = []
    src = c.nvlink_source or "nvidia-smi nvlink"
    any_links = False
    for g in c.gpus:
        nv = g.get("nvlink") or {}
        links = nv.get("links") or {}
        if not links:
            continue
        any_links = True
        inactive = sorted((k for k, x in links.items() if x.get("active") is False), key=int)
        active = [k for k, x in links.items() if x.get("active")]
        if inactive and active:
            findings.append(
                NVLINK_INACTIVE.finding(
                    Severity.FAIL,
                    f"{gpu_label(g)}: NVLink link(s) {', '.join(inactive)} inactive ({len(active)} of {len(links)} up)",
                    evidence=[Evidence(src, ", ".join(f"Link {k}: <inactive>" for k in inactive))],
                    data={"gpu": g.get("index"), "inactive": inactive, "active": len(active)},
                )
            )
        elif inactive and not active:
            # Every link down: on an NVLink board that is a fault, on a PCIe card NVML lists no links at all.
            findings.append(
                NVLINK_INACTIVE.finding(
                    Severity.FAIL,
                    f"{gpu_label(g)}: all {len(inactive)} NVLink links are inactive",
                    evidence=[Evidence(src, f"{len(inactive)} links <inactive>")],
                    data={"gpu": g.get("index"), "inactive": inactive, "active": 0},
                )
            )
        noisy = {}
        for k, x in links.items():
            errs = {name: n for name, n in (x.get("errors") or {}).items() if n}
            if errs:
                noisy[k] = errs
        if noisy:
            recovery = any("recovery" in e for e in noisy.values())
            text = "; ".join(
                f"link {k}: " + ", ".join(f"{n} {name}" for name, n in e.items())
                for k, e in sorted(noisy.items(), key=lambda kv: int(kv[0]))
            )
            findings.append(
                NVLINK_ERRORS.finding(
                    Severity.WARN,
                    f"{gpu_label(g)}: NVLink errors: {text}"[:300]
                    + (" (recoveries stall traffic)" if recovery else ""),
                    evidence=[Evidence(src, text)],
                    data={"gpu": g.get("index"), "errors": noisy},
                )
            )
    if any_links and not any(f.id == NVLINK_INACTIVE.id for f in findings):
        findings.append(
            NVLINK_INACTIVE.finding(Severity.OK, "All NVLink links active", evidence=[Evidence(src)])
        )
    counters_known = any(
        (x.get("errors") or {}) for g in c.gpus for x in ((g.get("nvlink") or {}).get("links") or {}).values()
    )
    if counters_known and not any(f.id == NVLINK_ERRORS.id for f in findings):
        findings.append(
            NVLINK_ERRORS.finding(Severity.OK, "No NVLink error counts", evidence=[Evidence(src)])
        )

    def fabric(g: Mapping[str, Any]):
        f = g.get("fabric") or {}
        state, status = f.get("state"), f.get("status")
        if state is None:
            return None
        if state.lower() != "completed":
            return (
                Severity.FAIL,
                f"NVSwitch fabric state {state!r}: CUDA fails with error 802 until it completes",
                dict(f),
            )
        if status and status.lower() != "success":
            return Severity.FAIL, f"NVSwitch fabric registration failed: {status}", dict(f)
        return Severity.OK, "", dict(f)

    findings += _per_gpu(
        FABRIC,
        c.gpus,
        fabric,
        _source(c, "nvmlDeviceGetGpuFabricInfo", "Fabric"),
        "NVSwitch fabric completed on {n} GPU(s)",
        lambda g: (
            f"Fabric State {(g.get('fabric') or {}).get('state')}, Status {(g.get('fabric') or {}).get('status')}"
        ),
    )
    return findings


def judge_topology(c: GpuCollected) -> list[Finding]:
    from ddpdoctor.render.gpu import topology_text

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
                evidence=[Evidence(f"{TOPO_M.display} (compact)", topology_text(topo))],
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
    p2p = c.p2p
    if p2p and p2p.get("gpus"):
        names = list(p2p["gpus"])
        matrix = p2p.get("matrix") or {}
        bad = []
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                code = (matrix.get(a) or {}).get(b)
                if code and code not in ("OK", "X"):
                    bad.append((a, b, code))
        legend = dict(p2p.get("legend") or {}) or {
            "CNS": "chipset not supported",
            "GNS": "GPU not supported",
            "TNS": "topology not supported",
            "NS": "not supported",
            "DR": "disabled by regkey",
            "U": "unknown",
        }
        src = c.p2p_source or TOPO_P2P.display
        if bad:
            shown = "; ".join(f"{a}-{b} {code}" for a, b, code in bad[:6])
            findings.append(
                P2P.finding(
                    Severity.WARN,
                    f"{len(bad)} GPU pair(s) without peer-to-peer access: {shown}"
                    + (" ..." if len(bad) > 6 else ""),
                    evidence=[
                        Evidence(
                            src,
                            "\n".join(
                                f"{a}-{b}: {code} ({legend.get(code, code)})" for a, b, code in bad[:20]
                            ),
                        )
                    ],
                    data={"pairs": [{"a": a, "b": b, "status": code} for a, b, code in bad]},
                )
            )
        elif len(names) > 1:
            findings.append(
                P2P.finding(
                    Severity.OK, "Peer-to-peer access OK between all GPU pairs", evidence=[Evidence(src)]
                )
            )
    return findings


def judge_dmesg(c: GpuCollected) -> tuple[list[Finding], list[Mapping[str, Any]]]:
    """Xid and fallen-off-the-bus findings, and the PCIe "limited by" entries for judge_pcie."""
    result = c.dmesg
    if result is None:
        return [], []
    if (
        not result.found
        or result.timed_out
        or (result.returncode not in (0, None) and not result.stdout.strip())
    ):
        why = result.describe_failure() or "no output"
        if "not permitted" in (result.stderr + why).lower() or "permission" in (result.stderr + why).lower():
            why = f"not permitted (kernel.dmesg_restrict=1?): {why}"
        return [
            DMESG_UNREADABLE.finding(
                Severity.SKIP,
                f"Kernel log not readable, Xid events not checked: {why}"[:300],
                evidence=[Evidence(DMESG.display, (result.stderr.strip() or why)[:400])],
            )
        ], []
    parsed = parse_dmesg(result.stdout)
    findings: list[Finding] = []
    by_bus = {_bus_key(g.get("bus_id")): g for g in c.gpus}
    groups: dict[tuple[int, Optional[str]], list[Mapping[str, Any]]] = {}
    for x in parsed["xids"]:
        groups.setdefault((x["code"], x["bus_id"]), []).append(x)
    for (code, bus), events in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        info = XID_TABLE.get(code)
        sev = Severity.parse(info.severity) if info else Severity.WARN
        gpu = by_bus.get(bus)
        who = gpu_label(gpu) if gpu else f"GPU at {bus}"
        meaning = info.meaning if info else "unlisted Xid (see NVIDIA's Xid table)"
        findings.append(
            XID.finding(
                sev,
                f"{who}: Xid {code} x{len(events)}: {meaning}"[:300],
                evidence=[Evidence(DMESG.display, "\n".join(str(e["line"]) for e in events[-3:]))],
                fix=info.action if info else None,
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


def check_gpu(c: GpuCollected) -> list[Finding]:
    findings, go_on = judge_presence(c)
    dmesg_findings, limited = judge_dmesg(c)
    if not go_on:
        # Kernel-log evidence still helps explain a missing or broken driver (Xid 79, fallen off the bus).
        return findings + [f for f in dmesg_findings if f.severity > Severity.OK]
    findings += judge_inventory(c)
    findings += judge_lost(c)
    findings += judge_torch(c)
    findings += judge_ecc(c)
    findings += judge_memory_repair(c)
    findings += judge_pcie(c, limited)
    findings += judge_clocks_and_limits(c)
    findings += judge_sharing(c)
    findings += judge_nvlink(c)
    findings += judge_topology(c)
    findings += dmesg_findings
    return findings


AREA = Area(name="gpu", title="GPUs", collect=collect_gpu, judge=check_gpu, order=30)
