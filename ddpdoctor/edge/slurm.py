"""Slurm's side of `check --prolog --on-fail drain`: which node this is, and the one `scontrol` call
that drains it. Resuming a node is the admin's decision after a look: ddpdoctor never does it.

Equivalent: scontrol update nodename=$SLURMD_NODENAME state=drain reason="ddpdoctor: ID"
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Mapping, Optional

from ddpdoctor.edge.runner import CommandResult, run_argv

# scontrol asks slurmctld once; a controller that does not answer in this time will not answer a
# prolog either. The prolog's hard bound grows by this much with --on-fail drain.
DRAIN_TIMEOUT_S = 10.0
# Slurm keeps any reason, but `sinfo -R` shows about 40 characters and an id is shorter than that.
REASON_PREFIX = "ddpdoctor: "


@dataclass(frozen=True)
class DrainOutcome:
    node: str
    reason: str
    result: CommandResult

    @property
    def ok(self) -> bool:
        return self.result.ok

    def describe(self) -> str:
        """One line for stderr: what was done, or why it could not be."""
        if self.ok:
            return (
                f"ddpdoctor: drained node {self.node} (reason {self.reason!r}); resume it with "
                f"`scontrol update nodename={self.node} state=resume` once fixed"
            )
        return f"ddpdoctor: could not drain node {self.node}: {self.result.describe_failure()}"


def slurm_node_name(env: Mapping[str, str]) -> str:
    """The node's Slurm name: SLURMD_NODENAME (set in a Prolog and HealthCheckProgram), else
    SLURM_NODENAME (a job step), else the short host name (NodeName is usually it)."""
    for name in ("SLURMD_NODENAME", "SLURM_NODENAME"):
        value = (env.get(name) or "").strip()
        if value:
            return value
    return socket.gethostname().split(".")[0]


def drain_reason(finding_id: str) -> str:
    """`ddpdoctor: ID`: the id says which check to rerun by hand (`ddpdoctor check -v`)."""
    return f"{REASON_PREFIX}{finding_id}"


def drain_node(node: str, reason: str, timeout_s: float = DRAIN_TIMEOUT_S) -> DrainOutcome:
    """Drain `node` with `reason` through scontrol (an argv, no shell: the reason is one argument,
    whatever it holds). Never raises: a missing scontrol, a timeout or a refusal is in the outcome."""
    argv = ("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
    return DrainOutcome(node=node, reason=reason, result=run_argv(argv, timeout_s=timeout_s))


def drain_for(first_failing_id: Optional[str], env: Mapping[str, str]) -> Optional[DrainOutcome]:
    """Drain this node for the first failing finding; None when nothing failed (nothing to do)."""
    if not first_failing_id:
        return None
    return drain_node(slurm_node_name(env), drain_reason(first_failing_id))
