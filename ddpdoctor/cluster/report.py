"""The cluster report: every node's identity, key facts and findings, plus the cross-node findings.

Plain data: no I/O, no rich, no torch. Nodes are identified by node rank and host name together, since
several agents may share a host (containers, tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from ddpdoctor.core.model import Evidence, ExitCode, Finding, Severity, exit_code_for

CLUSTER_SCHEMA_VERSION = "ddpdoctor.cluster/1"

# Node states in the report.
REPORTED = "reported"  # joined and sent its facts and findings
MISSING = "missing"  # never joined within the join timeout
LOST = "lost"  # joined, then stopped responding before it reported
NO_DATA = "no-data"  # joined and finished, but its data could not be gathered


@dataclass(frozen=True)
class NodeIdentity:
    """What each rank publishes first, so rank 0 can name it even if it dies later."""

    rank: int
    hostname: str
    node_rank: Optional[int] = None
    local_rank: int = 0
    pid: int = 0
    launcher: str = ""

    @property
    def label(self) -> str:
        if self.node_rank is not None:
            return f"node {self.node_rank} ({self.hostname})"
        return f"rank {self.rank} ({self.hostname})"

    @property
    def key(self) -> str:
        """Unique per node: the node rank and host name together."""
        return f"{self.node_rank if self.node_rank is not None else 'r' + str(self.rank)}@{self.hostname}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node_rank": self.node_rank,
            "hostname": self.hostname,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "launcher": self.launcher,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeIdentity:
        node_rank = data.get("node_rank")
        return cls(
            rank=int(data.get("rank", -1)),
            hostname=str(data.get("hostname") or "unknown"),
            node_rank=int(node_rank) if node_rank is not None else None,
            local_rank=int(data.get("local_rank") or 0),
            pid=int(data.get("pid") or 0),
            launcher=str(data.get("launcher") or ""),
        )


def finding_from_dict(data: Mapping[str, Any]) -> Finding:
    """Rebuild a Finding sent by another node (Finding.to_dict's inverse); unknown severities are errors."""
    try:
        severity = Severity.parse(str(data.get("severity", "error")))
    except KeyError:
        severity = Severity.ERROR
    return Finding(
        id=str(data.get("id", "")),
        severity=severity,
        title=str(data.get("title", "")),
        summary=str(data.get("summary", "")),
        fix=str(data.get("fix") or ""),  # null in --json output
        evidence=tuple(
            Evidence(str(e.get("source", "")), str(e.get("excerpt", "")))
            for e in data.get("evidence") or []
            if isinstance(e, Mapping)
        ),
        area=str(data.get("area", "")),
        data=dict(data.get("data") or {}),
    )


@dataclass
class NodeResult:
    """One node in the cluster report. `identity` is None only for a node that never joined."""

    label: str
    status: str
    identity: Optional[NodeIdentity] = None
    facts: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    duration_s: float = 0.0
    detail: str = ""  # why a node has no data
    # A host from SLURM_JOB_NODELIST/--hosts that no rank came from (no rank was waited for).
    expected_only: bool = False

    @property
    def reported(self) -> bool:
        return self.status == REPORTED

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "status": self.status,
            "identity": self.identity.to_dict() if self.identity else None,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
            "facts": dict(self.facts),
            "worst": max((f.severity for f in self.findings), default=Severity.OK).label,
            "findings": [f.to_json() for f in self.findings],
        }


@dataclass
class ClusterReport:
    launcher: str
    world_size: int
    nodes: list[NodeResult]
    findings: list[Finding]  # cross-node findings, computed on rank 0
    duration_s: float = 0.0
    areas: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the pairwise matrix

    def all_findings(self) -> Iterable[Finding]:
        yield from self.findings
        for node in self.nodes:
            yield from node.findings

    def exit_code(self, strict: bool = False) -> ExitCode:
        return exit_code_for(self.all_findings(), strict)

    def to_dict(self, strict: bool = False) -> dict[str, Any]:
        from ddpdoctor import __version__

        counts: dict[str, int] = {s.label: 0 for s in Severity}
        for f in self.all_findings():
            counts[f.severity.label] += 1
        return {
            "schema": CLUSTER_SCHEMA_VERSION,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "launcher": self.launcher,
            "world_size": self.world_size,
            "duration_s": round(self.duration_s, 3),
            "areas": list(self.areas),
            "exit_code": int(self.exit_code(strict)),
            "counts": counts,
            "nodes": [n.to_dict() for n in self.nodes],
            "findings": [f.to_json() for f in self.findings],
            **self.extra,
        }
