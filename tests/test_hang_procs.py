"""Which processes are ranks and which are their helpers (procs.split_ranks), over synthetic process
tables (pid, ppid, name, command line, environment) laid out as torchrun, srun, mpirun and
torch.multiprocessing.spawn lay them out. The helpers' names and command lines are those real ones have:
a DataLoader worker names its main thread pt_data_worker (torch/utils/data/_utils/worker.py), spawn's
children run `spawn_main` with `--multiprocessing-fork`, a fork child keeps its parent's command line,
torch's compile workers run torch/_inductor/compile_worker/__main__.py. tests/test_hang_helpers.py runs
the same layout as real processes."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.hang.findings import HangFacts, describe_helpers, job_finding
from ddpdoctor.hang.procs import HELPER_KINDS, ProcInfo, find_jobs, select_job, split_ranks

SPAWN_MAIN = (
    "/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
    "--multiprocessing-fork",
)
TRAIN = ("/usr/bin/python3", "-u", "train.py")
COMPILE = ("/usr/bin/python3", "/venv/torch/_inductor/compile_worker/__main__.py", "--kind=fork", "--workers=2")
TRACKER = ("/usr/bin/python3", "-c", "from multiprocessing.resource_tracker import main;main(9)")
SLEEPER = ("/usr/bin/python3", "-c", "import time; time.sleep(600)")


def proc(pid: int, ppid: int, cmdline: tuple[str, ...], name: str = "python3", **env: str) -> ProcInfo:
    return ProcInfo(pid, ppid, name, cmdline, env)


def rank_env(rank: int, **extra: str) -> dict[str, str]:
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", **extra)


def roles(procs: list[ProcInfo]) -> tuple[list[int], dict[int, list[int]]]:
    ranks, helpers = split_ranks(procs)
    by_rank: dict[int, list[int]] = {}
    for helper in helpers:
        by_rank.setdefault(helper.rank_pid, []).append(helper.pid)
    return sorted(p.pid for p in ranks), {k: sorted(v) for k, v in by_rank.items()}


# torchrun: agent -> ranks; rank 0 has two fork DataLoader workers and a Python subprocess (whose own
# child inherits RANK too); rank 1 has a spawn DataLoader worker with its resource tracker and a torch
# compile worker pool (a fork child of it).
TORCHRUN = [
    proc(10, 1, ("/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py")),
    proc(12, 10, TRAIN, **rank_env(0, TORCHELASTIC_RUN_ID="r")),
    proc(13, 10, TRAIN, **rank_env(1, TORCHELASTIC_RUN_ID="r")),
    proc(14, 12, TRAIN, name="pt_data_worker", **rank_env(0, TORCHELASTIC_RUN_ID="r")),
    proc(15, 12, TRAIN, name="pt_data_worker", **rank_env(0, TORCHELASTIC_RUN_ID="r")),
    proc(16, 12, SLEEPER, **rank_env(0, TORCHELASTIC_RUN_ID="r")),
    proc(17, 16, SLEEPER, **rank_env(0, TORCHELASTIC_RUN_ID="r")),
    proc(18, 13, TRACKER, **rank_env(1, TORCHELASTIC_RUN_ID="r")),
    proc(19, 13, SPAWN_MAIN, name="pt_data_worker", **rank_env(1, TORCHELASTIC_RUN_ID="r")),
    proc(20, 13, COMPILE, **rank_env(1, TORCHELASTIC_RUN_ID="r")),
    proc(21, 20, COMPILE, **rank_env(1, TORCHELASTIC_RUN_ID="r")),
    proc(30, 1, ("bash",)),
]


def test_torchrun_layout_helpers_are_not_ranks():
    assert roles(TORCHRUN) == ([12, 13], {12: [14, 15, 16, 17], 13: [18, 19, 20, 21]})
    (job,) = find_jobs(TORCHRUN)
    assert job.agent_pid == 10 and [(w.rank, w.pid) for w in job.workers] == [(0, 12), (1, 13)]
    assert job.world_size == 2 and len(job.helpers) == 8
    kinds = {h.pid: h.kind for h in job.helpers}
    assert kinds == {
        14: "DataLoader worker", 15: "DataLoader worker", 16: "Python subprocess", 17: "Python subprocess",
        18: "multiprocessing bookkeeping process", 19: "DataLoader worker", 20: "torch compile worker",
        21: "torch compile worker",
    }
    assert describe_helpers(job) == [
        "rank 0 helpers: 2 DataLoader workers (pids 14, 15), 2 Python subprocesses (pids 16, 17)",
        "rank 1 helpers: 1 multiprocessing bookkeeping process (pid 18), 1 DataLoader worker (pid 19), "
        "2 torch compile workers (pids 20, 21)",
    ]
    finding = job_finding(HangFacts(host="h", job=job))
    assert finding.summary.startswith("2 local rank(s) of a 2-rank job under agent pid 10")
    assert "rank 0 helpers: 2 DataLoader workers (pids 14, 15)" in finding.summary
    # --pid of a helper is the job of its rank, not a job of its own.
    assert select_job([job], 19, TORCHRUN)[0] is job


# srun / mpirun: no agent, the ranks' parent is slurmstepd or a shell. Before split_ranks every Python
# process below carrying RANK was a rank: 2 ranks read as 4, "rank 0" and "rank 1" twice each.
SRUN = [
    proc(100, 1, ("slurmstepd: [7.0]",), name="slurmstepd"),
    proc(101, 100, ("/bin/bash", "-c", "RANK=$SLURM_PROCID python train.py"), name="bash"),
    proc(102, 101, TRAIN, **rank_env(0, SLURM_JOB_ID="7")),
    proc(103, 100, TRAIN, **rank_env(1, SLURM_JOB_ID="7")),
    proc(104, 102, TRAIN, name="pt_data_worker", **rank_env(0, SLURM_JOB_ID="7")),
    # A helper below a shell below its rank is still the rank's: the walk goes past the shell.
    proc(105, 103, ("/bin/sh", "-c", "python -c ..."), name="sh"),
    proc(106, 105, SLEEPER, **rank_env(1, SLURM_JOB_ID="7")),
]


def test_srun_layout_helpers_are_not_ranks():
    assert roles(SRUN) == ([102, 103], {102: [104], 103: [106]})
    (job,) = find_jobs(SRUN)
    assert job.agent_pid is None and [(w.rank, w.pid) for w in job.workers] == [(0, 102), (1, 103)]
    assert job.world_size == 2 and sorted(h.pid for h in job.helpers) == [104, 106]
    assert len({w.rank for w in job.workers}) == len(job.workers)  # no rank twice


def test_a_child_with_another_rank_is_a_rank_and_no_launcher_rank_stays_a_rank():
    # mpirun-like: the launcher is no Python process and carries no RANK; its children are ranks even
    # when one of them started another (a different RANK is not inherited: it is a rank of its own).
    procs = [
        proc(1, 0, ("/sbin/init",), name="systemd"),
        proc(50, 1, ("mpirun", "-np", "2", "python", "train.py"), name="mpirun"),
        proc(51, 50, TRAIN, **rank_env(0)),
        proc(52, 51, TRAIN, **rank_env(1)),
    ]
    assert roles(procs) == ([51, 52], {})


# torch.multiprocessing.spawn, RANK set in code: the children carry no RANK in their environment and
# are found from --pid of the parent; a rank's fork DataLoader workers are its helpers.
SPAWN = [
    proc(200, 1, ("/usr/bin/python3", "train_spawn.py")),
    proc(201, 200, SPAWN_MAIN),
    proc(202, 200, SPAWN_MAIN),
    proc(203, 200, TRACKER),
    proc(204, 201, SPAWN_MAIN, name="pt_data_worker"),
    proc(205, 201, SPAWN_MAIN, name="pt_data_worker"),
    proc(206, 202, SLEEPER),
]


def test_spawn_layout_from_the_parent_pid():
    assert find_jobs(SPAWN) == []  # no launcher variable anywhere: --pid is needed, as before
    job, why = select_job(find_jobs(SPAWN), 200, SPAWN)
    assert why == "" and job.agent_pid == 200 and [w.pid for w in job.workers] == [201, 202]
    assert {(h.pid, h.rank_pid, h.kind) for h in job.helpers} == {
        (204, 201, "DataLoader worker"), (205, 201, "DataLoader worker"), (206, 202, "Python subprocess"),
    }
    # --pid of one spawned rank: that rank alone; its own spawned DataLoader workers are not ranks.
    lone, _ = select_job([], 201, SPAWN)
    assert [w.pid for w in lone.workers] == [201] and [h.pid for h in lone.helpers] == [204, 205]


def test_spawn_children_with_rank_in_their_environment():
    # The parent carries no RANK and sets RANK per child before starting it: the children are ranks
    # (found without --pid, grouped by MASTER_ADDR:PORT) and their spawn DataLoader workers, which
    # inherit the child's RANK, are helpers.
    procs = [
        proc(300, 1, ("/usr/bin/python3", "train_spawn.py"), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500"),
        proc(301, 300, SPAWN_MAIN, **rank_env(0)),
        proc(302, 300, SPAWN_MAIN, **rank_env(1)),
        proc(303, 301, SPAWN_MAIN, name="pt_data_worker", **rank_env(0)),
        proc(304, 302, SPAWN_MAIN, name="pt_data_worker", **rank_env(1)),
    ]
    assert roles(procs) == ([301, 302], {301: [303], 302: [304]})
    (job,) = find_jobs(procs)
    assert [(w.rank, w.pid) for w in job.workers] == [(0, 301), (1, 302)] and job.world_size == 2
    by_parent, _ = select_job([job], 300, procs)
    assert [w.pid for w in by_parent.workers] == [301, 302] and sorted(h.pid for h in by_parent.helpers) == [303, 304]


def test_spawn_parent_that_carries_rank_itself():
    # torchrun starts one process per node (RANK=0), which spawns its ranks with RANK set per child:
    # the parent is a spawner, no rank; its child with the parent's RANK is a rank, not a helper.
    procs = [
        proc(400, 1, ("/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "1", "train_spawn.py")),
        proc(401, 400, ("/usr/bin/python3", "train_spawn.py"), **rank_env(0, TORCHELASTIC_RUN_ID="s")),
        proc(402, 401, SPAWN_MAIN, **rank_env(0, TORCHELASTIC_RUN_ID="s")),
        proc(403, 401, SPAWN_MAIN, **rank_env(1, TORCHELASTIC_RUN_ID="s")),
        proc(404, 402, SPAWN_MAIN, name="pt_data_worker", **rank_env(0, TORCHELASTIC_RUN_ID="s")),
        proc(405, 401, TRACKER, **rank_env(0, TORCHELASTIC_RUN_ID="s")),
    ]
    assert roles(procs) == ([402, 403], {402: [404]})
    (job,) = find_jobs(procs)
    assert job.agent_pid == 400 and [(w.rank, w.pid) for w in job.workers] == [(0, 402), (1, 403)]


def test_own_process_and_pid_loops():
    # ddpdoctor itself may carry RANK (run inside a rank's shell); a ppid loop must not spin.
    procs = [
        proc(500, 501, TRAIN, **rank_env(0)),
        proc(501, 500, TRAIN, **rank_env(0)),
        proc(502, 1, TRAIN, **rank_env(1)),
        proc(503, 502, ("/usr/bin/python3", "-m", "ddpdoctor", "hang"), **rank_env(1)),
    ]
    ranks, helpers = split_ranks(procs, own_pid=503)
    assert 503 not in {p.pid for p in ranks} | {h.pid for h in helpers}
    assert 502 in {p.pid for p in ranks} and {500, 501}.isdisjoint(p.pid for p in ranks)


def test_helper_kinds_match_the_schema():
    schema = json.loads((Path(__file__).parent.parent / "docs" / "schemas" / "hang.schema.json").read_text())
    kinds = schema["properties"]["job"]["properties"]["helpers"]["items"]["properties"]["kind"]["enum"]
    assert sorted(kinds) == sorted(HELPER_KINDS)


def test_forked_orphans_only_where_the_ranks_lead_their_own_group():
    from ddpdoctor.hang.procs import Worker, forked_orphans

    def worker(pid: int, rank: int) -> Worker:
        return Worker(pid, rank, rank, ("python", "train.py"), {"RANK": str(rank)})

    ranks = [worker(100, 0), worker(200, 1), worker(350, 2)]
    # pid 350 carries RANK=2, but its group and session are pid 300's, which is gone: rank 2 forked it and died.
    leaders = {100: (100, 100), 200: (200, 200), 350: (300, 300)}
    assert [(w.pid, leader) for w, leader in forked_orphans(ranks, leaders, {300})] == [(350, 300)]
    # the leader alive: a process started in another rank's group, not an orphan
    assert forked_orphans(ranks, leaders, set()) == []
    # nobody leads a group (a plain `&` in a script whose shell has exited): nothing can be told
    shared = {100: (50, 50), 200: (50, 50), 350: (50, 50)}
    assert forked_orphans(ranks, shared, {50}) == []
