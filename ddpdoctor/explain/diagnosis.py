"""One explain verdict: a diagnosis (what, where, why, the fix) and the log lines that show it.

Its own module so that the reasoning (reason.py) and the next-log advice (nextlog.py) share it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.core.model import Severity

EVIDENCE_DEFAULT = 3


@dataclass
class Occurrence:
    file: str
    line: int
    text: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": f"{self.file}:{self.line}",
            "file": self.file,
            "line": self.line,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "excerpt": self.text,
        }


@dataclass
class Diagnosis:
    id: str
    title: str
    severity: Severity
    role: str
    component: str
    cause: str
    fix: str
    references: list[str]
    first: Occurrence | None
    evidence: list[Occurrence]
    count: int
    ranks: list[int] = field(default_factory=list)
    local_ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    derived: bool = False
    reasoning: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    sort_key: tuple[Any, ...] = ()

    def to_dict(self, all_evidence: bool = False) -> dict[str, Any]:
        evidence = self.evidence if all_evidence else self.evidence[:EVIDENCE_DEFAULT]
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity.label,
            "role": "derived" if self.derived else self.role,
            "component": self.component,
            "ranks": self.ranks,
            "local_ranks": self.local_ranks,
            "hosts": self.hosts,
            "count": self.count,
            "first": self.first.to_dict() if self.first else None,
            "evidence": [e.to_dict() for e in evidence],
            "reasoning": self.reasoning,
            "cause": self.cause,
            "fix": self.fix,
            "references": self.references,
            "data": self.data,
        }
