"""The one launch reader (core.launchenv): real-shaped torchrun, srun and Open MPI environments, and a
property: every command that reads the launcher variables agrees with LaunchEnv, hostile values included."""

from __future__ import annotations

from typing import Optional

import pytest
from _cluster_agents import LAUNCHER_VARS
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.bench.preflight import gather_launch_facts, plan_joined
from ddpdoctor.checks.launch import check_launch_env, parse_launch_env
from ddpdoctor.cluster.launch import LaunchError, LaunchInfo, detect_launch
from ddpdoctor.core.launchenv import LAUNCH_VARS, LaunchEnv, read_launch_env, tasks_on_node
from ddpdoctor.core.placement import read_local_ranks
from ddpdoctor.edge.runner import Command, CommandResult
from ddpdoctor.hang.procs import ENV_KEYS, ProcInfo, find_jobs

# What torchrun (torch 2.x, elastic agent) sets for worker 1 of node 1 with --nnodes 2 --nproc-per-node 2,
# plus a few unrelated variables a real environment holds.
TORCHRUN_WORKER = {
    "LOCAL_RANK": "1",
    "RANK": "3",
    "GROUP_RANK": "1",
    "ROLE_RANK": "3",
    "ROLE_NAME": "default",
    "LOCAL_WORLD_SIZE": "2",
    "WORLD_SIZE": "4",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_WORLD_SIZE": "4",
    "MASTER_ADDR": "node0.cluster",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RUN_ID": "job42",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCHELASTIC_ERROR_FILE": "/tmp/torchelastic_x/none_y/attempt_0/1/error.json",
    "OMP_NUM_THREADS": "1",
    "PATH": "/usr/bin",
}

# `srun -N4 -n7 python train.py` (Slurm 23.x), the task with SLURM_PROCID 6: nodes 0-2 run two tasks,
# node 3 one.
SRUN_TASK = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOBID": "123456",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "6",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "3",
    "SLURM_NTASKS": "7",
    "SLURM_NPROCS": "7",
    "SLURM_NNODES": "4",
    "SLURM_JOB_NUM_NODES": "4",
    "SLURM_TASKS_PER_NODE": "2(x3),1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
    "SLURM_STEP_NUM_TASKS": "7",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_JOB_NODELIST": "gpu[07-09,12]",
    "SLURM_NODELIST": "gpu[07-09,12]",
    "SLURM_STEP_NODELIST": "gpu[07-09,12]",
    "SLURM_TOPOLOGY_ADDR": "gpu12",
    "SLURMD_NODENAME": "gpu12",
    "SLURM_CPUS_ON_NODE": "16",
}

# `mpirun -np 8 --map-by ppr:2:node python train.py` (Open MPI 4.1, PMIx), rank 3.
OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_UNIVERSE_SIZE": "8",
    "OMPI_MCA_orte_ess_num_procs": "8",
    "PMIX_RANK": "3",
    "PMIX_NAMESPACE": "prterun-node0-1234@1",
}


def test_torchrun_worker() -> None:
    env = read_launch_env(TORCHRUN_WORKER)
    assert (env.launcher, env.under_torchrun, env.under_slurm) == ("torchrun", True, False)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (3, 4, 1, 2, 1)
    assert (env.master_addr, env.master_port) == ("node0.cluster", 29500)
    assert (env.ranks_per_node, env.ranks_per_node_source) == (2, "LOCAL_WORLD_SIZE=2")
    assert env.malformed == {}
    info = detect_launch(TORCHRUN_WORKER)
    assert info is not None and (info.rank, info.world_size, info.local_rank) == (3, 4, 1)
    assert check_launch_env(TORCHRUN_WORKER)[0].summary.startswith("torchrun")


def test_srun_task_on_the_node_with_one_task() -> None:
    env = read_launch_env(SRUN_TASK)
    assert (env.launcher, env.under_slurm, env.under_torchrun) == ("slurm", True, False)
    assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (6, 7, 0, 3)
    # SLURM_STEP_TASKS_PER_NODE=2(x3),1 read for SLURM_NODEID=3.
    assert env.ranks_per_node == 1 and env.ranks_per_node_launcher == "slurm"
    assert "(node 3)" in env.ranks_per_node_source
    on_node_1 = read_launch_env({**SRUN_TASK, "SLURM_NODEID": "1", "SLURM_PROCID": "3"})
    assert on_node_1.ranks_per_node == 2
    assert read_launch_env({k: v for k, v in SRUN_TASK.items() if k != "SLURM_NODEID"}).ranks_per_node is None
    assert read_local_ranks(SRUN_TASK).count == 1
    info = detect_launch(SRUN_TASK)
    assert info is not None and (info.rank, info.world_size, info.master_addr) == (6, 7, "gpu07")


def test_open_mpi_rank() -> None:
    env = read_launch_env(OPEN_MPI)
    assert env.launcher == "mpi"
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 8, 1, 2)
    # MPI's local size is read but taken as ranks per node by no command yet; check --cluster runs no MPI.
    assert env.ranks_per_node is None and detect_launch(OPEN_MPI) is None
    assert read_launch_env({"PMI_RANK": "2", "PMI_SIZE": "4"}).rank == 2
    # srun --mpi=pmix sets both: Slurm's variables win.
    both = read_launch_env({**OPEN_MPI, "SLURM_PROCID": "5", "SLURM_NTASKS": "8"})
    assert (both.launcher, both.rank) == ("slurm", 5)


