"""`bench-nccl --pairwise`: send/recv bandwidth between every pair of nodes, and which node or link is slow.

One rank per node (the node's lowest rank) takes part. Pairs run in rounds of a round-robin
tournament (the circle method), so a node is in at most one pair at a time and a slow node cannot
hide behind another pair's traffic. In each pair, each direction is timed separately: the sender
sends `iters` messages, the receiver answers with a 1-element ack, and the sender's clock gives
bytes / time, best of `trials`. Each node also times a matmul, so a slow node (slow CPU/GPU) can be told from a slow
network path.

Outliers (analyze_pairwise, pure): a pair's bandwidth is the slower of its two directions. The
reference is the median, over nodes, of each node's fastest pair: a bad node makes all of its own
pairs slow but not the other nodes' best pairs, so the reference stays that of a healthy link even
when most pairs touch the bad node (with 3 nodes, 2 of the 3 pairs do). A pair below
SLOW_FRACTION x reference is slow. A node all of whose pairs are slow (it needs at least two pairs,
so three nodes) is a bad node; a slow pair between two nodes that each have a fast pair is a bad link.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping, Optional, Sequence

from ddpdoctor.core.model import Evidence, Finding, Severity, define
from ddpdoctor.core.placement import PLACEMENT, GpuSupply, LocalRanks, judge_placement

SLOW_FRACTION = 0.5
COMPUTE_SECONDS = 0.3
SCHEMA = "ddpdoctor.pairwise/1"

SLOW_NODE = define(
    "cluster.pairwise.slow_node",
    "Slow node",
    "Every pair this node is in is slow while other nodes have fast pairs: the problem is on this node "
    "(its NIC or cable, a PCIe link trained down, a NIC on the wrong NUMA node, CPU affinity, or a "
    "host-side rate limit), not in one switch port between two nodes.",
    "On that node: `ibstat`/`ethtool IFACE` (link rate), `lspci -vv` (PCIe width and speed of the NIC), "
    "`ddpdoctor check` (NIC/GPU NUMA affinity); drain it (`scontrol update nodename=HOST state=drain`) "
    "until fixed.",
)
SLOW_LINK = define(
    "cluster.pairwise.slow_link",
    "Slow link between two nodes",
    "One pair of nodes is slow while each of the two nodes is fast with others: the path between them "
    "(a cable, a switch port, a congested or misrouted uplink) is bad, not either node.",
    "Find the switch ports on the path between the two hosts (`ibtracert`, LLDP) and check their "
    "error counters (`perfquery`, `ibqueryerrors`); reseat or replace the cable.",
)
SLOW_COMPUTE = define(
    "cluster.pairwise.slow_compute",
    "Node slow at compute",
    "This node's matmul rate is well below the others': a throttled GPU (power brake, thermal), a "
    "different GPU, or CPU cores shared with other work. A synchronous job runs at its pace.",
    "Check clocks and throttle reasons (`nvidia-smi -q -d PERFORMANCE`), other processes on the node, "
    "and `ddpdoctor check` on that node.",
)
PAIR_FAILED = define(
    "cluster.pairwise.failed",
    "Pair could not be measured",
    "A send/recv between two nodes failed or timed out: the nodes cannot exchange data on the interface "
    "the backend picked.",
    "Set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to the interface the nodes share and check that TCP "
    "is allowed between them; run `ddpdoctor check --cluster` for the details.",
)
PAIRWISE_OK = define(
    "cluster.pairwise.ok",
    "Pairwise bandwidth",
    "Every pair of nodes was measured and none is an outlier, for the record.",
)
TOO_FEW = define(
    "cluster.pairwise.too_few_nodes",
    "Too few nodes to localize",
    "With two nodes there is one pair: a slow result cannot be pinned on a node or the link between them.",
    "Run with three or more nodes to tell a slow node from a slow link.",
)


def schedule_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of 0..n-1 exactly once, in rounds where no index appears twice (circle method).

    n even: n-1 rounds of n/2 pairs; n odd: n rounds, one index sits out each round.
    """
    if n < 2:
        return []
    players: list[Optional[int]] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds: list[list[tuple[int, int]]] = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        # Keep the first player fixed, rotate the rest by one.
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def pair_bandwidth(matrix: Sequence[Sequence[Optional[float]]], i: int, j: int) -> Optional[float]:
    """The slower direction of a pair (None when neither direction was measured)."""
    values = [v for v in (matrix[i][j], matrix[j][i]) if v is not None]
    return min(values) if values else None


