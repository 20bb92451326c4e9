"""Judges of who may use the GPUs: compute mode against the ranks that must share a GPU, MIG, and other
processes already holding GPU memory."""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ddpdoctor.checks.gpu.collect import GpuCollected
from ddpdoctor.checks.gpu.per_gpu import evidence_source, gpu_fix, gpu_label, live_gpus
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.core.placement import judge_placement, read_local_ranks, supply_from_gpus
from ddpdoctor.core.visible_devices import expected_cuda_count

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
KNOWN_MODES = ("Default", "Exclusive_Process", "Exclusive_Thread", "Prohibited")


def _local_world_size(c: GpuCollected) -> Optional[int]:
    return read_local_ranks(c.env, c.nproc_per_node).count


def _mode_verdict(mode: str, ranks: Optional[int], sharing: bool, visible: int) -> tuple[Severity, str]:
    if mode == "Prohibited":
        return Severity.FAIL, "compute mode Prohibited: no process can use this GPU"
    if mode in ("Exclusive_Process", "Exclusive_Thread"):
        if sharing:
            return (
                Severity.FAIL,
                f"compute mode {mode} but {ranks} local ranks share {visible} GPU(s): all but one will fail",
            )
        return (
            Severity.WARN,
            f"compute mode {mode}: one process per GPU only (fine for one rank per GPU; anything sharing it fails)",
        )
    return Severity.INFO, f"unrecognised compute mode {mode!r}: not judged"


def judge_compute_mode(c: GpuCollected) -> list[Finding]:
    """Exclusive Process / Prohibited GPUs, failing when more local ranks than GPUs must share them."""
    findings: list[Finding] = []
    live = live_gpus(c)
    ranks = _local_world_size(c)
    visible = expected_cuda_count(c.gpus, c.env.get("CUDA_VISIBLE_DEVICES")) or len(live)
    sharing = ranks is not None and visible > 0 and ranks > visible
    src = evidence_source(c, "nvmlDeviceGetComputeMode", "Compute Mode")
    default = 0
    for g in live:
        mode = g.get("compute_mode")
        if mode is None:
            continue
        if mode == "Default":
            default += 1
            continue
        severity, text = _mode_verdict(mode, ranks, sharing, visible)
        findings.append(
            COMPUTE_MODE.finding(
                severity,
                f"{gpu_label(g)}: {text}",
                evidence=[Evidence(src, f"Compute Mode: {mode}; LOCAL_WORLD_SIZE={ranks}")],
                fix=gpu_fix(COMPUTE_MODE.fix, g) if severity >= Severity.WARN else None,
                data={"gpu": g.get("index"), "mode": mode, "local_ranks": ranks},
            )
        )
    if default and not findings:
        findings.append(
            COMPUTE_MODE.finding(
                Severity.OK, f"Compute mode Default on {default} GPU(s)", evidence=[Evidence(src)]
            )
        )
    return findings


def judge_mig(c: GpuCollected) -> list[Finding]:
    """MIG enabled, or pending a reset, per GPU."""
    findings: list[Finding] = []
    src = evidence_source(c, "nvmlDeviceGetMigMode", "MIG Mode")
    for g in live_gpus(c):
        mig = g.get("mig_mode") or {}
        if mig.get("current"):
            text = "MIG is enabled: NCCL cannot use NVLink/P2P between MIG instances"
        elif mig.get("pending"):
            text = "MIG is off but enabling it is pending a GPU reset"
        else:
            continue
        findings.append(
            MIG.finding(
                Severity.WARN,
                f"{gpu_label(g)}: {text}",
                evidence=[Evidence(src, f"current={mig.get('current')} pending={mig.get('pending')}")],
                fix=gpu_fix(MIG.fix, g),
                data={"gpu": g.get("index"), **mig},
            )
        )
    return findings


def _process_line(g: Mapping[str, Any], p: Mapping[str, Any]) -> str:
    return (
        f"{gpu_label(g)}: pid {p.get('pid')} {p.get('name') or '?'}"
        + (f" (user {p['user']})" if p.get("user") else "")
        + (f" {p.get('used_memory_mib')} MiB" if p.get("used_memory_mib") is not None else "")
    )


def judge_processes(c: GpuCollected) -> list[Finding]:
    """Processes other than this one holding memory on the GPUs, with PID, name, user and memory."""
    src = evidence_source(c, "nvmlDeviceGetComputeRunningProcesses", "Processes")
    own = {os.getpid()}
    live = live_gpus(c)
    busy = [(g, p) for g in live for p in g.get("processes") or [] if p.get("pid") not in own]
    if busy:
        lines = [_process_line(g, p) for g, p in busy]
        pids = " ".join(sorted({str(p.get("pid")) for _, p in busy if p.get("pid") is not None}))
        # A desktop (Xorg, gnome-shell) holds a little memory on a workstation GPU: worth knowing, not a
        # stray job. Anything with a compute context ("C", "C+G") is.
        display_only = all(str(p.get("type") or "").upper() == "G" for _, p in busy)
        return [
            PROCESSES.finding(
                Severity.INFO if display_only else Severity.WARN,
                f"{len(busy)} "
                + (
                    "display process(es) (a desktop session) on the GPUs: "
                    if display_only
                    else "process(es) already on the GPUs: "
                )
                + "; ".join(lines[:4])
                + (" ..." if len(lines) > 4 else ""),
                evidence=[Evidence(src, "\n".join(lines[:20]))],
                fix=(
                    f"See who runs them (`ps -o pid,user,etime,args -p {pids.replace(' ', ',')}`) and stop the "
                    f"strays (`kill {pids}`), or ask the scheduler why the node was handed out busy."
                    if pids
                    else None
                ),
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
        ]
    reported = [g for g in live if g.get("processes") is not None]
    if reported:
        return [
            PROCESSES.finding(
                Severity.OK, f"No other process on {len(reported)} GPU(s)", evidence=[Evidence(src)]
            )
        ]
    return []


def judge_local_ranks(c: GpuCollected) -> list[Finding]:
    """This job's ranks per node (launcher variables, or `check --nproc-per-node`) against the GPUs
    visible to them; a skip, never a pass, when no GPU can be read here."""
    ranks = read_local_ranks(c.env, c.nproc_per_node)
    if not c.gpus:
        why = "no NVIDIA GPU or driver found" + (" in the snapshot" if c.replay else " on this machine")
        supply = supply_from_gpus([], None, "NVML, nvidia-smi -q", why_unknown=why)
    else:
        source = evidence_source(c, "nvmlDeviceGetCount + CUDA_VISIBLE_DEVICES", "Attached GPUs")
        supply = supply_from_gpus(
            c.gpus, c.env.get("CUDA_VISIBLE_DEVICES"), source, None if c.replay else c.job_pids
        )
    return judge_placement(ranks, supply, None)


def judge_sharing(c: GpuCollected) -> list[Finding]:
    """Ranks per node vs GPUs, compute mode vs ranks sharing a GPU, MIG, and other processes on the GPUs."""
    return judge_local_ranks(c) + judge_compute_mode(c) + judge_mig(c) + judge_processes(c)
