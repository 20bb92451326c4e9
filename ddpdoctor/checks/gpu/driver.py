"""Judges of the driver layer: is there a usable NVIDIA driver and NVML, which GPUs, and can torch use them
(torch's CUDA build against the CUDA version the driver supports, torch's device count against NVML's)."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from ddpdoctor.checks.gpu.collect import NVIDIA_SMI_Q, GpuCollected
from ddpdoctor.checks.gpu.health import LOST
from ddpdoctor.checks.gpu.models import describe_architecture
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.core.visible_devices import expected_cuda_count

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
    nvml_ev = Evidence(
        "NVML nvmlInit",
        str(
            nvml_error.get("message")
            or ("nvml.json not in the snapshot" if c.replay and c.nvml is None else "")
        ),
    )
    smi_ev = (
        Evidence(NVIDIA_SMI_Q.display, c.smi.excerpt(4) or c.smi.describe_failure())
        if c.smi is not None
        else Evidence(NVIDIA_SMI_Q.display, "not run")
    )
    where = "in this snapshot" if c.replay else "on this machine"
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
                    fix="Check that libnvidia-ml.so.1 is on the loader path (`ldconfig -p | grep nvidia-ml`) "
                    "and readable by this user, and that the nvidia-ml-py package is installed.",
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
        # nvidia-smi -i takes a PCI bus id too: name the unreachable GPU by the one the error gives.
        bus = re.search(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]", handle_errors[0])
        return [
            LOST.finding(
                Severity.FAIL,
                f"nvidia-smi cannot reach a GPU: {handle_errors[0]}",
                evidence=[smi_ev],
                fix=LOST.fix.replace("-i N", f"-i {bus.group(0)}") if bus else None,
                data={"errors": handle_errors, "bus_id": bus.group(0) if bus else None},
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
                f"No permission to use NVML, so the GPUs could not be checked: {nvml_error.get('message')}",
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
                f"NVIDIA driver {version} loaded but no GPU is visible {where}: GPU checks skipped".replace(
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
                f"No NVIDIA GPU or driver {where} ({why}; {smi_why or 'nvidia-smi -q printed nothing'}): "
                "GPU checks skipped",
                evidence=[nvml_ev, smi_ev, Evidence("/sys/bus/pci/devices", "no NVIDIA display/3D device")],
            )
        ], False
    output = f"{c.smi.stdout if c.smi else ''}\n{c.smi.stderr if c.smi else ''}"
    why = (
        nvml_error.get("message")
        or (c.smi.describe_failure() if c.smi else "")
        or "no GPU section in the nvidia-smi -q output"
    )
    if "communicate with the nvidia driver" in output.lower():
        return [
            DRIVER.finding(
                Severity.FAIL,
                "nvidia-smi is installed but cannot communicate with the NVIDIA driver (module not loaded?)",
                evidence=[smi_ev, nvml_ev],
                fix="Load the driver (`sudo modprobe nvidia`; `dmesg | grep -i nvrm` says why it failed), or "
                "reinstall it for the running kernel (`uname -r`); then `nvidia-smi` must list the GPUs.",
            )
        ], False
    return [
        DRIVER.finding(
            Severity.ERROR,
            f"Could not read the GPUs, so none was checked: {why}"[:300],
            evidence=[nvml_ev, smi_ev],
            fix="Run `nvidia-smi -q` by hand and look at what it says.",
        )
    ], False


def judge_inventory(c: GpuCollected) -> list[Finding]:
    """The models, count, driver and CUDA version, for the record."""
    names: dict[str, int] = {}
    archs: dict[str, str] = {}
    for g in c.gpus:
        name = g.get("name") or "unknown GPU"
        names[name] = names.get(name, 0) + 1
        # Never null: old drivers, nvidia-smi before R450 and older snapshots do not say; the name often does.
        archs.setdefault(name, describe_architecture(g.get("architecture"), g.get("name")))
    models = ", ".join(f"{n}x {name} ({archs[name]})" for name, n in names.items())
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
                "architectures": [archs[name] for name in names],
                "driver_version": c.driver_version,
                "cuda_driver_version": c.cuda_driver_version,
                "source": c.source,
            },
        )
    ]


def _compat_verdict(
    build: Optional[str], driver_cuda: Optional[str], c: GpuCollected, torch: Mapping[str, Any]
) -> tuple[Severity, str]:
    """Severity and summary of torch's CUDA build against the driver's CUDA version."""
    tb, dv = _version_tuple(build), _version_tuple(driver_cuda)
    if build is None:
        return (
            Severity.FAIL,
            f"torch {torch.get('version')} is a CPU-only build on a node with {len(c.gpus)} NVIDIA GPU(s)",
        )
    if tb is None or dv is None:
        return (
            Severity.INFO,
            f"torch built for CUDA {build}; the driver's CUDA version is unknown ({driver_cuda or 'not reported'})",
        )
    if tb[0] > dv[0]:
        return (
            Severity.FAIL,
            f"torch is built for CUDA {build} but driver {c.driver_version} supports only CUDA {driver_cuda}: "
            "torch cannot use the GPUs",
        )
    if tb[0] == dv[0] and tb[1] > dv[1]:
        return (
            Severity.WARN,
            f"torch is built for CUDA {build}, newer than the driver's CUDA {driver_cuda}: runs through "
            "minor-version compatibility, but PTX JIT and some features fail",
        )
    return Severity.OK, f"torch CUDA {build} <= driver CUDA {driver_cuda}"


def judge_torch(c: GpuCollected) -> list[Finding]:
    """torch's CUDA build vs the driver's CUDA version, and torch's device count vs NVML's."""
    if c.torch is None:
        return []
    torch = c.torch.get("torch")
    if not isinstance(torch, dict):
        return []  # the torch area reports an import failure
    build = torch.get("cuda")
    build = str(build) if build is not None else None
    if build is None and torch.get("hip"):
        return []  # a ROCm build: not this area's business
    driver_cuda = c.cuda_driver_version
    src = "torch.version.cuda (python -m ddpdoctor.edge.torch_info); driver CUDA version"
    excerpt = f"torch {torch.get('version')} built for CUDA {build}; driver {c.driver_version} supports CUDA {driver_cuda}"
    errors = c.torch.get("errors")
    warnings = (
        [str(v) for k, v in errors.items() if k.endswith(".warning")] if isinstance(errors, dict) else []
    )
    warning = warnings[0] if warnings else ""
    if warning:
        excerpt += f"\n{warning}"
    data = {"torch_cuda": build, "driver_cuda": driver_cuda, "driver_version": c.driver_version}
    severity, summary = _compat_verdict(build, driver_cuda, c, torch)
    findings = [CUDA_COMPAT.finding(severity, summary, evidence=[Evidence(src, excerpt)], data=data)]
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
    if expected is None or not isinstance(count, int):
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
