"""`ddpdoctor hang --cluster` on every task of a small diagnostic job (one task per node): each node
gathers and judges its own hang facts (probe_io), sends its report through the launcher's store, and
rank 0 merges them (merge.py). Reuses check --cluster's session: joining, heartbeats, the bounded gather
and missing nodes named within --join-timeout."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.cluster.report import NO_DATA, REPORTED, NodeIdentity
from ddpdoctor.cluster.session import ClusterOptions, ClusterOutcome, Gathered, run_cluster_session
from ddpdoctor.hang.merge import HangClusterReport, merge_hang_reports

# Bound on one node's own analysis (process discovery, RAS and the py-spy runs in parallel, each
# bounded by --timeout, then the dumps): rank 0 names the node lost past this plus the session's slack.
LOCAL_SLACK_S = 15.0


@dataclass
class HangLocalOptions:
    pid: Optional[int]
    fr: Optional[str]
    ras_addr: Optional[str]
    use_ras: bool
    use_stacks: bool
    use_fr: bool
    timeout_s: float
    samples: int = 2
    interval_s: float = 1.0


def run_node(local: HangLocalOptions, identity: NodeIdentity) -> dict[str, Any]:
    """This node's hang report (ddpdoctor.hang/1), redacted, as the payload sent to rank 0."""
    from ddpdoctor.edge.sources import redact_data
    from ddpdoctor.hang.probe_io import gather_facts
    from ddpdoctor.hang.verdict import judge_hang

    try:
        facts = gather_facts(
            local.pid, local.fr, local.ras_addr, use_ras=local.use_ras, use_stacks=local.use_stacks,
            timeout_s=local.timeout_s, use_fr=local.use_fr, samples=local.samples, interval_s=local.interval_s,
        )
        report: Optional[dict[str, Any]] = judge_hang(facts).to_dict()
        error = ""
    except Exception as exc:  # noqa: BLE001 - one node's failure is reported by rank 0, never a traceback
        report, error = None, f"the hang analysis failed on this node: {type(exc).__name__}: {exc}"
    return redact_data({"identity": identity.to_dict(), "report": report, "error": error})


def conclude_hang(gathered: Gathered, opts: ClusterOptions) -> tuple[HangClusterReport, int]:
    """Rank 0: the node results of the session, each reported node's hang report, merged."""
    nodes = gathered.nodes(opts)
    reports: dict[str, dict[str, Any]] = {}
    for node in nodes:
        if node.status != REPORTED or node.identity is None:
            continue
        payload = gathered.payloads.get(node.identity.rank)
        report = payload.get("report") if isinstance(payload, dict) else None
        if isinstance(report, dict):
            reports[node.label] = report
        else:
            node.status = NO_DATA
            node.detail = (payload.get("error") if isinstance(payload, dict) else "") or "it sent no hang report"
    report = merge_hang_reports(
        nodes,
        reports,
        opts.join_timeout_s,
        launcher=gathered.info.launcher,
        nodes_expected=gathered.info.world_size,
        gather_findings=gathered.findings,
        duration_s=time.monotonic() - gathered.start,
    )
    return report, report.exit_code()


def run_hang_cluster(local: HangLocalOptions, join_timeout_s: float, expected_hosts: tuple[str, ...] = ()) -> ClusterOutcome:
    """Run on every task; rank 0's outcome carries the merged report. Raises ClusterUsageError."""
    opts = ClusterOptions(
        areas=[],
        check_timeout_s=2 * local.timeout_s + LOCAL_SLACK_S,
        join_timeout_s=join_timeout_s,
        expected_hosts=expected_hosts,
    )
    return run_cluster_session(
        opts,
        lambda identity: run_node(local, identity),
        lambda gathered: conclude_hang(gathered, opts),
        command="hang --cluster",
    )
