"""`ddpdoctor hang --cluster`: merge the per-node hang reports into one verdict for the whole job. Pure.

Each node ran `ddpdoctor hang` on its own ranks (stacks, its Flight Recorder dumps, NCCL RAS) and sent
its `ddpdoctor.hang/1` report; the node that did not answer is a cluster.node.* finding. The merge sees
what no single node sees: a rank whose stack differs from every rank on the other nodes, a rank whose
last Flight Recorder sequence number is behind ranks dumped on other nodes, and where (node, host, pid)
the rank that a node's dumps or RAS named actually runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ddpdoctor.cluster.judge import judge_membership
from ddpdoctor.cluster.report import REPORTED, NodeResult
from ddpdoctor.core.model import Evidence, Finding, Severity, define, exit_code_for
from ddpdoctor.hang.findings import format_ranks, plural_ranks, ranks_verb

HANG_CLUSTER_SCHEMA_VERSION = "ddpdoctor.hang.cluster/1"

CLUSTER_VERDICT = define(
    "hang.cluster.verdict",
    "Why the job hangs, across its nodes",
    "`ddpdoctor hang --cluster` runs the hang analysis on every node of the job (one task per node) and "
    "merges the reports on rank 0: the rank that is behind or out of step on whichever node it runs, with "
    "its host and pid, what the ranks of the other nodes wait in, and the nodes that did not answer. "
    "Its kind (`data.kind`) is one of `ddpdoctor hang`'s, plus `unanswered` (no culprit among the nodes "
    "that answered while some did not: the cause is likely there).",
    "Fix the code path of the named rank on the named node; if nodes did not answer, run `ddpdoctor hang` "
    "on them (or find out why their task did not start).",
)

# Local verdict kinds that name a culprit rank.
CULPRIT_KINDS = ("stopped", "behind", "desync", "only_some", "extra", "stack_outlier", "missing", "spinning", "exited")
# `file:line in func()` at the start of a stack description (describe_stack); linear, anchored.
_WHERE = re.compile(r"^(?P<file>[^\s:][^:]{0,1000}):(?P<line>\d{1,9}) in ")


@dataclass
class RankSeen:
    """One rank as the node that runs it saw it."""

    rank: int
    node: str
    host: str
    pid: Optional[int]
    where: Optional[str] = None
    waiting_in: Optional[str] = None


@dataclass
class HangClusterReport:
    launcher: str
    nodes_expected: int
    verdict: dict[str, Any]
    findings: list[Finding]
    nodes: list[dict[str, Any]]
    job: dict[str, Any]
    stack_groups: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0

    def exit_code(self) -> int:
        return int(exit_code_for(self.findings))

    def to_dict(self) -> dict[str, Any]:
        from ddpdoctor import __version__

        return {
            "schema": HANG_CLUSTER_SCHEMA_VERSION,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "launcher": self.launcher,
            "nodes_expected": self.nodes_expected,
            "duration_s": round(self.duration_s, 3),
            "exit_code": self.exit_code(),
            "verdict": self.verdict,
            "job": self.job,
            "nodes": self.nodes,
            "stack_groups": self.stack_groups,
            "findings": [f.to_json() for f in self.findings],
        }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int_or_none(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def clean_report(report: Any) -> dict[str, Any]:
    """A node's report with the containers the merge reads coerced to their documented types: a node
    sends JSON that this process did not produce, so a wrong type is left out, never a crash."""
    if not isinstance(report, Mapping):
        return {}
    out = dict(report)
    for key in ("job", "verdict", "flight_recorder"):
        out[key] = report.get(key) if isinstance(report.get(key), Mapping) else {}
    for key in ("stacks", "findings"):
        value = report.get(key)
        out[key] = [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []
    out["host"] = report.get("host") if isinstance(report.get("host"), str) else ""
    return out


def collect_ranks(reported: Sequence[tuple[NodeResult, Mapping[str, Any]]]) -> dict[int, RankSeen]:
    """Every rank some node runs, keyed by global rank: its node, host, pid and stack."""
    seen: dict[int, RankSeen] = {}
    for node, report in reported:
        host = str(report.get("host") or (node.identity.hostname if node.identity else ""))
        job = report.get("job") or {}
        entries = job.get("ranks") if isinstance(job.get("ranks"), list) else []
        for entry in entries:
            rank = _int_or_none(entry.get("rank")) if isinstance(entry, Mapping) else None
            if rank is not None and rank not in seen:
                seen[rank] = RankSeen(rank, node.label, host, _int_or_none(entry.get("pid")))
        for stack in report["stacks"]:
            rank = _int_or_none(stack.get("rank"))
            if rank is None:
                continue
            record = seen.setdefault(rank, RankSeen(rank, node.label, host, _int_or_none(stack.get("pid"))))
            if record.node == node.label:
                record.where = stack.get("where") if isinstance(stack.get("where"), str) else None
                record.waiting_in = stack.get("waiting_in") if isinstance(stack.get("waiting_in"), str) else None
    return seen


def merge_stack_groups(seen: Mapping[int, RankSeen]) -> list[dict[str, Any]]:
    """Ranks of every node with the same stack (where, waiting_in), largest group first."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for rank in sorted(seen):
        record = seen[rank]
        if record.where is None:
            continue
        key = (record.where, record.waiting_in or "")
        group = groups.setdefault(
            key, {"ranks": [], "where": record.where, "waiting_in": record.waiting_in, "nodes": []}
        )
        group["ranks"].append(rank)
        if record.node not in group["nodes"]:
            group["nodes"].append(record.node)
    return sorted(groups.values(), key=lambda g: (-len(g["ranks"]), g["ranks"]))


