"""`ddpdoctor hang --cluster` end to end on loopback: a real gloo job hung across two real torchrun
agents (two "nodes", one rank each: the last rank sleeps before a collective), and beside it a second,
small diagnostic job of two real torchrun agents running `-m ddpdoctor hang --cluster`, each pointed at
its own node's agent (--pid) and its own rank's Flight Recorder dump, as on nodes without a shared
filesystem. Rank 0 of the diagnostic job must name the rank that is behind with its node, host and pid.
Both jobs run in sessions of their own and are SIGKILLed in the finalizer: nothing is left running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import jsonschema
import psutil
from _cluster_agents import Agents, agent_env, describe, find_json, torchrun_argv, wait_listening
from _hang_harness import JOB, group_alive, marker_line
from referencing import Registry, Resource

from ddpdoctor.edge.ports import pick_free_port

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"
RUN_TIMEOUT_S = 150


def start_nodes(agents: Agents, args: list[list[str]], envs: list[dict[str, str]], script: str = "", cwd: str = "/") -> None:
    """Agents of one c10d rendezvous on 127.0.0.1 (args and env per agent); agent 0 first, once its store
    listens."""
    port = pick_free_port()
    endpoint = f"127.0.0.1:{port}"
    run_id = f"ddpdoctor-hang-{uuid.uuid4().hex[:8]}"
    for i, env in enumerate(envs):
        agents.start(torchrun_argv(len(envs), endpoint, run_id, args[i], 1, script), agent_env(env), cwd=cwd)
        if i == 0:
            wait_listening("127.0.0.1", port)


def ranks_of(agent_pid: int) -> dict[int, int]:
    """{RANK: pid} of the workers under one torchrun agent, from their environment."""
    out = {}
    for child in psutil.Process(agent_pid).children(recursive=True):
        try:
            rank = child.environ().get("RANK")
        except (psutil.Error, OSError):
            continue
        if rank is not None and rank.isdigit():
            out[int(rank)] = child.pid
    return out


def kill_job(agents: Agents, pids: set[int]) -> list[int]:
    """SIGKILL the agents' groups and every rank (torchrun starts each rank in a session of its own);
    the pids of anything still running afterwards."""
    for proc in agents.procs:
        try:
            pids |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        pids.add(proc.pid)
    for pid in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    agents.kill_all()
    deadline = time.monotonic() + 10
    alive: list[int] = []
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        alive += [p for g in pids for p in group_alive(g) if p not in pids]
        if not alive:
            break
        time.sleep(0.1)
    return alive


def test_hang_cluster_names_the_rank_behind_on_the_other_node(tmp_path: Path) -> None:
    prefix = str(tmp_path / "fr_rank_")
    job_env = {"HANG_FR_PREFIX": prefix, "HANG_FR_AFTER": "1", "TORCH_FR_BUFFER_SIZE": "200",
               "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}
    hung = Agents()
    pids: set[int] = set()
    try:
        start_nodes(hung, [["sleep"], ["sleep"]], [job_env, job_env], script=str(JOB), cwd=str(tmp_path))
        deadline = time.monotonic() + 120
        while not all(Path(f"{prefix}{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline, "the hung job did not dump its Flight Recorder buffers in time"
            assert all(p.poll() is None for p in hung.procs), "the hung job exited"
            time.sleep(0.3)
        by_agent = [ranks_of(p.pid) for p in hung.procs]
        pids = {pid for ranks in by_agent for pid in ranks.values()}
        assert sorted(r for ranks in by_agent for r in ranks) == [0, 1], by_agent
        sleeper_agent = next(i for i, ranks in enumerate(by_agent) if 1 in ranks)
        sleeper_pid = by_agent[sleeper_agent][1]

        # The diagnostic job: one task per "node", each pointed at its node's agent and its rank's dump.
        host = socket.gethostname()
        args = [
            ["hang", "--cluster", "--json", "--pid", str(hung.procs[i].pid), "--fr", f"{prefix}{rank}",
             "--timeout", "20", "--join-timeout", "60", "--hosts", f"{host},ddpdoctor-absent[1-1]"]
            for i, ranks in enumerate(by_agent) for rank in ranks
        ]
        with Agents() as diag:
            start_nodes(diag, args, [{}, {}])
            runs = diag.wait_all(RUN_TIMEOUT_S)
    finally:
        alive = kill_job(hung, pids)
    assert alive == [], f"processes of the hung job survived: {alive}"

    printer, data = find_json(runs, "ddpdoctor.hang.cluster/")
    schema = json.loads((SCHEMAS / "hang-cluster.schema.json").read_text())
    node_schema = json.loads((SCHEMAS / "hang.schema.json").read_text())
    registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in (schema, node_schema)])
    jsonschema.Draft202012Validator(schema, registry=registry).validate(data)
    assert all(r is printer or not r.stdout.strip() for r in runs), "only rank 0 prints\n" + describe(runs)

    reported = [n for n in data["nodes"] if n["status"] == "reported"]
    assert len(reported) == 2, describe(runs)
    # Each node analysed only the ranks of the agent it was pointed at.
    node_of_agent = {n["report"]["job"]["agent_pid"]: n["label"] for n in reported}
    assert set(node_of_agent) == {p.pid for p in hung.procs}
    assert sorted(n["report"]["flight_recorder"]["ranks"] for n in reported) == [[0], [1]]

    verdict = data["verdict"]
    assert verdict["culprit_ranks"] == [1], verdict
    culprit = verdict["culprits"][0]
    assert culprit["pid"] == sleeper_pid and culprit["host"] == host
    assert culprit["node"] == node_of_agent[hung.procs[sleeper_agent].pid]
    assert f"pid {sleeper_pid} on {host}" in verdict["summary"]
    stacks_read = all(s["frames"] for n in reported for s in n["report"]["stacks"])
    if stacks_read:
        assert culprit["file"].endswith("_hang_job.py") and culprit["line"] == marker_line("sleep"), culprit
        assert verdict["other_ranks"] == [0]
    # Without stacks the Flight Recorder sequence numbers of both nodes still name rank 1.
    assert verdict["kind"] == "behind" and verdict["source"] == "flight_recorder", verdict
    assert data["job"] == {"world_size": 2, "ranks_seen": [0, 1], "ranks_unseen": []}

    # The host --hosts expects but no task came from is named; the status is in the report (exit_code 1)
    # and every task exits 0, so that torchrun prints no ChildFailedError traceback after the verdict.
    missing = [f for f in data["findings"] if f["id"] == "cluster.node.missing"]
    assert len(missing) == 1 and "ddpdoctor-absent1" in missing[0]["summary"]
    assert "no answer from host ddpdoctor-absent1" in verdict["summary"]
    assert data["exit_code"] == 1
    assert [r.returncode for r in runs] == [0, 0], describe(runs)
    assert not any("ChildFailedError" in r.stderr for r in runs), describe(runs)


def test_two_agents_of_one_run_on_a_node_are_one_job(tmp_path: Path) -> None:
    # `srun --ntasks-per-node=2 torchrun --nproc-per-node 1`: two agents of one run (same run id) on one
    # node. The real process listing, narrowed to this job's processes (other jobs run on this machine).
    from ddpdoctor.hang.probe_io import list_processes
    from ddpdoctor.hang.procs import find_jobs, select_job

    prefix = str(tmp_path / "fr_rank_")
    job_env = {"HANG_FR_PREFIX": prefix, "HANG_FR_AFTER": "1", "TORCH_FR_BUFFER_SIZE": "200",
               "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}
    hung = Agents()
    pids: set[int] = set()
    try:
        start_nodes(hung, [["sleep"], ["sleep"]], [job_env, job_env], script=str(JOB), cwd=str(tmp_path))
        deadline = time.monotonic() + 120
        while not all(Path(f"{prefix}{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in hung.procs)
            time.sleep(0.3)
        agents = {p.pid for p in hung.procs}
        pids = {pid for a in agents for pid in ranks_of(a).values()}
        mine = agents | {c.pid for a in agents for c in psutil.Process(a).children(recursive=True)}
        procs = [p for p in list_processes() if p.pid in mine]
        jobs = find_jobs(procs)
        job, error = select_job(jobs, None, procs)
        one, _ = select_job(jobs, hung.procs[1].pid, procs)
    finally:
        alive = kill_job(hung, pids)
    assert alive == []
    assert len(jobs) == 2 and error == "", error  # two agents, found as one job
    assert job is not None and sorted(w.rank for w in job.workers) == [0, 1] and job.world_size == 2
    assert {job.agent_pid, *job.more_agents} == agents
    # --pid of one agent still narrows to that agent's ranks (what `hang --cluster` on loopback relies on).
    assert one is not None and one.agent_pid == hung.procs[1].pid and len(one.workers) == 1
