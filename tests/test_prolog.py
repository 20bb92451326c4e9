"""`check --prolog`: silent with exit 0 when healthy, one short line per failing finding and a non-zero exit
otherwise, and a hard bound on the whole run (real subprocesses, a real hanging tool)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddpdoctor.render.formats import PROLOG_LINE_MAX

ROOT = Path(__file__).resolve().parent.parent
CI = Path(__file__).parent / "fixtures" / "ci"
HEALTHY = CI / "healthy-cpu-node"
MISMATCHED = CI / "mismatched-gpu-node"
H100 = ROOT / "docs" / "examples" / "8xh100-sxm-ndr400.toml"
LINE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+: \S.*$")


def ddpdoctor(
    *args: str, env: dict | None = None, timeout: float = 120
) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return proc, time.monotonic() - start


def test_healthy_replay_is_silent_with_exit_0() -> None:
    proc, _ = ddpdoctor("check", "--prolog", "--replay", str(HEALTHY))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_failing_replay_gives_one_line_per_failing_finding() -> None:
    args = ("check", "--replay", str(MISMATCHED), "--expect", str(H100))
    proc, _ = ddpdoctor(*args, "--prolog")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert proc.stdout.endswith("\n") and lines
    for line in lines:
        assert LINE.match(line), line
        assert len(line) <= PROLOG_LINE_MAX and '"' not in line and "\r" not in line
    # Exactly the fail and error findings of the same run, worst first.
    full, _ = ddpdoctor(*args, "--format", "json")
    failing = [f for f in json.loads(full.stdout)["findings"] if f["severity"] in ("fail", "error")]
    assert len(lines) == len(failing)
    assert sorted(line.split(":", 1)[0] for line in lines) == sorted(f["id"] for f in failing)
    assert "expect.gpu.count: Expected 8 GPUs, found 1 (8 attached)" in lines
    severities = {f["id"]: f["severity"] for f in failing}
    ranks = [0 if severities[x.split(":", 1)[0]] == "fail" else 1 for x in lines]
    assert ranks == sorted(ranks)


def test_a_hanging_tool_is_bounded_and_killed(tmp_path: Path) -> None:
    # A real `df` that hangs (a stale NFS mount does this): the probe is killed at --timeout and the
    # prolog reports the unchecked /dev/shm as a reason, within the bound.
    pidfile = tmp_path / "df.pid"
    fake = tmp_path / "df"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    proc, elapsed = ddpdoctor("check", "--prolog", "--only", "system", "--timeout", "2", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert any(line.startswith("system.shm.unreadable: ") for line in proc.stdout.splitlines())
    assert all(LINE.match(x) for x in proc.stdout.splitlines())
    # Loose "did not hang" bound: 2 s of probes + 2 s grace + interpreter start-up on a busy machine.
    assert elapsed < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the hanging df survived"
        time.sleep(0.05)


def test_hard_deadline_stops_anything_and_kills_children(tmp_path: Path) -> None:
    # Whatever hangs outside the probes, the prolog process itself ends at the hard bound, with a line,
    # exit 3, and no child left behind.
    script = (
        "import subprocess, sys, time\n"
        "from ddpdoctor.ci.prolog import arm_hard_deadline\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "arm_hard_deadline(1.0)\n"
        "time.sleep(300)\n"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 3
    pid_line, reason = proc.stdout.splitlines()
    assert reason == "core.prolog.deadline: ddpdoctor check did not finish within 1s"
    assert elapsed < 30
    pid = int(pid_line)
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child survived the hard deadline"
        time.sleep(0.05)


def test_usage_error_in_prolog_mode_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpu]\ncuont = 8\n")
    proc, _ = ddpdoctor("check", "--prolog", "--replay", str(HEALTHY), "--expect", str(bad))
    assert proc.returncode == 2
    assert "gpu.cuont: unknown key" in proc.stderr


def test_the_hard_bound_ends_with_the_check_in_a_longer_lived_process() -> None:
    """In-process (an embedding tool, or CliRunner in tests) the bound must be cancelled once check is
    done: a timer left behind would os._exit() the host process --timeout + 2 s later."""
    import threading

    from typer.testing import CliRunner

    from ddpdoctor.ci.prolog import DEADLINE_THREAD
    from ddpdoctor.cli import app

    for args in (["--replay", str(HEALTHY)], ["--replay", str(HEALTHY), "--only", "no-such-area"]):
        res = CliRunner().invoke(app, ["check", "--prolog", "--timeout", "30", *args])
        assert res.exit_code in (0, 2), res.output
        timers = [t for t in threading.enumerate() if t.name == DEADLINE_THREAD]
        for t in timers:
            t.join(5)
        assert not [t for t in timers if t.is_alive()], "prolog hard deadline still armed after check"
