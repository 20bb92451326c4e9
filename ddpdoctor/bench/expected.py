"""What all_reduce bus bandwidth is normal for an interconnect ("is this number normal?").

Ranges are for large messages (>= 1 GiB, where busbw plateaus) on healthy, well-configured systems.
Each entry says where its numbers come from: a measurement reported publicly (`reported`), or the
link's line rate times the efficiency NCCL reaches (`derived`: NCCL's protocol overhead is about
20%, per the NCCL maintainer in NVIDIA/nccl-tests#212). Line rates are unidirectional, per GPU (or
per NIC): that is what busbw is comparable to (nccl-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

# NCCL reaches ~80% of NVLink/PCIe/IB line rate with its ring/tree protocols; less is a problem,
# more is only possible with in-network reduction (NVLink SHARP, "NVLS", on NVLink4 NVSwitch systems).
EFFICIENCY_LOW = 0.65
EFFICIENCY_HIGH = 0.85


@dataclass(frozen=True)
class Interconnect:
    """The slowest link an all_reduce crosses, per GPU (unidirectional GB/s)."""

    kind: str  # "nvlink", "pcie", "ib"
    label: str  # e.g. "NVLink 12 links x 25 GB/s"
    line_rate_gbps: float  # GB/s (bytes), unidirectional, per GPU or per NIC
    links: int = 0
    gpu_name: str = ""
    pcie_gen: Optional[int] = None
    pcie_width: Optional[int] = None
    nics: int = 0


@dataclass(frozen=True)
class ExpectedRange:
    low: float
    high: float
    basis: str  # "reported" or "derived"
    note: str
    sources: tuple[str, ...]
    metric: str = "all_reduce busbw"  # what the range is for (one GPU: the out-of-place ops' algbw)

    def to_dict(self) -> dict[str, object]:
        return {
            "low": self.low,
            "high": self.high,
            "basis": self.basis,
            "note": self.note,
            "sources": list(self.sources),
            "metric": self.metric,
        }


@dataclass(frozen=True)
class TableEntry:
    """A row of the documented table (docs/bench.md renders the same rows)."""

    name: str
    kind: str
    match_links: Optional[int]  # NVLink links per GPU
    line_rate_gbps: float
    low: float
    high: float
    basis: str
    sources: tuple[str, ...]
    gpu_pattern: str = ""  # regex on the GPU name, where the link count alone is ambiguous


TABLE: tuple[TableEntry, ...] = (
    TableEntry(
        "NVLink4, 18 links (H100/H200 SXM, NVSwitch), 8 GPUs",
        "nvlink",
        18,
        450.0,
        360.0,
        490.0,
        "reported",
        (
            "NVIDIA/nccl-tests#212: maintainer: ~370 GB/s busbw with ring, peak ~480 GB/s with NVLink SHARP on 8 GPUs",
            "NVIDIA/nccl-tests#272: 8x H200, all_reduce peak 475 GB/s",
        ),
    ),
    TableEntry(
        "NVLink4, 8 links (H800 SXM), 8 GPUs",
        "nvlink",
        8,
        200.0,
        150.0,
        220.0,
        "reported",
        ("NVIDIA/nccl#1374: 8x H800 all_reduce busbw 215 GB/s",),
        gpu_pattern=r"H800|H20\b",
    ),
    TableEntry(
        "NVLink3, 12 links (A100 SXM, NVSwitch), 8 GPUs",
        "nvlink",
        12,
        300.0,
        190.0,
        240.0,
        "reported",
        (
            "NVIDIA/nccl-tests#149: 8x A100-SXM4-80GB (HPE Apollo 6500), busbw ~200 GB/s",
            "NVIDIA/nccl-tests#178: A100 pair over NV12, busbw 208 GB/s",
        ),
    ),
    TableEntry(
        "NVLink2, 6 links (V100 SXM2)",
        "nvlink",
        6,
        150.0,
        150.0 * EFFICIENCY_LOW,
        150.0 * EFFICIENCY_HIGH,
        "derived",
        ("NVIDIA V100 datasheet: 300 GB/s NVLink bidirectional (6 links x 25 GB/s per direction)",),
    ),
    TableEntry(
        "PCIe Gen3 x16",
        "pcie",
        None,
        15.75,
        15.75 * EFFICIENCY_LOW,
        15.75 * EFFICIENCY_HIGH,
        "derived",
        (
            "PCI-SIG: 8 GT/s x16 with 128b/130b = 15.75 GB/s per direction",
            "shared/fixtures all_reduce_perf 2x RTX 2080 Ti without P2P: 4.0 GB/s (a slow, host-staged path)",
        ),
    ),
    TableEntry(
        "PCIe Gen4 x16",
        "pcie",
        None,
        31.5,
        31.5 * EFFICIENCY_LOW,
        31.5 * EFFICIENCY_HIGH,
        "derived",
        ("PCI-SIG: 16 GT/s x16 = 31.5 GB/s per direction",),
    ),
    TableEntry(
        "PCIe Gen5 x16",
        "pcie",
        None,
        63.0,
        63.0 * EFFICIENCY_LOW,
        63.0 * EFFICIENCY_HIGH,
        "derived",
        ("PCI-SIG: 32 GT/s x16 = 63 GB/s per direction",),
    ),
    TableEntry(
        "InfiniBand EDR 100 Gb/s, per NIC",
        "ib",
        None,
        12.5,
        12.5 * 0.75,
        12.5 * 0.96,
        "derived",
        ("IBTA: EDR 4x = 100 Gb/s = 12.5 GB/s per direction",),
    ),
    TableEntry(
        "InfiniBand HDR 200 Gb/s, per NIC",
        "ib",
        None,
        25.0,
        25.0 * 0.75,
        25.0 * 0.96,
        "derived",
        ("IBTA: HDR 4x = 200 Gb/s = 25 GB/s per direction",),
    ),
    TableEntry(
        "InfiniBand NDR 400 Gb/s, per NIC",
        "ib",
        None,
        50.0,
        50.0 * 0.75,
        50.0 * 0.96,
        "derived",
        ("IBTA: NDR 4x = 400 Gb/s = 50 GB/s per direction",),
    ),
)

_PCIE_RATE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}  # GB/s per lane per direction


def expected_busbw(ic: Interconnect) -> Optional[ExpectedRange]:
    """Expected all_reduce busbw range for an interconnect, from TABLE or derived from its line rate."""
    for e in TABLE:
        if e.kind != ic.kind:
            continue
        if e.kind == "nvlink" and e.match_links == ic.links:
            if e.gpu_pattern and not re.search(e.gpu_pattern, ic.gpu_name):
                continue
            if not e.gpu_pattern and any(
                o.gpu_pattern and o.match_links == ic.links and re.search(o.gpu_pattern, ic.gpu_name)
                for o in TABLE
            ):
                continue
            return ExpectedRange(e.low, e.high, e.basis, e.name, e.sources)
        if e.kind == "pcie" and abs(e.line_rate_gbps - ic.line_rate_gbps) < 0.5:
            return ExpectedRange(e.low, e.high, e.basis, e.name, e.sources)
        if e.kind == "ib" and abs(e.line_rate_gbps - ic.line_rate_gbps) < 0.5:
            n = max(ic.nics, 1)
            return ExpectedRange(e.low * n, e.high * n, e.basis, f"{e.name} x {n} NIC(s) per node", e.sources)
    if ic.line_rate_gbps <= 0:
        return None
    return ExpectedRange(
        ic.line_rate_gbps * EFFICIENCY_LOW,
        ic.line_rate_gbps * EFFICIENCY_HIGH,
        "derived",
        f"{ic.label}: {EFFICIENCY_LOW:.0%}-{EFFICIENCY_HIGH:.0%} of the {ic.line_rate_gbps:g} GB/s line rate",
        ("NVIDIA/nccl-tests#212: NCCL's protocol overhead is ~20% of the line rate",),
    )


# ---------------------------------------------------------------------------------------------
# One GPU (world size 1): no interconnect. busbw is 0 by definition for all_reduce and the chunked ops
# (factor (n-1)/n), and in-place ops move no data at all; what a single rank does measure is the
# out-of-place ops' local copy, which reads and writes every byte: its algbw at >= 1 GiB stays below
# half the GPU memory bandwidth.
SINGLE_GPU_COPY_LOW = 0.35
SINGLE_GPU_COPY_HIGH = 0.50
SINGLE_GPU_METRIC = "out-of-place algbw (all_gather, reduce_scatter, all_to_all) at one rank"
SINGLE_GPU_SOURCES = (
    "tests/fixtures/bench/h100-nproc1 (one H100 80GB HBM3, 3352 GB/s, NCCL 2.28.9): bench-nccl all_gather/"
    "reduce_scatter/all_to_all at 1 GiB in 713-717 us = 1498-1506 GB/s (0.45 of memory bandwidth); nccl-tests "
    "2.19.6 out-of-place 713 us (default), 884 us (-G 1, 0.36)",
    "a device copy reads and writes each byte: algbw <= memory bandwidth / 2",
)


def expected_single_gpu(memory_gbps: Optional[float]) -> Optional[ExpectedRange]:
    """The one-GPU case: no interconnect to expect a busbw of; the local copy's algbw range instead
    (35-50% of the GPU memory bandwidth), None when that bandwidth is unknown."""
    from ddpdoctor.bench.limits import WORLD_SIZE_ONE_HEADING

    if not memory_gbps or memory_gbps <= 0:
        return None
    return ExpectedRange(
        memory_gbps * SINGLE_GPU_COPY_LOW,
        memory_gbps * SINGLE_GPU_COPY_HIGH,
        "reported",
        f"{WORLD_SIZE_ONE_HEADING}: a copy within the GPU, {SINGLE_GPU_COPY_LOW:.0%}-{SINGLE_GPU_COPY_HIGH:.0%} "
        f"of its {memory_gbps:.0f} GB/s memory bandwidth; all_reduce busbw is 0 by definition",
        SINGLE_GPU_SOURCES,
        metric=SINGLE_GPU_METRIC,
    )


# ---------------------------------------------------------------------------------------------
# Reading the interconnect from tool output (pure; the CLI runs the commands).


def parse_nvlink_speeds(text: str) -> dict[int, tuple[str, list[float]]]:
    """`nvidia-smi nvlink -s` -> {gpu index: (name, [GB/s of each active link])}; inactive links left out."""
    from ddpdoctor.parsers.nvidia_smi_nvlink import parse_nvlink

    out: dict[int, tuple[str, list[float]]] = {}
    for gpu in parse_nvlink(text).get("gpus", []):
        speeds = [
            float(link["speed_gbps"])
            for link in (gpu.get("links") or {}).values()
            if link.get("active") and link.get("speed_gbps")
        ]
        out[int(gpu["index"])] = (gpu.get("name") or "", speeds)
    return out


def nvlink_interconnect(
    speeds: dict[int, tuple[str, list[float]]], gpus: Sequence[int]
) -> Optional[Interconnect]:
    """NVLink when every GPU of the run has active links; the slowest GPU's total decides."""
    chosen = [speeds[g] for g in gpus if g in speeds]
    if not chosen or len(chosen) < len(gpus) or any(not links for _, links in chosen):
        return None
    name, links = min(chosen, key=lambda item: sum(item[1]))
    per_link = max(links)
    return Interconnect(
        kind="nvlink",
        label=f"NVLink {len(links)} links x {per_link:g} GB/s",
        line_rate_gbps=sum(links),
        links=len(links),
        gpu_name=name,
    )


