"""RDMA's host side: GPUDirect RDMA (the peer-memory kernel module) and the locked-memory limit.

Split from rdma.py (the ports and NCCL's IB settings); the rdma area runs these checks. The facts are
duck-typed (`sysfs`, `modules`, `lsmod`: an rdma.RdmaFacts) so that this module does not import rdma."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence

from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.edge.json_shape import ListOf, Record
from ddpdoctor.edge.runner import CommandResult, define_command
from ddpdoctor.edge.sources import define_fact
from ddpdoctor.parsers.lspci import PciDevice
from ddpdoctor.parsers.modules import module_names
from ddpdoctor.parsers.ulimit import parse_ulimit

LSMOD = define_command("lsmod", ("lsmod",), "Loaded kernel modules (read when /proc/modules is not)")
MODULES_FACT = define_fact(
    "kernel-modules",
    "Text of /proc/modules and the names in /sys/module (nvidia_peermem, ib_core, mlx5_ib)",
    dict,
)

# RDMA registration pins memory: the 64 KiB kernel default, 8 MiB or Docker's 64 MiB all end in
# "ibv_reg_mr ... Cannot allocate memory". Below this the check fails; unlimited is what NCCL wants.
MEMLOCK_FAIL_BYTES = 1024**3
GPUDIRECT_MODULES = ("nvidia_peermem", "nv_peer_mem")
GPUDIRECT = define(
    "rdma.gpudirect.module",
    "GPUDirect RDMA",
    "Without the GPUDirect RDMA peer-memory module (nvidia_peermem, or nv_peer_mem on old MOFED) NCCL "
    "stages every inter-node transfer through host memory: lower bandwidth, more CPU. (NCCL >= 2.19 can "
    "use DMA-BUF instead, with the open GPU kernel modules on Linux >= 5.12.)",
    "Load it: `sudo modprobe nvidia_peermem` (shipped with the NVIDIA driver >= 470; needs MOFED/ib_core "
    "loaded first), and add it to /etc/modules-load.d/ so it survives reboots.",
)
MEMLOCK = define(
    "rdma.memlock",
    "Locked-memory limit (memlock)",
    "RDMA registers (pins) memory; the memlock limit caps how much. The kernel default of 64 KiB, or 8-64 "
    "MiB in many images, ends in `ibv_reg_mr ... failed with error Cannot allocate memory` from NCCL.",
    "Run `ulimit -l unlimited` in the job script (check it inside the job: under srun/mpirun/containers "
    "it can differ); for containers `docker run --ulimit memlock=-1`; for Slurm and containerd set "
    "`LimitMEMLOCK=infinity` in the slurmd.service / containerd.service units (systemd ignores "
    "/etc/security/limits.conf) and restart them.",
)

class ModuleFacts(Protocol):
    """What the module checks read: rdma.RdmaFacts has these fields."""

    sysfs: Optional[Mapping[str, Any]]
    modules: Optional[Mapping[str, Any]]
    lsmod: Optional[CommandResult]


KERNEL_MODULES_SHAPE = Record({"proc_modules": str, "sys_module": ListOf(str)})


def read_kernel_modules(root: Path = Path("/")) -> dict[str, Any]:
    """Equivalent: cat /proc/modules; ls /sys/module."""
    root = Path(root)
    try:
        text: Optional[str] = (root / "proc/modules").read_text(errors="replace")
    except OSError:
        text = None
    try:
        names: Optional[list[str]] = sorted(os.listdir(root / "sys/module"))[:10000]
    except OSError:
        names = None
    return {"proc_modules": text, "sys_module": names}


def loaded_modules(facts: ModuleFacts) -> tuple[Optional[set[str]], str]:
    """Module names (dashes as underscores) and where they were read; None when no source was readable."""
    mods = facts.modules or {}
    if mods.get("proc_modules") and mods["proc_modules"].strip():
        return {n.replace("-", "_") for n in module_names(mods["proc_modules"])}, "/proc/modules"
    if facts.lsmod is not None and facts.lsmod.found and facts.lsmod.stdout.strip():
        return {n.replace("-", "_") for n in module_names(facts.lsmod.stdout)}, "lsmod"
    if mods.get("sys_module"):
        return {n.replace("-", "_") for n in mods["sys_module"]}, "/sys/module"
    return None, ""


def check_gpudirect(facts: ModuleFacts, pci: Sequence[PciDevice]) -> list[Finding]:
    names, where = loaded_modules(facts)
    markers = (facts.sysfs or {}).get("gdr_markers", [])
    loaded = sorted(set(GPUDIRECT_MODULES) & (names or set()))
    if loaded or markers:
        shown = ", ".join(loaded) or ", ".join(f"/{m}" for m in markers)
        return [
            GPUDIRECT.finding(
                Severity.OK,
                f"GPUDirect RDMA peer-memory module loaded ({shown})",
                evidence=[Evidence(where or "sysfs", shown)],
            )
        ]
    has_gpu = any(d.kind == "gpu" and "nvidia" in d.description.lower() for d in pci)
    if names is None:
        return [
            GPUDIRECT.finding(
                Severity.INFO,
                "Could not tell whether nvidia_peermem is loaded: no module list (/proc/modules, lsmod, "
                "/sys/module) was available",
                evidence=[Evidence("/proc/modules, lsmod, /sys/module", "not available")],
            )
        ]
    if "nvidia" not in names and not has_gpu:
        return [
            GPUDIRECT.finding(
                Severity.SKIP,
                "No NVIDIA GPU driver loaded: GPUDirect RDMA does not apply",
                evidence=[Evidence(where, "no nvidia module")],
            )
        ]
    return [
        GPUDIRECT.finding(
            Severity.WARN,
            "RDMA devices and the NVIDIA driver are present but nvidia_peermem is not loaded: inter-node "
            "transfers are staged through host memory (unless NCCL uses DMA-BUF)",
            evidence=[Evidence(where, f"{len(names)} modules; none of {', '.join(GPUDIRECT_MODULES)}")],
        )
    ]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:g} {unit}" if n % scale == 0 else f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def check_memlock(result: Optional[CommandResult], disabled_by: Optional[str]) -> list[Finding]:
    stdout = result.stdout if result is not None else ""
    # The memlock line is the evidence; the whole `ulimit -a` output only when that line is missing.
    line = next((x.strip() for x in stdout.splitlines() if "locked memory" in x), None)
    shown = line or ((result.excerpt(20) or result.describe_failure()) if result else "not run")
    evidence = [Evidence(result.display if result else "ulimit -a", shown)]
    limits = parse_ulimit(stdout) if stdout else None
    memlock = limits.get("l") if limits else None
    if memlock is None:
        why = (result.describe_failure() if result else "") or "no 'max locked memory' line"
        # Absent (not installed, or not in the snapshot): the system area reports the unreadable limits.
        sev = Severity.SKIP if result is None or not result.found else Severity.ERROR
        return [MEMLOCK.finding(sev, f"Could not read the memlock limit: {why}", evidence=evidence)]
    if memlock.unlimited:
        return [
            MEMLOCK.finding(
                Severity.OK, "memlock is unlimited", evidence=evidence, data={"memlock_bytes": None}
            )
        ]
    size = memlock.bytes() or 0
    data = {"memlock_bytes": size}
    if size < MEMLOCK_FAIL_BYTES:
        sev = Severity.WARN if disabled_by else Severity.FAIL
        note = f" ({disabled_by}, so NCCL will not register memory now)" if disabled_by else ""
        return [
            MEMLOCK.finding(
                sev,
                f"memlock (max locked memory) is {_size(size)} with RDMA devices present: NCCL's ibv_reg_mr will fail with 'Cannot allocate memory'{note}",
                evidence=evidence,
                data=data,
            )
        ]
    return [
        MEMLOCK.finding(
            Severity.INFO,
            f"memlock is limited to {_size(size)}; unlimited (`ulimit -l unlimited`) is what NCCL expects",
            evidence=evidence,
            data=data,
        )
    ]