@dataclass
class PairwiseAnalysis:
    nodes: list[str]
    matrix_mbps: list[list[Optional[float]]]
    compute_gflops: dict[str, Optional[float]]
    slow_fraction: float
    reference_mbps: Optional[float] = None
    slow_pairs: list[tuple[int, int]] = field(default_factory=list)
    slow_nodes: list[str] = field(default_factory=list)
    bad_links: list[tuple[int, int]] = field(default_factory=list)
    slow_compute: list[str] = field(default_factory=list)
    failed_pairs: list[tuple[int, int]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for --json and the renderer."""
        return {
            "nodes": list(self.nodes),
            "matrix_mbps": [[None if v is None else round(v, 3) for v in row] for row in self.matrix_mbps],
            "compute_gflops": {k: None if v is None else round(v, 3) for k, v in self.compute_gflops.items()},
            "slow_fraction": self.slow_fraction,
            "reference_mbps": None if self.reference_mbps is None else round(self.reference_mbps, 3),
            "slow_pairs": [list(p) for p in self.slow_pairs],
            "slow_nodes": list(self.slow_nodes),
            "bad_links": [list(p) for p in self.bad_links],
            "slow_compute": list(self.slow_compute),
            "failed_pairs": [list(p) for p in self.failed_pairs],
            "findings": [f.to_dict() for f in self.findings],
        }


ONE_NODE = define(
    "cluster.pairwise.one_node",
    "One node: no pair of nodes to measure",
    "--pairwise measures send/recv between nodes, one rank per node; every rank of this job runs on "
    "one node, so there is no pair and no verdict: a 1x1 matrix must not read as a pass.",
    "Start it on two or more nodes (torchrun --nnodes N on each node, or srun -N N); for the GPUs "
    "inside one node, run `ddpdoctor bench-nccl` without --pairwise.",
)


def _mbps(v: Optional[float]) -> str:
    return "?" if v is None else (f"{v / 1000:.2f} GB/s" if v >= 1000 else f"{v:.0f} MB/s")


def analyze_pairwise(
    nodes: Sequence[str],
    matrix: Sequence[Sequence[Optional[float]]],
    compute: Mapping[str, Optional[float]],
    slow_fraction: float = SLOW_FRACTION,
) -> PairwiseAnalysis:
    """Name the slow nodes, slow links and slow-compute nodes (see the module docstring for the rule)."""
    n = len(nodes)
    out = PairwiseAnalysis(
        nodes=list(nodes),
        matrix_mbps=[list(row) for row in matrix],
        compute_gflops=dict(compute),
        slow_fraction=slow_fraction,
    )
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    bw = {p: pair_bandwidth(matrix, *p) for p in pairs}
    out.failed_pairs = [p for p in pairs if bw[p] is None]
    best: list[float] = []
    for i in range(n):
        mine = [bw[p] for p in pairs if i in p and bw[p] is not None]
        if mine:
            best.append(max(mine))  # type: ignore[arg-type]
    out.reference_mbps = statistics.median(best) if best else None
    findings: list[Finding] = []
    if out.failed_pairs:
        names = [f"{nodes[i]} <-> {nodes[j]}" for i, j in out.failed_pairs]
        findings.append(
            PAIR_FAILED.finding(
                Severity.ERROR,
                f"{len(names)} pair(s) could not be measured: {', '.join(names)}",
                evidence=[Evidence("torch.distributed send/recv", "\n".join(names))],
                data={"pairs": [list(p) for p in out.failed_pairs]},
            )
        )
    ref = out.reference_mbps
    if ref is not None and n >= 2:
        threshold = slow_fraction * ref
        out.slow_pairs = [p for p in pairs if bw[p] is not None and bw[p] < threshold]  # type: ignore[operator]
        if n >= 3:
            for i in range(n):
                mine = [p for p in pairs if i in p and bw[p] is not None]
                if len(mine) >= 2 and all(p in out.slow_pairs for p in mine):
                    out.slow_nodes.append(nodes[i])
            slow_idx = {nodes.index(s) for s in out.slow_nodes}
            out.bad_links = [p for p in out.slow_pairs if p[0] not in slow_idx and p[1] not in slow_idx]
    gf = {k: v for k, v in compute.items() if v is not None}
    if len(gf) >= 2:
        median_gf = statistics.median(gf.values())
        out.slow_compute = sorted(k for k, v in gf.items() if v < slow_fraction * median_gf)
    for name in out.slow_nodes:
        i = nodes.index(name)
        mine = [bw[p] for p in pairs if i in p and bw[p] is not None]
        compute_note = (
            "its compute is slow too (see below)"
            if name in out.slow_compute
            else "its compute rate is normal: the network path of this node"
        )
        findings.append(
            SLOW_NODE.finding(
                Severity.FAIL,
                f"{name}: every pair is slow (median {_mbps(statistics.median(mine))} vs a reference of "
                f"{_mbps(ref)}, threshold {slow_fraction:.0%}); {compute_note}",
                evidence=[
                    Evidence(
                        "pairwise send/recv bandwidth, slower direction",
                        "\n".join(
                            f"{nodes[p[0]]} <-> {nodes[p[1]]}: {_mbps(bw[p])}" for p in pairs if i in p
                        ),
                    )
                ],
                data={"node": name, "pairs_mbps": mine, "reference_mbps": ref},
            )
        )
    for i, j in out.bad_links:
        findings.append(
            SLOW_LINK.finding(
                Severity.FAIL,
                f"{nodes[i]} <-> {nodes[j]}: {_mbps(bw[(i, j)])} (reference {_mbps(ref)}, threshold "
                f"{slow_fraction:.0%}) while both nodes are fast with others",
                evidence=[
                    Evidence(
                        "pairwise send/recv bandwidth",
                        f"{nodes[i]} -> {nodes[j]}: {_mbps(matrix[i][j])}\n{nodes[j]} -> {nodes[i]}: {_mbps(matrix[j][i])}",
                    )
                ],
                data={"pair": [nodes[i], nodes[j]], "mbps": bw[(i, j)], "reference_mbps": ref},
            )
        )
    for name in out.slow_compute:
        findings.append(
            SLOW_COMPUTE.finding(
                Severity.WARN,
                f"{name}: {gf[name]:.1f} GFLOP/s vs a median of {statistics.median(gf.values()):.1f}",
                evidence=[
                    Evidence(
                        "matmul timing on each node",
                        "\n".join(f"{k}: {v:.1f}" for k, v in sorted(gf.items())),
                    )
                ],
                data={"node": name, "gflops": gf[name]},
            )
        )
    if n == 2 and ref is not None:
        findings.append(
            TOO_FEW.finding(
                Severity.INFO,
                f"2 nodes, one pair at {_mbps(bw[(0, 1)])}: run with 3 or more nodes to tell a slow node "
                "from a slow link",
                evidence=[Evidence("pairwise send/recv bandwidth")],
            )
        )
    elif not any(f.severity >= Severity.WARN for f in findings) and ref is not None:
        known = [v for v in bw.values() if v is not None]
        findings.append(
            PAIRWISE_OK.finding(
                Severity.OK,
                f"{n} nodes, {len(known)} pairs from {_mbps(min(known))} to {_mbps(max(known))} "
                f"(median {_mbps(statistics.median(known))}); no pair below {slow_fraction:.0%} of {_mbps(ref)}",
                evidence=[Evidence("pairwise send/recv bandwidth")],
            )
        )
    if n < 2:
        findings.append(
            ONE_NODE.finding(
                Severity.ERROR,
                f"one node ({', '.join(nodes) or 'none'}): no pair of nodes to measure",
                evidence=[Evidence("ranks grouped by host", f"{n} node(s): {', '.join(nodes)}")],
                data={"nodes": list(nodes)},
            )
        )
    out.findings = findings
    return out


# ---------------------------------------------------------------------------------------------
# Measuring (torch): runs on every rank of an initialized process group.


DEFAULT_BYTES = {"nccl": 64 * 2**20, "gloo": 4 * 2**20}


@dataclass(frozen=True)
class PairwiseSettings:
    nbytes: int = 0  # 0: DEFAULT_BYTES of the backend
    iters: int = 5
    warmup: int = 1
    trials: int = 3
    timeout_s: float = 60.0
    slow_fraction: float = SLOW_FRACTION


def measure_compute(device: Any, seconds: float = COMPUTE_SECONDS) -> float:
    """Matmul GFLOP/s on this node's device, timed for about `seconds`.

    Equivalent: python -c 'import torch; a = torch.randn(N, N); a @ a' in a timed loop.
    """
    import torch

    cuda = device.type == "cuda"
    n = 4096 if cuda else 256
    dtype = torch.float16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    a @ b  # warm up (kernel selection, caches)
    sync()
    count, start = 0, time.perf_counter()
    while True:
        for _ in range(4):
            a @ b
        count += 4
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * n**3 * count / elapsed / 1e9


def _send_timed(buf: Any, ack: Any, peer: int, iters: int, device: Any) -> float:
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    for _ in range(iters):
        dist.send(buf, dst=peer)
    dist.recv(ack, src=peer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _recv_all(buf: Any, ack: Any, peer: int, iters: int) -> None:
    import torch.distributed as dist

    for _ in range(iters):
        dist.recv(buf, src=peer)
    dist.send(ack, dst=peer)


def measure_pair(me: int, peer: int, first: bool, settings: PairwiseSettings, device: Any) -> Optional[float]:
    """Both directions of one pair; returns MB/s from me to peer (None on the receiving side)."""
    import torch

    buf = torch.empty(max(settings.nbytes // 4, 1), dtype=torch.float32, device=device)
    ack = torch.zeros(1, dtype=torch.float32, device=device)
    nbytes = buf.numel() * 4
    mine: Optional[float] = None
    # The lower index sends first; warmup runs once per direction, untimed.
    for sender_is_me in (True, False) if first else (False, True):
        if sender_is_me:
            if settings.warmup:
                _send_timed(buf, ack, peer, settings.warmup, device)
            # Best of a few trials: a scheduler hiccup slows one trial, a bad link slows them all.
            seconds = min(_send_timed(buf, ack, peer, settings.iters, device) for _ in range(settings.trials))
            mine = nbytes * settings.iters / seconds / 1e6 if seconds > 0 else None
        else:
            if settings.warmup:
                _recv_all(buf, ack, peer, settings.warmup)
            for _ in range(settings.trials):
                _recv_all(buf, ack, peer, settings.iters)
    return mine


@dataclass
class PairwiseOutcome:
    rank: int
    analysis: Optional[PairwiseAnalysis]  # rank 0 only
    exit_code: int
    settings: PairwiseSettings
    backend: str = ""
    error: str = ""
    local_rank: int = 0
    refusals: list[Finding] = field(default_factory=list)  # refused before init_process_group
    notes: list[str] = field(default_factory=list)


def choose_backend(
    entries: Sequence[Mapping[str, Any]], backend: str
) -> tuple[str, list[str], list[Finding]]:
    """(backend, notes, refusals) from every rank's {host, visible, cuda} (pure, so that every rank
    picks the same). Ranks on one host share its GPUs: with more of them than GPUs, NCCL would give a
    matrix of failed pairs, so auto picks gloo with a note and an explicit nccl is refused."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for e in entries:
        by_host.setdefault(str(e.get("host")), []).append(e)
    crowded: list[Finding] = []
    for host, on_host in sorted(by_host.items()):
        counts = [e.get("visible") for e in on_host]
        visible = None if any(not isinstance(c, int) for c in counts) else min(counts)
        ranks = LocalRanks(len(on_host), f"counted on host {host}", "torchrun")
        supply = GpuSupply(visible, "nvidia-smi", why_unknown="no GPU found")
        crowded += [f for f in judge_placement(ranks, supply, "nccl") if f.severity >= Severity.FAIL]
        # Separate agents on one host (containers, the loopback tests) each number their workers from
        # LOCAL_RANK 0: with NCCL they would all use cuda:0 however many GPUs the host has.
        local_ranks = [e.get("local_rank") for e in on_host]
        shared = sorted({lr for lr in local_ranks if isinstance(lr, int) and local_ranks.count(lr) > 1})
        if shared and not crowded:
            crowded.append(
                PLACEMENT.finding(
                    Severity.FAIL,
                    f"{len(on_host)} ranks on host {host} share LOCAL_RANK {shared[0]} (separate launchers on one "
                    f"host): with NCCL they would all use cuda:{shared[0]} and fail with 'Duplicate GPU detected'",
                    evidence=[Evidence("LOCAL_RANK of every rank on the host", str(local_ranks))],
                    fix="Start one launcher per host (torchrun --nproc-per-node N), or use --backend gloo.",
                    data={"host": host, "local_ranks": local_ranks},
                )
            )
    if backend == "auto":
        if entries and all(e.get("cuda") for e in entries) and not crowded:
            return "nccl", [], []
        why = crowded[0].summary if crowded else "not every rank has a CUDA build of torch and a visible GPU"
        return "gloo", [f"backend gloo on CPU: {why}"], []
    if backend == "nccl" and crowded:
        return backend, [], crowded
    return backend, [], []


