"""GPUs: driver and NVML, torch's CUDA build vs the driver, per-GPU health, NVLink, topology, Xids.

Facts come from NVML first (`ddpdoctor.edge.nvml`, stored as the `nvml` snapshot fact); `nvidia-smi -q` is
the fallback when NVML cannot be used and the replay source: a snapshot directory holding only
`nvidia-smi-q.txt` is enough for the per-GPU checks. Both give per-GPU dicts of the same shape
(docs/parse.md), judged by the same pure functions.

The modules, by what they judge: `collect` (the I/O edge: commands, facts, `read_gpu_facts`), `driver`
(driver, NVML, torch's CUDA build and device count), `health` (each GPU's memory, PCIe link, clocks,
temperature, power), `sharing` (compute mode, MIG, other processes), `interconnect` (NVLink, NVSwitch
fabric, topology, P2P, closest NIC) and `kernel_log` (Xid, fallen off the bus, PCIe limited); `per_gpu`
holds what they share.

Other areas reuse `read_gpu_facts(sources)` -> `GpuFacts` (model, count, driver, CUDA driver version,
compute modes, NVLink and PCIe state, topology).
"""

from __future__ import annotations

from ddpdoctor.checks.gpu.collect import (
    DMESG,
    NVIDIA_SMI_Q,
    NVLINK_E,
    NVLINK_S,
    TOPO_M,
    TOPO_P2P,
    GpuCollected,
    GpuFacts,
    GpuInfo,
    collect_gpu,
    collect_gpu_base,
    read_gpu_facts,
)
from ddpdoctor.checks.gpu.driver import judge_inventory, judge_presence, judge_torch
from ddpdoctor.checks.gpu.health import (
    CLOCK_CHECKS,
    MEMORY_CHECKS,
    PCIE_CHECKS,
    judge_lost,
    judge_persistence,
)
from ddpdoctor.checks.gpu.interconnect import FABRIC_CHECK, judge_nvlink, judge_topology
from ddpdoctor.checks.gpu.kernel_log import judge_dmesg, judge_pcie_limited
from ddpdoctor.checks.gpu.per_gpu import gpu_label, run_per_gpu
from ddpdoctor.checks.gpu.sharing import judge_local_ranks, judge_sharing
from ddpdoctor.core.engine import Area
from ddpdoctor.core.model import Finding, Severity
from ddpdoctor.core.visible_devices import expected_cuda_count

__all__ = [
    "AREA",
    "DMESG",
    "NVIDIA_SMI_Q",
    "NVLINK_E",
    "NVLINK_S",
    "TOPO_M",
    "TOPO_P2P",
    "GpuCollected",
    "GpuFacts",
    "GpuInfo",
    "check_gpu",
    "collect_gpu",
    "collect_gpu_base",
    "expected_cuda_count",
    "gpu_label",
    "read_gpu_facts",
]


def check_gpu(c: GpuCollected) -> list[Finding]:
    """Every GPU finding, in report order: driver, inventory, per-GPU health, sharing, interconnect, kernel log."""
    findings, go_on = judge_presence(c)
    dmesg_findings, limited = judge_dmesg(c)
    if not go_on:
        # Kernel-log evidence still helps explain a missing or broken driver (Xid 79, fallen off the bus).
        # Ranks per node still get their verdict: a skip saying why the GPUs cannot be judged here.
        return findings + judge_local_ranks(c) + [f for f in dmesg_findings if f.severity > Severity.OK]
    findings += judge_inventory(c)
    findings += judge_lost(c)
    findings += judge_torch(c)
    findings += run_per_gpu(MEMORY_CHECKS + PCIE_CHECKS, c)
    findings += judge_pcie_limited(c, limited)
    findings += run_per_gpu(CLOCK_CHECKS, c)
    findings += judge_persistence(c)
    findings += judge_sharing(c)
    findings += judge_nvlink(c)
    findings += run_per_gpu([FABRIC_CHECK], c)
    findings += judge_topology(c)
    findings += dmesg_findings
    return findings


AREA = Area(name="gpu", title="GPUs", collect=collect_gpu, judge=check_gpu, order=30)
