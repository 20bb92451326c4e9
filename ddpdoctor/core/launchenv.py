"""The launch environment: what torchrun, Slurm or an MPI launcher told this process (pure).

One reader for the launcher variables, used by every command that needs them: the launch checks,
the ranks-per-node judgement (`core.placement`), bench-nccl's preflight, `check --cluster`
(`cluster.launch`) and `hang`, which reads another process's /proc/PID/environ with the same function.
`read_launch_env(mapping)` never raises, whatever the values.

One rule holds for every reader:

- Integers are read by `parsers.numbers.parse_int`: ASCII decimal, surrounding whitespace and a '+'
  allowed, at most 18 digits (no '٣', '²', '1_0', nor a 5000-digit hostile value). Anything else is
  malformed, like `RANK=abc`. Empty text is malformed too (torch's int('') raises); a variable that is
  unset is simply absent.
- Ranks, ids and counters are >= 0; a negative value is malformed ("is negative"). Sizes (WORLD_SIZE,
  LOCAL_WORLD_SIZE, GROUP_WORLD_SIZE, SLURM_NTASKS, SLURM_NNODES, PET_NPROC_PER_NODE, the MPI sizes) are
  >= 1; zero is malformed. MASTER_PORT is a TCP port, 1-65535. MASTER_ADDR is a host name or an IP
  literal (no scheme, port or spaces).
- A few variables have other legal forms and are only read when plain: PET_NPROC_PER_NODE ("gpu",
  "auto"), PET_NNODES ("1:4"), SLURM_NTASKS_PER_NODE ("4(x2)"): a non-integer is not malformed.
- Which launcher set this process's rank (`launcher`): RANK and WORLD_SIZE first ("torchrun" when
  TORCHELASTIC_RUN_ID or GROUP_RANK says torchrun's agent started it, else "env", set by hand), then Slurm
  (SLURM_PROCID and SLURM_NTASKS: `srun torchrun` runs torchrun's workers inside a Slurm step), then MPI
  (OMPI_COMM_WORLD_*, MV2_COMM_WORLD_*, PMIX_RANK, PMI_RANK with PMI_SIZE). `rank`, `world_size` and
  `local_rank` are that launcher's.
- Ranks per node: LOCAL_WORLD_SIZE (torchrun, also inside a Slurm step), else torchrun's agent option
  PET_NPROC_PER_NODE, else Slurm's SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE or
  SLURM_TASKS_PER_NODE, whose compressed form `2(x3),1` (2 tasks on nodes 0-2, 1 on node 3) is read for
  this node's SLURM_NODEID; without a node id only a count every node shares is known. MPI's local size
  is read (`local_world_size` of an MPI launch) but not yet taken as ranks per node: no command judged
  it before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Optional

from ddpdoctor.parsers.numbers import parse_int

# torchrun sets all of these for every worker (torch.distributed.elastic.agent.server.api).
TORCH_INT_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)
SLURM_INT_VARS = (
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_GPUS_ON_NODE",
)
# Read as integers by `check --cluster` (the port it derives under srun); not reported by `check`.
SLURM_ID_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID")
MPI_INT_VARS = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_RANK",
    "MV2_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
)
# torchrun's agent options as PET_* variables (Kubeflow's PyTorchJob sets them): ints only when plain.
PET_VARS = ("PET_NPROC_PER_NODE", "PET_NNODES")
SLURM_TASK_LISTS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
SLURM_GPU_VARS = ("SLURM_GPUS_PER_TASK", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
TEXT_VARS = ("MASTER_ADDR", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "CUDA_VISIBLE_DEVICES")
INT_VARS = TORCH_INT_VARS + SLURM_INT_VARS + SLURM_ID_VARS + MPI_INT_VARS + PET_VARS + ("MASTER_PORT",)
# Every variable the reader looks at (tests generate environments from it).
LAUNCH_VARS = tuple(dict.fromkeys(INT_VARS + SLURM_TASK_LISTS + SLURM_GPU_VARS + TEXT_VARS))
# Integer variables whose other forms are legal, not malformed.
_LOOSE = frozenset({"PET_NPROC_PER_NODE", "PET_NNODES", "SLURM_NTASKS_PER_NODE"})
SIZE_VARS = frozenset(
    {
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "SLURM_NTASKS",
        "SLURM_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NNODES",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_SIZE",
        "PMI_SIZE",
    }
)
# Kept as text for display (the launch check shows them), beyond the variables read above.
SHOWN_PREFIXES = ("TORCHELASTIC_", "SLURM_")
# (rank, size, local rank, local size) of each MPI flavour, in the order they are tried.
_MPI = (
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PMIX_RANK", "PMI_SIZE", "", ""),
    ("PMI_RANK", "PMI_SIZE", "", ""),
)

_HOST = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$|^\[?[0-9A-Fa-f:.]+\]?$")
_TASKS = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


def valid_host(text: str) -> bool:
    """A host name or an IP address literal (not a URL, not host:port, no spaces)."""
    return bool(text) and len(text) <= 253 and bool(_HOST.match(text))


def parse_port(text: str) -> Optional[int]:
    """A TCP port (1-65535) under the integer rule, else None."""
    value = parse_int(text, signed=True)
    return value if value is not None and 1 <= value <= 65535 else None


def tasks_on_node(text: str, node_id: Optional[int]) -> Optional[int]:
    """Tasks on node `node_id` from Slurm's compressed list ("2(x3),1": 2 on nodes 0-2, 1 on node 3).

    Without a node id the count is only known when every node has the same; None when malformed.
    """
    counts: list[tuple[int, int]] = []
    for token in str(text).strip().split(","):
        m = _TASKS.fullmatch(token.strip())
        count = parse_int(m.group(1)) if m else None
        repeat = parse_int(m.group(2) or "1") if m else None
        if not count or repeat is None:
            return None
        counts.append((count, repeat))
    if not counts:
        return None
    if node_id is None or len(counts) == 1 and counts[0][1] == 1:
        # One plain number (SLURM_NTASKS_PER_NODE=8) holds for every node.
        distinct = {c for c, _ in counts}
        return distinct.pop() if len(distinct) == 1 else None
    seen = 0
    for count, repeat in counts:
        if node_id < seen + repeat:
            return count
        seen += repeat
    return None


def _shown(name: str, value: str) -> str:
    shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}... ({len(value)} characters)"
    return f"{name}={shown}"


@dataclass(frozen=True)
class LaunchEnv:
    """The launch variables of one process, read under the module's rule.

    `raw` holds every launcher variable present, as text; `ints` the integer variables with a valid
    value; `malformed` the variables whose value breaks the rule (name -> why, for a user).
    """

    raw: Mapping[str, str] = field(default_factory=dict)
    ints: Mapping[str, int] = field(default_factory=dict)
    malformed: Mapping[str, str] = field(default_factory=dict)
    launcher: str = ""  # "torchrun", "env" (RANK/WORLD_SIZE by hand), "slurm", "mpi", or "" (none)
    under_torchrun: bool = False  # torchrun's agent started this process (TORCHELASTIC_RUN_ID, GROUP_RANK)
    under_slurm: bool = False  # inside a Slurm job (SLURM_JOB_ID, SLURM_PROCID)
    rank: Optional[int] = None  # of `launcher`; None when unset or malformed
    world_size: Optional[int] = None
    local_rank: Optional[int] = None
    local_world_size: Optional[int] = None
    node_rank: Optional[int] = None  # GROUP_RANK under torchrun, SLURM_NODEID under srun
    master_addr: str = ""  # stripped; "" when unset (validity: `malformed`)
    master_port: Optional[int] = None
    # Ranks of this job on this node, where the number came from and which launcher said it.
    ranks_per_node: Optional[int] = None
    ranks_per_node_source: str = ""  # "LOCAL_WORLD_SIZE=2", "SLURM_TASKS_PER_NODE=2(x3),1 (node 3)"
    ranks_per_node_launcher: str = ""  # "torchrun", "env", "slurm"
    ranks_per_node_problems: tuple[str, ...] = ()  # sources present but unreadable, in the order tried
    slurm_node_id: Optional[int] = None
    gpus_per_task: Optional[int] = None  # SLURM_GPUS_PER_TASK ("1", or typed "a100:2")
    gpus_on_node: Optional[int] = None  # SLURM_GPUS_ON_NODE, when > 0
    # srun bound GPUs per task (--gpus-per-task, --gpu-bind): each task sees only its own GPU(s).
    per_task_binding: bool = False

    def get(self, name: str) -> Optional[int]:
        """The valid integer value of variable `name`, else None."""
        return self.ints.get(name)


def _read_ints(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, int], dict[str, str]]:
    raw: dict[str, str] = {}
    ints: dict[str, int] = {}
    malformed: dict[str, str] = {}
    for name in INT_VARS:
        if name not in env:
            continue
        value = str(env[name])
        raw[name] = value
        if name == "MASTER_PORT":
            port = parse_port(value)
            if port is None:
                malformed[name] = f"MASTER_PORT={value!r} is not a TCP port (1-65535)"
            else:
                ints[name] = port
            continue
        number = parse_int(value, signed=True)
        if number is None:
            if name not in _LOOSE:
                malformed[name] = f"{_shown(name, value)} is not an integer (or more than 18 digits)"
        elif number < 0:
            malformed[name] = f"{name}={value!r} is negative"
        elif number == 0 and name in SIZE_VARS:
            malformed[name] = f"{name}=0: a job has at least one process"
        else:
            ints[name] = number
    for name in SLURM_TASK_LISTS + SLURM_GPU_VARS + TEXT_VARS:
        if name in env:
            raw[name] = str(env[name])
    if "MASTER_ADDR" in raw and not valid_host(raw["MASTER_ADDR"].strip()):
        malformed["MASTER_ADDR"] = (
            f"MASTER_ADDR={raw['MASTER_ADDR']!r} is not a host name or IP address (no scheme, port or spaces)"
        )
    for name, value in env.items():
        if name.startswith(SHOWN_PREFIXES) and name not in raw:
            raw[name] = str(value)
    return raw, ints, malformed


def _gpus_per_task(text: Optional[str]) -> Optional[int]:
    """SLURM_GPUS_PER_TASK: "1", or typed as "a100:2"."""
    if text is None:
        return None
    return parse_int(str(text).rsplit(":", 1)[-1]) or None


def _bound_narrower(env: Mapping[str, str]) -> bool:
    """srun bound this task to fewer GPUs than the step has (--gpu-bind, --gpus-per-task): the task's
    CUDA_VISIBLE_DEVICES lists fewer entries than SLURM_STEP_GPUS / SLURM_JOB_GPUS."""
    step = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not step or visible is None:
        return False
    return len([x for x in visible.split(",") if x.strip()]) < len([x for x in step.split(",") if x.strip()])


def _ranks_per_node(
    env: Mapping[str, str], ints: Mapping[str, int], torchrun: bool
) -> tuple[Optional[int], str, str, tuple[str, ...]]:
    """(count, source, launcher, problems): LOCAL_WORLD_SIZE, PET_NPROC_PER_NODE, then Slurm's lists."""
    problems: list[str] = []
    if "LOCAL_WORLD_SIZE" in env:
        value = ints.get("LOCAL_WORLD_SIZE")
        if value is not None:
            return value, f"LOCAL_WORLD_SIZE={value}", "torchrun" if torchrun else "env", ()
        problems.append(f"LOCAL_WORLD_SIZE={str(env['LOCAL_WORLD_SIZE'])[:40]!r} is not a positive integer")
    # A check in the agent's container before the job starts sees --nproc-per-node here; "gpu"/"auto"
    # mean one rank per GPU: nothing to judge.
    value = ints.get("PET_NPROC_PER_NODE")
    if value is not None:
        return value, f"PET_NPROC_PER_NODE={value}", "torchrun", ()
    node_id = ints.get("SLURM_NODEID")
    for name in SLURM_TASK_LISTS:
        if name not in env:
            continue
        raw = str(env[name])
        value = tasks_on_node(raw, node_id)
        if value is None:
            problems.append(f"{name}={raw[:40]!r}: tasks on this node cannot be told")
            continue
        where = f" (node {node_id})" if node_id is not None and "," in raw else ""
        return value, f"{name}={raw[:40]}{where}", "slurm", tuple(problems)
    return None, "", "", tuple(problems)