def _odd_groups(groups: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The groups that are not the largest (stacks.odd_ones_out on merged groups): on a tie, the ones
    not waiting in a collective, since ranks waiting in a collective are the victims."""
    if len(groups) < 2:
        return []
    if len(groups[0]["ranks"]) == len(groups[1]["ranks"]):
        idle = [g for g in groups if not g["waiting_in"]]
        return idle if 0 < len(idle) < len(groups) else []
    return list(groups[1:])


def fr_behind(reported: Sequence[tuple[NodeResult, Mapping[str, Any]]]) -> Optional[tuple[str, list[int], list[int], int, int]]:
    """(process group, ranks behind, ranks ahead, their seq, the others' seq) from the last enqueued
    Flight Recorder sequence numbers of every node's dumps together, or None when all agree.

    A node's own alignment only sees the dumps it could read; across nodes a rank whose last enqueued
    collective is behind the others' never reached the collective they wait in (with two ranks too: the
    one ahead cannot have completed a collective without it)."""
    by_pg: dict[str, dict[int, int]] = {}
    for _, report in reported:
        last = report["flight_recorder"].get("last_enqueued")
        for pg, ranks in (last.items() if isinstance(last, Mapping) else ()):
            if not isinstance(ranks, Mapping):
                continue
            for rank_text, seq in ranks.items():
                if _int_or_none(seq) is not None and str(rank_text).isdigit():
                    current = by_pg.setdefault(str(pg), {})
                    current[int(rank_text)] = max(seq, current.get(int(rank_text), seq))
    for pg in sorted(by_pg):
        seqs = by_pg[pg]
        top = max(seqs.values())
        ahead = sorted(r for r, s in seqs.items() if s == top)
        behind = sorted(r for r, s in seqs.items() if s < top)
        if behind:
            return pg, behind, ahead, min(seqs[r] for r in behind), top
    return None


def _culprit(rank: int, seen: Mapping[int, RankSeen], local: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The culprit record of the merged verdict: where the rank runs, from the node that runs it."""
    record = seen.get(rank)
    where = record.where if record else None
    match = _WHERE.match(where) if where else None
    out = {
        "rank": rank,
        "node": record.node if record else None,
        "host": record.host if record else None,
        "pid": record.pid if record else None,
        "where": where,
        "file": match.group("file") if match else None,
        "line": int(match.group("line")) if match else None,
    }
    if local:
        # What the naming node knew (RAS knows the host and pid of every rank of the job).
        for key in ("host", "pid", "where", "file", "line"):
            if out[key] is None and local.get(key) is not None:
                out[key] = local[key]
    return out


def _at(where: Optional[str], waiting: Optional[str]) -> str:
    """A stack's place without the ` (in all_reduce)` its description ends with, when the sentence
    already says what it waits in."""
    text = where or "?"
    suffix = f" (in {waiting})"
    return text[: -len(suffix)] if waiting and text.endswith(suffix) else text


def who(rank: int, seen: Mapping[int, RankSeen]) -> str:
    record = seen.get(rank)
    if record is None:
        return f"rank {rank} (on no node that answered)"
    pid = f"pid {record.pid} " if record.pid else ""
    return f"rank {rank} ({pid}on {record.host}, {record.node})"


def _verdict(kind: str, summary: str, culprits: list[dict[str, Any]], others: list[int], fix: str,
             source: Optional[str], node: Optional[str]) -> dict[str, Any]:
    return {
        "kind": kind,
        "summary": summary,
        "culprit_ranks": [c["rank"] for c in culprits if c["rank"] is not None],
        "other_ranks": others,
        "culprits": culprits,
        "fix": fix,
        "source": source,
        "node": node,
    }


def _from_node(node: NodeResult, local: Mapping[str, Any], seen: Mapping[int, RankSeen]) -> dict[str, Any]:
    """A node's own culprit verdict, with each culprit placed on the node that runs it."""
    records = {c.get("rank"): c for c in _list(local.get("culprits")) if isinstance(c, Mapping)}
    culprits = [_culprit(r, seen, records.get(r)) for r in _list(local.get("culprit_ranks")) if _int_or_none(r) is not None]
    summary = str(local.get("summary") or "")
    elsewhere = [c for c in culprits if c["node"] and c["node"] != node.label]
    if elsewhere:
        summary += "; " + ", ".join(f"rank {c['rank']} runs on {c['node']}" + (f" as pid {c['pid']}" if c["pid"] else "")
                                   for c in elsewhere)
    return _verdict(
        str(local.get("kind")), f"{node.label}: {summary}", culprits,
        [r for r in _list(local.get("other_ranks")) if _int_or_none(r) is not None],
        str(local.get("fix") or ""), local.get("source") if local.get("source") in ("flight_recorder", "stacks", "ras") else None,
        node.label,
    )


def judge_across_nodes(reported: Sequence[tuple[NodeResult, Mapping[str, Any]]], seen: Mapping[int, RankSeen],
                       groups: Sequence[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The culprit across nodes, root cause first: a stopped rank, Flight Recorder (the node whose dumps
    cover the most ranks, then the sequence numbers of all nodes' dumps together), the stacks of every
    node together, NCCL RAS, then any node's own culprit. None when no node names one."""
    verdicts = [(node, report["verdict"]) for node, report in reported]
    for node, local in verdicts:
        if local.get("kind") == "stopped":
            return _from_node(node, local, seen)
    fr_nodes = [(node, local, report) for (node, local), (_, report) in zip(verdicts, reported)
                if local.get("source") == "flight_recorder" and local.get("kind") in CULPRIT_KINDS]
    if fr_nodes:
        node, local, _ = max(fr_nodes, key=lambda t: len(_list(t[2]["flight_recorder"].get("ranks"))))
        return _from_node(node, local, seen)
    behind = fr_behind(reported)
    if behind is not None:
        pg, late, ahead, late_seq, top = behind
        culprits = [_culprit(r, seen) for r in late]
        lead = late[0]
        where = f": its stack is in {seen[lead].where}" if lead in seen and seen[lead].where else ""
        places = {(seen[r].waiting_in, seen[r].where) for r in ahead if r in seen}
        waiting, at = next(iter(places)) if len(places) == 1 else (None, None)
        others = (f"{ranks_verb(ahead, 'waits', 'wait')} in {waiting} #{top} at {_at(at, waiting)}" if waiting
                  else f"{ranks_verb(ahead, 'has', 'have')} issued #{top}")
        summary = (
            f"{who(lead, seen) if len(late) == 1 else plural_ranks(late)} {'is' if len(late) == 1 else 'are'} "
            f"behind{where}; its last collective in process group {pg} was #{late_seq} while {others} "
            f"(Flight Recorder dumps of every node) -> the cause is on {plural_ranks(late)}, not the network"
        )
        fix = (f"Look at what {plural_ranks(late)} does instead of reaching collective #{top} (a slow or blocked "
               "step, I/O, a dataloader, a host-device sync like .item()).")
        return _verdict("behind", summary, culprits, ahead, fix, "flight_recorder", culprits[0]["node"])
    odd = _odd_groups(groups)
    if odd:
        late = sorted(r for g in odd for r in g["ranks"])
        main = next(g for g in groups if g not in odd)
        lead = late[0]
        culprits = [_culprit(r, seen) for r in late]
        main_nodes = ", ".join(main["nodes"])
        if seen[lead].waiting_in and main["waiting_in"]:
            summary = (
                f"{who(lead, seen)} waits in {seen[lead].waiting_in} at {_at(seen[lead].where, seen[lead].waiting_in)}, "
                f"while {ranks_verb(main['ranks'], 'waits', 'wait')} in {main['waiting_in']} at "
                f"{_at(main['where'], main['waiting_in'])} "
                f"({main_nodes}): the ranks are in different collectives (out of step) -> the cause is the "
                f"code path of {plural_ranks(late)}, not the network"
            )
            fix = ("Make every rank issue the same collectives in the same order: look for an if on the rank "
                   "(or on data that differs between ranks) around those lines.")
        else:
            others = (f"{ranks_verb(main['ranks'], 'waits', 'wait')} in {main['waiting_in']} at "
                      f"{_at(main['where'], main['waiting_in'])}"
                      if main["waiting_in"] else f"{ranks_verb(main['ranks'], 'is', 'are')} in {main['where']}")
            summary = (
                f"{who(lead, seen) if len(late) == 1 else plural_ranks(late)} is not where the ranks of the "
                f"other nodes are: its stack is in {seen[lead].where}, while {others} ({main_nodes}) "
                f"-> the cause is on {plural_ranks(late)}" + (", not the network" if main["waiting_in"] else "")
            )
            fix = "Look at what the named rank does at that line instead of joining the collective."
        return _verdict("stack_outlier", summary, culprits, list(main["ranks"]), fix, "stacks", culprits[0]["node"])
    for kind_source in ("ras", None):
        for node, local in verdicts:
            if local.get("kind") in CULPRIT_KINDS and (kind_source is None or local.get("source") == kind_source):
                return _from_node(node, local, seen)
    return None


def _job_dict(reported: Sequence[tuple[NodeResult, Mapping[str, Any]]], seen: Mapping[int, RankSeen]) -> dict[str, Any]:
    sizes = [_int_or_none(report["job"].get("world_size")) for _, report in reported]
    world = max((s for s in sizes if s), default=None)
    unseen = sorted(set(range(world)) - set(seen)) if world else []
    return {"world_size": world, "ranks_seen": sorted(seen), "ranks_unseen": unseen}


def _node_dict(node: NodeResult, report: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    local = clean_report(report)["verdict"] if report is not None else {}
    return {
        "label": node.label,
        "status": node.status,
        "detail": node.detail,
        "identity": node.identity.to_dict() if node.identity else None,
        "host": (report or {}).get("host") or (node.identity.hostname if node.identity else None),
        "verdict_kind": local.get("kind") if isinstance(local.get("kind"), str) else None,
        "summary": local.get("summary") if isinstance(local.get("summary"), str) else None,
        "exit_code": _int_or_none((report or {}).get("exit_code")),
        "report": dict(report) if report is not None else None,
    }


def merge_hang_reports(
    nodes: Sequence[NodeResult],
    reports: Mapping[str, Mapping[str, Any]],
    join_timeout_s: float,
    launcher: str = "",
    nodes_expected: int = 0,
    gather_findings: Sequence[Finding] = (),
    duration_s: float = 0.0,
) -> HangClusterReport:
    """Per-node hang reports (by node label; nodes that did not report have none) -> one verdict.

    `nodes` are the diagnostic job's node results (status reported, missing, lost or no-data); the
    membership findings name every node that did not answer, by host where known."""
    reported = [(n, clean_report(reports[n.label])) for n in nodes if n.status == REPORTED and n.label in reports]
    absent = [n for n in nodes if not (n.status == REPORTED and n.label in reports)]
    seen = collect_ranks(reported)
    groups = merge_stack_groups(seen)
    job = _job_dict(reported, seen)
    progressing = [(n, r) for n, r in reported if r["verdict"].get("kind") == "progressing"]
    stopped = any(r["verdict"].get("kind") == "stopped" for _, r in reported)
    # A node whose ranks finished collectives between its snapshots proves the job's collectives complete:
    # the job progresses, whatever one snapshot of the other nodes looks like (a stopped rank still wins).
    verdict = None if progressing and not stopped else judge_across_nodes(reported, seen, groups)
    absent_text = ", ".join(n.label for n in absent)
    if verdict is None and progressing and not stopped:
        node, local = progressing[0]
        verdict = _verdict("progressing", f"progressing, not hung: on {node.label}, {local['verdict'].get('summary', '')}",
                           [], list(job["ranks_seen"]), str(local["verdict"].get("fix") or ""), "progress", None)
        severity = Severity.OK
    elif verdict is not None:
        severity = Severity.FAIL
        if absent:
            verdict["summary"] += f" (no answer from {absent_text})"
    else:
        verdict = _no_culprit(reported, groups, job, absent, absent_text)
        severity = {"unanswered": Severity.FAIL, "all_waiting": Severity.WARN, "none": Severity.OK}.get(
            verdict["kind"], Severity.ERROR)
        if verdict["kind"] == "none" and reported and all(
            (r["findings"] or [{}])[0].get("severity") == "error" for _, r in reported
        ):
            severity = Severity.ERROR
            verdict["summary"] = "inconclusive: no node could read its ranks (" + "; ".join(
                f"{n.label}: {r['verdict'].get('summary', '')}" for n, r in reported) + ")"
        if not reported:
            severity = Severity.ERROR
    evidence = [Evidence(f"ddpdoctor hang on {n.label}", str(r["verdict"].get("summary", ""))[:500])
                for n, r in reported]
    findings = [
        CLUSTER_VERDICT.finding(
            severity, verdict["summary"], evidence=evidence[:16], fix=verdict["fix"] or None,
            data={k: v for k, v in verdict.items() if k not in ("summary", "fix")},
        ),
        *gather_findings,
        *judge_membership(nodes, join_timeout_s),
    ]
    return HangClusterReport(
        launcher=launcher,
        nodes_expected=nodes_expected or len(nodes),
        verdict=verdict,
        findings=findings,
        nodes=[_node_dict(n, reports.get(n.label) if n.status == REPORTED else None) for n in nodes],
        job=job,
        stack_groups=groups,
        duration_s=duration_s,
    )


def _no_culprit(reported: Sequence[tuple[NodeResult, Mapping[str, Any]]], groups: Sequence[Mapping[str, Any]],
                job: Mapping[str, Any], absent: Sequence[NodeResult], absent_text: str) -> dict[str, Any]:
    unseen = job["ranks_unseen"]
    unseen_text = f"; ranks {format_ranks(unseen)} ran on no node that answered" if unseen else ""
    if absent:
        return _verdict(
            "unanswered",
            f"no rank on the {len(reported)} node(s) that answered is behind or out of step, and "
            f"{absent_text} did not answer{unseen_text} -> the cause is likely there",
            [], list(job["ranks_seen"]),
            "Run `ddpdoctor hang` on the nodes that did not answer, or find out why their task did not start "
            "(a dead or unreachable node also hangs the job).", None, None,
        )
    if len(groups) == 1 and groups[0]["waiting_in"]:
        group = groups[0]
        return _verdict(
            "all_waiting",
            f"every rank seen on the {len(reported)} node(s) ({plural_ranks(group['ranks'])}) waits in "
            f"{group['waiting_in']} at {_at(group['where'], group['waiting_in'])}{unseen_text}: no rank is behind; the collective itself "
            "does not complete (network, NCCL transport, or a peer that died)",
            [], list(group["ranks"]),
            "Run `ddpdoctor check --cluster` and `ddpdoctor bench-nccl --pairwise` on these nodes for a "
            "network fault; if some ranks were not seen, look at their nodes.", "stacks", None,
        )
    return _verdict("none", "no sign of a hang on any node: no rank is behind or out of step in what could be read"
                    + unseen_text, [], [], "", None, None)
