"""Before launching ranks: which backend and how many ranks, and the pitfalls refused up front.

Facts come from nvidia-smi (through the runner), CUDA_VISIBLE_DEVICES, MASTER_PORT and torch's
build metadata (read without importing torch); `plan_launch` judges them with no I/O.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpdoctor.core.launchenv import read_launch_env
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.core.placement import GpuSupply, LocalRanks, judge_placement, read_local_ranks
from ddpdoctor.core.visible_devices import VisibleDevices, parse_visible_devices
from ddpdoctor.edge.files import load_json_file
from ddpdoctor.edge.runner import Command, CommandResult, define_command
from ddpdoctor.parsers.numbers import parse_int

NVIDIA_SMI_GPUS = define_command(
    "bench-nvidia-smi-gpus",
    (
        "nvidia-smi",
        "--query-gpu=index,uuid,name,compute_mode,pcie.link.gen.max,pcie.link.width.max,driver_version",
        "--format=csv,noheader,nounits",
    ),
    "GPUs, compute mode, PCIe generation/width and driver, for bench-nccl and the nccl smoke test",
)
NVIDIA_SMI_APPS = define_command(
    "bench-nvidia-smi-apps",
    ("nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name", "--format=csv,noheader"),
    "Processes already running on each GPU (an Exclusive_Process GPU admits only one)",
)
NVIDIA_SMI_NVLINK = define_command(
    "bench-nvidia-smi-nvlink",
    ("nvidia-smi", "nvlink", "-s"),
    "NVLink links and speeds per GPU, for the expected bus bandwidth",
)

DEFAULT_GLOO_NPROC = 4
# gloo ranks are CPU processes that each import torch and spin on their collectives: beyond a few per
# CPU they only measure the scheduler (and hundreds of them exhaust memory before the first op).
GLOO_RANKS_PER_CPU = 4
# No GPU or host today gives one rank a 1 TiB buffer; anything larger is a typo, refused even when
# the available memory cannot be read.
MAX_BYTES_CEILING = 1024**4

# Test-only: a directory holding a real `nvml.json` and `torch-info.txt` (as `ddpdoctor snapshot` writes
# them) that stands in for this node's GPUs and torch build, so that real torchrun agents on a CPU
# machine can be given a one-GPU node. Read only here, at the edge. Never set it in production.
FAKE_GPU_ENV = "DDPDOCTOR_FAKE_GPU_DIR"

NCCL_NO_CUDA = define(
    "bench.nccl.no_cuda",
    "NCCL requested without usable CUDA",
    "The NCCL backend runs on GPUs only; without a CUDA build of torch and a visible GPU it cannot start.",
    "Run on a GPU node with a CUDA build of torch (`python -c 'import torch; print(torch.version.cuda)'`), "
    "or use --backend gloo to test the CPU path.",
)
EXCLUSIVE_PROCESS = define(
    "bench.gpu.exclusive_process",
    "GPU in Exclusive_Process mode is already in use",
    "A GPU in Exclusive_Process compute mode accepts one process; a second one fails with "
    "'CUDA-capable device(s) is/are busy or unavailable'.",
    "Stop the process holding the GPU, or set the default mode: `sudo nvidia-smi -i N -c DEFAULT`.",
)
DUPLICATE_DEVICES = define(
    "bench.cuda_visible_devices.duplicate",
    "Duplicate CUDA_VISIBLE_DEVICES entries",
    "The same GPU listed twice makes two ranks share it: NCCL fails with 'Duplicate GPU detected'.",
    "List each GPU once in CUDA_VISIBLE_DEVICES.",
)
MASTER_PORT_IN_USE = define(
    "bench.master_port.in_use",
    "MASTER_PORT already in use",
    "Rank 0 must bind MASTER_PORT for the rendezvous; a port held by another process fails the launch "
    "(EADDRINUSE), often a leftover of an earlier job.",
    "Stop the process holding the port, or unset MASTER_PORT so that bench-nccl picks a free one.",
)
MASTER_PORT_INVALID = define(
    "bench.master_port.invalid",
    "MASTER_PORT is not a usable port",
    "A TCP port is a number from 1 to 65535; rank 0 cannot bind anything else, and silently picking "
    "another port would hide the mistake from the training job that reads the same variable.",
    "Set MASTER_PORT to a free port from 1 to 65535 (e.g. 29500), or unset it so that bench-nccl picks one.",
)

NPROC_TOO_MANY = define(
    "bench.nproc.too_many",
    "More gloo ranks than this host's CPUs can run",
    f"Each gloo rank is a CPU process that imports torch (hundreds of MB) and busy-waits on its "
    f"collectives; more than {GLOO_RANKS_PER_CPU} per usable CPU measures the scheduler, not the "
    "collectives, and hundreds of them can exhaust memory before the first op.",
    f"Use --nproc at most {GLOO_RANKS_PER_CPU}x the usable CPUs (`nproc`), or leave --nproc out "
    "(4 ranks, at most one per CPU).",
)
BUFFERS_TOO_LARGE = define(
    "bench.max_bytes.too_large",
    "--max-bytes buffers do not fit in memory",
    "Every rank allocates its send and receive buffers (and, with --check, the expected values) at the "
    "largest size; buffers larger than the free memory of the host (gloo) or the GPU (NCCL) end in the "
    f"OOM killer or a CUDA out-of-memory error instead of a measurement. Sizes above "
    f"{MAX_BYTES_CEILING // 1024**4} TiB are refused outright.",
    "Lower --max-bytes (e.g. 1G with NCCL, 64M with gloo), run fewer ranks, or free memory "
    "(`free -g`, `nvidia-smi --query-gpu=memory.free --format=csv`).",
)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    compute_mode: str
    pcie_gen: Optional[int]
    pcie_width: Optional[int]
    driver: str


@dataclass
class LaunchFacts:
    """What the launch decision needs; gathered by `gather_launch_facts`."""

    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_query: Optional[CommandResult] = None
    apps: dict[str, list[str]] = field(default_factory=dict)  # GPU uuid -> "pid name"
    visible: VisibleDevices = field(default_factory=lambda: parse_visible_devices(None))
    torch_version: Optional[str] = None
    torch_cuda: Optional[str] = None
    master_port: Optional[int] = None
    master_port_holder: Optional[str] = None
    master_port_invalid: Optional[str] = None


@dataclass(frozen=True)
class LaunchDecision:
    backend: str
    nproc: int
    gpu_indices: tuple[int, ...] = ()
    refusals: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    # Why `--backend auto` fell back to gloo on CPU (None when NCCL was chosen or asked for): said in the
    # output's first line, since a user who typed the README's NCCL command must not miss it.
    fallback: Optional[str] = None


def parse_gpu_query(text: str) -> list[GpuInfo]:
    """Rows of NVIDIA_SMI_GPUS; N/A and garbage become None, short rows are skipped."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        index = parse_int(parts[0]) if len(parts) >= 7 else None
        if index is None:
            continue
        gpus.append(
            GpuInfo(
                index=index,
                uuid=parts[1],
                name=parts[2],
                compute_mode=parts[3],
                pcie_gen=parse_int(parts[4]),
                pcie_width=parse_int(parts[5]),
                driver=parts[6],
            )
        )
    return gpus


