"""No physically impossible numbers: the GPU memory-bandwidth ceiling, rows above it, and world size 1.

Pure functions: the CLI gathers the facts (NVML memory bus width and maximum memory clock, GPU names,
the world size) and hands them in.

Why the ceiling: every collective writes its whole result into GPU memory (algbw divides that size by
the time), so no real measurement has an algbw above the memory's bandwidth. A number above it comes
from an operation that moved no data, e.g. torch's in-place all_reduce/broadcast/reduce at world size
1, where NCCL returns at once and the "bandwidth" is a launch time divided into a size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddpdoctor.core.model import Evidence, Finding, Severity, define

WORLD_SIZE_ONE_HEADING = "one rank: collectives move no data between GPUs; this times the local path only"


def world_size_one_heading(backend: Optional[str]) -> str:
    """The world-size-1 heading in the backend's words: gloo ranks on CPU have no GPU to move data between."""
    if backend == "nccl":
        return WORLD_SIZE_ONE_HEADING
    return "one rank: collectives move no data between ranks; this times the local path only"

ONE_RANK_GATE = define(
    "bench.one_rank.not_judged",
    "Bandwidth gate asked for at world size 1",
    "With one rank no data crosses an interconnect: NCCL returns at once for in-place operations, so busbw "
    "is a launch time divided into a size. A --min-busbw, --baseline or [busbw_min_gbps] verdict on it "
    "would pass or fail by accident, and a gate that cannot judge must not look like a pass.",
    "Run with 2 or more ranks (--nproc 2, or more GPUs), or drop --min-busbw/--baseline/--expect for a "
    "one-GPU node.",
)


@dataclass(frozen=True)
class MemoryBandwidth:
    """One GPU's memory bandwidth (GB/s, 10^9 bytes/s) and where the number comes from."""

    gbps: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"gbps": self.gbps, "source": self.source}


@dataclass(frozen=True)
class ModelBandwidth:
    pattern: str  # regex on the GPU name as NVML/nvidia-smi print it
    gbps: float
    model: str
    source: str


# Datasheet peak memory bandwidth, for GPUs whose NVML does not report bus width or memory clock.
# Order matters: the first match wins (GH200 before H200, the PCIe/NVL H100 before the SXM one).
# Where one name covers several memory configurations the higher figure is used: the table is a
# ceiling, and a ceiling too high only lets an artifact through, one too low would flag a real number.
MODEL_TABLE: tuple[ModelBandwidth, ...] = (
    ModelBandwidth(r"GH200", 4900.0, "GH200 (HBM3e 144 GB)", "NVIDIA GH200 Grace Hopper datasheet"),
    ModelBandwidth(r"H200", 4800.0, "H200 SXM/NVL 141 GB HBM3e", "NVIDIA H200 datasheet"),
    ModelBandwidth(r"H100.*PCIe", 2000.0, "H100 PCIe 80 GB HBM2e", "NVIDIA H100 datasheet"),
    ModelBandwidth(r"H100 NVL", 3900.0, "H100 NVL 94 GB HBM3", "NVIDIA H100 datasheet"),
    ModelBandwidth(r"H100", 3350.0, "H100 SXM5 80 GB HBM3", "NVIDIA H100 datasheet"),
    ModelBandwidth(r"H800", 3350.0, "H800 SXM5 80 GB HBM3", "NVIDIA H800 datasheet"),
    ModelBandwidth(r"H20\b", 4000.0, "H20 96 GB HBM3", "NVIDIA H20 product brief"),
    ModelBandwidth(r"B200|GB200|B100", 8000.0, "B200 HBM3e", "NVIDIA DGX B200 / HGX B200 datasheet"),
    ModelBandwidth(r"A100.*80GB", 2039.0, "A100 80 GB HBM2e", "NVIDIA A100 datasheet"),
    ModelBandwidth(r"A100", 1555.0, "A100 40 GB HBM2", "NVIDIA A100 datasheet"),
    ModelBandwidth(r"V100S", 1134.0, "V100S PCIe 32 GB", "NVIDIA V100S datasheet"),
    ModelBandwidth(r"V100", 900.0, "V100 16/32 GB HBM2", "NVIDIA V100 datasheet"),
    ModelBandwidth(r"L40", 864.0, "L40/L40S 48 GB GDDR6", "NVIDIA L40S datasheet"),
    ModelBandwidth(r"A40\b", 696.0, "A40 48 GB GDDR6", "NVIDIA A40 datasheet"),
    ModelBandwidth(r"A10\b", 600.0, "A10 24 GB GDDR6", "NVIDIA A10 datasheet"),
    ModelBandwidth(r"L4\b", 300.0, "L4 24 GB GDDR6", "NVIDIA L4 datasheet"),
    ModelBandwidth(r"T4\b", 320.0, "T4 16 GB GDDR6", "NVIDIA T4 datasheet"),
    ModelBandwidth(r"RTX 4090", 1008.0, "GeForce RTX 4090 GDDR6X", "NVIDIA RTX 4090 specifications"),
    ModelBandwidth(r"2080 Ti", 616.0, "GeForce RTX 2080 Ti GDDR6", "NVIDIA RTX 2080 Ti specifications"),
)