def _placement_entry(env: Mapping[str, str], local_rank: int) -> dict[str, Any]:
    """This rank's host and GPUs, for choose_backend (the I/O: nvidia-smi, or the test-only stand-in)."""
    import socket

    from ddpdoctor.bench.preflight import gather_launch_facts, gpu_supply
    from ddpdoctor.edge.runner import run_argv

    facts = gather_launch_facts(
        lambda c: run_argv(c.argv, c.timeout_s), {k: v for k, v in env.items() if k != "MASTER_PORT"}
    )
    visible = gpu_supply(facts).visible
    return {
        "host": socket.gethostname(),
        "visible": visible,
        "cuda": bool(facts.torch_cuda) and bool(visible),
    }


def agree_on_backend(
    store: Any, info: Any, backend: str, env: Mapping[str, str], timeout_s: float
) -> tuple[str, list[str], list[Finding]]:
    """Every rank publishes its entry through the launcher's store and judges all of them the same way,
    before init_process_group (a rank that never publishes is left out; init then names it)."""
    from ddpdoctor.cluster.membership import Channel

    channel = Channel(store)
    channel.set_json(f"placement/{info.rank}", _placement_entry(env, info.local_rank))
    deadline = time.monotonic() + max(timeout_s, 1.0)
    entries = []
    for r in range(info.world_size):
        if channel.wait_for(f"placement/{r}", deadline) is not None:
            entries.append(channel.get_json(f"placement/{r}") or {})
    return choose_backend(entries, backend)


