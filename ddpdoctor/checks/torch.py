"""Python / torch: versions, CUDA / cuDNN / NCCL builds, distributed backends, CUDA availability.

torch is never imported here: `python -m ddpdoctor.edge.torch_info` runs in a subprocess with a timeout,
so a missing, broken or hanging torch becomes a finding. The multiprocessing area reads the same
result (`run_torch_info` runs the subprocess once per Sources).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import weakref
from typing import Any, Mapping, Optional

from ddpdoctor.core.engine import Area, Context
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.edge.runner import CommandResult, define_command
from ddpdoctor.edge.sources import Sources

# Documented as `python`; run with this interpreter (sys.executable), the one ddpdoctor is installed in.
TORCH_INFO = define_command(
    "torch-info",
    ("python", "-m", "ddpdoctor.edge.torch_info"),
    "torch, CUDA, cuDNN and NCCL versions, distributed backends, CUDA availability, "
    "multiprocessing start method (JSON)",
    # A cold import of torch from a network filesystem can take tens of seconds; --timeout bounds it.
    timeout_s=120.0,
)

IMPORT = define(
    "torch.import",
    "torch import",
    "Distributed training needs torch in the Python environment that runs the job. A failed import "
    "(not installed, a missing shared library, an ABI clash) stops every rank before it starts.",
    "Install torch in this environment (`pip install torch`; on GPU nodes pick the wheel matching the "
    "driver's CUDA version), or run ddpdoctor with the Python that runs the training job.",
)
PROBE = define(
    "torch.probe",
    "torch probe",
    "The torch probe runs `python -m ddpdoctor.edge.torch_info` in a subprocess. When it crashes, hangs or "
    "prints garbage, nothing about torch was checked: that is never a pass.",
    "Run `python -c 'import torch; print(torch.__version__)'` by hand: a segfault or a hang there points "
    "to a broken CUDA driver or library (check `nvidia-smi` and `ldd` of torch's libraries).",
)
VERSION = define(
    "torch.version",
    "torch version",
    "The torch, CUDA and cuDNN versions, for the record: every rank of a job should run the same ones.",
)
CUDA = define(
    "torch.cuda",
    "CUDA from torch",
    "Whether torch can use CUDA here. A CPU-only wheel on a GPU node, or a CUDA wheel newer than the "
    "driver, makes torch.cuda.is_available() False and the nccl backend unusable.",
    "Install a torch wheel built for a CUDA version the driver supports (compare `nvidia-smi` 'CUDA "
    "Version' with torch.version.cuda), e.g. `pip install torch --index-url "
    "https://download.pytorch.org/whl/cu124`.",
)
NCCL = define(
    "torch.nccl",
    "NCCL version",
    "The NCCL library torch loads. Every rank of a job must run compatible NCCL versions; the CPU wheel "
    "has no NCCL (backend='nccl' fails with \"Distributed package doesn't have NCCL built in\").",
    "Use a CUDA build of torch for GPU training, or backend='gloo' on CPU.",
)
# The areas that read the torch-info result: `ddpdoctor check` starts the subprocess ahead for them.
TORCH_INFO_READERS = ("torch", "mp")

BACKENDS = define(
    "torch.distributed.backends",
    "Distributed backends",
    "Which torch.distributed backends this build provides (nccl, gloo, mpi, ucc). Without "
    "torch.distributed, init_process_group does not exist.",
    "Install an official torch wheel (they ship torch.distributed with gloo, and nccl on CUDA builds).",
)


@dataclasses.dataclass
class _Pending:
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Optional[CommandResult] = None


_RUNS: weakref.WeakKeyDictionary[Any, _Pending] = weakref.WeakKeyDictionary()
_RUNS_LOCK = threading.Lock()


def live_command():
    """TORCH_INFO with the interpreter ddpdoctor runs under (snapshots still store it as torch-info.txt)."""
    return dataclasses.replace(TORCH_INFO, argv=(sys.executable, *TORCH_INFO.argv[1:]))


def run_torch_info(sources: Sources) -> CommandResult:
    """The torch-info subprocess, run once per Sources even when several areas ask for it concurrently.

    Equivalent: python -m ddpdoctor.edge.torch_info
    """
    try:
        with _RUNS_LOCK:
            pending = _RUNS.get(sources)
            owner = pending is None
            if owner:
                pending = _RUNS[sources] = _Pending()
    except TypeError:  # a Sources that cannot be weakly referenced or hashed: no sharing, still correct
        return sources.run(live_command())
    assert pending is not None
    if owner:
        try:
            pending.result = sources.run(live_command())
        finally:
            pending.done.set()
    else:
        pending.done.wait(max(sources.deadline - time.monotonic(), 0.0))
    if pending.result is None:
        return CommandResult(argv=TORCH_INFO.argv, timed_out=True, error="torch-info did not finish")
    return pending.result


def parse_torch_info(text: str) -> Optional[dict[str, Any]]:
    """The JSON object printed by ddpdoctor.edge.torch_info, or None when the text holds none."""
    text = text.strip()
    candidates = [text]
    start = text.find("{")
    if start > 0:
        candidates.append(text[start:])  # tolerate a stray line printed before the JSON
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


@dataclasses.dataclass
class TorchFacts:
    """The torch-info run and its parsed JSON (None when it gave none); the torch and mp areas' facts."""

    result: CommandResult
    info: Optional[dict[str, Any]]

    def why_no_info(self) -> str:
        return self.result.describe_failure() or "no JSON in its output"

    def evidence(self, max_lines: int) -> list[Evidence]:
        return [Evidence(TORCH_INFO.display, self.result.excerpt(max_lines))]


