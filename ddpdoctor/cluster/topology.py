"""Which ranks share a node: intra-node groups (ranks on one host) and one leader per node.

Nodes are keyed by node rank and host name together, so agents that share a host (containers, tests)
still count as separate nodes. Pure functions, plus one helper that builds the torch groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ddpdoctor.cluster.report import NodeIdentity


@dataclass(frozen=True)
class Topology:
    """Ranks grouped per node, in node order (the node of rank 0 first)."""

    nodes: tuple[tuple[int, ...], ...]  # global ranks of each node, ascending
    labels: tuple[str, ...]  # one label per node ("node 1 (gpu-a17)")

    @property
    def leaders(self) -> list[int]:
        """One rank per node: the lowest global rank on it (rank 0 leads the first node)."""
        return [ranks[0] for ranks in self.nodes]

    @property
    def spans_nodes(self) -> bool:
        return len(self.nodes) > 1

    def node_of(self, rank: int) -> Optional[int]:
        for index, ranks in enumerate(self.nodes):
            if rank in ranks:
                return index
        return None


def group_by_node(identities: Sequence[Mapping[str, Any]]) -> Topology:
    """Identities (NodeIdentity dicts, any order, one per rank) -> ranks per node, ordered by lowest rank."""
    by_key: dict[str, list[int]] = {}
    labels: dict[str, str] = {}
    for raw in identities:
        ident = NodeIdentity.from_dict(raw)
        # Without a node rank from the launcher the host name alone identifies the node.
        key = ident.key if ident.node_rank is not None else f"host@{ident.hostname}"
        by_key.setdefault(key, []).append(ident.rank)
        if ident.node_rank is not None:
            labels.setdefault(key, f"node {ident.node_rank} ({ident.hostname})")
        else:
            labels.setdefault(key, ident.hostname)
    ordered = sorted(by_key.items(), key=lambda kv: min(kv[1]))
    return Topology(
        nodes=tuple(tuple(sorted(ranks)) for _, ranks in ordered),
        labels=tuple(labels[key] for key, _ in ordered),
    )


@dataclass
class ScopeGroups:
    """This rank's process groups for a multi-node benchmark."""

    intra: Any  # the ranks on this rank's node (None when the node has a single rank)
    inter: Any  # one rank per node (None on ranks that are not their node's leader)
    topology: Topology


def make_scope_groups(topology: Topology, rank: int, backend: Optional[str] = None) -> ScopeGroups:
    """Intra-node groups (one per node) and the inter-node group of leaders, as torch process groups.

    new_group is collective over the whole world: every rank must call this with the same topology.
    """
    import torch.distributed as dist

    intra = None
    for ranks in topology.nodes:
        group = dist.new_group(list(ranks), backend=backend) if len(ranks) > 1 else None
        if rank in ranks:
            intra = group
    leaders = topology.leaders
    inter_group = dist.new_group(leaders, backend=backend) if len(leaders) > 1 else None
    return ScopeGroups(intra=intra, inter=inter_group if rank in leaders else None, topology=topology)


INTRA_NODE = "intra-node"
INTER_NODE = "inter-node"
ALL_NODES = "all nodes"


class _ScopeReporter:
    """Passes a scoped run's progress on, naming the scope (in the watchdog's report and the progress
    bar) and tagging its rows."""

    def __init__(self, base: Any, scope: str, node: str) -> None:
        self.base, self.scope, self.node = base, scope, node

    def step(self, op: str, size: int) -> None:
        self.base.step(f"{self.scope} {op}", size)

    def row(self, row: dict[str, Any]) -> None:
        self.base.row({**row, "scope": self.scope, "node": self.node})

    def wait(self, label: str, timeout_s: float) -> None:
        self.base.wait(label, timeout_s)