def parse_compute_apps(text: str) -> dict[str, list[str]]:
    apps: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].startswith(("GPU-", "MIG-")):
            apps.setdefault(parts[0], []).append(" ".join(parts[1:3]))
    return apps


def read_torch_build() -> tuple[Optional[str], Optional[str]]:
    """(torch version, CUDA version it was built for) from torch/version.py, without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None, None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    namespace: dict[str, Any] = {}
    try:
        code = compile(path.read_text(), str(path), "exec")
        exec(code, namespace)  # noqa: S102 - torch's own generated metadata file, no imports of torch
    except (OSError, SyntaxError, Exception):  # noqa: BLE001
        return None, None
    version, cuda = namespace.get("__version__"), namespace.get("cuda")
    return (str(version) if version else None, str(cuda) if cuda else None)


def read_fake_gpus(directory: str) -> tuple[CommandResult, list[GpuInfo], Optional[str], Optional[str]]:
    """The test-only stand-in (FAKE_GPU_ENV): GPUs from nvml.json, torch's build from torch-info.txt."""
    root = Path(directory)
    try:
        nvml = load_json_file(root / "nvml.json")
        torch_info = load_json_file(root / "torch-info.txt")
        gpus = [
            GpuInfo(
                index=int(g["index"]),
                uuid=str(g.get("uuid") or ""),
                name=str(g.get("name") or ""),
                compute_mode=str(g.get("compute_mode") or "Default"),
                pcie_gen=(g.get("pcie") or {}).get("gen_max"),
                pcie_width=(g.get("pcie") or {}).get("width_max"),
                driver=str(nvml.get("driver_version") or ""),
            )
            for g in nvml.get("gpus") or []
        ]
        torch = torch_info.get("torch") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        result = CommandResult(argv=NVIDIA_SMI_GPUS.argv, found=False, error=f"{FAKE_GPU_ENV}: {exc}")
        return result, [], None, None
    shown = "\n".join(f"{g.index}, {g.uuid}, {g.name}, {g.compute_mode}" for g in gpus)
    result = CommandResult(argv=NVIDIA_SMI_GPUS.argv, returncode=0, stdout=shown)
    return result, gpus, torch.get("version"), torch.get("cuda")


