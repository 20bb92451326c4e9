"""The stderr progress bar: nothing at all off a terminal, a live bar (cleared at the end) on one."""

from __future__ import annotations

import io

import pytest

from ddpdoctor import render
from ddpdoctor.render.progress import StderrProgress


@pytest.fixture
def stderr_console(monkeypatch: pytest.MonkeyPatch):
    def use(terminal: bool) -> io.StringIO:
        from rich.console import Console

        buf = io.StringIO()
        monkeypatch.setattr(render, "_err_console", Console(file=buf, force_terminal=terminal, width=80))
        return buf

    yield use
    render.reset_consoles()


def test_off_a_terminal_nothing_is_written(stderr_console) -> None:
    buf = stderr_console(False)
    with StderrProgress("lint", total=3) as p:
        p.describe("train.py")
        p.advance()
    assert not p.shown and buf.getvalue() == ""


def test_on_a_terminal_the_bar_shows_what_it_is_doing(stderr_console) -> None:
    buf = stderr_console(True)
    with StderrProgress("explain", total=2048, unit="bytes") as p:
        assert p.shown
        p.describe("rank0.log")
        p.advance(1024)
        p._progress.refresh()
        assert "explain: rank0.log" in buf.getvalue()
    assert not p.shown


def _run_on_a_terminal(args: list[str], cwd: str) -> tuple[int, str]:
    """`python -m ddpdoctor ARGS` with stderr on a real pseudo-terminal; (exit code, what the tty got)."""
    import os
    import pty
    import select
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", *args], stdout=subprocess.DEVNULL,
                            stderr=slave, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
    os.close(slave)
    got = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            got += chunk
    finally:
        os.close(master)
        code = proc.wait(timeout=60)
    return code, got.decode("utf-8", "replace")


def test_snapshot_shows_progress_on_a_terminal_only(tmp_path) -> None:
    import subprocess
    import sys

    code, tty = _run_on_a_terminal(["snapshot", str(tmp_path / "snap"), "--only", "system,mp"], str(tmp_path))
    assert code == 0 and "snapshot" in tty and "recorded" in tty, tty
    piped = subprocess.run([sys.executable, "-m", "ddpdoctor", "snapshot", str(tmp_path / "snap2"), "--only",
                            "system,mp"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr


def test_every_area_reports_done_once() -> None:
    from ddpdoctor.checks import load_areas
    from ddpdoctor.core.engine import run_checks, select_areas
    from ddpdoctor.edge.sources import LiveSources

    done: list[str] = []
    areas = select_areas(load_areas(), ["system", "mp", "launch"], [])
    run_checks(LiveSources(), areas, timeout_s=30, on_area_done=done.append)
    assert sorted(done) == sorted(a.name for a in areas)


def test_lint_and_explain_show_progress_on_a_terminal(tmp_path) -> None:
    # The long runs of a first hour (a big tree, a big log) say what they are doing on a terminal.
    (tmp_path / "train.py").write_text("import torch.distributed as dist\ndist.init_process_group('nccl')\n")
    code, tty = _run_on_a_terminal(["lint", str(tmp_path)], str(tmp_path))
    assert code in (0, 1) and "lint" in tty, tty
    log = tmp_path / "rank0.log"
    log.write_text("NCCL WARN Call to ibv_create_cq failed\n" * 20000)
    code, tty = _run_on_a_terminal(["explain", str(log)], str(tmp_path))
    assert code in (0, 1) and "explain: rank0.log" in tty, tty


def test_lint_reports_its_bytes_done() -> None:
    from pathlib import Path

    from ddpdoctor.lint import lint_paths

    seen: list[tuple[int, int]] = []
    lint_paths([Path(__file__)], on_progress=lambda done, total, where: seen.append((done, total)))
    assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1] > 0
