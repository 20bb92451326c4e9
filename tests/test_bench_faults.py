"""Fault tests on real ranks: a killed rank, a stopped rank, a taken port, NCCL without CUDA, Ctrl-C.

bench-nccl runs as a real subprocess (`python -m ddpdoctor bench-nccl`); a marker in its
environment lets us find every process it started, to prove none survives.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

import ddpdoctor.bench.launcher as launcher
import ddpdoctor.bench.outcome as outcome
from ddpdoctor.bench.plan import FAULT_ENV, BenchPlan

STEP_TIMEOUT_S = 6
MARKER = "DDPDOCTOR_TEST_MARKER"
REPO = Path(__file__).resolve().parents[1]


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARKER) == marker and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _survivors(marker: str, wait_s: float = 2.0) -> list[psutil.Process]:
    end = time.monotonic() + wait_s
    while True:
        alive = _marked(marker)
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def _start(*args: str, fault: str | None = None, extra_env: dict | None = None):
    marker = uuid.uuid4().hex
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", **{MARKER: marker})
    env.pop("MASTER_PORT", None)
    if fault:
        env[FAULT_ENV] = fault
    env.update(extra_env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", "bench-nccl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    return proc, marker


def _run(*args: str, fault: str | None = None, extra_env: dict | None = None, limit_s: float = 60):
    proc, marker = _start(*args, fault=fault, extra_env=extra_env)
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=limit_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            for p in _marked(marker):
                p.kill()
    return proc.returncode, out, err, time.monotonic() - start, marker


BASE = (
    "--backend",
    "gloo",
    "--nproc",
    "3",
    "--ops",
    "all_reduce,broadcast",
    "--min-bytes",
    "64",
    "--max-bytes",
    "4K",
    "--step-factor",
    "8",
    "--iters",
    "2",
    "--warmup",
    "1",
    "--timeout",
    str(STEP_TIMEOUT_S),
)


def test_sigkill_one_rank_names_it_root_cause() -> None:
    code, out, err, took, marker = _run(*BASE, fault="rank=1,op=all_reduce,size=512,action=kill")
    assert code == 1, err
    assert took < STEP_TIMEOUT_S + 20  # failed fast: no need to wait for the watchdog
    root = [line for line in err.splitlines() if line.startswith("root cause:")]
    assert root and "rank 1" in root[0] and "all_reduce" in root[0] and "SIGKILL" in root[0], err
    assert "other ranks (consequences)" in err
    # Rows measured before the failure are still printed.
    assert "Collective test: all_reduce" in out and "      64" in out
    assert _survivors(marker) == []


def test_sigstop_one_rank_watchdog_names_it_and_kills_all() -> None:
    code, out, err, took, marker = _run(*BASE, fault="rank=2,op=broadcast,size=512,action=stop")
    assert code == 1, err
    assert took < STEP_TIMEOUT_S + 20, err
    assert f"watchdog: no progress within --timeout {STEP_TIMEOUT_S}s" in err, err
    root = [line for line in err.splitlines() if line.startswith("root cause:")]
    assert root and "rank 2" in root[0] and "broadcast" in root[0] and "stopped" in root[0], err
    # The stuck ranks' Python stacks are shown, the stopped one included, stopped where it stopped (its
    # main thread is continued so that it can dump, and must not have run on before the dump).
    stacks = err.split("stack of rank ")
    rank2 = [s for s in stacks if s.startswith("2 ")]
    assert rank2 and "in _maybe_fault" in rank2[0], err
    rank0 = [s for s in stacks if s.startswith("0 ")]
    assert rank0 and "torch/distributed" in rank0[0], err
    assert _survivors(marker) == []


def test_pinned_master_port_taken_is_refused_before_launch() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out, err, took, marker = _run(*BASE, extra_env={"MASTER_PORT": str(port)})
    assert code == 2
    assert "refused before launch" in err and f"MASTER_PORT={port}" in err
    assert f"PID {os.getpid()}" in err
    assert "Collective test" not in out  # nothing ran
    assert _survivors(marker) == []


def test_nccl_without_cuda_refused_clearly() -> None:
    # CUDA_VISIBLE_DEVICES="" hides every GPU: the refusal holds on a GPU node too.
    code, out, err, took, marker = _run(
        "--backend", "nccl", "--nproc", "2", extra_env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert code == 2
    assert "refused before launch: NCCL requested without usable CUDA" in err
    assert "fix:" in err and "--backend gloo" in err


def test_ctrl_c_stops_every_rank() -> None:
    proc, marker = _start(*BASE, fault="rank=0,op=broadcast,size=64,action=hang")
    try:
        deadline = time.monotonic() + 30
        # Wait until the ranks are up (they carry the marker too), then interrupt.
        while len(_marked(marker)) < 5 and time.monotonic() < deadline:  # cli + zygote + 3 ranks
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert _survivors(marker) == []


def test_sigterm_stops_every_rank_and_writes_partial_results(tmp_path: Path) -> None:
    """What Slurm sends on scancel or at the time limit: handled like Ctrl-C, exit 143."""
    import json

    import jsonschema

    out = tmp_path / "partial.json"
    proc, marker = _start(*BASE, "--json", str(out), fault="rank=0,op=broadcast,size=64,action=hang")
    try:
        deadline = time.monotonic() + 30
        while len(_marked(marker)) < 5 and time.monotonic() < deadline:  # cli + zygote + 3 ranks
            time.sleep(0.1)
        time.sleep(1.0)  # all_reduce measured, rank 0 hanging in broadcast
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "SIGTERM" in err and "every rank was stopped" in err
    assert _survivors(marker) == []
    data = json.loads(out.read_text())
    assert data["exit_code"] == 143 and data["launch"]["interrupted_by"] == "SIGTERM"
    assert {r["op"] for r in data["rows"]} == {"all_reduce"} and data["rows"]
    schema = json.loads((REPO / "docs" / "schemas" / "bench.schema.json").read_text())
    jsonschema.validate(data, schema)


def test_port_clash_is_retried_with_another_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        picks = iter([taken])
        real_pick = launcher.pick_free_port
        monkeypatch.setattr(launcher, "pick_free_port", lambda host: next(picks, None) or real_pick(host))
        result = launcher.launch_local(
            BenchPlan(ops=("all_reduce",), sizes=(64,), iters=1, warmup=0),
            nproc=2,
            backend="gloo",
            step_timeout_s=30,
        )
    assert result.ok, result.root_cause
    assert result.port_attempts == 2 and result.master_port != taken


BLOCKED_RANK = """
import faulthandler, os, signal, sys, threading
from ddpdoctor.bench.worker import acknowledge_stack_dumps
stack = open(sys.argv[1], "w")
acknowledge_stack_dumps(sys.argv[1] + ".done")
faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True, chain=True)
signal.signal(signal.SIGUSR2, lambda signum, frame: None)  # another signal with a Python handler
def helper_thread():
    os.read(int(sys.argv[2]), 1)
