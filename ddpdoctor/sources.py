"""Where probes get their facts: the live machine, a recording of it, or a snapshot directory.

Everything a probe reads goes through a Sources object: commands (by Command id) and facts (named
JSON-able values such as the environment or NVML readings). A snapshot directory holds
`<command-id>.txt` for each command and `<fact>.json` for each fact; a missing file means "not
available there", so a directory built by hand from pasted outputs works.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from ddpdoctor.runner import Command, CommandResult, kill_process_group, run_argv


class NotAvailable(Exception):
    """A fact that this source cannot provide (e.g. absent from a snapshot)."""


SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
# The password may itself contain "@": the credentials run to the last "@" before the host.
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/\s]*)?)@")
REDACTED = "<redacted>"


def redact_value(name: str, value: str) -> str:
    if SECRET_NAME.search(name):
        return REDACTED
    return URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment with secret-looking values replaced: safe to store or print."""
    return {k: redact_value(k, v) for k, v in env.items()}


# In free text (logs from another machine, command output) secrets show up as assignments to a
# secret-named variable or option (`HF_TOKEN=hf_...`, `"password": "..."`, `--api-key=...`) or as tokens
# whose format gives them away. Names are matched by whole segments, so NCCL_IB_PKEY or AUTHOR stay.
_SECRET_SEGMENT = (
    r"(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|SECRET[_-]?KEY|AUTH[_-]?KEY"
    r"|CREDENTIALS?|COOKIE|SESSION[_-]?KEY)"
)
_SECRET_ASSIGNMENT = re.compile(
    r"(?P<name>\b[A-Za-z0-9_.-]*(?<![A-Za-z0-9])" + _SECRET_SEGMENT + r"(?![A-Za-z0-9]))"
    r"(?P<sep>\"?\s*[=:]\s*\"?)(?P<value>[^\s\"',;&]+)",
    re.IGNORECASE,
)
_TOKEN_FORMATS = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})\b"
)
_BEARER = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}")


def _redact_assignment(m: re.Match[str]) -> str:
    value = m.group("value")
    if value.lower() in _NOT_SECRET_VALUES or value == REDACTED or value.startswith("<"):
        return m.group(0)
    return f"{m.group('name')}{m.group('sep')}{REDACTED}"


def redact_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """Remove credentials in URLs, values assigned to secret-named variables or options, tokens in a
    known format (Hugging Face, GitHub, GitLab, OpenAI-style, AWS access keys, Slack, Bearer), and any
    literal value of a secret-named variable in `env` (the current environment by default)."""
    text = URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _SECRET_ASSIGNMENT.sub(_redact_assignment, text)
    text = _TOKEN_FORMATS.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    secrets = [
        value
        for name, value in (env if env is not None else os.environ).items()
        if SECRET_NAME.search(name) and len(value) >= 4 and value.lower() not in _NOT_SECRET_VALUES
    ]
    # Longest first: a secret that contains a shorter one must not be left half replaced.
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


# Flag-like values of secret-named variables (AUTH_MODE=none) are not secrets; replacing the word
# everywhere would only garble reports.
_NOT_SECRET_VALUES = frozenset(
    {"true", "false", "none", "null", "unset", "auto", "default", "enabled", "disabled"}
)
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def redact_data(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """A JSON-able value with every string redacted (redact_text), and string values under
    environment-variable-like keys with secret names (an environment dict) replaced."""
    if isinstance(value, str):
        return redact_text(value, env)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            secret_key = isinstance(k, str) and _ENV_NAME.fullmatch(k) and SECRET_NAME.search(k)
            out[k] = REDACTED if secret_key and isinstance(v, str) and v else redact_data(v, env)
        return out
    if isinstance(value, (list, tuple)):
        return [redact_data(v, env) for v in value]
    return value


_FACTS: dict[str, str] = {}


def define_fact(name: str, description: str) -> str:
    """Declare a fact name (stored as DIR/<name>.json in snapshots, documented in docs/snapshot.md)."""
    _FACTS[name] = description
    return name


def all_facts() -> dict[str, str]:
    return dict(_FACTS)


ENV_FACT = define_fact("env", "The process environment, secret-looking values redacted")
HOST_FACT = define_fact("host", "The host name")


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
        return produce()


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
        value = produce()
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


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


class ReplaySources:
    """A snapshot directory instead of the live machine."""

    is_live = False

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.deadline = time.monotonic() + 3600

    def __enter__(self) -> ReplaySources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing runs from a snapshot: here for symmetry with LiveSources."""

    def run(self, cmd: Command) -> CommandResult:
        path = self.directory / f"{cmd.id}.txt"
        meta_path = self.directory / f"{cmd.id}.meta.json"
        if not path.is_file() and meta_path.is_file():
            meta = _read_meta(meta_path)
            if meta.get("found") is False:  # the tool was missing on the recorded machine
                error = meta.get("error")
                return CommandResult(
                    argv=cmd.argv,
                    found=False,
                    error=error if isinstance(error, str) else f"{cmd.argv[0]}: command not found",
                )
        if not path.is_file():
            return CommandResult(
                argv=cmd.argv,
                found=False,
                captured=False,
                error=f"{cmd.id}.txt not in snapshot {self.directory}",
            )
        stdout = path.read_bytes().decode("utf-8", errors="replace")
        returncode: int | None = 0
        stderr, timed_out = "", False
        if meta_path.is_file():
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
        path = self.directory / f"{name}.json"
        if not path.is_file():
            raise NotAvailable(f"{name}.json not in snapshot {self.directory}")
        try:
            return json.loads(path.read_text())
        except ValueError as exc:
            raise NotAvailable(f"{name}.json in {self.directory} is not valid JSON: {exc}") from exc


def fact_or_none(sources: Sources, name: str, produce: Callable[[], Any]) -> Any:
    """A fact, or None where the source cannot provide it (e.g. absent from a hand-built snapshot)."""
    try:
        return sources.fact(name, produce)
    except NotAvailable:
        return None
