"""Which launcher started this process, and where rank 0 is: torchrun's or srun's environment.

Pure functions over an environment mapping; ddpdoctor never launches or rendezvouses on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from ddpdoctor.cluster.hostlist import expand_hostlist

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


def _int(env: Mapping[str, str], name: str, default: Optional[int] = None) -> Optional[int]:
    text = env.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        return int(text.strip())
    except ValueError:
        raise LaunchError(f"{name}={text!r} is not an integer") from None


def slurm_master_port(env: Mapping[str, str]) -> int:
    """MASTER_PORT when set, else 20000 + (SLURM_JOB_ID + SLURM_STEP_ID) mod 20000."""
    explicit = _int(env, "MASTER_PORT")
    if explicit is not None:
        return explicit
    job = _int(env, "SLURM_JOB_ID", 0) or 0
    step = _int(env, "SLURM_STEP_ID", 0) or 0
    return SLURM_PORT_BASE + (job + step) % SLURM_PORT_SPAN


def detect_launch(env: Mapping[str, str]) -> Optional[LaunchInfo]:
    """torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) first, then srun (SLURM_PROCID, ...).

    None when neither launcher's variables are present; LaunchError when they are incomplete.
    torchrun wins over srun: `srun torchrun ...` runs torchrun's workers inside a Slurm step.
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        rank = _int(env, "RANK")
        world = _int(env, "WORLD_SIZE")
        addr = env.get("MASTER_ADDR", "").strip()
        port = _int(env, "MASTER_PORT")
        if not addr or port is None:
            raise LaunchError("RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not")
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env else "env"
        info = LaunchInfo(
            launcher=launcher,
            rank=rank or 0,
            world_size=world or 0,
            local_rank=_int(env, "LOCAL_RANK", 0) or 0,
            node_rank=_int(env, "GROUP_RANK"),
            master_addr=addr,
            master_port=port,
            use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            run_id=env.get("TORCHELASTIC_RUN_ID", ""),
            restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0) or 0,
        )
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        hosts = tuple(expand_hostlist(nodelist)) if nodelist.strip() else ()
        addr = env.get("MASTER_ADDR", "").strip() or (hosts[0] if hosts else "")
        if not addr:
            raise LaunchError("under srun, neither MASTER_ADDR nor SLURM_JOB_NODELIST is set")
        info = LaunchInfo(
            launcher="slurm",
            rank=_int(env, "SLURM_PROCID") or 0,
            world_size=_int(env, "SLURM_NTASKS") or 0,
            local_rank=_int(env, "SLURM_LOCALID", 0) or 0,
            node_rank=_int(env, "SLURM_NODEID"),
            master_addr=addr,
            master_port=slurm_master_port(env),
            run_id=f"slurm-{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}",
            expected_hosts=hosts,
        )
    else:
        return None
    if info.world_size < 1:
        raise LaunchError(f"world size {info.world_size} must be at least 1")
    if not 0 <= info.rank < info.world_size:
        raise LaunchError(f"rank {info.rank} is outside world size {info.world_size}")
    if not 0 < info.master_port < 65536:
        raise LaunchError(f"MASTER_PORT {info.master_port} is not a TCP port")
    return info