def blocked_in_c():
    os.read(int(sys.argv[2]), 1)  # blocked in a system call, as a rank waiting inside a collective
# A second thread, as gloo's in a rank: sent to the process, a signal pending in a stopped rank may be
# taken by it rather than by the main thread.
threading.Thread(target=helper_thread, daemon=True).start()
print("ready", flush=True)
blocked_in_c()
"""


@pytest.mark.parametrize(
    ("stopped", "earlier_signal"),
    [(False, False), (True, False), (False, True)],
    ids=["blocked", "stopped", "earlier-signal"],
)
def test_stack_dump_is_acknowledged_once_complete(tmp_path: Path, stopped: bool, earlier_signal: bool) -> None:
    """The launcher reads a rank's stack once the rank says the dump is complete (no fixed sleep), for a
    rank blocked in C and for one stopped by SIGSTOP (continued after the dump is requested); the dump is
    taken by the main thread; an acknowledgement written before the request (any signal with a Python
    handler writes one) does not count."""
    stack = tmp_path / "rank2.stack"
    done = tmp_path / "rank2.stack.done"
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED_RANK, str(stack), str(read_end)],
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(read_end,),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

        def wait_for(status: str) -> None:
            deadline = time.monotonic() + 30
            while psutil.Process(proc.pid).status() != status and time.monotonic() < deadline:
                time.sleep(0.01)

        # "ready" is printed just before the read: wait until the rank is really blocked in it, and only
        # then stop it, so that a stopped rank is stopped inside blocked_in_c, as a hung rank would be.
        wait_for("sleeping")
        expected = "stopped" if stopped else "sleeping"
        before = b""
        if earlier_signal:
            proc.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not done.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.01)
            before = bytes([signal.SIGUSR2])
            assert done.read_bytes() == before
            wait_for(expected)
        if stopped:
            proc.send_signal(signal.SIGSTOP)
            wait_for(expected)
        state = outcome.RankState(rank=2, pid=proc.pid)
        result = outcome.LaunchResult(world_size=3, backend="gloo", timeout_s=5)
        launcher._report_stuck(result, [state], tmp_path)
        (failure,) = result.failures
        assert failure.kind == "stuck" and failure.status == expected
        assert done.read_bytes() == before + bytes([signal.SIGUSR1])
        # Whole: the innermost frame and the outermost one, in faulthandler's order, taken by the main
        # thread itself (faulthandler heads the thread that ran the dump "Current thread").
        main = failure.stack[failure.stack.index("Current thread") :]
        assert "blocked_in_c" in main and main.rstrip().endswith("in <module>"), failure.stack
        assert "helper_thread" in failure.stack and failure.stack_missing == ""
        assert proc.poll() is None  # the dump did not disturb the rank
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)
        os.close(write_end)


IGNORING_RANK = """
import signal, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a rank that cannot dump: the request never gets through
print("ready", flush=True)
time.sleep(120)
"""


def test_stack_not_dumped_is_said_with_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stuck rank whose dump never comes: reported as not dumped, with its process status and the time
    waited, never silently without a stack; a byte already in its .done file does not pass for the dump."""
    from io import StringIO

    from rich.console import Console

    import ddpdoctor.render as render
    from ddpdoctor.render.bench import render_launch_failure

    monkeypatch.setattr(launcher, "STACK_WAIT_S", 0.5)
    (tmp_path / "rank1.stack.done").write_bytes(bytes([signal.SIGUSR2]))  # an earlier signal's byte
    proc = subprocess.Popen([sys.executable, "-c", IGNORING_RANK], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        result = outcome.LaunchResult(world_size=2, backend="gloo", timeout_s=5, timed_out=True)
        launcher._report_stuck(result, [outcome.RankState(rank=1, pid=proc.pid, op="broadcast")], tmp_path)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    (failure,) = result.failures
    assert failure.stack == ""
    assert failure.stack_missing.startswith("process sleeping, waited "), failure.stack_missing
    result.root_cause = outcome.pick_root_cause(result.failures)
    buf = StringIO()
    monkeypatch.setattr(render, "_err_console", Console(file=buf, width=200))
    render_launch_failure(result)
    assert f"stack of rank 1: not dumped ({failure.stack_missing})" in buf.getvalue(), buf.getvalue()