def collect_torch(ctx: Context) -> TorchFacts:
    """Equivalent: python -m ddpdoctor.edge.torch_info"""
    result = run_torch_info(ctx.sources)
    return TorchFacts(result=result, info=parse_torch_info(result.stdout) if result.stdout else None)


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """A JSON list field, or [] when the snapshot holds something else there."""
    return list(value) if isinstance(value, (list, tuple)) else []


def probe_failure(result: CommandResult) -> Optional[Finding]:
    """An error finding when the torch-info subprocess gave no usable JSON, else None."""
    evidence = [Evidence(TORCH_INFO.display, result.excerpt(12) or result.describe_failure())]
    if not result.captured:
        return PROBE.finding(
            Severity.SKIP, f"torch not checked: {result.describe_failure()}", evidence=evidence
        )
    if not result.found:
        why = result.describe_failure()
        return PROBE.finding(Severity.ERROR, f"torch probe did not run: {why}", evidence=evidence)
    if result.timed_out:
        return PROBE.finding(
            Severity.ERROR,
            f"`import torch` did not finish within {result.duration_s:.3g}s (hung CUDA driver or slow filesystem?)",
            evidence=evidence,
        )
    if result.returncode is not None and result.returncode < 0:
        return PROBE.finding(
            Severity.ERROR,
            f"Importing torch crashed the interpreter (signal {-result.returncode})",
            evidence=[Evidence(TORCH_INFO.display, (result.stderr.strip() or "no output")[-1500:])],
        )
    return None


def check_torch_info(info: Mapping[str, Any]) -> list[Finding]:
    """Judge the parsed torch-info JSON (pure)."""
    source = TORCH_INFO.display
    py = _dict(info.get("python"))
    torch = info.get("torch")
    if not isinstance(torch, dict):
        error = str(info.get("import_error") or "torch did not import (no details)")
        return [
            IMPORT.finding(
                Severity.FAIL,
                f"`import torch` fails in {py.get('executable') or 'this Python'}: {error.splitlines()[-1][:200]}",
                evidence=[Evidence(source, error[-1500:])],
                data={"import_error": error, "python": py.get("executable")},
            )
        ]
    errors = {str(k): str(v) for k, v in _dict(info.get("errors")).items()}
    cuda_build = torch.get("cuda")
    hip_build = torch.get("hip")
    build = f"CUDA {cuda_build}" if cuda_build else (f"ROCm {hip_build}" if hip_build else "CPU-only build")
    cudnn = torch.get("cudnn")
    version_text = f"torch {torch.get('version', '?')} ({build}"
    version_text += f", cuDNN {cudnn})" if cudnn else ")"
    version_text += f" on Python {py.get('version', '?')}"
    excerpt = json.dumps({k: torch.get(k) for k in ("version", "cuda", "hip", "cudnn", "nccl", "path")})
    findings = [
        IMPORT.finding(Severity.OK, f"imported from {torch.get('path') or '?'}", evidence=[Evidence(source)]),
        VERSION.finding(
            Severity.INFO,
            version_text,
            evidence=[Evidence(source, excerpt)],
            data={k: torch.get(k) for k in ("version", "cuda", "hip", "cudnn", "git_version")},
        ),
    ]
    findings += _check_cuda(info, torch, errors)
    findings += _check_nccl(torch, errors)
    findings += _check_backends(torch, errors)
    return findings


