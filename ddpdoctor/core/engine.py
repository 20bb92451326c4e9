"""Runs the check areas concurrently, each bounded by a wall-clock deadline."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ddpdoctor.core.model import Evidence, Finding, Report, Severity, define
from ddpdoctor.edge.sources import ENV_FACT, HOST_FACT, Sources, fact_or_none, redact_env

# Slack on top of --timeout for the engine's own bookkeeping: the total stays within timeout + 1 s.
JOIN_SLACK_S = 0.5

PROBE_TIMEOUT = define(
    "core.probe.timeout",
    "Probe timed out",
    "A probe did not finish within --timeout. Its area is unchecked: that is never reported as a pass.",
    "Find which tool hangs (often nvidia-smi on a GPU in a bad state, or a stale NFS mount) and fix it, "
    "or raise --timeout.",
)
ENV_NOT_RECORDED = define(
    "core.env.not_recorded",
    "Environment not recorded",
    "The snapshot has no env.json, so the checks of environment variables (launch variables, NCCL "
    "settings) cannot tell an unset variable from an unrecorded one and are skipped.",
    "Add the environment to the snapshot: `ddpdoctor snapshot DIR` records it (secrets redacted), or save "
    "`env | grep -E '^(RANK|WORLD_SIZE|LOCAL_|MASTER_|SLURM_|NCCL_|TORCH_|CUDA_VISIBLE)'` as JSON in DIR/env.json.",
)
PROBE_CRASHED = define(
    "core.probe.crashed",
    "Probe failed unexpectedly",
    "A probe raised an unexpected error, so its area is unchecked. This is a ddpdoctor bug worth reporting.",
    "Report it with `ddpdoctor snapshot DIR` attached; meanwhile run the area's tools by hand.",
)
SNAPSHOT_BAD_FILE = define(
    "core.snapshot.bad_file",
    "Snapshot file unusable",
    "A file of the replayed snapshot could not be used: unreadable, not a regular file, too large, not "
    "valid JSON, nested too deeply or not in the shape docs/snapshot.md documents. The checks that need it "
    "ran as if it were absent, so the replay is inconclusive rather than a pass.",
    "Record the snapshot again with `ddpdoctor snapshot DIR`, or fix the named file by hand "
    "(docs/snapshot.md lists each file's content).",
)
SNAPSHOT_EMPTY = define(
    "core.snapshot.empty",
    "Snapshot held nothing to check",
    "No file of the replayed directory was a snapshot file any check could use, so nothing was checked: "
    "a check of nothing is inconclusive, never a pass.",
    "Point --replay at a directory written by `ddpdoctor snapshot DIR`, or add the captured outputs under "
    "the names docs/snapshot.md lists (e.g. nvidia-smi-q.txt, env.json).",
)


def snapshot_problem_findings(sources: Sources) -> list[Finding]:
    """One finding per snapshot file the sources could not use (ReplaySources.problems), and one when
    no file at all was used (ReplaySources.used empty)."""
    problems: Mapping[str, str] = getattr(sources, "problems", None) or {}
    directory = getattr(sources, "directory", "")
    out = []
    used = getattr(sources, "used", None)
    if used is not None and not used and not problems:
        f = SNAPSHOT_EMPTY.finding(
            Severity.ERROR,
            f"No file in {directory} was a snapshot file the selected checks could use: nothing was checked.",
            evidence=[Evidence(f"ls {directory}", "no <command>.txt or <fact>.json that a check read")],
        )
        out.append(dataclasses.replace(f, area="core"))
    for file, why in sorted(dict(problems).items()):
        f = SNAPSHOT_BAD_FILE.finding(
            Severity.ERROR,
            f"{file} in snapshot {directory} is unusable: {why}",
            evidence=[Evidence(f"read {directory}/{file}", why)],
            data={"file": file},
        )
        out.append(dataclasses.replace(f, area="core"))
    return out


@dataclass
class Context:
    """What a probe may use: the sources, the (redacted) environment and command options."""

    sources: Sources
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    # False when a replayed snapshot holds no env.json: "no variable set" would then be a guess.
    env_recorded: bool = True

    @property
    def deadline(self) -> float:
        return self.sources.deadline

    def remaining(self) -> float:
        return max(self.sources.deadline - time.monotonic(), 0.0)


@dataclass(frozen=True)
class Area:
    """A group of checks: `collect` gathers facts through the sources, `judge` is pure."""

    name: str
    title: str
    collect: Callable[[Context], Any]
    judge: Callable[[Any], list[Finding]]
    order: int = 50


def load_environment(sources: Sources) -> dict[str, str]:
    return read_environment(sources) or {}


def read_environment(sources: Sources) -> dict[str, str] | None:
    """The (redacted) environment, or None where a snapshot did not record it."""
    env = fact_or_none(sources, ENV_FACT, lambda: redact_env(os.environ))
    if not isinstance(env, dict):
        return None
    # A replayed env.json may be hand-written: names and values are strings for every judge.
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in env.items()}


def load_hostname(sources: Sources) -> str:
    host = fact_or_none(sources, HOST_FACT, socket.gethostname)
    return str(host) if host else "unknown"


def _crash_finding(area: Area, exc: BaseException) -> Finding:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    f = PROBE_CRASHED.finding(
        Severity.ERROR,
        f"The {area.title} probe failed: {type(exc).__name__}: {exc}",
        evidence=[Evidence(f"ddpdoctor area {area.name}", tb.strip())],
    )
    return dataclasses.replace(f, area=area.name)


def run_area(area: Area, ctx: Context) -> list[Finding]:
    """Collect and judge one area; an exception becomes an error finding, never a traceback."""
    try:
        facts = area.collect(ctx)
        findings = list(area.judge(facts))
    except Exception as exc:  # noqa: BLE001 - never crash on the machine we diagnose
        return [_crash_finding(area, exc)]
    # The engine's area name wins over the id prefix: reports group by the area that ran the check.
    return [f if f.area == area.name else dataclasses.replace(f, area=area.name) for f in findings]


def run_checks(
    sources: Sources,
    areas: Sequence[Area],
    timeout_s: float,
    options: Mapping[str, Any] | None = None,
    source_label: str = "live",
    on_area_done: Callable[[str], None] | None = None,
) -> Report:
    """Run every area concurrently; an area still running at the deadline becomes an error finding.
    `on_area_done(name)` is called from the area's thread as each one finishes (a progress bar)."""
    start = time.monotonic()
    sources.deadline = start + timeout_s
    env = read_environment(sources)
    ctx = Context(sources=sources, env=env or {}, options=dict(options or {}), env_recorded=env is not None)
    host = load_hostname(sources)
    results: dict[str, list[Finding]] = {}
    lock = threading.Lock()

    def work(area: Area) -> None:
        found = run_area(area, ctx)
        with lock:
            results[area.name] = found
            if on_area_done is not None:
                on_area_done(area.name)

    # Daemon threads: a probe stuck in a C call must not keep the process alive after the report.
    threads = [threading.Thread(target=work, args=(a,), name=f"probe-{a.name}", daemon=True) for a in areas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(sources.deadline + JOIN_SLACK_S - time.monotonic(), 0.0))
    findings: list[Finding] = []
    with lock:
        for area in areas:
            if area.name in results:
                findings.extend(results[area.name])
            else:
                f = PROBE_TIMEOUT.finding(
                    Severity.ERROR,
                    f"The {area.title} probe did not finish within {timeout_s:g}s; its checks did not run.",
                    evidence=[Evidence(f"ddpdoctor area {area.name}", f"still running after {timeout_s:g}s")],
                )
                findings.append(dataclasses.replace(f, area=area.name))
    findings.extend(snapshot_problem_findings(sources))
    return Report(
        host=host,
        findings=findings,
        duration_s=time.monotonic() - start,
        source=source_label,
        areas=[a.name for a in areas],
    )


def is_selected(name: str, only: Sequence[str] = (), skip: Sequence[str] = ()) -> bool:
    """Whether --only/--skip keep the area called `name`."""
    return (not only or name in only) and name not in skip


def select_areas(all_areas: Iterable[Area], only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[Area]:
    """Filter areas by name; unknown names, or a selection that leaves no area, raise ValueError (a
    usage error): a check that checked nothing must not report a pass."""
    areas = list(all_areas)
    names = {a.name for a in areas}
    unknown = sorted((set(only) | set(skip)) - names)
    if unknown:
        raise ValueError(f"unknown area(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    selected = [a for a in areas if is_selected(a.name, only, skip)]
    if not selected:
        raise ValueError(
            "--only/--skip leave no area to check (a check of nothing cannot pass); "
            f"known: {', '.join(sorted(names))}"
        )
    return selected
