"""Cluster mode: `check --cluster` and `bench-nccl --pairwise` across nodes under torchrun or srun.

ddpdoctor never launches, SSHes or rendezvouses on its own: it joins the launcher's rendezvous
(launch.py), publishes who it is through torch's TCPStore (membership.py), runs the node's checks,
gathers them to rank 0 over gloo (session.py) and judges across nodes with pure functions (judge.py).
pairwise.py measures every node pair; topology.py splits ranks into intra-node and inter-node groups.
"""

from __future__ import annotations

from ddpdoctor.cluster.hostlist import expand_hostlist
from ddpdoctor.cluster.launch import LaunchError, LaunchInfo, detect_launch
from ddpdoctor.cluster.report import ClusterReport, NodeIdentity, NodeResult

__all__ = [
    "ClusterReport",
    "LaunchError",
    "LaunchInfo",
    "NodeIdentity",
    "NodeResult",
    "detect_launch",
    "expand_hostlist",
]
