"""Which launcher started this process, and where rank 0 is: torchrun's or srun's environment.

Pure functions over an environment mapping, read by core.launchenv (its rule: a variable that is set
but malformed, empty included, is a LaunchError here); ddpdoctor never launches or rendezvouses on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from ddpdoctor.cluster.hostlist import expand_hostlist
from ddpdoctor.core.launchenv import LaunchEnv, read_launch_env

# Under srun without MASTER_PORT we derive a port from the job and step id, so every task of one
# step computes the same port and two steps of a job do not collide. Documented in docs/cluster.md.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000


class LaunchError(ValueError):
    """The environment names a launcher but is incomplete or inconsistent (a usage error)."""


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str  # "torchrun", "slurm" or "env" (RANK/WORLD_SIZE set by hand)
    rank: int
    world_size: int
    local_rank: int
    node_rank: Optional[int]  # torchrun GROUP_RANK or SLURM_NODEID; None when the launcher does not say
    master_addr: str
    master_port: int
    use_agent_store: bool = False  # torchrun's agent already hosts the TCPStore at MASTER_ADDR:PORT
    run_id: str = ""
    restart_count: int = 0
    expected_hosts: tuple[str, ...] = ()  # Slurm: the job's node list, to name a node that never starts

    @property
    def store_prefix(self) -> str:
        return f"ddpdoctor/{self.run_id or 'run'}/{self.restart_count}"

    def to_dict(self) -> dict[str, object]:
        return {
            "launcher": self.launcher,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "node_rank": self.node_rank,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
        }


def _checked(launch: LaunchEnv, *names: str) -> None:
    """LaunchError naming the first of `names` that is set but breaks the launch rule (core.launchenv)."""
    for name in names:
        if name in launch.malformed:
            raise LaunchError(launch.malformed[name])


def slurm_master_port(env: Mapping[str, str]) -> int:
    """MASTER_PORT when set, else 20000 + (SLURM_JOB_ID + SLURM_STEP_ID) mod 20000."""
    launch = read_launch_env(env)
    _checked(launch, "MASTER_PORT", "SLURM_JOB_ID", "SLURM_STEP_ID")
    if launch.master_port is not None:
        return launch.master_port
    job = launch.get("SLURM_JOB_ID") or 0
    step = launch.get("SLURM_STEP_ID") or 0
    return SLURM_PORT_BASE + (job + step) % SLURM_PORT_SPAN


def detect_launch(env: Mapping[str, str]) -> Optional[LaunchInfo]:
    """torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) first, then srun (SLURM_PROCID, ...).

    None when neither launcher's variables are present; LaunchError when they are incomplete.
    torchrun wins over srun: `srun torchrun ...` runs torchrun's workers inside a Slurm step.
    """
    launch = read_launch_env(env)
    if launch.launcher in ("torchrun", "env"):
        _checked(launch, "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")
        if not launch.master_addr or "MASTER_PORT" not in env:
            raise LaunchError("RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not")
        _checked(launch, "MASTER_PORT")
        info = LaunchInfo(
            launcher=launch.launcher,
            rank=launch.rank or 0,
            world_size=launch.world_size or 0,
            local_rank=launch.local_rank or 0,
            node_rank=launch.node_rank,
            master_addr=launch.master_addr,
            master_port=launch.master_port or 0,
            use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            run_id=env.get("TORCHELASTIC_RUN_ID", ""),
            restart_count=launch.get("TORCHELASTIC_RESTART_COUNT") or 0,
        )
    elif launch.launcher == "slurm":
        _checked(launch, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        hosts = tuple(expand_hostlist(nodelist)) if nodelist.strip() else ()
        addr = launch.master_addr or (hosts[0] if hosts else "")
        if not addr:
            raise LaunchError("under srun, neither MASTER_ADDR nor SLURM_JOB_NODELIST is set")
        info = LaunchInfo(
            launcher="slurm",
            rank=launch.rank or 0,
            world_size=launch.world_size or 0,
            local_rank=launch.local_rank or 0,
            node_rank=launch.node_rank,
            master_addr=addr,
            master_port=slurm_master_port(env),
            run_id=f"slurm-{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}",
            expected_hosts=hosts,
        )
    else:
        # An MPI launch (mpirun without torchrun or srun) is read by core.launchenv but not run here.
        return None
    if info.world_size < 1:
        raise LaunchError(f"world size {info.world_size} must be at least 1")
    if not 0 <= info.rank < info.world_size:
        raise LaunchError(f"rank {info.rank} is outside world size {info.world_size}")
    if not 0 < info.master_port < 65536:
        raise LaunchError(f"MASTER_PORT {info.master_port} is not a TCP port")
    return info
