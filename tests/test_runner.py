from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from ddpdoctor.edge.runner import run_argv


def test_missing_binary_is_a_result() -> None:
    res = run_argv(["ddpdoctor-no-such-binary-xyz", "--help"], timeout_s=5)
    assert not res.found
    assert not res.ok
    assert "command not found" in res.describe_failure()


def test_nonzero_exit_is_a_result() -> None:
    res = run_argv(
        [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], timeout_s=20
    )
    assert res.found and res.returncode == 3 and not res.ok
    assert "exited with 3" in res.describe_failure()
    assert "boom" in res.describe_failure()


def test_output_captured() -> None:
    res = run_argv([sys.executable, "-c", "print('hello')"], timeout_s=20)
    assert res.ok and res.stdout == "hello\n"


def test_hung_binary_is_killed_with_its_children(tmp_path: Path) -> None:
    # A fake tool that starts a child and then sleeps forever, like a hung nvidia-smi.
    tool = tmp_path / "hung-tool"
    pidfile = tmp_path / "child.pid"
    tool.write_text(f"#!/bin/sh\nsleep 1000 &\necho $! > {pidfile}\nsleep 1000\n")
    tool.chmod(0o755)
    start = time.monotonic()
    res = run_argv([str(tool)], timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert res.timed_out and not res.ok
    assert "timed out" in res.describe_failure()
    assert elapsed < 10  # bounded: the exact bound is the timeout, checked loosely against a busy CI box
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and time.monotonic() < deadline:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    alive = psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
    assert not alive, "the hung tool's child survived the timeout"


def test_invalid_utf8_output_does_not_raise() -> None:
    res = run_argv(
        [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'\\xff\\xfeok')"], timeout_s=20
    )
    assert res.ok and res.stdout.endswith("ok")


def test_no_shell_true_anywhere() -> None:
    root = Path(__file__).resolve().parent.parent / "ddpdoctor"
    offenders = [str(p) for p in root.rglob("*.py") if "shell=True" in p.read_text()]
    assert offenders == []


def test_live_sources_run_each_command_once(tmp_path: Path) -> None:
    import threading

    from ddpdoctor.edge.runner import Command
    from ddpdoctor.edge.sources import LiveSources

    counter = tmp_path / "count"
    tool = tmp_path / "counting-tool"
    tool.write_text(f"#!/bin/sh\necho x >> {counter}\nsleep 0.3\necho done\n")
    tool.chmod(0o755)
    cmd = Command("test-counting", (str(tool),), "test only")
    sources = LiveSources()
    results = []
    threads = [threading.Thread(target=lambda: results.append(sources.run(cmd))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 4 and all(r.ok and r.stdout == "done\n" for r in results)
    assert counter.read_text().count("x") == 1


def _wait_for(path: Path, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_prefetched_command_is_shared_with_the_later_run(tmp_path: Path) -> None:
    from ddpdoctor.edge.runner import Command
    from ddpdoctor.edge.sources import LiveSources

    counter = tmp_path / "count"
    tool = tmp_path / "counting-tool"
    tool.write_text(f"#!/bin/sh\necho x >> {counter}\nsleep 0.3\necho done\n")
    tool.chmod(0o755)
    cmd = Command("test-prefetch", (str(tool),), "test only")
    with LiveSources() as sources:
        sources.prefetch(cmd)
        _wait_for(counter)  # it runs before anyone asked for it ...
        res = sources.run(cmd)  # ... and the run waits for that same process
    assert res.ok and res.stdout == "done\n"
    assert counter.read_text().count("x") == 1


def test_close_kills_a_prefetched_command_and_its_children(tmp_path: Path) -> None:
    from ddpdoctor.edge.runner import Command
    from ddpdoctor.edge.sources import LiveSources

    pids = tmp_path / "pids"
    # The tool starts a grandchild too: the whole process group must go.
    tool = tmp_path / "hanging-tool"
    tool.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    tool.chmod(0o755)
    sources = LiveSources()
    sources.prefetch(Command("test-hang", (str(tool),), "test only", timeout_s=300))
    tool_pid, grandchild = (int(x) for x in _wait_for(pids).split())
    start = time.monotonic()
    sources.close()
    assert _gone(tool_pid) and _gone(grandchild)
    assert time.monotonic() - start < 10
    # A closed source runs nothing more.
    late = sources.run(Command("test-late", ("true",), "test only"))
    assert not late.ok and "not run" in late.describe_failure()
