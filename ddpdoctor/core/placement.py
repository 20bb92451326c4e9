"""How many ranks of this job run on this node, and how many GPUs they can have (pure).

One judgement for every command that starts or checks ranks: `check` (gpu area, also with
`--nproc-per-node N` before a job starts), `check --cluster`, `bench-nccl` (local and under
torchrun/srun), `bench-nccl --pairwise` and the NCCL smoke test. Ranks per node come from the launcher's
environment (`read_local_ranks`); the GPUs from NVML, nvidia-smi or a snapshot after CUDA_VISIBLE_DEVICES,
gathered at each caller's edge into a `GpuSupply`; `judge_placement` turns both into findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from ddpdoctor.core.launchenv import read_launch_env
from ddpdoctor.core.launchenv import tasks_on_node as tasks_on_node  # re-exported
from ddpdoctor.core.model import Evidence, Finding, Severity, define

PLACEMENT = define(
    "gpu.ranks_per_node",
    "Ranks per node and GPUs",
    "NCCL needs one GPU per rank. With more ranks on a node than GPUs visible to them, ranks whose "
    "LOCAL_RANK has no GPU fail with 'CUDA error: invalid device ordinal', and ranks mapped onto the same "
    "GPU (LOCAL_RANK % GPUs, or no set_device at all) make NCCL fail with 'Duplicate GPU detected : rank 0 "
    "and rank 1 both on CUDA device ...' or deadlock in the first collective. A gloo job on CPU does not "
    "use the GPUs and is unaffected. Ranks per node come from `check --nproc-per-node N` (a preflight "
    "before the job starts), torchrun's LOCAL_WORLD_SIZE (or its agent's PET_NPROC_PER_NODE), or Slurm's "
    "SLURM_STEP_TASKS_PER_NODE / SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE (the `2(x3),1` form read "
    "for this SLURM_NODEID); GPUs from NVML or nvidia-smi after CUDA_VISIBLE_DEVICES (indices, UUIDs, MIG "
    "ids), less those already running another job's compute process (a warning). Under srun's per-task "
    "GPU binding (--gpus-per-task, or a CUDA_VISIBLE_DEVICES narrower than SLURM_STEP_GPUS) each task is "
    "judged on its own GPUs. Judged the same way by `check`, `check --cluster`, `bench-nccl` (local and "
    "on every rank under torchrun/srun, which refuse with exit 2), `bench-nccl --pairwise` and the smoke "
    "test. Where no GPU can be read it is never a pass: inconclusive (exit 3) for `check --nproc-per-node`, "
    "which asked the question, and a skip under a launcher, where gloo on CPU is a fine answer.",
    "Start at most one rank per visible GPU (torchrun --nproc-per-node, srun --ntasks-per-node), make more "
    "GPUs visible (CUDA_VISIBLE_DEVICES, the scheduler's GPU request), or run the job with gloo on CPU.",
)
SLURM_SHORT = define(
    "gpu.slurm.gpus_short",
    "Slurm gave fewer GPUs than the job asked for",
    "The job asked Slurm for GPUs per task (--gpus-per-task, SLURM_GPUS_PER_TASK) but the node or the "
    "task got fewer (SLURM_GPUS_ON_NODE, the GPUs visible to the task): some ranks have no GPU of their "
    "own, and fail or share one.",
    "Check the allocation (`scontrol show job $SLURM_JOB_ID | grep -i tres`), request GPUs per node that "
    "match tasks per node x GPUs per task, or lower --ntasks-per-node.",
)


@dataclass(frozen=True)
class LocalRanks:
    """How many ranks of this job run on this node, and where that number came from."""

    count: Optional[int] = None
    source: str = ""  # e.g. "LOCAL_WORLD_SIZE=2", "SLURM_TASKS_PER_NODE=2(x3)", "--nproc-per-node 8"
    # "torchrun", "slurm", "env" (set by hand), "preflight" (check --nproc-per-node), "bench" (--nproc)
    launcher: str = ""
    gpus_per_task: Optional[int] = None  # SLURM_GPUS_PER_TASK
    gpus_on_node: Optional[int] = None  # SLURM_GPUS_ON_NODE
    # srun with --gpus-per-task binds GPUs per task: each task sees only its own GPU(s).
    per_task_binding: bool = False
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuSupply:
    """The GPUs the ranks of this node can use, as gathered at the caller's edge."""

    visible: Optional[int]  # devices CUDA shows this process (CUDA_VISIBLE_DEVICES applied); None unknown
    source: str  # "NVML", "nvidia-smi", "torch", ...
    why_unknown: str = ""  # when visible is None: why the GPUs could not be read
    held_by_others: tuple[str, ...] = ()  # "GPU 1: pid 4242 python" (compute processes of another job)
    held_gpus: int = 0  # visible GPUs holding another job's compute process
    excerpt: str = ""  # evidence: the raw reading


