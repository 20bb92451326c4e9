"""Launch environment: torchrun / torchelastic and Slurm variables, and CUDA_VISIBLE_DEVICES.

Everything here is judged from the (redacted) environment, so it works the same on a snapshot.
"""

from __future__ import annotations

from typing import Mapping, Optional

from ddpdoctor.core.engine import ENV_NOT_RECORDED, Area, Context
from ddpdoctor.core.launchenv import (
    SHOWN_PREFIXES,
    SLURM_INT_VARS,
    TORCH_INT_VARS,
    LaunchEnv,
    read_launch_env,
)
from ddpdoctor.core.launchenv import parse_port as parse_port  # re-exported
from ddpdoctor.core.launchenv import valid_host as valid_host
from ddpdoctor.core.model import CheckSpec, Evidence, Finding, Severity, define
from ddpdoctor.core.visible_devices import parse_visible_devices
from ddpdoctor.parsers.numbers import parse_int as parse_int  # re-exported: the one integer reader

# What init_process_group(init_method="env://") reads; a partial set is the classic
# "environment variable RANK expected, but not set".
ENV_INIT_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
# The variables this area reports as malformed (LaunchEnv reads more: MPI's, PET_*, the Slurm ids).
CHECKED_VARS = frozenset(TORCH_INT_VARS + SLURM_INT_VARS + ("MASTER_PORT", "MASTER_ADDR"))
SHOWN_VARS = TORCH_INT_VARS + (
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_NCCL_USE_COMM_NONBLOCKING",
)