def read_memory_ceiling(backend: str, indices: Optional[list[int]], names: Sequence[str]) -> Any:
    """The GPUs' memory bandwidth (limits.MemoryBandwidth from NVML, else the datasheet table by GPU
    name): no algbw above it is real. None for gloo on CPU."""
    if backend != "nccl":
        return None
    from ddpdoctor.bench.limits import bandwidth_ceiling
    from ddpdoctor.edge.nvml import read_memory_specs

    specs = read_memory_specs(indices)
    if specs:
        return bandwidth_ceiling([(s["name"], s["bus_width_bits"], s["max_memory_clock_mhz"]) for s in specs])
    return bandwidth_ceiling([(n, None, None) for n in names])


def gather_launch_facts(
    run: Callable[[Command], CommandResult],
    env: Mapping[str, str],
    find_holder: Optional[Callable[[int], Any]] = None,
) -> LaunchFacts:
    """Equivalent: nvidia-smi --query-gpu=...; nvidia-smi --query-compute-apps=...; ss -ltnp sport = :$MASTER_PORT."""
    facts = LaunchFacts(visible=parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES")))
    fake = os.environ.get(FAKE_GPU_ENV)
    if fake:
        facts.gpu_query, facts.gpus, facts.torch_version, facts.torch_cuda = read_fake_gpus(fake)
    else:
        facts.gpu_query = run(NVIDIA_SMI_GPUS)
        if facts.gpu_query.ok:
            facts.gpus = parse_gpu_query(facts.gpu_query.stdout)
        facts.torch_version, facts.torch_cuda = read_torch_build()
    if any(g.compute_mode.lower().startswith("exclusive") for g in facts.gpus):
        apps = run(NVIDIA_SMI_APPS)
        if apps.ok:
            facts.apps = parse_compute_apps(apps.stdout)
    raw_port = env.get("MASTER_PORT")
    # An empty MASTER_PORT counts as unset here: the launcher then picks a free port itself.
    if raw_port:
        port = read_launch_env(env).master_port
        if port is None:
            facts.master_port_invalid = raw_port
        else:
            facts.master_port = port
            if find_holder is None:
                from ddpdoctor.edge.ports import find_port_holder as find_holder
            holder = find_holder(port)
            facts.master_port_holder = holder.describe() if holder is not None else None
    return facts


def visible_gpus(facts: LaunchFacts) -> list[GpuInfo]:
    """The GPUs CUDA will show this process, in CUDA order (CUDA_VISIBLE_DEVICES applied)."""
    vis = facts.visible
    if not vis.is_set:
        return list(facts.gpus)
    by_index = {str(g.index): g for g in facts.gpus}
    out = []
    for entry, kind in zip(vis.entries, vis.kinds):
        if kind == "index":
            g = by_index.get(entry.lstrip("0") or "0")
        elif kind == "uuid":
            g = next((x for x in facts.gpus if x.uuid.startswith(entry)), None)
        else:  # MIG: a slice of a GPU we cannot map here; count it
            g = GpuInfo(-1, entry, "MIG device", "Default", None, None, "")
        if g is None:
            break  # CUDA stops at the first entry that matches no device
        out.append(g)
    return out


def plan_launch(
    facts: LaunchFacts, backend: str, nproc: Optional[int], cpu_count: Optional[int] = None
) -> LaunchDecision:
    """Pick backend and rank count, and the refusals that stop the launch (pure)."""
    gpus = visible_gpus(facts)
    cuda_build = facts.torch_cuda is not None
    usable = cuda_build and len(gpus) > 0
    evidence = [
        Evidence(
            facts.gpu_query.display if facts.gpu_query else "nvidia-smi",
            (facts.gpu_query.excerpt() or facts.gpu_query.describe_failure()) if facts.gpu_query else "",
        ),
        Evidence("CUDA_VISIBLE_DEVICES", str(facts.visible.raw) if facts.visible.is_set else "(unset)"),
        Evidence("torch/version.py", f"torch {facts.torch_version}, cuda {facts.torch_cuda}"),
    ]
    refusals: list[Finding] = []
    notes: list[str] = []
    if facts.master_port_invalid is not None:
        refusals.append(
            MASTER_PORT_INVALID.finding(
                Severity.FAIL,
                f"MASTER_PORT={facts.master_port_invalid!r} is not a port number from 1 to 65535",
                evidence=[Evidence("MASTER_PORT", facts.master_port_invalid)],
                data={"value": facts.master_port_invalid},
            )
        )
    if facts.master_port_holder:
        refusals.append(
            MASTER_PORT_IN_USE.finding(
                Severity.FAIL,
                f"MASTER_PORT={facts.master_port} is pinned but taken: {facts.master_port_holder}",
                evidence=[Evidence(f"ss -ltnp sport = :{facts.master_port}", facts.master_port_holder)],
                data={"port": facts.master_port},
            )
        )
    chosen = backend
    fallback: Optional[str] = None
    if backend == "auto":
        chosen = "nccl" if usable else "gloo"
        if not usable:
            fallback = "torch is a CPU-only build" if not cuda_build else "no GPU is visible"
            notes.append(f"backend gloo on CPU ({fallback})")
    if chosen == "gloo":
        n = nproc or max(2, min(DEFAULT_GLOO_NPROC, cpu_count or DEFAULT_GLOO_NPROC))
        if nproc is not None and cpu_count and nproc > GLOO_RANKS_PER_CPU * cpu_count:
            refusals.append(
                NPROC_TOO_MANY.finding(
                    Severity.FAIL,
                    f"--nproc {nproc} gloo ranks on {cpu_count} usable CPU(s): more than "
                    f"{GLOO_RANKS_PER_CPU} per CPU (at most {GLOO_RANKS_PER_CPU * cpu_count} here)",
                    evidence=[Evidence("os.sched_getaffinity(0)", f"{cpu_count} CPU(s)")],
                    data={"nproc": nproc, "cpus": cpu_count, "ceiling": GLOO_RANKS_PER_CPU * cpu_count},
                )
            )
        return LaunchDecision("gloo", n, (), tuple(refusals), tuple(notes), fallback)
    # NCCL from here on.
    if not usable:
        if not cuda_build:
            why = f"this torch ({facts.torch_version or 'not found'}) is a CPU-only build"
        elif facts.visible.hides_all:
            why = f"CUDA_VISIBLE_DEVICES={facts.visible.raw!r} hides every GPU"
        elif facts.gpu_query is not None and not facts.gpu_query.ok:
            why = f"no GPU found ({facts.gpu_query.describe_failure()})"
        else:
            why = "no GPU is visible"
        refusals.append(
            NCCL_NO_CUDA.finding(Severity.FAIL, f"--backend nccl needs CUDA, but {why}", evidence=evidence)
        )
        return LaunchDecision("nccl", nproc or 0, (), tuple(refusals), tuple(notes))
    n = nproc or len(gpus)
    if facts.visible.duplicates:
        refusals.append(
            DUPLICATE_DEVICES.finding(
                Severity.FAIL,
                f"CUDA_VISIBLE_DEVICES={facts.visible.raw!r} lists {', '.join(facts.visible.duplicates)} more than once",
                evidence=evidence,
            )
        )
    ranks = LocalRanks(n, f"--nproc {n}", "bench")
    refusals += [f for f in judge_placement(ranks, gpu_supply(facts), "nccl") if f.severity >= Severity.FAIL]
    for g in gpus[:n]:
        if g.compute_mode.lower().startswith("exclusive"):
            busy = facts.apps.get(g.uuid, [])
            if busy or n > len(gpus):
                holder = f"already used by {', '.join(busy)}" if busy else "and would be shared by two ranks"
                refusals.append(
                    EXCLUSIVE_PROCESS.finding(
                        Severity.FAIL,
                        f"GPU {g.index} ({g.name}) is in {g.compute_mode} mode {holder}",
                        evidence=evidence,
                        data={"gpu": g.index},
                    )
                )
    return LaunchDecision("nccl", n, tuple(g.index for g in gpus[:n]), tuple(refusals), tuple(notes))


def judge_buffer_memory(
    ops: Sequence[str],
    size: int,
    elt_size: int,
    nranks: int,
    local_ranks: int,
    check: bool,
    available: Optional[int],
    source: str,
) -> Optional[Finding]:
    """The refusal when the largest size's buffers (the op that needs the most, per rank, times the
    ranks sharing `available` bytes) cannot fit, or exceed MAX_BYTES_CEILING; None when they fit or
    the memory is unknown (pure). `local_ranks`: ranks on this host (gloo) or per GPU (NCCL: 1)."""
    from ddpdoctor.bench.math import rank_buffer_bytes
    from ddpdoctor.bench.sizes import format_size

    if not ops:
        return None
    need_op = max(ops, key=lambda op: rank_buffer_bytes(op, size, elt_size, nranks, check))
    per_rank = rank_buffer_bytes(need_op, size, elt_size, nranks, check)
    need = per_rank * max(local_ranks, 1)
    data = {
        "max_bytes": size,
        "op": need_op,
        "per_rank_bytes": per_rank,
        "needed_bytes": need,
        "local_ranks": local_ranks,
        "available_bytes": available,
    }
    if size > MAX_BYTES_CEILING:
        return BUFFERS_TOO_LARGE.finding(
            Severity.FAIL,
            f"the largest size, {format_size(size)}, is above the {format_size(MAX_BYTES_CEILING)} ceiling: no rank can hold "
            "such a buffer",
            evidence=[Evidence("--max-bytes", str(size))],
            data=data,
        )
    if available is None or need <= available:
        return None
    return BUFFERS_TOO_LARGE.finding(
        Severity.FAIL,
        f"the largest size, {format_size(size)}, needs about {_gib(need)} ({need_op}: {_gib(per_rank)} per rank x "
        f"{local_ranks} rank(s)), but only {_gib(available)} is available",
        evidence=[Evidence(source, f"{available} bytes available")],
        data=data,
    )


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def read_available_memory(backend: str, gpu_indices: Sequence[int]) -> tuple[Optional[int], str]:
    """Bytes one group of ranks may allocate, and where that came from: the smallest free memory of
    the GPUs used (NCCL, from NVML; None when unreadable), else the host's available memory.
    Equivalent: nvidia-smi --query-gpu=memory.free --format=csv / free -b (available)."""
    if backend == "nccl":
        from ddpdoctor.edge.nvml import read_memory_specs

        free = [s.get("free_memory_bytes") for s in read_memory_specs(list(gpu_indices))]
        known = [f for f in free if isinstance(f, int)]
        if not known or len(known) < len(free):
            return None, "nvmlDeviceGetMemoryInfo"
        return min(known), "nvmlDeviceGetMemoryInfo (free, smallest of the GPUs used)"
    try:
        import psutil

        return int(psutil.virtual_memory().available), "psutil.virtual_memory().available (free -b)"
    except Exception:  # noqa: BLE001 - an odd container: only the ceiling applies
        return None, "psutil.virtual_memory()"


def gpu_supply(facts: LaunchFacts) -> GpuSupply:
    """The GPUs this node's ranks can have, from the launch facts (CUDA_VISIBLE_DEVICES applied)."""
    query = facts.gpu_query
    source = query.display if query is not None else "nvidia-smi"
    excerpt = f"CUDA_VISIBLE_DEVICES={facts.visible.raw if facts.visible.is_set else '(unset)'}"
    if facts.gpus or (query is not None and query.ok):
        gpus = visible_gpus(facts)
        listed = "; ".join(f"{g.index} {g.name}" for g in facts.gpus)
        return GpuSupply(len(gpus), source, excerpt=f"{listed or 'no GPU listed'}; {excerpt} -> {len(gpus)}")
    why = query.describe_failure() if query is not None else "not queried"
    return GpuSupply(None, source, why_unknown=f"no GPU found: {why}", excerpt=why)


def plan_joined(facts: LaunchFacts, backend: str, env: Mapping[str, str]) -> LaunchDecision:
    """Backend and refusals for a rank started by torchrun/srun (pure): every rank of a node computes the
    same answer from the same facts, so all of them refuse together, before init_process_group."""
    ranks = read_local_ranks(env)
    supply = gpu_supply(facts)
    cuda_build = facts.torch_cuda is not None
    chosen = backend
    notes: list[str] = []
    if backend == "auto":
        chosen = "nccl" if cuda_build and (supply.visible or 0) > 0 else "gloo"
        if chosen == "gloo":
            notes.append(
                f"backend gloo on CPU ({'no GPU is visible' if cuda_build else 'torch is a CPU-only build'})"
            )
    refusals: list[Finding] = []
    if chosen == "nccl" and not cuda_build:
        refusals.append(
            NCCL_NO_CUDA.finding(
                Severity.FAIL,
                f"--backend nccl needs CUDA, but this torch ({facts.torch_version or 'not found'}) is a CPU-only build",
                evidence=[
                    Evidence("torch/version.py", f"torch {facts.torch_version}, cuda {facts.torch_cuda}")
                ],
            )
        )
    if chosen == "nccl" and facts.visible.duplicates:
        refusals.append(
            DUPLICATE_DEVICES.finding(
                Severity.FAIL,
                f"CUDA_VISIBLE_DEVICES={facts.visible.raw!r} lists {', '.join(facts.visible.duplicates)} more than once",
                evidence=[Evidence("CUDA_VISIBLE_DEVICES", str(facts.visible.raw))],
            )
        )
    refusals += [f for f in judge_placement(ranks, supply, chosen) if f.severity >= Severity.FAIL]
    return LaunchDecision(chosen, ranks.count or 0, (), tuple(refusals), tuple(notes))


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