def run_pairwise(
    settings: PairwiseSettings, backend: str = "auto", env: Optional[Mapping[str, str]] = None
) -> PairwiseOutcome:
    """Join the launcher's job, measure every node pair, analyze on rank 0; every rank gets the exit code.

    Raises ClusterUsageError when not started by torchrun/srun.
    """
    import os

    import torch
    import torch.distributed as dist

    from ddpdoctor.cluster.collectives import all_gather_json, gather_json
    from ddpdoctor.cluster.membership import open_store
    from ddpdoctor.cluster.session import make_identity, require_launch
    from ddpdoctor.cluster.topology import group_by_node
    from ddpdoctor.core.model import ExitCode

    info = require_launch(os.environ if env is None else env)
    store = dist.PrefixStore("pairwise", open_store(info, settings.timeout_s))
    asked = backend
    backend, notes, refusals = agree_on_backend(
        store, info, asked, os.environ if env is None else env, settings.timeout_s
    )
    if refusals:
        return PairwiseOutcome(
            info.rank,
            None,
            int(ExitCode.USAGE),
            settings,
            backend,
            local_rank=info.local_rank,
            refusals=refusals,
        )
    if asked == "auto" and backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        backend, notes = (
            "gloo",
            [*notes, "backend gloo on CPU: torch cannot use CUDA or NCCL in this process"],
        )
    if settings.nbytes <= 0:
        settings = dataclasses.replace(settings, nbytes=DEFAULT_BYTES.get(backend, DEFAULT_BYTES["gloo"]))
    from ddpdoctor.bench.worker import select_device

    # The device the placement judgement expects (under srun's per-task binding: the task's own GPU).
    device = select_device(backend, info.local_rank)
    timeout = timedelta(seconds=settings.timeout_s)
    dist.init_process_group(backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout)
    try:
        # Control traffic (identities, results, the exit code) on CPU tensors: a gloo group.
        ctrl = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        identities = all_gather_json(make_identity(info).to_dict(), group=ctrl)
        topo = group_by_node([i for i in identities if isinstance(i, dict)])
        leaders = topo.leaders
        leader_ctrl = dist.new_group(leaders, backend="gloo", timeout=timeout)
        result: dict[str, Any] = {}
        if info.rank in leaders:
            me = leaders.index(info.rank)
            result = {"node": me, "compute_gflops": measure_compute(device), "to": {}}
            for round_pairs in schedule_rounds(len(leaders)):
                for a, b in round_pairs:
                    if me in (a, b):
                        peer = b if me == a else a
                        try:
                            mbps = measure_pair(me, leaders[peer], me == a, settings, device)
                        except Exception as exc:  # noqa: BLE001 - a failed pair is a finding
                            mbps = None
                            errors = result.setdefault("errors", {})
                            errors[str(peer)] = f"{type(exc).__name__}: {exc}"[:500]
                        result["to"][str(peer)] = mbps
                dist.barrier(group=leader_ctrl)
            gathered = gather_json(result, dst=0, group=leader_ctrl)
        else:
            gathered = None
        analysis = None
        code = torch.zeros(1, dtype=torch.int64)
        if info.rank == 0 and gathered is not None:
            analysis = assemble(list(topo.labels), gathered, settings.slow_fraction)
            code[0] = (
                int(ExitCode.FAILED)
                if any(f.severity == Severity.FAIL for f in analysis.findings)
                else (
                    int(ExitCode.INCONCLUSIVE)
                    if any(f.severity == Severity.ERROR for f in analysis.findings)
                    else 0
                )
            )
        # Every rank exits with rank 0's verdict (torchrun agents otherwise wait in their exit barrier).
        dist.broadcast(code, src=0, group=ctrl)
        return PairwiseOutcome(
            info.rank,
            analysis,
            int(code[0].item()),
            settings,
            backend,
            local_rank=info.local_rank,
            notes=notes,
        )
    finally:
        dist.destroy_process_group()


def assemble(labels: list[str], gathered: Sequence[Any], slow_fraction: float) -> PairwiseAnalysis:
    """Per-leader results (rank order of the leader group) -> the matrix, then analyze_pairwise."""
    n = len(labels)
    matrix: list[list[Optional[float]]] = [[None] * n for _ in range(n)]
    compute: dict[str, Optional[float]] = {label: None for label in labels}
    for item in gathered:
        if not isinstance(item, dict) or not isinstance(item.get("node"), int):
            continue
        i = item["node"]
        if not 0 <= i < n:
            continue
        gf = item.get("compute_gflops")
        compute[labels[i]] = float(gf) if isinstance(gf, (int, float)) else None
        for peer, mbps in (item.get("to") or {}).items():
            try:
                j = int(peer)
            except ValueError:
                continue
            if 0 <= j < n and isinstance(mbps, (int, float)):
                matrix[i][j] = float(mbps)
    return analyze_pairwise(labels, matrix, compute, slow_fraction)