def _check_cuda(
    info: Mapping[str, Any], torch: Mapping[str, Any], errors: Mapping[str, str]
) -> list[Finding]:
    source = "torch.cuda.is_available(), torch.cuda.device_count()"
    gpu_files = [str(x) for x in as_list(info.get("nvidia_device_files"))]
    gpu_node = bool(gpu_files) or info.get("nvidiactl") is True
    available = bool(torch.get("cuda_available"))
    count = torch.get("device_count")
    gpu_build = bool(torch.get("cuda") or torch.get("hip"))
    warning = errors.get("cuda_available.warning") or errors.get("device_count.warning") or ""
    excerpt = f"is_available={available} device_count={count} /dev/nvidia*={gpu_files or 'none'}"
    if warning:
        excerpt += f"\n{warning}"
    ev = [Evidence(source, excerpt)]
    data = {"available": available, "device_count": count, "nvidia_device_files": gpu_files}
    if available:
        sev, text = Severity.OK, f"CUDA available: {count} device(s) visible to torch"
    elif not gpu_build and gpu_node:
        sev = Severity.FAIL
        text = f"torch is a CPU-only build but this node has NVIDIA devices ({', '.join(gpu_files) or '/dev/nvidiactl'})"
    elif not gpu_build:
        sev, text = Severity.INFO, "CPU-only torch build and no NVIDIA device: gloo on CPU only"
    elif gpu_node:
        detail = f": {warning}" if warning else ""
        sev = Severity.FAIL
        text = f"torch is built for CUDA {torch.get('cuda') or torch.get('hip')} but cannot use the GPUs{detail}"[
            :300
        ]
    else:
        sev, text = Severity.INFO, "CUDA build of torch, but no NVIDIA device on this node"
    return [CUDA.finding(sev, text, evidence=ev, data=data)]


def _check_nccl(torch: Mapping[str, Any], errors: Mapping[str, str]) -> list[Finding]:
    source = "torch.cuda.nccl.version()"
    nccl = torch.get("nccl")
    if not (torch.get("cuda") or torch.get("hip")):
        summary = "CPU-only torch build: no NCCL (use backend='gloo')"
        return [NCCL.finding(Severity.SKIP, summary, evidence=[Evidence(source)])]
    if nccl:
        ev = [Evidence(source, str(nccl))]
        return [NCCL.finding(Severity.INFO, f"NCCL {nccl}", evidence=ev, data={"version": nccl})]
    why = errors.get("nccl", "no version reported")
    summary = f"CUDA build of torch but the NCCL version could not be read: {why}"[:300]
    return [NCCL.finding(Severity.WARN, summary, evidence=[Evidence(source, why)])]


def _check_backends(torch: Mapping[str, Any], errors: Mapping[str, str]) -> list[Finding]:
    source = "torch.distributed.is_available(), is_{nccl,gloo,mpi,ucc}_available()"
    backends = _dict(torch.get("backends"))
    if not backends.get("distributed"):
        why = errors.get("distributed", "torch.distributed.is_available() is False")
        return [
            BACKENDS.finding(
                Severity.FAIL,
                f"torch.distributed is not available in this build: {why}"[:300],
                evidence=[Evidence(source, why)],
            )
        ]
    present = [b for b in ("nccl", "gloo", "mpi", "ucc") if backends.get(b)]
    missing = [b for b in ("nccl", "gloo", "mpi", "ucc") if not backends.get(b)]
    gpu_build = bool(torch.get("cuda") or torch.get("hip"))
    text = f"available: {', '.join(present) or 'none'}; not built in: {', '.join(missing) or 'none'}"
    ev = [Evidence(source, json.dumps(dict(backends), sort_keys=True))]
    data = {"backends": dict(backends)}
    if gpu_build and not backends.get("nccl"):
        problem = "CUDA build without the nccl backend; "
    elif not present:
        problem = "no distributed backend at all; "
    else:
        return [BACKENDS.finding(Severity.OK, text, evidence=ev, data=data)]
    return [BACKENDS.finding(Severity.FAIL, problem + text, evidence=ev, data=data)]


def check_torch(facts: TorchFacts) -> list[Finding]:
    failure = probe_failure(facts.result)
    if failure is not None:
        return [failure]
    if facts.info is None:
        summary = f"torch probe gave no usable result: {facts.why_no_info()}"[:300]
        return [PROBE.finding(Severity.ERROR, summary, evidence=facts.evidence(12))]
    return check_torch_info(facts.info)


AREA = Area(name="torch", title="Python / torch", collect=collect_torch, judge=check_torch, order=20)
