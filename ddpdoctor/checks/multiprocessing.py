"""Multiprocessing: the default start method, and the fork-after-CUDA pitfall.

Reads the same `python -m ddpdoctor.edge.torch_info` result as the torch area (run once).
"""

from __future__ import annotations

from typing import Any, Mapping

from ddpdoctor.checks.torch import TorchFacts, as_list, collect_torch
from ddpdoctor.core.engine import Area
from ddpdoctor.core.model import Evidence, Finding, Severity, define

START_METHOD = define(
    "mp.start_method",
    "Default start method",
    "DataLoader workers and torch.multiprocessing children start with this method unless the code picks "
    "one. 'fork' (the Linux default before Python 3.14) copies the parent, including any CUDA state.",
)
FORK_CUDA = define(
    "mp.fork_cuda",
    "fork and CUDA",
    "CUDA cannot be re-initialised in a forked child: a worker that touches CUDA after the parent did "
    'fails with "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you '
    "must use the 'spawn' start method\".",
    "Keep CUDA out of Dataset/__getitem__ and DataLoader workers, or start CUDA-using workers with spawn: "
    "`torch.multiprocessing.set_start_method('spawn', force=True)` (or `mp.get_context('spawn')`) inside "
    "`if __name__ == '__main__':`; launch ranks with torchrun instead of forking them.",
)
UNKNOWN = define(
    "mp.unknown",
    "Start method unknown",
    "The start method comes from the torch probe (`python -m ddpdoctor.edge.torch_info`); when that gave no "
    "result, this area is unchecked.",
    "See the torch area's finding for why the probe failed.",
)


def cuda_present(info: Mapping[str, Any]) -> bool:
    """torch can use CUDA, or the node has NVIDIA device files (CUDA may come from another install)."""
    torch = info.get("torch") if isinstance(info.get("torch"), dict) else {}
    return (
        bool(torch.get("cuda_available"))
        or bool(as_list(info.get("nvidia_device_files")))
        or info.get("nvidiactl") is True
    )


def check_start_method(info: Mapping[str, Any]) -> list[Finding]:
    """Judge the torch-info JSON (pure)."""
    method = info.get("mp_start_method")
    method = str(method) if isinstance(method, str) and method else None
    methods = [str(m) for m in as_list(info.get("mp_start_methods"))]
    platform = str(info.get("platform") or "?")
    source = "multiprocessing.get_start_method()"
    ev = [Evidence(source, f"{method} (available: {', '.join(methods) or '?'}; platform {platform})")]
    if not method:
        return [UNKNOWN.finding(Severity.ERROR, "The torch probe did not report a start method", evidence=ev)]
    findings = [
        START_METHOD.finding(
            Severity.INFO,
            f"{method} on {platform}",
            evidence=ev,
            data={"start_method": method, "available": methods},
        )
    ]
    present = cuda_present(info)
    cuda_ev = [Evidence("torch.cuda.is_available(), /dev/nvidia*", f"cuda present: {present}")]
    if method == "fork" and present:
        findings.append(
            FORK_CUDA.finding(
                Severity.INFO,
                "CUDA is present and the default start method is fork: CUDA-using workers need spawn or "
                "forkserver",
                evidence=ev + cuda_ev,
                fix=FORK_CUDA.fix,
            )
        )
    elif method == "fork":
        findings.append(
            FORK_CUDA.finding(Severity.SKIP, "No CUDA on this node: fork is safe here", evidence=cuda_ev)
        )
    else:
        findings.append(
            FORK_CUDA.finding(
                Severity.OK, f"Default start method {method} does not inherit CUDA state", evidence=ev
            )
        )
    return findings


def check_mp(facts: TorchFacts) -> list[Finding]:
    if facts.info is None:
        summary = f"The torch probe gave no result ({facts.why_no_info()}); start method not checked"[:300]
        # Absent from a snapshot is "not available there", not a probe that failed.
        severity = Severity.SKIP if not facts.result.captured else Severity.ERROR
        return [UNKNOWN.finding(severity, summary, evidence=facts.evidence(6))]
    return check_start_method(facts.info)


# The same run of `python -m ddpdoctor.edge.torch_info` as the torch area (LiveSources runs it once).
AREA = Area(name="mp", title="Multiprocessing", collect=collect_torch, judge=check_mp, order=25)