LAUNCHER = define(
    "launch.launcher",
    "Launcher",
    "Which launcher set up this process (torchrun, Slurm, none), and the rank variables it set.",
)
MALFORMED = define(
    "launch.var.malformed",
    "Malformed launch variable",
    "torch parses RANK, WORLD_SIZE, LOCAL_RANK, MASTER_PORT and the Slurm counters as integers; a "
    "value such as RANK=abc or MASTER_PORT=99999 makes init_process_group raise (ValueError, or a store "
    "that cannot bind or connect).",
    "Fix the variable where the job script or launcher sets it; let torchrun set the rank variables.",
)
MISSING = define(
    "launch.var.missing",
    "Launch variables missing",
    "init_process_group(init_method='env://') needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE. With "
    'only some set it fails with "environment variable RANK expected, but not set" (or hangs waiting '
    "for ranks that never come).",
    "Launch with `torchrun --nproc_per_node=N train.py`, which sets all of them; or export all four.",
)
RANK_RANGE = define(
    "launch.rank.out_of_range",
    "RANK range",
    "Ranks run from 0 to WORLD_SIZE-1. A rank outside that range never joins: the rendezvous waits for "
    "the missing rank until it times out, or the store rejects it.",
    "Make WORLD_SIZE the total number of processes (nodes x processes per node) and RANK unique in "
    "0..WORLD_SIZE-1; with torchrun set --nnodes and --nproc_per_node and let it compute both.",
)
LOCAL_RANK_RANGE = define(
    "launch.local_rank.out_of_range",
    "LOCAL_RANK range",
    "LOCAL_RANK selects the GPU of a process on its node and runs from 0 to LOCAL_WORLD_SIZE-1; a value "
    "outside makes two ranks share a GPU or picks a GPU that does not exist (invalid device ordinal).",
    "Let torchrun set LOCAL_RANK and LOCAL_WORLD_SIZE (--nproc_per_node); do not derive them by hand.",
)
SIZES = define(
    "launch.world_size.inconsistent",
    "Inconsistent world sizes",
    "WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK and RANK must fit together (RANK = GROUP_RANK x "
    "LOCAL_WORLD_SIZE + LOCAL_RANK on uniform nodes); when they do not, two processes claim one rank "
    "or the rendezvous waits for a rank that never comes.",
    "Use the same --nnodes/--nproc_per_node on every node and let torchrun compute the rank variables.",
)
SLURM = define(
    "launch.slurm.mismatch",
    "Slurm and torch disagree",
    "When Slurm starts one task per rank (srun without torchrun), RANK must be SLURM_PROCID, WORLD_SIZE "
    "SLURM_NTASKS and LOCAL_RANK SLURM_LOCALID. A mismatch gives duplicate or missing ranks: a hang at "
    "init_process_group, or two ranks on one GPU.",
    "Derive the torch variables from Slurm's in the job script (RANK=$SLURM_PROCID, "
    "WORLD_SIZE=$SLURM_NTASKS, LOCAL_RANK=$SLURM_LOCALID), or run one torchrun per node with "
    "`srun --ntasks-per-node=1 torchrun ...`.",
)
SLURM_TORCHRUN = define(
    "launch.slurm.torchrun_per_task",
    "Several torchrun agents per node",
    "Under Slurm, torchrun should run once per node (it starts the per-GPU workers itself). With more "
    "Slurm tasks than nodes, several agents start on each node: duplicate ranks, port clashes on "
    "MASTER_PORT and a rendezvous that never completes.",
    "Use `srun --ntasks-per-node=1 torchrun --nproc_per_node=N ...` (or #SBATCH --ntasks-per-node=1).",
)
RESTARTED = define(
    "launch.elastic.restarted",
    "Elastic restart",
    "TORCHELASTIC_RESTART_COUNT > 0 means torchrun already restarted the workers after a failure: the "
    "first failure's logs hold the root cause.",
    "Read the logs of the first attempt (torchrun prints the root-cause rank and exit code).",
)
CVD = define(
    "launch.cuda_visible_devices",
    "Visible GPUs",
    "Which GPUs CUDA shows to this process (indices, GPU UUIDs or MIG ids).",
)
CVD_DUP = define(
    "launch.cuda_visible_devices.duplicate",
    "GPU listed twice in CUDA_VISIBLE_DEVICES",
    "A GPU listed twice appears as two devices that are really one: two ranks using cuda:0 and cuda:1 "
    'share a GPU, and NCCL fails with "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device" '
    "or the job deadlocks in its first collective.",
    "List each GPU once (e.g. CUDA_VISIBLE_DEVICES=0,1), and give every rank its own GPU with "
    "`torch.cuda.set_device(int(os.environ['LOCAL_RANK']))`.",
)
CVD_INVALID = define(
    "launch.cuda_visible_devices.invalid",
    "Invalid CUDA_VISIBLE_DEVICES entry",
    "CUDA stops reading CUDA_VISIBLE_DEVICES at the first empty or invalid entry: that GPU and every one "
    "listed after it are silently hidden (fewer GPUs than ranks, 'invalid device ordinal').",
    "Use comma-separated indices (0,1,2,3), GPU UUIDs (GPU-...) or MIG ids (MIG-...), no empty entries "
    "or spaces; `nvidia-smi -L` lists valid ids.",
)
CVD_EMPTY = define(
    "launch.cuda_visible_devices.empty",
    "CUDA_VISIBLE_DEVICES hides every GPU",
    "An empty CUDA_VISIBLE_DEVICES (or one starting with an invalid entry such as -1) hides every GPU: "
    'fine for a CPU/gloo job, fatal for the nccl backend ("no CUDA GPUs are available").',
    "Unset CUDA_VISIBLE_DEVICES, or list the GPUs this job should use.",
)
DEVICE_ORDINAL = define(
    "launch.local_rank.no_device",
    "LOCAL_RANK has no GPU",
    "A rank that calls torch.cuda.set_device(LOCAL_RANK) needs at least LOCAL_RANK+1 visible GPUs; "
    "otherwise it fails with 'CUDA error: invalid device ordinal'.",
    "Keep --nproc_per_node at most the number of visible GPUs; when CUDA_VISIBLE_DEVICES gives each "
    "process a single GPU, use cuda:0 in the script instead of cuda:LOCAL_RANK.",
)


