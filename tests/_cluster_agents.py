"""Start real torchrun agents (the c10d rendezvous) as separate "nodes", and always clean them up.

Shared by tests/test_cluster_loopback.py and tests/test_cluster_netns.py. Every agent runs in its own
process group, so a timeout or a failed assertion kills it and everything it started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

# Variables of an outer launcher that must not leak into the agents we start.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)


def agent_env(extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "NCCL_", "GLOO_"))
    }
    env.update(
        {
            "OMP_NUM_THREADS": "1",  # 2 cores shared by every "node"
            "PYTHONWARNINGS": "ignore",
            "COLUMNS": "120",
            "NO_COLOR": "1",
            "TORCH_CPP_LOG_LEVEL": "ERROR",
            "LOGLEVEL": "ERROR",
        }
    )
    env.update(extra or {})
    return env


def torchrun_argv(
    nnodes: int, endpoint: str, run_id: str, args: Sequence[str], nproc: int = 1, script: str = ""
) -> list[str]:
    """torchrun with the c10d rendezvous running `-m ddpdoctor ARGS` (or SCRIPT ARGS) per rank."""
    target = [script] if script else ["-m", "ddpdoctor"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        "join_timeout=60",
        "--max-restarts",
        "0",
        *target,
        *args,
    ]


@dataclass
class AgentRun:
    index: int
    returncode: Optional[int]
    stdout: str
    stderr: str


class Agents:
    """Agent processes; leaving the `with` block kills whatever is still running."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def __enter__(self) -> Agents:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill_all()

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str = "/") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            kill_group(proc.pid)
        for proc in self.procs:
            try:
                proc.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass

    def wait_all(self, timeout_s: float) -> list[AgentRun]:
        """Wait for every agent (one shared deadline); an agent still running is killed and has returncode None."""
        deadline = time.monotonic() + timeout_s
        runs = []
        for index, proc in enumerate(self.procs):
            try:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
                runs.append(AgentRun(index, proc.returncode, out, err))
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                out, err = proc.communicate(timeout=10)
                runs.append(AgentRun(index, None, out, err))
        return runs


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_listening(host: str, port: int, timeout_s: float = 30.0) -> None:
    """Until something accepts TCP connections on host:port (the first agent's rendezvous store)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened on {host}:{port} within {timeout_s}s")


def find_json(runs: Sequence[AgentRun], schema_prefix: str) -> tuple[AgentRun, dict[str, Any]]:
    """The one agent whose stdout is a JSON document of that schema (rank 0's report)."""
    found = []
    for run in runs:
        text = run.stdout.strip()
        start = text.find("{")
        if start < 0:
            continue
        try:
            data = json.loads(text[start:])
        except ValueError:
            continue
        if str(data.get("schema", "")).startswith(schema_prefix):
            found.append((run, data))
    assert len(found) == 1, "expected exactly one report; agents said:\n" + describe(runs)
    return found[0]


def describe(runs: Sequence[AgentRun]) -> str:
    return "\n".join(
        f"--- agent {r.index} rc={r.returncode}\nstdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-2500:]}"
        for r in runs
    )
