"""NCCL smoke test: prove collectives work (not just that NCCL is compiled in).

Where GPUs are visible: one rank per GPU through the bench launcher and its watchdog, init NCCL,
one small all_reduce and one broadcast, values verified, a report per rank. Without GPUs it is a
skip unless forced with `check --smoke` (then gloo on CPU, the same way); `--no-smoke` skips it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.bench.preflight import gather_launch_facts, gpu_supply, plan_launch
from ddpdoctor.core.engine import Area, Context
from ddpdoctor.core.launchenv import read_launch_env
from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.core.placement import judge_placement, read_local_ranks

SMOKE_STEP_TIMEOUT_S = 20.0
CPU_SMOKE_RANKS = 2

SMOKE = define(
    "nccl.smoke",
    "Collective smoke test",
    "An all_reduce and a broadcast across every GPU of the node prove that the communication stack works "
    "end to end; `torch.distributed.is_nccl_available()` only proves it was compiled in.",
    "Read the root cause below; rerun with NCCL_DEBUG=INFO and see `ddpdoctor bench-nccl` for details.",
)
SMOKE_RANK = define(
    "nccl.smoke.rank",
    "Smoke test rank",
    "Each rank checks the values it received: a wrong value is silent data corruption on that GPU's path.",
    "Run `ddpdoctor bench-nccl` on the node and check that GPU's links (nvidia-smi nvlink -e, PCIe errors).",
)
SMOKE_REFUSED = define(
    "nccl.smoke.refused",
    "Smoke test not started",
    "A pitfall found before launch (see the finding) means the smoke test would fail or hang.",
    "Fix the reported pitfall, then rerun `ddpdoctor check`.",
)


@dataclass
class SmokeFacts:
    mode: str  # "skip", "refused", "ran"
    reason: str = ""
    backend: str = ""
    nproc: int = 0
    refusals: list[Finding] = field(default_factory=list)
    launch: Optional[Any] = None  # LaunchResult


def collect_nccl(ctx: Context) -> SmokeFacts:
    """Equivalent: a torchrun job doing one all_reduce and one broadcast per GPU, with a deadline."""
    smoke = ctx.options.get("smoke")
    if smoke is False:
        return SmokeFacts("skip", "disabled with --no-smoke")
    if not ctx.sources.is_live:
        return SmokeFacts("skip", "the smoke test runs live only (not from a snapshot)")
    env = dict(os.environ)
    facts = gather_launch_facts(ctx.sources.run, env)
    ranks = read_local_ranks(env, ctx.options.get("nproc_per_node"))
    if ranks.launcher != "preflight" and ranks.count and ranks.count > 1:
        # Inside a job: the node's ranks would each start a smoke test on every GPU at once.
        launch = read_launch_env(env)
        # LOCAL_RANK alone (no RANK/WORLD_SIZE) still says which rank of the node this is.
        known = (launch.local_rank, launch.get("LOCAL_RANK"), launch.get("SLURM_LOCALID"))
        if next((v for v in known if v is not None), 0) != 0:
            return SmokeFacts("skip", f"local rank 0 runs it for the {ranks.count} ranks of this node")
        supply = gpu_supply(facts)
        if supply.visible and any(
            f.severity >= Severity.FAIL for f in judge_placement(ranks, supply, "nccl")
        ):
            return SmokeFacts(
                "skip", f"{ranks.count} ranks on this node do not fit its GPUs (see gpu.ranks_per_node)"
            )
    decision = plan_launch(facts, "auto", None)
    if decision.backend != "nccl":
        if smoke is None:
            return SmokeFacts(
                "skip", "no usable GPU (run `ddpdoctor check --smoke` to test the gloo path on CPU)"
            )
        decision = plan_launch(facts, "gloo", CPU_SMOKE_RANKS)
    if decision.refusals:
        return SmokeFacts(
            "refused", backend=decision.backend, nproc=decision.nproc, refusals=list(decision.refusals)
        )
    from ddpdoctor.bench.launcher import launch_local
    from ddpdoctor.bench.plan import SmokePlan

    budget = max(ctx.remaining() - 1.0, 1.0)
    step_timeout = min(
        float(ctx.options.get("timeout") or SMOKE_STEP_TIMEOUT_S), SMOKE_STEP_TIMEOUT_S, budget
    )
    launch = launch_local(
        SmokePlan(),
        nproc=decision.nproc,
        backend=decision.backend,
        step_timeout_s=step_timeout,
        total_timeout_s=budget,
        master_port=facts.master_port,
    )
    return SmokeFacts("ran", backend=decision.backend, nproc=decision.nproc, launch=launch)


def check_nccl(facts: SmokeFacts) -> list[Finding]:
    if facts.mode == "skip":
        return [SMOKE.finding(Severity.SKIP, f"Skipped: {facts.reason}")]
    if facts.mode == "refused":
        return list(facts.refusals) + [
            SMOKE_REFUSED.finding(
                Severity.ERROR,
                f"{facts.backend} smoke test with {facts.nproc} rank(s) not started: "
                + "; ".join(f.summary for f in facts.refusals),
            )
        ]
    launch = facts.launch
    label = f"{facts.backend} on {facts.nproc} rank(s)"
    findings: list[Finding] = []
    for rank, result in sorted(launch.results().items()):
        ar = (result or {}).get("all_reduce", {})
        bc = (result or {}).get("broadcast", {})
        wrong = int(ar.get("wrong", 0)) + int(bc.get("wrong", 0))
        findings.append(
            SMOKE_RANK.finding(
                Severity.FAIL if wrong else Severity.OK,
                f"rank {rank} ({result.get('device', '?')} on {result.get('host', '?')}): "
                + (f"{wrong} wrong values" if wrong else "all_reduce and broadcast values correct"),
                evidence=[Evidence("torch.distributed all_reduce + broadcast", str(result))],
                data={"rank": rank, **(result or {})},
            )
        )
    bad = [f for f in findings if f.severity >= Severity.FAIL]
    if launch.ok and not bad:
        findings.insert(
            0,
            SMOKE.finding(
                Severity.OK,
                f"{label}: init, all_reduce and broadcast verified in {launch.duration_s:.1f}s",
                evidence=[Evidence("ddpdoctor.bench.launcher", f"master port {launch.master_port}")],
            ),
        )
        return findings
    if launch.ok:
        findings.insert(0, SMOKE.finding(Severity.FAIL, f"{label}: {len(bad)} rank(s) received wrong values"))
        return findings
    root = launch.root_cause
    if launch.timed_out:
        what = f"no progress within {launch.timeout_s:g}s"
    elif launch.interrupted:
        what = "interrupted"
    else:
        what = "a rank failed"
    summary = f"{label}: {what}" + (f"; root cause: {root.describe()}" if root else "")
    excerpt = ""
    if root is not None:
        excerpt = (root.stack or root.traceback or root.log_tail or root.message)[-1500:]
    findings.insert(
        0,
        SMOKE.finding(
            Severity.FAIL,
            summary,
            evidence=[Evidence("ddpdoctor.bench.launcher (watchdog)", excerpt)],
            data={"launch": launch.to_dict()},
        ),
    )
    return findings


AREA = Area(name="nccl", title="NCCL smoke test", collect=collect_nccl, judge=check_nccl, order=80)