def parse_launch_env(env: Mapping[str, str]) -> LaunchEnv:
    """Pick out and type-check the launch variables; never raises, whatever the values."""
    return read_launch_env(env)


def is_multi_node(env: Mapping[str, str]) -> bool:
    """The job spans nodes, as far as the environment tells."""
    parsed = parse_launch_env(env)
    for name in ("GROUP_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        if (parsed.get(name) or 0) > 1:
            return True
    world, local = parsed.get("WORLD_SIZE"), parsed.get("LOCAL_WORLD_SIZE")
    return world is not None and local is not None and world > local


def _ev(launch: LaunchEnv, *names: str) -> list[Evidence]:
    shown = " ".join(f"{n}={launch.raw[n]}" for n in names if n in launch.raw)
    return [Evidence("environment", shown)]


def check_launcher(launch: LaunchEnv, env: Mapping[str, str]) -> list[Finding]:
    kinds = (["torchrun"] if launch.under_torchrun else []) + (["Slurm"] if launch.under_slurm else [])
    shown = {n: launch.raw[n] for n in sorted(launch.raw) if n in SHOWN_VARS or n.startswith(SHOWN_PREFIXES)}
    if not kinds and not any(n in launch.raw for n in ENV_INIT_VARS):
        text = "No launcher variables set (normal outside a job; torchrun or srun set them for each rank)"
    else:
        head = " under ".join(kinds) if kinds else "Launch variables set by hand"
        core = ", ".join(
            f"{n}={launch.raw[n]}" for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if n in launch.raw
        )
        text = head + (f": {core}" if core else "")
    excerpt = "\n".join(f"{k}={v}" for k, v in shown.items())
    return [
        LAUNCHER.finding(
            Severity.INFO, text, evidence=[Evidence("environment", excerpt)], data={"vars": shown}
        )
    ]


MALFORMED_FIXES = {
    "MASTER_PORT": "Set MASTER_PORT to a free TCP port between 1024 and 65535, outside the ephemeral range "
    "(e.g. 29500), or pass --master_port to torchrun.",
    "MASTER_ADDR": "Set MASTER_ADDR to the bare host name or IP address of the rank-0 node (no tcp://, no "
    ":port), or pass --master_addr to torchrun.",
}


def malformed_fix(name: str) -> str:
    """The fix for one malformed variable, naming it."""
    if name in MALFORMED_FIXES:
        return MALFORMED_FIXES[name]
    setter = "srun sets SLURM_* itself" if name.startswith("SLURM_") else "torchrun sets it for every worker"
    return (
        f"Set {name} to a whole number >= 0 (> 0 for a size) where the job script sets it, or leave it "
        f"to the launcher ({setter})."
    )


def check_malformed(launch: LaunchEnv) -> list[Finding]:
    return [
        MALFORMED.finding(
            Severity.FAIL,
            why,
            evidence=_ev(launch, name),
            fix=malformed_fix(name),
            data={"name": name, "value": launch.raw.get(name, "")},
        )
        for name, why in sorted(launch.malformed.items())
        if name in CHECKED_VARS
    ]


def check_missing(launch: LaunchEnv) -> list[Finding]:
    present = [n for n in ENV_INIT_VARS if n in launch.raw]
    missing = [n for n in ENV_INIT_VARS if n not in launch.raw]
    if not present or not missing:
        return []
    return [
        MISSING.finding(
            Severity.FAIL,
            f"{', '.join(present)} set but {', '.join(missing)} not: init_process_group('env://') will fail",
            evidence=_ev(launch, *ENV_INIT_VARS),
            data={"present": present, "missing": missing},
        )
    ]


def _check_range(spec: CheckSpec, launch: LaunchEnv, name: str, size_name: str, noun: str) -> list[Finding]:
    """`name` (RANK, LOCAL_RANK) must lie in 0..`size_name`-1 when both are set."""
    value, size = launch.get(name), launch.get(size_name)
    if value is None or size is None:
        return []
    ev = _ev(launch, name, size_name)
    if value < size:
        return [spec.finding(Severity.OK, f"{name}={value} within {size_name}={size}", evidence=ev)]
    return [
        spec.finding(
            Severity.FAIL,
            f"{name}={value} but {size_name}={size}: {noun} run from 0 to {size - 1}",
            evidence=ev,
            data={name.lower(): value, size_name.lower(): size},
        )
    ]


def check_ranks(launch: LaunchEnv) -> list[Finding]:
    rank, world = launch.get("RANK"), launch.get("WORLD_SIZE")
    local, local_world = launch.get("LOCAL_RANK"), launch.get("LOCAL_WORLD_SIZE")
    group = launch.get("GROUP_RANK")
    findings = _check_range(RANK_RANGE, launch, "RANK", "WORLD_SIZE", "ranks")
    findings += _check_range(LOCAL_RANK_RANGE, launch, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "local ranks")
    if world is not None and local_world is not None:
        names = ("WORLD_SIZE", "LOCAL_WORLD_SIZE")
        if local_world > world:
            findings.append(
                SIZES.finding(
                    Severity.FAIL,
                    f"LOCAL_WORLD_SIZE={local_world} is larger than WORLD_SIZE={world}",
                    evidence=_ev(launch, *names),
                )
            )
        elif world % local_world:
            findings.append(
                SIZES.finding(
                    Severity.WARN,
                    f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}: nodes run "
                    "different numbers of processes (or disagree on the world size)",
                    evidence=_ev(launch, *names),
                )
            )
        elif None not in (rank, local, group) and local is not None and local < local_world:
            assert rank is not None and group is not None
            expected = group * local_world + local
            if expected != rank:
                findings.append(
                    SIZES.finding(
                        Severity.WARN,
                        f"RANK={rank} but GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK = {expected}",
                        evidence=_ev(launch, "RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK"),
                    )
                )
    return findings