@pytest.mark.parametrize(
    "value,expected,why",
    [
        ("+3", 3, None),
        (" 3 ", 3, None),
        ("-1", None, "negative"),
        ("", None, "not an integer"),
        ("٣", None, "not an integer"),
        ("²", None, "not an integer"),
        ("1_0", None, "not an integer"),
        ("0x3", None, "not an integer"),
        ("9" * 5000, None, "more than 18 digits"),
        ("9" * 18, 10**18 - 1, None),
        ("1" + "0" * 18, None, "more than 18 digits"),
    ],
)
def test_one_rule_for_hostile_values(value: str, expected: Optional[int], why: Optional[str]) -> None:
    env = read_launch_env({"RANK": value, "WORLD_SIZE": str(10**18 - 1), "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert env.rank == expected
    if why is None:
        assert "RANK" not in env.malformed
    else:
        assert why in env.malformed["RANK"] and len(env.malformed["RANK"]) < 200
        with pytest.raises(LaunchError):
            detect_launch(env.raw)


def test_sizes_are_positive_and_loose_forms_are_not_malformed() -> None:
    env = read_launch_env(
        {"WORLD_SIZE": "0", "PET_NPROC_PER_NODE": "gpu", "PET_NNODES": "1:4", "SLURM_NTASKS_PER_NODE": "4(x2)"}
    )
    assert set(env.malformed) == {"WORLD_SIZE"}
    assert env.ranks_per_node == 4  # SLURM_NTASKS_PER_NODE, read as a task list
    assert tasks_on_node("2(x3),1", 3) == 1 and tasks_on_node("9" * 30, None) is None


# ------------------------------------------------------------------ every reader agrees

_NAMES = st.sampled_from(sorted(set(LAUNCH_VARS) | set(LAUNCHER_VARS) | {"SLURM_JOB_NODELIST"}))
_VALUES = st.one_of(
    st.integers(-2, 9).map(str),
    st.integers(10, 70000).map(str),
    st.sampled_from(
        ["", " 2 ", "+3", "-0", "٣", "²", "1_0", "0x10", "9" * 5000, "9" * 19, "2(x3),1", "4(x2)", "gpu", "h", "gpu[1-2]"]
    ),
    st.text(max_size=8),
)


def _runner(cmd: Command) -> CommandResult:
    return CommandResult(argv=cmd.argv, found=False, error=f"{cmd.argv[0]}: not found")


def _cluster(env: dict[str, str]) -> Optional[LaunchInfo]:
    try:
        return detect_launch(env)
    except LaunchError:
        return None


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_NAMES, _VALUES, max_size=14))
def test_every_reader_agrees_with_launch_env(env: dict[str, str]) -> None:
    launch = read_launch_env(env)
    assert isinstance(launch, LaunchEnv) and set(launch.ints).isdisjoint(launch.malformed)
    assert all(v >= 0 for v in launch.ints.values())

    # check: its parsed variables are LaunchEnv's; a rank it fails is LaunchEnv's rank.
    assert parse_launch_env(env) == launch
    for f in check_launch_env(env):
        if f.id == "launch.rank.out_of_range" and "rank" in f.data:
            assert f.data["rank"] == launch.get("RANK")

    # Ranks per node: the placement judgement and bench-nccl under a launcher.
    ranks = read_local_ranks(env)
    assert ranks.count == launch.ranks_per_node
    facts = gather_launch_facts(_runner, env, find_holder=lambda port: None)
    assert plan_joined(facts, "gloo", env).nproc == (launch.ranks_per_node or 0)
    assert facts.master_port == (launch.master_port if env.get("MASTER_PORT") else None)

    # check --cluster: rank, world size and local rank of the launcher LaunchEnv names.
    info = _cluster(env)
    if info is not None:
        assert info.launcher == launch.launcher
        assert (info.rank, info.world_size, info.local_rank) == (
            launch.rank,
            launch.world_size,
            launch.local_rank or 0,
        )
    if launch.launcher in ("", "mpi"):
        assert detect_launch(env) is None

    # hang: another process's environ (only ENV_KEYS are kept), read by the same function.
    seen = {k: v for k, v in env.items() if k in ENV_KEYS}
    proc_env = read_launch_env(seen)
    assert (proc_env.get("RANK"), proc_env.get("LOCAL_RANK")) == (launch.get("RANK"), launch.get("LOCAL_RANK"))
    jobs = find_jobs([ProcInfo(10, 1, "python", ("python", "train.py"), seen)])
    if jobs:
        (worker,) = jobs[0].workers
        assert (worker.rank, worker.local_rank) == (launch.get("RANK"), launch.get("LOCAL_RANK"))
        assert jobs[0].world_size == launch.get("WORLD_SIZE")
    else:
        assert launch.get("RANK") is None and launch.get("LOCAL_RANK") is None