def read_local_ranks(env: Mapping[str, str], nproc_per_node: Optional[int] = None) -> LocalRanks:
    """Ranks of this job on this node, from the environment (pure; never raises).

    An explicit `--nproc-per-node` wins (preflight before a job starts), then what `read_launch_env`
    reads: torchrun's LOCAL_WORLD_SIZE (torchrun starts the per-node workers, also inside a Slurm step)
    or its agent's PET_NPROC_PER_NODE, then Slurm's tasks per node.
    """
    launch = read_launch_env(env)
    common = {"gpus_per_task": launch.gpus_per_task, "gpus_on_node": launch.gpus_on_node}
    if nproc_per_node is not None and nproc_per_node > 0:
        return LocalRanks(nproc_per_node, f"--nproc-per-node {nproc_per_node}", "preflight", **common)
    return LocalRanks(
        launch.ranks_per_node,
        launch.ranks_per_node_source,
        launch.ranks_per_node_launcher,
        per_task_binding=launch.per_task_binding,
        problems=launch.ranks_per_node_problems,
        **common,
    )


def choose_cuda_index(local_rank: int, visible: Optional[int], env: Mapping[str, str]) -> int:
    """The CUDA device index a rank with `local_rank` pins, consistent with `judge_placement` (pure).

    `visible`: the devices CUDA shows this process (None when unknown). LOCAL_RANK counts ranks across
    the node, but under srun's per-task GPU binding (--gpus-per-task, --gpu-bind) each task sees only
    its own GPU(s), renumbered from 0: the judgement calls that fine, so the rank takes its task's first
    GPU rather than fail with 'invalid device ordinal'. Likewise with exactly one GPU visible (a wrapper
    that sets CUDA_VISIBLE_DEVICES per rank). Otherwise LOCAL_RANK, which the judgement already fails
    when it is past the visible GPUs.
    """
    if visible is None or local_rank < visible:
        return local_rank
    if visible == 1 or (visible > 1 and read_local_ranks(env).per_task_binding):
        return 0
    return local_rank


def _consequence(n: int, have: int) -> str:
    if have == 0:
        return "with NCCL every rank fails ('no CUDA GPUs are available')"
    return (
        f"ranks with LOCAL_RANK >= {have} get 'CUDA error: invalid device ordinal', or, mapped with "
        f"LOCAL_RANK % {have}, two ranks share a GPU and NCCL fails with 'Duplicate GPU detected' or deadlocks"
    )


def _fix(n: int, have: int, ranks: LocalRanks) -> str:
    if ranks.launcher == "bench":
        fewer = f"bench-nccl --nproc {have}" if have else "a node with GPUs"
    elif ranks.launcher == "slurm":
        fewer = f"srun --ntasks-per-node={have}" if have else "a GPU partition (--gpus-per-node)"
    elif ranks.launcher == "preflight":
        fewer = f"--nproc-per-node {have}" if have else "a node with GPUs"
    else:
        fewer = f"torchrun --nproc-per-node {have}" if have else "a node with GPUs"
    return (
        f"Start at most {have} rank(s) on this node ({fewer}), or make {n} GPUs visible "
        "(CUDA_VISIBLE_DEVICES, the scheduler's GPU request); a CPU job can use the gloo backend "
        "(bench-nccl --backend gloo)."
    )


