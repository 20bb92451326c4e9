"""Slurm's side of `check --prolog --on-fail drain`: which node this is, and the one `scontrol` call
that drains it. Resuming a node is the admin's decision after a look: ddpdoctor never does it.

Equivalent: scontrol update nodename=$SLURMD_NODENAME state=drain reason="ddpdoctor: ID"
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Mapping, Optional

from ddpdoctor.edge.runner import CommandResult, run_argv

# scontrol asks slurmctld once; a controller that does not answer in this time will not answer a
# prolog either. The prolog's hard bound grows by this much with --on-fail drain.
DRAIN_TIMEOUT_S = 10.0
# Slurm keeps any reason, but `sinfo -R` shows about 40 characters and an id is shorter than that.
REASON_PREFIX = "ddpdoctor: "
# One node, as slurm.conf names it: scontrol reads `nodename=` as a hostlist, so `gpu[01-99]`, `a,b` or
# a space would drain many nodes. Letters, digits, `.`, `_`, `-`; at most a DNS name's length.
_PLAIN_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}", re.ASCII)


@dataclass(frozen=True)
class DrainOutcome:
    node: str
    reason: str
    result: Optional[CommandResult]
    # Why no drain was tried (the node name could not be trusted); empty when scontrol ran.
    refused: str = ""

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    def describe(self) -> str:
        """One line for stderr: what was done, or why it could not be."""
        if self.result is None:
            return f"ddpdoctor: did not drain: {self.refused}"
        if self.ok:
            return (
                f"ddpdoctor: drained node {self.node} (reason {self.reason!r}); resume it with "
                f"`scontrol update nodename={self.node} state=resume` once fixed"
            )
        return f"ddpdoctor: could not drain node {self.node}: {self.result.describe_failure()}"


def _host_names() -> tuple[str, ...]:
    full = socket.gethostname()
    return (full.lower(), full.split(".")[0].lower())


def slurm_node_name(env: Mapping[str, str]) -> str:
    """The node's Slurm name: SLURMD_NODENAME (set in a Prolog and HealthCheckProgram), else
    SLURM_NODENAME (a job step), else the short host name (NodeName is usually it)."""
    for name in ("SLURMD_NODENAME", "SLURM_NODENAME"):
        value = (env.get(name) or "").strip()
        if value:
            return value
    return socket.gethostname().split(".")[0]


def node_name_problem(node: str) -> str:
    """Why `node` must not be drained ('' when it may): it must be one plain node name, and this
    host's. SLURM_NODENAME is the user's to set, and a drain is run as root: a name that is not this
    host's would take someone else's node down. Comparing with the host name refuses a cluster whose
    NodeName differs from it; that costs one manual drain, a wrong name costs other jobs' nodes."""
    shown = ascii(node[:80])
    if not _PLAIN_NODE.fullmatch(node):
        return (
            f"the node name {shown} is not one plain Slurm node name (scontrol would read it as a "
            f"list of nodes); drain this node by hand"
        )
    if node.lower() not in _host_names():
        return (
            f"the node name {shown} is not this host ({ascii(socket.gethostname()[:80])}); "
            f"drain this node by hand"
        )
    return ""


def drain_reason(finding_id: str) -> str:
    """`ddpdoctor: ID`: the id says which check to rerun by hand (`ddpdoctor check -v`)."""
    return f"{REASON_PREFIX}{finding_id}"


def drain_node(node: str, reason: str, timeout_s: float = DRAIN_TIMEOUT_S) -> DrainOutcome:
    """Drain `node` with `reason` through scontrol (an argv, no shell: the reason is one argument,
    whatever it holds). Never raises: a missing scontrol, a timeout or a refusal is in the outcome.
    A name that is not one plain node name is refused before scontrol runs."""
    if not _PLAIN_NODE.fullmatch(node):
        return DrainOutcome(node=node, reason=reason, result=None, refused=node_name_problem(node))
    argv = ("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
    return DrainOutcome(node=node, reason=reason, result=run_argv(argv, timeout_s=timeout_s))


def drain_for(first_failing_id: Optional[str], env: Mapping[str, str]) -> Optional[DrainOutcome]:
    """Drain this node for the first failing finding; None when nothing failed (nothing to do).
    A node name that is not this host's one plain name is refused: no scontrol call."""
    if not first_failing_id:
        return None
    node = slurm_node_name(env)
    reason = drain_reason(first_failing_id)
    problem = node_name_problem(node)
    if problem:
        return DrainOutcome(node=node, reason=reason, result=None, refused=problem)
    return drain_node(node, reason)