def memory_bandwidth_from_nvml(
    bus_width_bits: Optional[int], max_memory_clock_mhz: Optional[int]
) -> Optional[MemoryBandwidth]:
    """bus width (bits) / 8 x max memory clock x 2 (double data rate): e.g. H100 SXM 5120-bit x 2619 MHz
    -> 3352 GB/s. None when NVML did not report either number."""
    if not bus_width_bits or not max_memory_clock_mhz or bus_width_bits <= 0 or max_memory_clock_mhz <= 0:
        return None
    gbps = bus_width_bits / 8 * max_memory_clock_mhz * 1e6 * 2 / 1e9
    return MemoryBandwidth(
        round(gbps, 1), f"NVML: {bus_width_bits}-bit bus x {max_memory_clock_mhz} MHz max memory clock x 2"
    )


def memory_bandwidth_for_model(name: Optional[str]) -> Optional[MemoryBandwidth]:
    """The documented datasheet figure for a GPU name (MODEL_TABLE), None for a GPU not in it."""
    if not name:
        return None
    for entry in MODEL_TABLE:
        if re.search(entry.pattern, name):
            return MemoryBandwidth(entry.gbps, f"datasheet table: {entry.model} ({entry.source})")
    return None


def bandwidth_ceiling(
    gpus: Sequence[tuple[Optional[str], Optional[int], Optional[int]]],
) -> Optional[MemoryBandwidth]:
    """The lowest memory bandwidth among the run's GPUs, each (name, bus width bits, max memory clock
    MHz): NVML's numbers where it gave them, else the datasheet table. None when no GPU is known."""
    known = []
    for name, width, clock in gpus:
        bw = memory_bandwidth_from_nvml(width, clock) or memory_bandwidth_for_model(name)
        if bw is not None:
            known.append(bw)
    return min(known, key=lambda b: b.gbps, default=None)


def is_implausible(row: Mapping[str, Any], ceiling_gbps: Optional[float]) -> Optional[bool]:
    """True when the row's algbw is above the memory bandwidth; None when there is no ceiling (CPU, an
    unknown GPU) or no bandwidth to judge."""
    if row.get("implausible") is True:
        return True  # flagged before (its algbw is gone): stays flagged
    algbw = row.get("algbw")
    if ceiling_gbps is None or not isinstance(algbw, (int, float)) or row.get("skipped"):
        return None
    return float(algbw) > ceiling_gbps


def flag_implausible(
    rows: Iterable[Mapping[str, Any]], ceiling: Optional[MemoryBandwidth]
) -> list[dict[str, Any]]:
    """Copies of the rows with `implausible` set (True, False, or None where it cannot be judged).

    A flagged row keeps its time (a real measurement: the launch of an operation that moved no data)
    but loses its algbw and busbw (None): no impossible bandwidth is printed or written anywhere.
    """
    limit = ceiling.gbps if ceiling is not None else None
    out = []
    for r in rows:
        flag = is_implausible(r, limit)
        out.append({**r, "implausible": flag, **({"algbw": None, "busbw": None} if flag else {})})
    return out


def plausible(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows a peak or a gate may use: every row not flagged implausible."""
    return [r for r in rows if r.get("implausible") is not True]


def implausible_note(rows: Sequence[Mapping[str, Any]], ceiling: Optional[MemoryBandwidth]) -> Optional[str]:
    """One line for the notes when any row was flagged, else None."""
    bad = [r for r in rows if r.get("implausible") is True]
    if not bad or ceiling is None:
        return None
    ops = ", ".join(dict.fromkeys(str(r.get("op")) for r in bad))
    return (
        f"{len(bad)} row(s) ({ops}) have an algbw above the GPU memory bandwidth {ceiling.gbps:.0f} GB/s "
        f"({ceiling.source}): flagged implausible (the operation moved no data) and left out of peaks and gates"
    )


def one_rank_gate_refusal(
    world_size: int,
    min_busbw: Optional[float],
    baseline: bool,
    expect_busbw: bool,
    backend: Optional[str] = "nccl",
) -> Optional[Finding]:
    """A refusal before launch when a bandwidth gate is asked for at world size 1, else None."""
    if world_size != 1:
        return None
    gates = [
        flag
        for flag, asked in (
            ("--min-busbw", min_busbw is not None),
            ("--baseline", baseline),
            ("--expect [busbw_min_gbps]", expect_busbw),
        )
        if asked
    ]
    if not gates:
        return None
    return ONE_RANK_GATE.finding(
        Severity.FAIL,
        f"{' and '.join(gates)} {'judges' if len(gates) == 1 else 'judge'} the interconnect, but this run has "
        f"{world_size_one_heading(backend)}",
        evidence=[Evidence("world size", "1")],
        data={"world_size": 1, "gates": gates},
    )


def with_one_rank_gate_refusal(
    decision: Any, min_busbw: Optional[float], baseline: bool, expect_busbw: bool
) -> Any:
    """A launch decision (preflight.LaunchDecision) with the world-size-1 gate refusal added, when it
    applies and nothing else was refused already."""
    import dataclasses

    if decision.refusals:
        return decision
    refusal = one_rank_gate_refusal(decision.nproc, min_busbw, baseline, expect_busbw, decision.backend)
    if refusal is None:
        return decision
    return dataclasses.replace(decision, refusals=(*decision.refusals, refusal))
