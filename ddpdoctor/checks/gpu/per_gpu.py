"""What the GPU judges share: how a GPU is named, where evidence comes from, and the per-GPU check table.

Most GPU checks have one shape: judge each GPU that is not lost, report every GPU with a problem (named
by index and bus id), and say "fine on N GPU(s)" only when at least one GPU reported the reading. A
check of that shape is a `PerGpuCheck` row; `run_per_gpu` is the one loop that runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional

from ddpdoctor.checks.gpu.collect import NVIDIA_SMI_Q, GpuCollected
from ddpdoctor.core.model import CheckSpec, Evidence, Finding, Severity


class Verdict(NamedTuple):
    """A judge's answer for one GPU; `fix` replaces the finding id's usual fix when given."""

    severity: Severity
    text: str
    data: Mapping[str, Any]
    fix: Optional[str] = None


def gpu_label(gpu: Mapping[str, Any]) -> str:
    """`GPU 3 (00000000:5D:00.0)`: the index users pass to nvidia-smi -i, and the bus id in Xid lines."""
    bus = gpu.get("bus_id")
    return f"GPU {gpu.get('index', '?')}" + (f" ({bus})" if bus else "")


def gpu_fix(fix: str, gpu: Mapping[str, Any]) -> str:
    """A finding id's fix with its `-i N` placeholder replaced by this GPU's index."""
    index = gpu.get("index")
    return fix.replace("-i N", f"-i {index}") if isinstance(index, int) else fix


def evidence_source(c: GpuCollected, nvml_call: str, smi_section: str) -> str:
    """Where a reading came from: the NVML call, or the section of `nvidia-smi -q`."""
    if c.source == "nvml":
        return f"NVML {nvml_call}"
    return f"{NVIDIA_SMI_Q.display} ({smi_section})"


def live_gpus(c: GpuCollected) -> list[dict[str, Any]]:
    """The GPUs that answered (a lost GPU is reported once, by gpu.lost)."""
    return [g for g in c.gpus if not g.get("lost")]


@dataclass(frozen=True)
class PerGpuCheck:
    """One finding id judged GPU by GPU. `judge` returns None when the GPU does not report the reading
    (not supported, unreadable): such a GPU is neither a problem nor counted as fine."""

    spec: CheckSpec
    judge: Callable[[Mapping[str, Any]], Optional[Verdict]]
    nvml_call: str
    smi_section: str
    ok_text: str  # `{n}` is the number of GPUs that reported the reading
    excerpt: Callable[[Mapping[str, Any]], str]


def run_per_gpu(checks: Iterable[PerGpuCheck], c: GpuCollected) -> list[Finding]:
    """For each check: a finding per GPU with a problem, else one ok finding if any GPU reported."""
    findings: list[Finding] = []
    for check in checks:
        source = evidence_source(c, check.nvml_call, check.smi_section)
        found: list[Finding] = []
        checked = 0
        for g in live_gpus(c):
            verdict = check.judge(g)
            if verdict is None:
                continue
            checked += 1
            if verdict.severity <= Severity.OK:
                continue
            fix = verdict.fix
            if fix is None and verdict.severity >= Severity.WARN:
                fix = gpu_fix(check.spec.fix, g)
            found.append(
                check.spec.finding(
                    verdict.severity,
                    f"{gpu_label(g)}: {verdict.text}",
                    evidence=[Evidence(source, check.excerpt(g))],
                    fix=fix,
                    data={"gpu": g.get("index"), "bus_id": g.get("bus_id"), **verdict.data},
                )
            )
        if checked and not found:
            found.append(
                check.spec.finding(Severity.OK, check.ok_text.format(n=checked), evidence=[Evidence(source)])
            )
        findings += found
    return findings


def fields_text(section: Optional[Mapping[str, Any]]) -> str:
    """`gpu_c=45, slowdown_c=89`: a reading section as evidence, unknown values left out."""
    if not section:
        return "(not reported)"
    shown = ", ".join(f"{k}={v}" for k, v in section.items() if v is not None)
    return shown or "(not reported)"
