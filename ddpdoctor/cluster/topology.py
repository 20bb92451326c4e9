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


def run_scoped_benchmark(plan: Any, device: Any, backend: str, reporter: Any = None) -> list[dict[str, Any]]:
    """bench-nccl's plan run intra-node (each node's ranks, all nodes at once) and inter-node (one rank
    per node), on a world that is already initialized and spans nodes.

    Every rank must call it (group creation is collective). Returns, on every rank, the rows of every
    node's intra-node run and of the inter-node run, each row tagged with `scope` ("intra-node" or
    "inter-node") and `node` (the node's label, or "all nodes"); [] when the world is one node.
    """
    import os

    import torch.distributed as dist

    from ddpdoctor.bench.worker import run_benchmark
    from ddpdoctor.cluster.collectives import all_gather_json
    from ddpdoctor.cluster.session import make_identity, require_launch

    rank = dist.get_rank()
    # Identities and rows travel on CPU tensors: a gloo group when the benchmark runs on NCCL.
    ctrl = dist.new_group(backend="gloo") if backend != "gloo" else None
    identities = all_gather_json(make_identity(require_launch(os.environ)).to_dict(), group=ctrl)
    topology = group_by_node([i for i in identities if isinstance(i, dict)])
    if not topology.spans_nodes:
        return []
    groups = make_scope_groups(topology, rank, backend=backend)
    mine: list[dict[str, Any]] = []
    node = topology.node_of(rank)
    if groups.intra is not None and node is not None:
        rows = run_benchmark(plan, device, reporter, group=groups.intra)
        # Every rank of a group returns the same reduced row: the node's first rank reports it.
        if rank == topology.nodes[node][0]:
            mine += [{**r, "scope": "intra-node", "node": topology.labels[node]} for r in rows]
    dist.barrier(group=ctrl)
    if groups.inter is not None:
        rows = run_benchmark(plan, device, reporter, group=groups.inter)
        if rank == topology.leaders[0]:
            mine += [{**r, "scope": "inter-node", "node": "all nodes"} for r in rows]
    dist.barrier(group=ctrl)
    gathered = all_gather_json(mine, group=ctrl)
    return [row for part in gathered if isinstance(part, list) for row in part if isinstance(row, dict)]