def check_slurm(launch: LaunchEnv, env: Mapping[str, str]) -> list[Finding]:
    ntasks, nnodes = (
        launch.get("SLURM_NTASKS"),
        launch.get("SLURM_NNODES") or launch.get("SLURM_JOB_NUM_NODES"),
    )
    if ntasks is None and launch.get("SLURM_PROCID") is None:
        return []
    if launch.under_torchrun:
        if ntasks is not None and nnodes is not None and ntasks > nnodes:
            return [
                SLURM_TORCHRUN.finding(
                    Severity.WARN,
                    f"torchrun under Slurm with SLURM_NTASKS={ntasks} on SLURM_NNODES={nnodes}: "
                    f"{ntasks // nnodes if nnodes else '?'} torchrun agents per node",
                    evidence=_ev(launch, "SLURM_NTASKS", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "GROUP_RANK"),
                )
            ]
        return []
    pairs = (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"), ("LOCAL_RANK", "SLURM_LOCALID"))
    findings = []
    for torch_name, slurm_name in pairs:
        t, s = launch.get(torch_name), launch.get(slurm_name)
        if t is None or s is None or t == s:
            continue
        findings.append(
            SLURM.finding(
                Severity.FAIL,
                f"{torch_name}={t} but {slurm_name}={s} (one Slurm task per rank, no torchrun)",
                evidence=_ev(launch, torch_name, slurm_name),
                data={"torch": {torch_name: t}, "slurm": {slurm_name: s}},
            )
        )
    return findings


def check_restarts(launch: LaunchEnv) -> list[Finding]:
    count = launch.get("TORCHELASTIC_RESTART_COUNT")
    if not count:
        return []
    limit = launch.get("TORCHELASTIC_MAX_RESTARTS")
    of = f" of {limit}" if limit is not None else ""
    return [
        RESTARTED.finding(
            Severity.WARN,
            f"torchrun restarted the workers {count} time(s){of}: an earlier attempt failed",
            evidence=_ev(launch, "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"),
        )
    ]


def check_visible_devices(env: Mapping[str, str], launch: Optional[LaunchEnv] = None) -> list[Finding]:
    """CUDA_VISIBLE_DEVICES: duplicates (GPU sharing deadlock), invalid or empty entries, LOCAL_RANK fit."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    vd = parse_visible_devices(raw)
    ev = [
        Evidence(
            "environment",
            f"CUDA_VISIBLE_DEVICES={raw!r}" if raw is not None else "CUDA_VISIBLE_DEVICES unset",
        )
    ]
    data = {"raw": raw, "entries": list(vd.entries), "kinds": list(vd.kinds)}
    if not vd.is_set:
        return [
            CVD.finding(
                Severity.INFO, "CUDA_VISIBLE_DEVICES is unset: every GPU is visible", evidence=ev, data=data
            )
        ]
    findings: list[Finding] = []
    if vd.duplicates:
        findings.append(
            CVD_DUP.finding(
                Severity.FAIL,
                f"CUDA_VISIBLE_DEVICES={raw} lists {', '.join(vd.duplicates)} more than once: two device "
                "indices are one GPU, so the ranks on them share one GPU and NCCL fails ('Duplicate GPU "
                "detected') or the job deadlocks",
                evidence=ev,
                data=data | {"duplicates": list(vd.duplicates)},
            )
        )
    if vd.hides_all:
        findings.append(
            CVD_EMPTY.finding(
                Severity.WARN,
                f"CUDA_VISIBLE_DEVICES={raw!r} hides every GPU" + (f" ({vd.notes[0]})" if vd.notes else ""),
                evidence=ev,
                data=data,
            )
        )
    elif vd.invalid or vd.empty_entries:
        bad = ", ".join(repr(x) for x in vd.invalid) or "an empty entry"
        findings.append(
            CVD_INVALID.finding(
                Severity.FAIL,
                f"CUDA_VISIBLE_DEVICES={raw} has {bad}: CUDA ignores it and everything after it, so only "
                f"{', '.join(vd.entries)} stay visible",
                evidence=ev,
                data=data | {"invalid": list(vd.invalid), "empty_entries": vd.empty_entries},
            )
        )
    if not findings:
        findings.append(
            CVD.finding(
                Severity.OK,
                f"CUDA_VISIBLE_DEVICES={raw}: {len(vd.entries)} GPU(s) ({', '.join(sorted(set(vd.kinds)))})",
                evidence=ev,
                data=data,
            )
        )
    local = launch.get("LOCAL_RANK") if launch else None
    if local is not None and vd.entries and local >= len(vd.entries):
        findings.append(
            DEVICE_ORDINAL.finding(
                Severity.WARN,
                f"LOCAL_RANK={local} but CUDA_VISIBLE_DEVICES shows {len(vd.entries)} GPU(s): "
                f"cuda:{local} does not exist in this process",
                evidence=ev + _ev(launch, "LOCAL_RANK") if launch else ev,
                data={"local_rank": local, "visible": len(vd.entries)},
            )
        )
    return findings


def check_launch_env(env: Optional[Mapping[str, str]]) -> list[Finding]:
    """Judge the launch environment (pure); None: a snapshot without the environment."""
    if env is None:
        return [
            ENV_NOT_RECORDED.finding(
                Severity.SKIP, "Launch variables not checked: the snapshot holds no env.json"
            )
        ]
    launch = parse_launch_env(env)
    findings = check_launcher(launch, env)
    findings += check_malformed(launch)
    findings += check_missing(launch)
    findings += check_ranks(launch)
    findings += check_slurm(launch, env)
    findings += check_restarts(launch)
    findings += check_visible_devices(env, launch)
    return findings


def collect_launch(ctx: Context) -> Optional[dict[str, str]]:
    """Equivalent: env | grep -E '^(RANK|WORLD_SIZE|LOCAL_|GROUP_|MASTER_|TORCHELASTIC_|SLURM_|CUDA_VISIBLE)'"""
    return dict(ctx.env) if ctx.env_recorded else None


AREA = Area(
    name="launch", title="Launch environment", collect=collect_launch, judge=check_launch_env, order=30
)
