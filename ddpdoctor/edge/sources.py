"""Where probes get their facts: the live machine, a recording of it, or a snapshot directory.

Everything a probe reads goes through a Sources object: commands (by Command id) and facts (named
JSON-able values such as the environment or NVML readings). A snapshot directory holds
`<command-id>.txt` for each command and `<fact>.json` for each fact; a missing file means "not
available there", so a directory built by hand from pasted outputs works.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

from ddpdoctor.edge.files import (
    JSON_FILE_LIMIT,
    TOOL_OUTPUT_LIMIT,
    load_json_text,
    read_snapshot_bytes,
    snapshot_entry_present,
)
from ddpdoctor.edge.json_shape import Shape, find_mismatch
from ddpdoctor.edge.redact import (
    REDACTED,
    SECRET_NAME,
    URL_CREDENTIALS,
    redact_data,
    redact_env,
    redact_text,
    redact_value,
)
from ddpdoctor.edge.runner import Command, CommandResult, kill_process_group, run_argv


class NotAvailable(Exception):
    """A fact that this source cannot provide (e.g. absent from a snapshot)."""


# Redaction lives at the edge (ddpdoctor/edge/redact.py); these names stay importable from here.
__all__ = [
    "REDACTED",
    "SECRET_NAME",
    "URL_CREDENTIALS",
    "redact_data",
    "redact_env",
    "redact_text",
    "redact_value",
]


_FACTS: dict[str, str] = {}
_SHAPES: dict[str, Shape] = {}


def define_fact(name: str, description: str, shape: Optional[Shape] = None) -> str:
    """Declare a fact name (stored as DIR/<name>.json in snapshots, documented in docs/snapshot.md) and
    the shape its file must have (json_shape): a replayed file that departs from it is refused at the
    edge with one finding, so no judge meets a type it was not written for."""
    _FACTS[name] = description
    if shape is not None:
        _SHAPES[name] = shape
    return name


def fact_shape(name: str) -> Optional[Shape]:
    """The declared shape of a fact, if any."""
    return _SHAPES.get(name)


def all_facts() -> dict[str, str]:
    return dict(_FACTS)


ENV_FACT = define_fact("env", "The process environment, secret-looking values redacted", dict)
HOST_FACT = define_fact("host", "The host name", str)


class Sources(Protocol):
    deadline: float

    def run(self, cmd: Command) -> CommandResult: ...

    def fact(self, name: str, produce: Callable[[], Any]) -> Any: ...

    @property
    def is_live(self) -> bool: ...


class _Once:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: CommandResult | None = None


class LiveSources:
    """The machine we are running on.

    A command runs once per LiveSources (areas asking for the same id share the run), may be started
    ahead with `prefetch`, and never outlives it: `close()` (or leaving a `with` block) kills every
    command still running, so an early exit, a usage error or Ctrl-C leaves no orphan behind.
    """

    is_live = True

    def __init__(self, deadline: float | None = None, env: Mapping[str, str] | None = None) -> None:
        self.deadline = deadline if deadline is not None else time.monotonic() + 3600
        self.env = env
        self._cache_lock = threading.Lock()
        self._cache: dict[str, _Once] = {}
        self._running: set[subprocess.Popen[bytes]] = set()
        self._closed = False

    def __enter__(self) -> LiveSources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def remaining(self) -> float:
        return max(self.deadline - time.monotonic(), 0.01)

    def prefetch(self, cmd: Command) -> None:
        """Start `cmd` now, in the background; `run(cmd)` then waits for this run instead of starting one.

        Used for the slowest probe (the torch import) so that it overlaps everything else.
        """
        with self._cache_lock:
            if self._closed or cmd.id in self._cache:
                return
            once = self._cache[cmd.id] = _Once()
        threading.Thread(
            target=self._execute, args=(cmd, once), name=f"prefetch-{cmd.id}", daemon=True
        ).start()

    def _started(self, proc: subprocess.Popen[bytes]) -> None:
        with self._cache_lock:
            if not self._closed:
                self._running.add(proc)
                return
        kill_process_group(proc)  # started after close(): nobody is left to wait for it

    def _execute(self, cmd: Command, once: _Once) -> None:
        try:
            once.result = run_argv(
                cmd.argv, timeout_s=min(cmd.timeout_s, self.remaining()), env=self.env, started=self._started
            )
        finally:
            with self._cache_lock:
                self._running = {p for p in self._running if p.returncode is None}
            once.done.set()

    def run(self, cmd: Command) -> CommandResult:
        """Run a command once per Sources: areas asking for the same command id share one run."""
        with self._cache_lock:
            if self._closed:
                return CommandResult(argv=cmd.argv, error=f"`{cmd.display}` not run: the check has ended")
            once = self._cache.get(cmd.id)
            first = once is None
            if first:
                once = self._cache[cmd.id] = _Once()
        assert once is not None
        if first:
            self._execute(cmd, once)
        elif not once.done.wait(self.remaining()):
            return CommandResult(
                argv=cmd.argv, timed_out=True, error=f"`{cmd.display}` still running at the deadline"
            )
        if once.result is None:  # the first caller raised (e.g. KeyboardInterrupt)
            return CommandResult(argv=cmd.argv, error=f"`{cmd.display}` did not complete")
        return once.result

    def close(self) -> None:
        """Kill every command still running (its whole process group); later runs are refused."""
        with self._cache_lock:
            self._closed = True
            running = [p for p in self._running if p.returncode is None]
            self._running.clear()
        for proc in running:
            kill_process_group(proc)

    def fact(self, name: str, produce: Callable[[], Any]) -> Any:
        # Redacted here, where the fact enters: no check, finding or output format can see a secret.
        return redact_data(produce())


class RecordingSources(LiveSources):
    """Live sources that keep every command output and fact, for `ddpdoctor snapshot`."""

    def __init__(self, deadline: float | None = None) -> None:
        super().__init__(deadline)
        self._lock = threading.Lock()
        self.commands: dict[str, CommandResult] = {}
        self.facts: dict[str, Any] = {}

    def run(self, cmd: Command) -> CommandResult:
        result = super().run(cmd)
        with self._lock:
            self.commands[cmd.id] = result
        return result

    def fact(self, name: str, produce: Callable[[], Any]) -> Any:
        value = redact_data(produce())
        with self._lock:
            self.facts[name] = value
        return value

    def write(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        env = os.environ
        for cid, res in sorted(self.commands.items()):
            if not res.found:
                # A tool missing here is a finding live ("lspci: command not found"); record it so that the
                # replay gives the same one rather than "not in snapshot" (a skip).
                meta_path = directory / f"{cid}.meta.json"
                meta = {"argv": list(res.argv), "found": False, "error": redact_text(res.error, env)}
                meta_path.write_text(json.dumps(meta, indent=2) + "\n")
                written.append(meta_path)
                continue
            path = directory / f"{cid}.txt"
            path.write_text(redact_text(res.stdout, env))
            written.append(path)
            if res.returncode != 0 or res.stderr or res.timed_out:
                meta = {
                    "argv": list(res.argv),
                    "returncode": res.returncode,
                    "timed_out": res.timed_out,
                    "stderr": redact_text(res.stderr, env),
                }
                meta_path = directory / f"{cid}.meta.json"
                meta_path.write_text(json.dumps(meta, indent=2) + "\n")
                written.append(meta_path)
        for name, value in sorted(self.facts.items()):
            path = directory / f"{name}.json"
            path.write_text(redact_text(json.dumps(value, indent=2, sort_keys=True, default=str), env) + "\n")
            written.append(path)
        return written


# A .meta.json holds argv, a return code and stderr: far below this.
META_FILE_LIMIT = 1024 * 1024


def _is_present(path: Path) -> bool:
    """Whether `path` names anything at all (a link, a special or unreadable file included: those are
    read, and refused, with a finding, rather than silently taken for absent)."""
    return snapshot_entry_present(path.parent, path.name)


def _read_snapshot(path: Path, limit: int) -> bytes:
    """A snapshot file: regular, directly inside the snapshot, never through a link (edge/files.py)."""
    return read_snapshot_bytes(path.parent, path.name, limit)


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = load_json_text(_read_snapshot(path, META_FILE_LIMIT))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _reason(exc: BaseException) -> str:
    return (getattr(exc, "strerror", None) or str(exc)) if isinstance(exc, OSError) else str(exc)


class ReplaySources:
    """A snapshot directory instead of the live machine.

    Every file is read bounded, regular-only and never through a symbolic link (edge/files.py
    read_snapshot_bytes: a snapshot is someone else's directory, and a link in it to /etc/shadow must not
    become evidence), each fact file is checked against its
    declared shape, and every value is redacted as it enters. A file that cannot be used is kept in
    `problems` (file name -> what was wrong); the engine reports each as one finding."""

    is_live = False

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.deadline = time.monotonic() + 3600
        self.problems: dict[str, str] = {}
        self.used: set[str] = set()  # the files read successfully: none means nothing was checked

    def __enter__(self) -> ReplaySources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing runs from a snapshot: here for symmetry with LiveSources."""

    def run(self, cmd: Command) -> CommandResult:
        name = f"{cmd.id}.txt"
        path = self.directory / name
        meta_path = self.directory / f"{cmd.id}.meta.json"
        if not _is_present(path) and _is_present(meta_path):
            meta = _read_meta(meta_path)
            if meta.get("found") is False:  # the tool was missing on the recorded machine
                self.used.add(meta_path.name)
                error = meta.get("error")
                return CommandResult(
                    argv=cmd.argv,
                    found=False,
                    error=error if isinstance(error, str) else f"{cmd.argv[0]}: command not found",
                )
        if not _is_present(path):
            return CommandResult(
                argv=cmd.argv,
                found=False,
                captured=False,
                error=f"{name} not in snapshot {self.directory}",
            )
        try:
            stdout = _read_snapshot(path, TOOL_OUTPUT_LIMIT).decode("utf-8", errors="replace")
        except OSError as exc:
            self.problems[name] = f"cannot read it: {_reason(exc)}"
            return CommandResult(argv=cmd.argv, error=f"cannot read {path}: {_reason(exc)}")
        self.used.add(name)
        returncode: int | None = 0
        stderr, timed_out = "", False
        if _is_present(meta_path):
            meta = _read_meta(meta_path)
            # A hand-edited meta file may hold anything: keep only well-typed values.
            rc = meta.get("returncode", 0)
            returncode = rc if rc is None or (isinstance(rc, int) and not isinstance(rc, bool)) else 0
            stderr = meta["stderr"] if isinstance(meta.get("stderr"), str) else ""
            timed_out = meta.get("timed_out") is True
        return CommandResult(
            argv=cmd.argv, returncode=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out
        )

    def fact(self, name: str, produce: Callable[[], Any]) -> Any:
        file = f"{name}.json"
        path = self.directory / file
        if not _is_present(path):
            raise NotAvailable(f"{file} not in snapshot {self.directory}")
        try:
            value = load_json_text(_read_snapshot(path, JSON_FILE_LIMIT))
        except OSError as exc:
            why = f"cannot read it: {_reason(exc)}"
        except ValueError as exc:
            why = f"not valid JSON: {exc}"
        else:
            shape = fact_shape(name)
            mismatch = find_mismatch(value, shape) if shape is not None else None
            if mismatch is None:
                self.used.add(file)
                return redact_data(value)
            why = f"not in the documented shape (docs/snapshot.md): {mismatch}"
        self.problems[file] = why
        raise NotAvailable(f"{file} in {self.directory}: {why}")


def fact_or_none(sources: Sources, name: str, produce: Callable[[], Any]) -> Any:
    """A fact, or None where the source cannot provide it (e.g. absent from a hand-built snapshot)."""
    try:
        return sources.fact(name, produce)
    except NotAvailable:
        return None