def pcie_interconnect(gen: Optional[int], width: Optional[int], gpu_name: str = "") -> Optional[Interconnect]:
    if not gen or not width or gen not in _PCIE_RATE:
        return None
    # The table is per x16 link; derive the rest from the lane rate.
    rate = round(_PCIE_RATE[gen] * width, 2)
    return Interconnect(
        kind="pcie",
        label=f"PCIe Gen{gen} x{width}",
        line_rate_gbps=rate,
        pcie_gen=gen,
        pcie_width=width,
        gpu_name=gpu_name,
    )


_IB_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", re.IGNORECASE)


def read_ib_ports(root: str = "/sys/class/infiniband") -> list[float]:
    """Active InfiniBand port rates in Gb/s, from sysfs. Equivalent: ibstat | grep -A1 'State: Active'."""
    rates = []
    base = Path(root)
    try:
        ports = sorted(base.glob("*/ports/*"))
    except OSError:
        return []
    for port in ports:
        try:
            state = (port / "state").read_text()
            layer = (
                (port / "link_layer").read_text().strip() if (port / "link_layer").exists() else "InfiniBand"
            )
            rate_text = (port / "rate").read_text()
        except OSError:
            continue
        m = _IB_RATE.match(rate_text)
        if "ACTIVE" in state.upper() and layer == "InfiniBand" and m:
            rates.append(float(m.group(1)))
    return rates


def ib_interconnect(rates_gbit: Sequence[float]) -> Optional[Interconnect]:
    if not rates_gbit:
        return None
    slowest = min(rates_gbit)
    return Interconnect(
        kind="ib",
        label=f"InfiniBand {len(rates_gbit)} x {slowest:g} Gb/s",
        line_rate_gbps=slowest / 8,
        nics=len(rates_gbit),
    )