def judge_placement(ranks: LocalRanks, supply: GpuSupply, backend: Optional[str] = None) -> list[Finding]:
    """Whether this node's ranks each get a GPU. `backend`: "nccl", "gloo", or None when not known (check).

    Fail for NCCL (or an unknown backend on a node with GPUs); fine for gloo on CPU, and says so.
    """
    n = ranks.count
    if n is None:
        return []
    src = ranks.source
    ev = [
        Evidence("environment", src + "".join(f"; {p}" for p in ranks.problems)),
        Evidence(supply.source or "GPUs", supply.excerpt or _describe_supply(supply)),
    ]
    data = {
        "local_ranks": n,
        "source": src,
        "launcher": ranks.launcher,
        "visible_gpus": supply.visible,
        "gpus_per_task": ranks.gpus_per_task,
        "gpus_on_node": ranks.gpus_on_node,
        "backend": backend,
    }
    have = supply.visible
    if backend == "gloo":
        if have is not None and n > have:
            text = f"{n} rank(s) per node ({src}), {have} GPU(s) visible: fine for gloo on CPU"
        else:
            text = f"{n} rank(s) per node ({src}) with gloo on CPU: the GPUs are not used"
        return [PLACEMENT.finding(Severity.OK, text, evidence=ev, data=data)]
    findings = _judge_slurm(ranks, supply, ev, data)
    # `check --nproc-per-node N` asks this one question: where it cannot be answered, the run is
    # inconclusive (exit 3), never a pass. Under a launcher the count is only context, and gloo on CPU
    # is a fine answer, so there it stays a skip.
    asked = ranks.launcher == "preflight" and backend is None
    if have is None:
        return findings + [
            PLACEMENT.finding(
                Severity.FAIL if backend == "nccl" else Severity.ERROR if asked else Severity.SKIP,
                f"{n} rank(s) per node ({src}), but the GPUs cannot be read here ({supply.why_unknown or 'unknown'}): "
                + (
                    "NCCL needs one GPU per rank"
                    if backend == "nccl"
                    else "not judged (fine for gloo on CPU)"
                ),
                evidence=ev,
                fix="Check that `nvidia-smi` lists the GPUs on this node (driver loaded, devices passed into "
                "the container), or use the gloo backend on CPU."
                if backend == "nccl" or asked
                else None,
                data=data,
            )
        ]
    if ranks.per_task_binding:
        # Each task sees only its own GPU(s): the node-wide count is Slurm's to keep (judged above).
        if not findings:
            findings.append(
                PLACEMENT.finding(
                    Severity.OK,
                    f"{n} task(s) per node ({src}), GPUs bound per task: this task sees {have}",
                    evidence=ev,
                    data=data,
                )
            )
        return findings
    if have == 0 and backend is None:
        return findings + [
            PLACEMENT.finding(
                Severity.ERROR if asked else Severity.SKIP,
                f"{n} rank(s) per node ({src}) but no GPU is visible here: cannot judge GPU placement "
                "(fine for gloo on CPU; NCCL would fail)",
                evidence=ev,
                fix="Run this check on the GPU node the job will use, with its GPUs visible "
                "(CUDA_VISIBLE_DEVICES, the scheduler's GPU request); a CPU job on gloo needs no GPU."
                if asked
                else None,
                data=data,
            )
        ]
    if n > have:
        return findings + [
            PLACEMENT.finding(
                Severity.FAIL,
                f"{n} rank(s) per node ({src}) but {have} GPU(s) visible: {_consequence(n, have)}",
                evidence=ev,
                fix=_fix(n, have, ranks),
                data=data,
            )
        ]
    free = have - supply.held_gpus
    if supply.held_gpus and n > free:
        return findings + [
            PLACEMENT.finding(
                Severity.WARN,
                f"{n} rank(s) per node ({src}), {have} GPU(s) visible, but {supply.held_gpus} already "
                f"run another job's process ({'; '.join(supply.held_by_others[:3])}): {n - free} rank(s) "
                "would share a GPU with it (slower, or out of memory)",
                evidence=ev,
                fix="Stop the other job's processes (`nvidia-smi --query-compute-apps=pid,process_name "
                "--format=csv`), or ask the scheduler why the node was handed out busy.",
                data=data | {"held_by_others": list(supply.held_by_others)},
            )
        ]
    return findings + [
        PLACEMENT.finding(
            Severity.OK,
            f"{n} rank(s) per node ({src}), {have} GPU(s) visible: one GPU per rank",
            evidence=ev,
            data=data,
        )
    ]