def run_scoped_benchmark(
    plan: Any,
    device: Any,
    backend: str,
    reporter: Any = None,
    step_timeout_s: Optional[float] = None,
    fault: Any = None,
) -> list[dict[str, Any]]:
    """bench-nccl's plan run intra-node (each node's ranks, all nodes at once) and inter-node (one rank
    per node), on a world that is already initialized and spans nodes.

    Every rank must call it (group creation is collective). Returns, on every rank, the rows of every
    node's intra-node run and of the inter-node run, each row tagged with `scope` ("intra-node" or
    "inter-node") and `node` (the node's label, or "all nodes"); [] when the world is one node. A node
    with a single rank has no intra-node run; with one rank on every node the whole-world run already
    is the inter-node run, so it is not repeated.

    `reporter` (bench.worker.Reporter) hears every step, as in run_benchmark, so the caller's watchdog
    bounds each one by `step_timeout_s`; a rank with nothing to run in a phase waits for the others
    under `reporter.wait`, bounded by the whole phase (every step at most `step_timeout_s`).
    `fault` (test-only, bench.plan.FaultHook) fires where its op names the scope, e.g. op
    "inter-node all_reduce" on global rank 2.
    """
    import datetime
    import os

    import torch.distributed as dist

    from ddpdoctor.bench.worker import NullReporter, run_benchmark
    from ddpdoctor.cluster.collectives import all_gather_json
    from ddpdoctor.cluster.session import make_identity, require_launch

    reporter = reporter or NullReporter()
    rank = dist.get_rank()
    # Waiting for another node's whole phase is bounded by that phase, not by one step.
    phase_s = (plan.steps + 1) * step_timeout_s if step_timeout_s else None
    reporter.step("topology", 0)
    # Identities, rows and the waits between phases travel on a gloo group of their own (CPU tensors
    # when the benchmark runs on NCCL), whose timeout outlasts a phase so that the watchdog, with its
    # stack dump, fires first.
    ctrl_timeout = datetime.timedelta(seconds=(plan.steps + 2) * step_timeout_s) if step_timeout_s else None
    ctrl = dist.new_group(backend="gloo", timeout=ctrl_timeout)
    identities = all_gather_json(make_identity(require_launch(os.environ)).to_dict(), group=ctrl)
    topology = group_by_node([i for i in identities if isinstance(i, dict)])
    if not topology.spans_nodes or all(len(ranks) == 1 for ranks in topology.nodes):
        return []
    groups = make_scope_groups(topology, rank, backend=backend)
    mine: list[dict[str, Any]] = []
    node = topology.node_of(rank)
    if groups.intra is not None and node is not None:
        label = topology.labels[node]
        rows = run_benchmark(
            plan,
            device,
            _ScopeReporter(reporter, INTRA_NODE, label),
            group=groups.intra,
            fault=_scoped_fault(fault, INTRA_NODE, rank, groups.intra),
        )
        # Every rank of a group returns the same reduced row: the node's first rank reports it.
        if rank == topology.nodes[node][0]:
            mine += [{**r, "scope": INTRA_NODE, "node": label} for r in rows]
    _wait_for_peers(reporter, f"{INTRA_NODE}: waiting for the other nodes", phase_s, ctrl)
    if groups.inter is not None:
        rows = run_benchmark(
            plan,
            device,
            _ScopeReporter(reporter, INTER_NODE, ALL_NODES),
            group=groups.inter,
            fault=_scoped_fault(fault, INTER_NODE, rank, groups.inter),
        )
        if rank == topology.leaders[0]:
            mine += [{**r, "scope": INTER_NODE, "node": ALL_NODES} for r in rows]
    _wait_for_peers(reporter, f"{INTER_NODE}: waiting for the node leaders", phase_s, ctrl)
    reporter.step("gather scoped results", 0)
    gathered = all_gather_json(mine, group=ctrl)
    tagged = [row for part in gathered if isinstance(part, list) for row in part if isinstance(row, dict)]
    # Intra-node tables in node order, then the inter-node one (a stable sort keeps op and size order).
    order = {label: index for index, label in enumerate(topology.labels)}
    return sorted(tagged, key=lambda r: (r.get("scope") == INTER_NODE, order.get(r.get("node"), len(order))))


def _wait_for_peers(reporter: Any, label: str, bound_s: Optional[float], ctrl: Any) -> None:
    """Barrier on the control group, the watchdog re-armed for a whole phase of the other ranks' work."""
    import torch.distributed as dist

    if bound_s:
        reporter.wait(label, bound_s)
    dist.barrier(group=ctrl)


def _scoped_fault(fault: Any, scope: str, rank: int, group: Any) -> Any:
    """The test-only fault hook for one scope's run: its op without the scope, its rank in the group."""
    import dataclasses

    import torch.distributed as dist

    prefix = f"{scope} "
    if fault is None or fault.rank != rank or not str(fault.op).startswith(prefix):
        return None
    return dataclasses.replace(fault, op=fault.op[len(prefix) :], rank=dist.get_rank(group))
