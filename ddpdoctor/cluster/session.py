"""`check --cluster` on every rank: join, run the local checks, gather to rank 0, judge, report.

Every wait is bounded: joining by --join-timeout, the local checks by --timeout, the gather by the
collective timeout. A rank that never joins or goes silent is named in the report instead of hanging it.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpdoctor.cluster.collectives import gather_json
from ddpdoctor.cluster.facts import make_facts_area
from ddpdoctor.cluster.judge import GATHER_FAILED, judge_cluster
from ddpdoctor.cluster.launch import LaunchError, LaunchInfo, detect_launch
from ddpdoctor.cluster.membership import (
    LOST_AFTER_S,
    NEVER_JOINED,
    PLAN_KEY,
    POLL_INTERVAL_S,
    READY,
    READY_SLACK_S,
    SILENT,
    Channel,
    Heartbeat,
    WaitOutcome,
    identity_key,
    name_absent,
    open_store,
    payload_key,
    ready_key,
    wait_for_ranks,
)
from ddpdoctor.cluster.report import (
    LOST,
    MISSING,
    NO_DATA,
    REPORTED,
    ClusterReport,
    NodeIdentity,
    NodeResult,
    finding_from_dict,
)
from ddpdoctor.core.engine import Area, run_checks
from ddpdoctor.core.model import Evidence, ExitCode, Finding, Severity
from ddpdoctor.edge.sources import LiveSources, redact_data

DEFAULT_JOIN_TIMEOUT_S = 120.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 30.0
# How long rank 0 waits for the other ranks to read the exit code before it exits itself.
ACK_WAIT_S = 10.0
RESULT_KEY = "result"


def ack_key(rank: int) -> str:
    return f"ack/{rank}"


class ClusterUsageError(ValueError):
    """Not started by a launcher, or an inconsistent launcher environment."""


@dataclass
class ClusterOptions:
    areas: Sequence[Area]
    check_timeout_s: float
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    lost_after_s: float = LOST_AFTER_S
    options: Mapping[str, Any] = field(default_factory=dict)
    expected_hosts: Sequence[str] = ()  # --hosts; under srun SLURM_JOB_NODELIST is used when empty
    strict: bool = False


@dataclass
class ClusterOutcome:
    rank: int
    report: Any  # only on rank 0: a ClusterReport for check --cluster, the command's own report otherwise
    exit_code: int
    message: str = ""  # for stderr on ranks other than 0


@dataclass
class Gathered:
    """What rank 0 holds once every rank reported, went missing or was given up on."""

    info: LaunchInfo
    outcome: WaitOutcome
    payloads: dict[int, Any]
    findings: list[Finding]  # about the gathering itself (the gloo gather failed)
    no_data_detail: str
    start: float

    def nodes(self, opts: ClusterOptions) -> list[NodeResult]:
        expected = list(opts.expected_hosts) or list(self.info.expected_hosts)
        source = "--hosts" if opts.expected_hosts else "SLURM_JOB_NODELIST"
        return build_nodes(self.outcome, self.payloads, self.info, expected, source, self.no_data_detail)


def require_launch(env: Mapping[str, str], command: str = "check --cluster") -> LaunchInfo:
    try:
        info = detect_launch(env)
    except LaunchError as exc:
        raise ClusterUsageError(str(exc)) from None
    if info is None:
        raise ClusterUsageError(
            f"{command} runs under a launcher: start it with torchrun (RANK, WORLD_SIZE, MASTER_ADDR, "
            "MASTER_PORT) or srun (SLURM_PROCID, SLURM_NTASKS); see docs/cluster.md"
        )
    return info


def make_identity(info: LaunchInfo) -> NodeIdentity:
    return NodeIdentity(
        rank=info.rank,
        hostname=socket.gethostname(),
        node_rank=info.node_rank,
        local_rank=info.local_rank,
        pid=os.getpid(),
        launcher=info.launcher,
    )


def run_local(opts: ClusterOptions, identity: NodeIdentity) -> dict[str, Any]:
    """This node's checks and key facts, bounded by --timeout like `ddpdoctor check`."""
    facts: dict[str, Any] = {}
    areas = [*opts.areas, make_facts_area(facts)]
    with LiveSources() as sources:  # a probe still running at the deadline is killed, not orphaned
        report = run_checks(sources, areas, timeout_s=opts.check_timeout_s, options=opts.options)
    # Findings quote commands, environment values and tool output: redact before anything leaves the node.
    return redact_data(
        {
            "identity": identity.to_dict(),
            "facts": facts,
            "findings": [f.to_dict() for f in report.findings],
            "duration_s": report.duration_s,
        }
    )