def read_launch_env(env: Mapping[str, str]) -> LaunchEnv:
    """Read the launch variables of `env` (os.environ, a snapshot's env.json, or another process's
    /proc/PID/environ) under the module's rule. Pure; never raises."""
    raw, ints, malformed = _read_ints(env)
    torchrun = "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env
    slurm = "SLURM_JOB_ID" in env or "SLURM_PROCID" in env
    launcher = ""
    rank = world = local = local_world = node = None
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun" if torchrun else "env"
        rank, world, local = ints.get("RANK"), ints.get("WORLD_SIZE"), ints.get("LOCAL_RANK")
        local_world, node = ints.get("LOCAL_WORLD_SIZE"), ints.get("GROUP_RANK")
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "slurm"
        rank, world, local = ints.get("SLURM_PROCID"), ints.get("SLURM_NTASKS"), ints.get("SLURM_LOCALID")
        node = ints.get("SLURM_NODEID")
    else:
        for rank_var, size_var, local_var, local_size_var in _MPI:
            if rank_var in env and size_var in env:
                launcher = "mpi"
                rank, world = ints.get(rank_var), ints.get(size_var)
                local, local_world = ints.get(local_var), ints.get(local_size_var)
                break
    count, source, count_launcher, problems = _ranks_per_node(env, ints, torchrun)
    gpt = _gpus_per_task(env.get("SLURM_GPUS_PER_TASK"))
    in_step = "SLURM_STEP_ID" in env and not torchrun
    return LaunchEnv(
        raw=raw,
        ints=ints,
        malformed=malformed,
        launcher=launcher,
        under_torchrun=torchrun,
        under_slurm=slurm,
        rank=rank,
        world_size=world,
        local_rank=local,
        local_world_size=local_world,
        node_rank=node,
        master_addr=raw.get("MASTER_ADDR", "").strip(),
        master_port=ints.get("MASTER_PORT"),
        ranks_per_node=count,
        ranks_per_node_source=source,
        ranks_per_node_launcher=count_launcher,
        ranks_per_node_problems=problems,
        slurm_node_id=ints.get("SLURM_NODEID"),
        gpus_per_task=gpt,
        gpus_on_node=ints.get("SLURM_GPUS_ON_NODE") or None,
        per_task_binding=count_launcher == "slurm" and in_step and (gpt is not None or _bound_narrower(env)),
    )
