"""Findings and reports: plain data, no I/O, no rich, no torch."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

JSON_SCHEMA_VERSION = "ddpdoctor.check/1"


class Severity(enum.IntEnum):
    """Ordered so that the worst severity is the largest value."""

    OK = 0
    INFO = 1
    SKIP = 2
    WARN = 3
    ERROR = 4  # the probe itself could not run: inconclusive, never a pass
    FAIL = 5

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


class ExitCode(enum.IntEnum):
    """Stable exit codes: scripts and Slurm prologs depend on them."""

    HEALTHY = 0  # warnings allowed
    FAILED = 1  # at least one fail (or a warn with --strict)
    USAGE = 2
    INCONCLUSIVE = 3  # nothing failed, but a probe could not run


EXIT_CODES_HELP = (
    "Exit codes: 0 healthy (warnings allowed); 1 at least one check failed (or warned, with --strict); "
    "2 usage error; 3 nothing failed but a probe could not run; 130 interrupted (Ctrl-C); 143 terminated "
    "(SIGTERM)."
)


@dataclass(frozen=True)
class Evidence:
    """Where a finding comes from: the command (argv) or API call, and an excerpt of what it said."""

    source: str
    excerpt: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "excerpt": self.excerpt}


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    title: str
    summary: str
    fix: str = ""
    evidence: tuple[Evidence, ...] = ()
    area: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "area": self.area,
            "severity": self.severity.label,
            "title": self.title,
            "summary": self.summary,
            "evidence": [e.to_dict() for e in self.evidence],
            "fix": self.fix,
            "data": dict(self.data),
        }

    def to_json(self) -> dict[str, Any]:
        """to_dict as every --json output writes it: no fix is null, not "" (a finding with nothing to
        do, ok, info or skip, says so plainly)."""
        return {**self.to_dict(), "fix": self.fix or None}


@dataclass(frozen=True)
class CheckSpec:
    """A finding id declared once: its title, why it matters and the usual fix (docs/checks.md is built from these)."""

    id: str
    title: str
    why: str
    fix: str = ""

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    def finding(
        self,
        severity: Severity,
        summary: str,
        *,
        evidence: Iterable[Evidence] = (),
        fix: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> Finding:
        # ok/info/skip findings carry no fix unless one is given: there is nothing to do.
        default_fix = self.fix if severity >= Severity.WARN else ""
        return Finding(
            id=self.id,
            severity=severity,
            title=self.title,
            summary=summary,
            fix=default_fix if fix is None else fix,
            evidence=tuple(evidence),
            area=self.area,
            data=dict(data or {}),
        )


_SPECS: dict[str, CheckSpec] = {}


def define(id: str, title: str, why: str, fix: str = "") -> CheckSpec:
    """Declare a finding id. Ids are stable dotted slugs; declaring one twice with other text is a bug."""
    spec = CheckSpec(id=id, title=title, why=why, fix=fix)
    existing = _SPECS.get(id)
    if existing is not None and existing != spec:
        raise ValueError(f"finding id {id!r} declared twice with different text")
    _SPECS[id] = spec
    return spec


def all_specs() -> dict[str, CheckSpec]:
    return dict(_SPECS)


def worst(findings: Iterable[Finding]) -> Severity:
    return max((f.severity for f in findings), default=Severity.OK)


def exit_code_for(findings: Iterable[Finding], strict: bool = False) -> ExitCode:
    severities = {f.severity for f in findings}
    if Severity.FAIL in severities or (strict and Severity.WARN in severities):
        return ExitCode.FAILED
    if Severity.ERROR in severities:
        return ExitCode.INCONCLUSIVE
    return ExitCode.HEALTHY


def failing_findings(findings: Iterable[Finding], strict: bool = False) -> list[Finding]:
    """The findings that make the exit code non-zero (fail, error; warn with `strict`), worst first, in
    their order otherwise; none when the exit code is 0. The first one names a drain reason."""
    findings = list(findings)
    if exit_code_for(findings, strict) == ExitCode.HEALTHY:
        return []
    threshold = {Severity.FAIL, Severity.ERROR} | ({Severity.WARN} if strict else set())
    return sorted((f for f in findings if f.severity in threshold), key=lambda f: -f.severity)


@dataclass
class Report:
    host: str
    findings: list[Finding]
    duration_s: float = 0.0
    source: str = "live"  # "live" or "replay:<dir>"
    areas: list[str] = field(default_factory=list)

    def exit_code(self, strict: bool = False) -> ExitCode:
        return exit_code_for(self.findings, strict)

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        from ddpdoctor import __version__

        counts: dict[str, int] = {s.label: 0 for s in Severity}
        for f in self.findings:
            counts[f.severity.label] += 1
        return {
            "schema": JSON_SCHEMA_VERSION,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "host": self.host,
            "source": self.source,
            "duration_s": round(self.duration_s, 3),
            "areas": list(self.areas),
            "exit_code": int(self.exit_code(strict)),
            "counts": counts,
            "findings": [f.to_json() for f in self.findings],
        }