def short_error(exc: BaseException) -> str:
    """An exception in one line: c10 errors carry 'Exception raised from ...' and C++ frames after it."""
    text = str(exc).split("Exception raised from", 1)[0].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


def _store_failure(info: LaunchInfo, exc: BaseException) -> str:
    exc_text = short_error(exc)
    where = f"{info.master_addr}:{info.master_port}"
    if info.rank == 0 and not info.use_agent_store:
        from ddpdoctor.edge.ports import find_port_holder

        holder = find_port_holder(info.master_port)
        extra = f"; {holder.describe()}" if holder else ""
        return f"rank 0 could not host the TCP store at {where}: {exc_text}{extra}"
    return f"rank {info.rank} could not reach the TCP store at {where}: {exc_text}"


def gather_over_gloo(
    channel: Channel, info: LaunchInfo, payload: Any, timeout_s: float
) -> tuple[Optional[list[Any]], str]:
    """Payloads to rank 0 over a gloo group built on the same store; (payloads or None, error)."""
    import torch.distributed as dist

    store = dist.PrefixStore("gloo", channel.store)
    try:
        store.set_timeout(timedelta(seconds=timeout_s))
        dist.init_process_group(
            "gloo",
            store=store,
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        return gather_json(payload, dst=0), ""
    except Exception as exc:  # noqa: BLE001 - a gloo failure is a finding, not a crash
        return None, f"{type(exc).__name__}: {short_error(exc)}"
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001, S110 - best effort on the way out
            pass


def collect_from_store(channel: Channel, ranks: Sequence[int], deadline: float) -> dict[int, Any]:
    """Rank 0: payloads that ranks put into the store, until all came or the deadline."""
    got: dict[int, Any] = {}
    while True:
        for r in ranks:
            if r not in got:
                value = channel.get_json(payload_key(r))
                if value is not None:
                    got[r] = value
        if len(got) == len(ranks) or time.monotonic() >= deadline:
            return got
        time.sleep(POLL_INTERVAL_S)


def build_nodes(
    outcome: WaitOutcome,
    payloads: Mapping[int, Any],
    info: LaunchInfo,
    expected_hosts: Sequence[str],
    host_source: str,
    no_data_detail: str,
) -> list[NodeResult]:
    """One NodeResult per node leader that reported, plus one per rank or expected host that did not."""
    joined = {r: w.identity for r, w in outcome.watches.items() if w.identity is not None}
    missing = outcome.ranks_in(NEVER_JOINED)
    missing_labels, absent_hosts = name_absent(missing, joined, expected_hosts, info.world_size, host_source)
    nodes: list[tuple[tuple[int, int], NodeResult]] = []
    for rank, watch in sorted(outcome.watches.items()):
        ident = watch.identity
        order = (ident.node_rank if ident and ident.node_rank is not None else rank, rank)
        if watch.state == NEVER_JOINED:
            label, detail = missing_labels[rank]
            nodes.append((order, NodeResult(label=label, status=MISSING, detail=detail)))
            continue
        assert ident is not None
        label = ident.label if ident.local_rank == 0 else f"{ident.label} rank {rank}"
        if watch.state == SILENT:
            nodes.append((order, NodeResult(label=label, status=LOST, identity=ident, detail=watch.detail)))
            continue
        payload = payloads.get(rank)
        if isinstance(payload, dict):
            nodes.append(
                (
                    order,
                    NodeResult(
                        label=label,
                        status=REPORTED,
                        identity=ident,
                        facts=dict(payload.get("facts") or {}),
                        findings=[
                            finding_from_dict(f) for f in payload.get("findings") or [] if isinstance(f, dict)
                        ],
                        duration_s=float(payload.get("duration_s") or 0.0),
                    ),
                )
            )
        elif ident.local_rank == 0 and watch.state == READY:
            nodes.append(
                (order, NodeResult(label=label, status=NO_DATA, identity=ident, detail=no_data_detail))
            )
    tail = (10**9, 10**9)
    nodes += [
        (tail, NodeResult(label=label, status=MISSING, detail=detail, expected_only=True))
        for label, detail in absent_hosts
    ]
    return [n for _, n in sorted(nodes, key=lambda item: item[0])]


def _gather_failed_finding(error: str) -> Finding:
    return GATHER_FAILED.finding(
        Severity.ERROR,
        f"Every rank joined but the gloo gather failed: {error}",
        evidence=[Evidence("torch.distributed.init_process_group('gloo') + gather", error)],
        data={"error": error},
    )


def run_cluster_check(opts: ClusterOptions, env: Optional[Mapping[str, str]] = None) -> ClusterOutcome:
    """Run on every rank; rank 0's outcome carries the cluster report. Raises ClusterUsageError."""

    def conclude(gathered: Gathered) -> tuple[ClusterReport, int]:
        nodes = gathered.nodes(opts)
        report = ClusterReport(
            launcher=gathered.info.launcher,
            world_size=gathered.info.world_size,
            nodes=nodes,
            findings=gathered.findings + judge_cluster(nodes, opts.join_timeout_s),
            duration_s=time.monotonic() - gathered.start,
            areas=[a.name for a in opts.areas],
        )
        return report, int(report.exit_code(opts.strict))

    return run_cluster_session(opts, lambda identity: run_local(opts, identity), conclude, env)


def run_cluster_session(
    opts: ClusterOptions,
    make_payload: Callable[[NodeIdentity], Any],
    conclude: Callable[[Gathered], tuple[Any, int]],
    env: Optional[Mapping[str, str]] = None,
    command: str = "check --cluster",
) -> ClusterOutcome:
    """The cluster mechanism of any command, on every rank: join, make this node's JSON payload (local
    rank 0 only, bounded by the caller within opts.check_timeout_s), gather the payloads to rank 0,
    which concludes (report, exit code); every rank exits with that code. Raises ClusterUsageError."""
    info = require_launch(os.environ if env is None else env, command)
    # c10d logs every failed store connection attempt with its C++ frames (66 lines for one unreachable
    # master); the failure is reported here in one line with its cause. Read by torch when it loads, so
    # set before the store is opened; a level the user chose is kept.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    start = time.monotonic()
    identity = make_identity(info)
    try:
        channel = Channel(open_store(info, opts.join_timeout_s))
        channel.set_json(identity_key(info.rank), identity.to_dict())
    except Exception as exc:  # noqa: BLE001 - an unreachable master is the finding itself
        return ClusterOutcome(info.rank, None, int(ExitCode.INCONCLUSIVE), _store_failure(info, exc))

    heartbeat = Heartbeat(channel, info.rank).start() if info.rank != 0 else None
    try:
        payload = make_payload(identity) if info.local_rank == 0 else None
        channel.set(ready_key(info.rank), "1")
    except Exception as exc:  # noqa: BLE001 - store gone: rank 0 died
        return ClusterOutcome(info.rank, None, int(ExitCode.INCONCLUSIVE), f"lost rank 0: {short_error(exc)}")
    finally:
        if heartbeat is not None:
            heartbeat.stop()

    if info.rank != 0:
        return _follow_plan(channel, info, opts, payload, start)
    gathered = _lead(channel, info, opts, identity, payload, start)
    report, code = conclude(gathered)
    return ClusterOutcome(0, report, _finish(channel, code, gathered.outcome.ranks_in(READY)))


def _follow_plan(
    channel: Channel, info: LaunchInfo, opts: ClusterOptions, payload: Any, start: float
) -> ClusterOutcome:
    """Ranks other than 0: wait for rank 0's plan, send the payload over gloo or the store, then exit
    with the cluster's exit code (see _finish)."""
    deadline = (
        start
        + opts.join_timeout_s
        + opts.check_timeout_s
        + READY_SLACK_S
        + opts.lost_after_s
        + opts.collective_timeout_s
    )
    try:
        if channel.wait_for(PLAN_KEY, deadline) is None:
            return ClusterOutcome(
                info.rank,
                None,
                int(ExitCode.INCONCLUSIVE),
                f"rank 0 did not publish a plan within {deadline - start:.0f}s",
            )
        plan = channel.get_json(PLAN_KEY) or {}
        message = ""
        if plan.get("mode") == "gather":
            _, error = gather_over_gloo(channel, info, payload, opts.collective_timeout_s)
            if error:
                channel.set_json(payload_key(info.rank), payload)
                message = f"gloo gather failed ({error}); sent the report over the store"
        elif info.rank in (plan.get("ranks") or []):
            channel.set_json(payload_key(info.rank), payload)
        else:
            message = "rank 0 gave up waiting for this rank (it joined or finished too late)"
        # The fallback may keep rank 0 waiting for a collective timeout plus slack before it judges.
        wait_until = time.monotonic() + 2 * opts.collective_timeout_s + 2 * READY_SLACK_S
        result = channel.wait_for(RESULT_KEY, wait_until)
        if result is None:
            return ClusterOutcome(
                info.rank, None, int(ExitCode.INCONCLUSIVE), message or "rank 0 published no result"
            )
        channel.set(ack_key(info.rank), "1")
        return ClusterOutcome(info.rank, None, _exit_code_from(result), message)
    except Exception as exc:  # noqa: BLE001 - rank 0 went away mid-way
        return ClusterOutcome(info.rank, None, int(ExitCode.INCONCLUSIVE), f"lost rank 0: {short_error(exc)}")


def _exit_code_from(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return int(ExitCode.INCONCLUSIVE)


def _finish(channel: Channel, code: int, ranks: Sequence[int]) -> int:
    """Publish the cluster's exit code so every rank exits with it, and wait (briefly) until they read it.

    torchrun agents whose workers all succeeded wait in an exit barrier for the agents of the other
    nodes, which never come when those failed: one exit code on every rank keeps every agent on the
    same path, and gives srun one exit code for the step.
    """
    try:
        channel.set(RESULT_KEY, str(code))
        deadline = time.monotonic() + ACK_WAIT_S
        pending = [r for r in ranks if r != 0]
        while pending and time.monotonic() < deadline:
            pending = [r for r in pending if not channel.has(ack_key(r))]
            if pending:
                time.sleep(POLL_INTERVAL_S)
    except Exception:  # noqa: BLE001, S110 - the report is done; a rank that left early changes nothing
        pass
    return code


def _lead(
    channel: Channel,
    info: LaunchInfo,
    opts: ClusterOptions,
    identity: NodeIdentity,
    payload: Any,
    start: float,
) -> Gathered:
    """Rank 0: wait for everyone (bounded) and gather their payloads."""
    outcome = wait_for_ranks(
        channel,
        info.world_size,
        identity,
        join_deadline=start + opts.join_timeout_s,
        check_timeout_s=opts.check_timeout_s,
        lost_after_s=opts.lost_after_s,
    )
    ready = outcome.ranks_in(READY)
    payloads: dict[int, Any] = {0: payload}
    extra_findings: list[Finding] = []
    no_data_detail = "its report did not arrive"
    if outcome.complete:
        channel.set_json(PLAN_KEY, {"mode": "gather", "ranks": ready})
        gathered, error = gather_over_gloo(channel, info, payload, opts.collective_timeout_s)
        if gathered is not None:
            payloads = dict(enumerate(gathered))
        else:
            extra_findings.append(_gather_failed_finding(error))
            no_data_detail = (
                f"gloo gather failed and the report did not arrive over the store either ({error})"
            )
            others = [r for r in ready if r != 0]
            # A rank may sit in the failed collective for up to its timeout before it falls back.
            fallback_deadline = time.monotonic() + opts.collective_timeout_s + READY_SLACK_S
            payloads.update(collect_from_store(channel, others, fallback_deadline))
    else:
        channel.set_json(PLAN_KEY, {"mode": "store", "ranks": ready})
        others = [r for r in ready if r != 0]
        payloads.update(collect_from_store(channel, others, time.monotonic() + opts.collective_timeout_s))
    return Gathered(info, outcome, payloads, extra_findings, no_data_detail, start)


def print_rank_message(outcome: ClusterOutcome) -> None:
    """Ranks other than 0 stay silent on stdout (srun merges every task's stdout); problems go to stderr.

    A rank that exits non-zero always says why on its own stderr: under torchrun each rank's log is read
    on its own, and an empty one next to a ChildFailedError tells a user nothing."""
    if outcome.message:
        sys.stderr.write(f"ddpdoctor rank {outcome.rank}: {outcome.message}\n")
    elif outcome.exit_code != 0:
        sys.stderr.write(
            f"ddpdoctor rank {outcome.rank}: exit {outcome.exit_code}, the verdict of the whole job: "
            "rank 0's output holds the report\n"
        )