def _judge_slurm(ranks: LocalRanks, supply: GpuSupply, ev: list[Evidence], data: dict) -> list[Finding]:
    """A job that asked Slurm for GPUs per task but got fewer, naming both numbers."""
    gpt, n = ranks.gpus_per_task, ranks.count or 0
    if gpt is None:
        return []
    findings = []
    asked = gpt * n
    got = ranks.gpus_on_node
    if got is not None and got < asked:
        findings.append(
            SLURM_SHORT.finding(
                Severity.FAIL,
                f"Slurm was asked for {gpt} GPU(s) per task x {n} task(s) = {asked} GPU(s) on this node "
                f"but allocated {got} (SLURM_GPUS_ON_NODE={got})",
                evidence=ev,
                data=data | {"asked": asked, "got": got},
            )
        )
    have = supply.visible
    if ranks.per_task_binding and have is not None and have < gpt:
        findings.append(
            SLURM_SHORT.finding(
                Severity.FAIL,
                f"Slurm was asked for {gpt} GPU(s) per task (SLURM_GPUS_PER_TASK) but this task sees {have}",
                evidence=ev,
                data=data | {"asked": gpt, "got": have},
            )
        )
    return findings


def _describe_supply(supply: GpuSupply) -> str:
    if supply.visible is None:
        return supply.why_unknown or "GPUs unknown"
    held = f"; held by another job: {'; '.join(supply.held_by_others[:4])}" if supply.held_by_others else ""
    return f"{supply.visible} GPU(s) visible{held}"


def _visible_gpu_dicts(gpus: list[Mapping], raw_visible: Optional[str]) -> list[Mapping]:
    from ddpdoctor.core.visible_devices import parse_visible_devices

    vis = parse_visible_devices(raw_visible)
    if not vis.is_set:
        return list(gpus)
    out = []
    for entry, kind in zip(vis.entries, vis.kinds):
        if kind == "index":
            match = next((g for g in gpus if str(g.get("index")) == (entry.lstrip("0") or "0")), None)
        elif kind == "uuid":
            match = next((g for g in gpus if str(g.get("uuid") or "").startswith(entry)), None)
        else:
            match = None  # a MIG instance: counted, but its parent GPU is not known here
        if match is not None:
            out.append(match)
    return out


def supply_from_gpus(
    gpus: list[Mapping],
    raw_visible: Optional[str],
    source: str,
    job_pids: Optional[frozenset[int]] = None,
    why_unknown: str = "",
) -> GpuSupply:
    """The supply from per-GPU dicts in nvml.GPU_SHAPE (NVML, nvidia-smi -q, a snapshot), after
    CUDA_VISIBLE_DEVICES (indices, UUIDs, MIG ids). `job_pids`: this job's processes, so that compute
    processes of another job can be told apart (None: not known, e.g. in a replay)."""
    from ddpdoctor.core.visible_devices import expected_cuda_count, parse_visible_devices

    live = [g for g in gpus if not g.get("lost")]
    if not gpus and why_unknown:
        return GpuSupply(None, source, why_unknown=why_unknown)
    count = expected_cuda_count(live, raw_visible)
    if count is None:  # MIG ids: CUDA shows each listed instance
        count = len(parse_visible_devices(raw_visible).entries)
    held: list[str] = []
    held_gpus = 0
    if job_pids is not None:
        for g in _visible_gpu_dicts(live, raw_visible):
            others = [
                p
                for p in g.get("processes") or []
                if "C" in str(p.get("type") or "C").upper() and p.get("pid") not in job_pids
            ]
            if others:
                held_gpus += 1
                held += [f"GPU {g.get('index')}: pid {p.get('pid')} {p.get('name') or '?'}" for p in others]
    names = sorted({str(g.get("name")) for g in live if g.get("name")})
    excerpt = (
        f"{len(live)} GPU(s) ({', '.join(names) or 'unnamed'}); CUDA_VISIBLE_DEVICES="
        + (raw_visible if raw_visible is not None else "(unset)")
        + f" -> {count} visible"
    )
    return GpuSupply(count, source, held_by_others=tuple(held), held_gpus=held_gpus, excerpt=excerpt)
