"""Cross-node findings: pure functions over every node's key facts and local findings.

Nothing here talks to the network; the session gathers, these judge, render/cluster.py prints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Optional, Sequence

from ddpdoctor.cluster.facts import KEY_FACTS
from ddpdoctor.cluster.report import LOST, MISSING, NO_DATA, NodeResult
from ddpdoctor.core.model import CheckSpec, Evidence, Finding, Severity, define

# Longer lists of node labels are cut in summaries (the JSON data keeps every node).
MAX_LABELS = 8
UNKNOWN = "unknown"

CONSISTENT = define(
    "cluster.consistent",
    "Nodes agree",
    "Every node that reported has the same versions and hardware in the key facts compared here.",
)
NODE_MISSING = define(
    "cluster.node.missing",
    "Node never joined",
    "A node the job expects never joined within the join timeout: its task did not start (bad node, "
    "full disk, wrong image), or it cannot reach MASTER_ADDR:MASTER_PORT (firewall, wrong interface). "
    "A training job would hang at init_process_group waiting for it.",
    "Look at that node's task output (`sacct -j JOB --format=JobID,NodeList,State,ExitCode`, or the pod's "
    "events), check it can reach the master (`nc -vz MASTER_ADDR MASTER_PORT`) and drain it if it is bad.",
)
NODE_LOST = define(
    "cluster.node.lost",
    "Node stopped responding",
    "A node joined, then stopped sending its heartbeat before it reported: its process died (OOM killer, "
    "node failure) or its network went away. A training job would hang or fail in the first collective.",
    "Check that node's kernel log (`dmesg -T | tail`) and its task's exit status; run `ddpdoctor check` on "
    "it alone; drain it if it keeps failing.",
)
GATHER_FAILED = define(
    "cluster.gather.failed",
    "Gathering over gloo failed",
    "Every node joined through the TCP store, but the gloo process group (a TCP connection between every "
    "pair of ranks) could not exchange the reports: the store port is reachable but the ports gloo opens "
    "are not, or gloo picked an interface the other nodes cannot route to.",
    "Set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface the nodes share, and allow TCP "
    "between the nodes on all ports (gloo and NCCL use ephemeral ports).",
)
NODE_FAILED_CHECKS = define(
    "cluster.node.failed_checks",
    "Node failed local checks",
    "A node's own checks failed; a job including this node will likely fail or crawl.",
    "Read that node's findings below and fix them, or exclude the node (`sbatch --exclude=HOST`).",
)
NODE_INCONCLUSIVE = define(
    "cluster.node.inconclusive",
    "Node checks inconclusive",
    "Some of a node's probes could not run (timed out or crashed), so that node is only partly checked.",
    "Read that node's error findings below; a probe that hangs on one node only (nvidia-smi, a mount) is "
    "itself a sign of a sick node.",
)
ENV_MISMATCH = define(
    "cluster.env.mismatch",
    "Collective settings differ",
    "NCCL_*, GLOO_*, TORCH_NCCL_*, UCX_* or FI_* variables differ between nodes. NCCL needs the same "
    "transport choices on every rank: one node with NCCL_IB_DISABLE=1, another NCCL_SOCKET_IFNAME or "
    "NCCL_PROTO makes the job fail to connect, hang, or fall back to slow sockets.",
    "Set these variables in the job script (exported to every task) rather than in per-node shell profiles "
    "or images, and give every node the same values.",
)


@dataclass(frozen=True)
class Comparison:
    """A key fact that must agree across nodes: its finding id and how bad a disagreement is."""

    key: str
    spec: CheckSpec
    severity: Severity
    outlier: bool = False  # a count or rate: name the node that differs from the majority


def _mismatch(key: str, label: str, why: str, fix: str) -> CheckSpec:
    return define(f"cluster.mismatch.{key}", f"{label} differs between nodes", why, fix)


COMPARISONS: tuple[Comparison, ...] = (
    Comparison(
        "torch",
        _mismatch(
            "torch",
            "torch version",
            "Ranks running different torch versions may disagree on collective and pickling protocols; "
            "the usual result is a hang or an error in the first collective.",
            "Use one container image or one environment for every node.",
        ),
        Severity.FAIL,
    ),
    Comparison(
        "nccl",
        _mismatch(
            "nccl",
            "NCCL version",
            "NCCL versions must match on all ranks of a communicator; a mismatch can hang at "
            "communicator init or corrupt results.",
            "Use one container image for every node; check that no node picks up another libnccl "
            "through LD_LIBRARY_PATH or NCCL_* plugins.",
        ),
        Severity.FAIL,
    ),
    Comparison(
        "cuda_build",
        _mismatch(
            "cuda_build",
            "CUDA build",
            "Nodes run torch builds for different CUDA versions: different environments were installed.",
            "Use one container image or one environment for every node.",
        ),
        Severity.WARN,
    ),
    Comparison(
        "driver",
        _mismatch(
            "driver",
            "NVIDIA driver",
            "Nodes run different NVIDIA drivers: some were not updated with the rest of the fleet. "
            "Older drivers may lack fixes or not support the job's CUDA version.",
            "Update the lagging nodes to the fleet's driver, or drain them.",
        ),
        Severity.WARN,
    ),
    Comparison(
        "gpu_model",
        _mismatch(
            "gpu_model",
            "GPU model",
            "Nodes have different GPU models; a synchronous job runs at the pace of the slowest one.",
            "Constrain the job to one GPU type (`sbatch --constraint=`, a Kubernetes nodeSelector).",
        ),
        Severity.WARN,
    ),
    Comparison(
        "gpu_count",
        define(
            "cluster.outlier.gpu_count",
            "Node with a different GPU count",
            "A node sees fewer (or more) GPUs than most nodes: a GPU fell off the bus (Xid 79), is "
            "hidden by CUDA_VISIBLE_DEVICES or by the scheduler's cgroup. With --nproc-per-node fixed, "
            "the job fails on that node.",
            "Run `nvidia-smi` and `dmesg | grep -i xid` on that node; drain it until a lost GPU is "
            "recovered (a reboot or a GPU reset).",
        ),
        Severity.FAIL,
        outlier=True,
    ),
    Comparison(
        "hca_model",
        _mismatch(
            "hca_model",
            "HCA model",
            "Nodes have different InfiniBand/RoCE adapters; the job runs at the pace of the slowest.",
            "Constrain the job to nodes with the same fabric hardware.",
        ),
        Severity.WARN,
    ),
    Comparison(
        "hca_firmware",
        _mismatch(
            "hca_firmware",
            "HCA firmware",
            "Adapters run different firmware: some nodes missed a fleet update (known bugs, link issues).",
            "Update the firmware on the lagging nodes (`mlxfwmanager`), or drain them.",
        ),
        Severity.WARN,
    ),
    Comparison(
        "ib_rate",
        define(
            "cluster.outlier.ib_rate",
            "Node with a different IB link rate",
            "A node's active InfiniBand ports run at another rate than most nodes (e.g. 100 instead of "
            "200 Gb/s): a bad cable or transceiver renegotiated a lower speed. Every collective "
            "crossing that node runs at its rate.",
            "Check `ibstat` on that node and reseat or replace the cable/transceiver of the slow port.",
        ),
        Severity.WARN,
        outlier=True,
    ),
    Comparison(
        "ib_ports_active",
        define(
            "cluster.outlier.ib_ports",
            "Node with a different number of active IB ports",
            "A node has fewer active InfiniBand ports than most nodes: a port is Down or Polling, so "
            "NCCL uses fewer rails there and that node slows every collective.",
            "Run `ibstat` on that node and fix the port that is not Active (cable, switch port, "
            "subnet manager).",
        ),
        Severity.WARN,
        outlier=True,
    ),
    Comparison(
        "ofed",
        _mismatch(
            "ofed",
            "OFED version",
            "Nodes run different OFED stacks: some missed a fleet update.",
            "Install the fleet's OFED version on the lagging nodes.",
        ),
        Severity.WARN,
    ),
    Comparison(
        "kernel",
        _mismatch(
            "kernel",
            "Kernel",
            "Nodes run different kernels: some were not rebooted into the fleet's image.",
            "Reboot or reimage the lagging nodes.",
        ),
        Severity.WARN,
    ),
    Comparison(
        "python",
        _mismatch(
            "python",
            "Python version",
            "Nodes run different Python versions: different environments were installed, and objects "
            "pickled by one rank may not load on another.",
            "Use one container image or one environment for every node.",
        ),
        Severity.WARN,
    ),
)


def strict_majority(values: Iterable[Hashable]) -> Optional[Hashable]:
    """The value held by more than half of the entries, or None when no value has a majority."""
    counts = Counter(values)
    total = sum(counts.values())
    if not total:
        return None
    value, count = counts.most_common(1)[0]
    return value if count * 2 > total else None


def find_outliers(values: Mapping[str, Hashable]) -> tuple[Optional[Hashable], list[str]]:
    """(majority value, the keys whose value differs from it); ([], None) when nothing differs.

    Without a strict majority every key is returned: there is no baseline to single one out.
    """
    if len(set(values.values())) <= 1:
        return (next(iter(values.values())) if values else None), []
    majority = strict_majority(values.values())
    if majority is None:
        return None, sorted(values)
    return majority, sorted(k for k, v in values.items() if v != majority)


def list_labels(labels: Sequence[str]) -> str:
    shown = list(labels[:MAX_LABELS])
    if len(labels) > MAX_LABELS:
        shown.append(f"and {len(labels) - MAX_LABELS} more")
    return ", ".join(shown)


def _value_text(value: Any) -> str:
    return UNKNOWN if value is None else str(value)


def compare_fact(comparison: Comparison, nodes: Sequence[NodeResult]) -> list[Finding]:
    """A finding when the nodes that reported disagree on one key fact. All unknown: not applicable."""
    reported = [n for n in nodes if n.reported]
    raw = {n.label: n.facts.get(comparison.key) for n in reported}
    if all(v is None for v in raw.values()):
        return []
    values = {label: _value_text(v) for label, v in raw.items()}
    majority, outliers = find_outliers(values)
    if not outliers:
        return []
    groups: dict[str, list[str]] = {}
    for label, value in values.items():
        groups.setdefault(value, []).append(label)
    name = comparison.spec.title.replace(" differs between nodes", "")
    if majority is not None:
        parts = [
            f"{list_labels(sorted(labels))} {'has' if len(labels) == 1 else 'have'} {value}"
            for value, labels in sorted(groups.items())
            if value != majority
        ]
        summary = (
            f"{name}: {'; '.join(parts)} where {len(groups[majority])} of {len(values)} nodes have {majority}"
        )
    else:
        parts = [
            f"{value} on {list_labels(sorted(labels))}"
            for value, labels in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        ]
        summary = f"{name} differs with no majority: {'; '.join(parts)}"
    return [
        comparison.spec.finding(
            comparison.severity,
            summary,
            evidence=[
                Evidence(
                    f"key fact '{comparison.key}' of every node",
                    "\n".join(f"{k}: {v}" for k, v in values.items()),
                )
            ],
            data={"key": comparison.key, "majority": majority, "outliers": outliers, "values": values},
        )
    ]


def compare_env(nodes: Sequence[NodeResult]) -> list[Finding]:
    """One finding listing every collective-related variable whose value differs (unset counts)."""
    reported = [n for n in nodes if n.reported]
    if len(reported) < 2:
        return []
    envs = {n.label: dict(n.facts.get("env") or {}) for n in reported}
    names = sorted({k for env in envs.values() for k in env})
    differing: dict[str, dict[str, str]] = {}
    for name in names:
        values = {label: env.get(name, "<unset>") for label, env in envs.items()}
        if len(set(values.values())) > 1:
            differing[name] = values
    if not differing:
        return []
    parts = []
    for name, values in differing.items():
        majority, outliers = find_outliers(values)
        if majority is not None:
            parts.append(
                f"{name} on {list_labels(outliers)} ({', '.join(sorted({values[o] for o in outliers}))}; "
                f"most nodes: {majority})"
            )
        else:
            parts.append(f"{name} ({'; '.join(f'{k}={v}' for k, v in sorted(values.items()))})")
    return [
        ENV_MISMATCH.finding(
            Severity.WARN,
            "Differs: " + "; ".join(parts),
            evidence=[
                Evidence(
                    "os.environ of every node (NCCL_*, GLOO_*, TORCH_NCCL_*, UCX_*, FI_*)",
                    "\n".join(f"{n}: {v}" for n, v in differing.items()),
                )
            ],
            data={"variables": differing},
        )
    ]


def judge_node_health(nodes: Sequence[NodeResult]) -> list[Finding]:
    """A cross-node finding per node whose local checks failed or could not run."""
    out: list[Finding] = []
    for node in nodes:
        if not node.reported:
            continue
        failed = sorted({f.id for f in node.findings if f.severity == Severity.FAIL})
        errors = sorted({f.id for f in node.findings if f.severity == Severity.ERROR})
        if failed:
            spec, sev, key, ids = NODE_FAILED_CHECKS, Severity.FAIL, "failed", failed
            text = f"{node.label} failed {len(failed)} local check(s): {', '.join(failed)}"
        elif errors:
            spec, sev, key, ids = NODE_INCONCLUSIVE, Severity.ERROR, "errors", errors
            text = f"{node.label}: {len(errors)} probe(s) could not run: {', '.join(errors)}"
        else:
            continue
        ev = [Evidence(f"ddpdoctor check on {node.label}", "\n".join(ids))]
        out.append(spec.finding(sev, text, evidence=ev, data={"node": node.label, key: ids}))
    return out


def _membership_problem(node: NodeResult, join_timeout_s: float) -> Optional[tuple[CheckSpec, Severity, str]]:
    """What is wrong with a node that did not report (spec, severity, summary), or None when it did."""
    detail = node.detail
    if node.status == MISSING:
        within = "" if node.expected_only else f" within {join_timeout_s:g}s"
        return (
            NODE_MISSING,
            Severity.FAIL,
            f"{node.label} never joined{within}" + (f" ({detail})" if detail else ""),
        )
    if node.status == LOST:
        text = f"{node.label} joined, then stopped responding before it reported" + (
            f": {detail}" if detail else ""
        )
        return NODE_LOST, Severity.FAIL, text
    if node.status == NO_DATA:
        text = f"{node.label} joined and ran its checks, but its report could not be gathered: {detail}"
        return GATHER_FAILED, Severity.ERROR, text
    return None


def judge_membership(nodes: Sequence[NodeResult], join_timeout_s: float) -> list[Finding]:
    """Name every node that never joined, vanished, or whose data could not be gathered."""
    out: list[Finding] = []
    for node in nodes:
        problem = _membership_problem(node, join_timeout_s)
        if problem is None:
            continue
        spec, severity, summary = problem
        data = {"node": node.label, "status": node.status, "detail": node.detail}
        if node.identity is not None:
            data["identity"] = node.identity.to_dict()
        evidence = [Evidence("TCPStore keys ddpdoctor/*/identity, heartbeat, ready", node.detail)]
        out.append(spec.finding(severity, summary, evidence=evidence, data=data))
    return out


def judge_cluster(nodes: Sequence[NodeResult], join_timeout_s: float) -> list[Finding]:
    """Every cross-node finding, worst first within the order: membership, health, facts, environment."""
    findings = judge_membership(nodes, join_timeout_s)
    findings += judge_node_health(nodes)
    facts_findings: list[Finding] = []
    for comparison in COMPARISONS:
        facts_findings += compare_fact(comparison, nodes)
    findings += facts_findings
    findings += compare_env(nodes)
    reported = [n for n in nodes if n.reported]
    if reported and not facts_findings:
        known = [
            f"{kf.label} {reported[0].facts.get(kf.key)}"
            for kf in KEY_FACTS
            if reported[0].facts.get(kf.key) is not None
        ]
        findings.append(
            CONSISTENT.finding(
                Severity.OK,
                f"{len(reported)} node(s) agree: {', '.join(known) or 'no key facts known'}",
                evidence=[Evidence("key facts of every node")],
                data={"nodes": len(reported)},
            )
        )
    return findings
