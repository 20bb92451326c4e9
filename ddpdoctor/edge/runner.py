"""The one place that runs external commands.

Argv lists only, never a shell string; every call has a timeout; a missing binary, a timeout or a
non-zero exit comes back as a CommandResult, never as an exception.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

DEFAULT_TIMEOUT_S = 10.0
# A tool that floods stdout must not exhaust memory; keep the head, which holds what parsers need.
MAX_OUTPUT_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Command:
    """A command a probe runs, under a fixed id: snapshots store its output as DIR/<id>.txt."""

    id: str
    argv: tuple[str, ...]
    description: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def display(self) -> str:
        return " ".join(self.argv)


_COMMANDS: dict[str, Command] = {}


def define_command(
    id: str, argv: Sequence[str], description: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Command:
    """Declare a command id (documented in docs/snapshot.md, which is generated from these)."""
    cmd = Command(id=id, argv=tuple(argv), description=description, timeout_s=timeout_s)
    existing = _COMMANDS.get(id)
    if existing is not None and (existing.argv, existing.description) != (cmd.argv, cmd.description):
        raise ValueError(f"command id {id!r} declared twice")
    _COMMANDS[id] = cmd
    return cmd


def all_commands() -> dict[str, Command]:
    return dict(_COMMANDS)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    found: bool = True  # False: the binary is not installed (or, in a replay, the output was not captured)
    timed_out: bool = False
    duration_s: float = 0.0
    error: str = ""  # why it could not run (permission, OS error, not in snapshot)
    # False only in a replay whose snapshot lacks this command's file: "not available there", which
    # checks report as a skip, not as a probe that failed.
    captured: bool = True

    @property
    def ok(self) -> bool:
        return self.found and not self.timed_out and self.returncode == 0

    @property
    def display(self) -> str:
        return " ".join(self.argv)

    def describe_failure(self) -> str:
        """One line saying why this run gave no usable output (empty when it did)."""
        if not self.found:
            return self.error or f"{self.argv[0]}: command not found"
        if self.timed_out:
            return f"`{self.display}` timed out after {self.duration_s:.1f}s"
        if self.error:
            return self.error
        if self.returncode != 0:
            tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or [""]
            return f"`{self.display}` exited with {self.returncode}: {tail[0][:200]}".rstrip(": ")
        return ""

    def excerpt(self, max_lines: int = 8) -> str:
        text = (self.stdout.strip() or self.stderr.strip()).splitlines()
        cut = text[:max_lines]
        if len(text) > max_lines:
            cut.append(f"... ({len(text) - max_lines} more lines)")
        return "\n".join(cut)


def kill_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a command started by run_argv and everything it started (it leads its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _decode(data: bytes | None) -> str:
    if not data:
        return ""
    return data[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace")


def run_argv(
    argv: Sequence[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    started: Optional[Callable[[subprocess.Popen[bytes]], None]] = None,
) -> CommandResult:
    """Run argv with a wall-clock timeout; the whole process group is killed when it expires.

    `started(proc)` is called as soon as the process exists, so an owner (LiveSources) can kill it
    when the whole check ends early; the run then comes back with the kill's exit status.
    """
    argv = tuple(argv)
    if not argv:
        raise ValueError("empty argv")
    if shutil.which(argv[0]) is None:
        return CommandResult(argv=argv, found=False, error=f"{argv[0]}: command not found")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            # Own process group: a timeout kills the tool and anything it started.
            start_new_session=True,
        )
    except FileNotFoundError:
        return CommandResult(argv=argv, found=False, error=f"{argv[0]}: command not found")
    except OSError as exc:
        return CommandResult(argv=argv, error=f"{argv[0]}: {exc.strerror or exc}")
    try:
        if started is not None:
            started(proc)
        out, err = proc.communicate(timeout=max(timeout_s, 0.01))
    except subprocess.TimeoutExpired:
        kill_process_group(proc)
        out, err = proc.communicate()
        return CommandResult(
            argv=argv,
            returncode=None,
            stdout=_decode(out),
            stderr=_decode(err),
            timed_out=True,
            duration_s=time.monotonic() - start,
        )
    except BaseException:
        kill_process_group(proc)
        proc.wait()
        raise
    return CommandResult(
        argv=argv,
        returncode=proc.returncode,
        stdout=_decode(out),
        stderr=_decode(err),
        duration_s=time.monotonic() - start,
    )
