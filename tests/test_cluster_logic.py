"""Cluster mode's pure parts: hostlists, launcher detection, membership states, cross-node judging,
round-robin scheduling, pairwise outliers, topology, and the renderers."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.cluster.facts import (
    read_collective_env,
    summarize_hca,
    summarize_nvml,
)
from ddpdoctor.cluster.hostlist import expand_hostlist
from ddpdoctor.cluster.judge import (
    compare_env,
    find_outliers,
    judge_cluster,
    strict_majority,
)
from ddpdoctor.cluster.launch import LaunchError, detect_launch, slurm_master_port
from ddpdoctor.cluster.membership import (
    NEVER_JOINED,
    PENDING,
    READY,
    SILENT,
    RankWatch,
    classify_rank,
    name_absent,
)
from ddpdoctor.cluster.pairwise import analyze_pairwise, assemble, schedule_rounds
from ddpdoctor.cluster.report import (
    LOST,
    MISSING,
    REPORTED,
    ClusterReport,
    NodeIdentity,
    NodeResult,
    finding_from_dict,
)
from ddpdoctor.cluster.session import ClusterOutcome, print_rank_message
from ddpdoctor.cluster.topology import group_by_node
from ddpdoctor.core.model import Evidence, Severity, define
from ddpdoctor.edge.sysfs_ib import read_infiniband_sysfs

# ---------------------------------------------------------------------------------------------
# Slurm hostlists


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[01-04,7]", ["node01", "node02", "node03", "node04", "node7"]),
        ("gpu-a17", ["gpu-a17"]),
        ("n1,n2,n3", ["n1", "n2", "n3"]),
        ("gpu[1-2],cpu[009-011]", ["gpu1", "gpu2", "cpu009", "cpu010", "cpu011"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("rack[1-2]-ib", ["rack1-ib", "rack2-ib"]),
        ("a[8-10]", ["a8", "a9", "a10"]),
        ("a[098-101]", ["a098", "a099", "a100", "a101"]),
        (" node[1,3] ", ["node1", "node3"]),
        ("", []),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text", ["node[1-", "node]1[", "node[3-1]", "node[a-b]", "n[[1]]", "node[1-999999999]"]
)
def test_expand_hostlist_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab01-9[],. x", max_size=30))
def test_expand_hostlist_never_crashes(text: str) -> None:
    try:
        hosts = expand_hostlist(text)
    except ValueError:
        return
    assert all(isinstance(h, str) and h for h in hosts)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)), min_size=1, max_size=5))
def test_expand_hostlist_counts_ranges(ranges: list[tuple[int, int]]) -> None:
    body = ",".join(f"{lo}-{lo + span}" for lo, span in ranges)
    hosts = expand_hostlist(f"n[{body}]")
    assert len(hosts) == sum(span + 1 for _, span in ranges)
    assert hosts[0] == f"n{ranges[0][0]}"


# ---------------------------------------------------------------------------------------------
# Launcher detection


def test_detect_torchrun() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "job7",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    info = detect_launch(env)
    assert info is not None
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.node_rank) == (
        "torchrun",
        3,
        4,
        1,
        1,
    )
    assert info.use_agent_store and info.store_prefix == "ddpdoctor/job7/2"


def test_detect_slurm_derives_master_from_nodelist() -> None:
    env = {
        "SLURM_PROCID": "2",
        "SLURM_NTASKS": "4",
        "SLURM_NODEID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "gpu[07-09,12]",
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "3",
    }
    info = detect_launch(env)
    assert info is not None
    assert info.launcher == "slurm" and info.master_addr == "gpu07"
    assert info.expected_hosts == ("gpu07", "gpu08", "gpu09", "gpu12")
    assert info.master_port == slurm_master_port(env) == 20000 + (123456 + 3) % 20000
    assert info.node_rank == 2 and not info.use_agent_store


def test_slurm_respects_explicit_master() -> None:
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "MASTER_ADDR": "10.1.1.1",
        "MASTER_PORT": "29400",
    }
    info = detect_launch(env)
    assert info is not None and (info.master_addr, info.master_port) == ("10.1.1.1", 29400)


def test_torchrun_wins_over_slurm() -> None:
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1234",
        "GROUP_RANK": "0",
    }
    info = detect_launch(env)
    assert info is not None and info.launcher == "torchrun" and info.rank == 5


def test_no_launcher_is_none() -> None:
    assert detect_launch({"HOME": "/root", "SLURM_JOB_ID": "5"}) is None


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "0", "WORLD_SIZE": "2"},  # no MASTER_ADDR/PORT
        {"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
        {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},  # no nodelist, no MASTER_ADDR
    ],
)
def test_bad_launcher_environment(env: dict[str, str]) -> None:
    with pytest.raises(LaunchError):
        detect_launch(env)


def test_check_cluster_without_launcher_is_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    res = CliRunner().invoke(app, ["check", "--cluster", "--only", "system"])
    assert res.exit_code == 2
    assert "torchrun" in res.stderr and "srun" in res.stderr


def test_bench_pairwise_without_launcher_is_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    res = CliRunner().invoke(app, ["bench-nccl", "--pairwise"])
    assert res.exit_code == 2
    assert "between nodes" in res.stderr


# ---------------------------------------------------------------------------------------------
# Membership


def test_classify_rank_states() -> None:
    now = 100.0
    w = RankWatch(rank=1)
    assert classify_rank(w, now, join_deadline=120, check_timeout_s=30)[0] == PENDING
    assert classify_rank(w, now, join_deadline=90, check_timeout_s=30)[0] == NEVER_JOINED
    w = RankWatch(rank=1, joined_at=95.0, beat_changed_at=99.0)
    assert classify_rank(w, now, join_deadline=90, check_timeout_s=30, lost_after_s=10)[0] == PENDING
    state, why = classify_rank(w, 110.0, join_deadline=90, check_timeout_s=30, lost_after_s=10)
    assert state == SILENT and "heartbeat" in why
    # Beating but never done: stuck, also lost once its checks' bound has passed.
    w = RankWatch(rank=1, joined_at=0.0, beat_changed_at=99.5)
    state, why = classify_rank(w, now, join_deadline=90, check_timeout_s=30, lost_after_s=10)
    assert state == SILENT and "stuck" in why
    w = RankWatch(rank=1, joined_at=0.0, ready=True)
    assert classify_rank(w, 1e9, join_deadline=0, check_timeout_s=1)[0] == READY


def _ident(rank: int, host: str, node_rank: int | None = None) -> NodeIdentity:
    return NodeIdentity(rank=rank, hostname=host, node_rank=rank if node_rank is None else node_rank)


def test_name_absent_one_task_per_host() -> None:
    joined = {0: _ident(0, "gpu01.cluster"), 1: _ident(1, "gpu02")}
    ranks, hosts = name_absent([2], joined, ["gpu01", "gpu02", "gpu03"], 3, "SLURM_JOB_NODELIST")
    assert ranks == {2: ("node 2 (gpu03)", "rank 2, expected on gpu03 per SLURM_JOB_NODELIST")}
    assert hosts == []


def test_name_absent_lists_hosts_without_ranks() -> None:
    # torchrun elastic: 2 of 3 expected hosts formed the job; the third is named from --hosts.
    joined = {0: _ident(0, "a1"), 1: _ident(1, "a3")}
    ranks, hosts = name_absent([], joined, ["a1", "a2", "a3"], 2, "--hosts")
    assert ranks == {}
    assert hosts == [("host a2", "listed in --hosts but no rank from it joined")]
    # Several tasks per host: missing ranks by number, hosts by name.
    ranks, hosts = name_absent([3], {0: _ident(0, "a1")}, ["a1", "a2"], 4, "SLURM_JOB_NODELIST")
    assert ranks == {3: ("rank 3", "never published its identity")}
    assert [h for h, _ in hosts] == ["host a2"]


# ---------------------------------------------------------------------------------------------
# Cross-node judging


def test_strict_majority_and_outliers() -> None:
    assert strict_majority(["a", "a", "b"]) == "a"
    assert strict_majority(["a", "b"]) is None
    assert strict_majority([]) is None
    assert find_outliers({"n0": 8, "n1": 8, "n2": 7, "n3": 8}) == (8, ["n2"])
    assert find_outliers({"n0": 1, "n1": 1}) == (1, [])
    assert find_outliers({"n0": 1, "n1": 2}) == (None, ["n0", "n1"])


def _node(label: str, facts: dict, findings=(), status: str = REPORTED) -> NodeResult:
    ident = NodeIdentity(rank=int(label[-1]), hostname=f"h{label[-1]}", node_rank=int(label[-1]))
    return NodeResult(label=label, status=status, identity=ident, facts=facts, findings=list(findings))


BASE = {
    "torch": "2.4.0",
    "nccl": "2.21.5",
    "cuda_build": "12.4",
    "driver": "550.90.07",
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpu_count": 8,
    "hca_model": "MT4129",
    "hca_firmware": "28.39.1002",
    "ib_rate": "400 Gb/s",
    "ib_ports_active": 8,
    "kernel": "5.15.0-105-generic",
    "python": "3.11.7",
    "env": {"NCCL_IB_HCA": "mlx5"},
}


def _by_id(findings):
    out: dict[str, list] = {}
    for f in findings:
        out.setdefault(f.id, []).append(f)
    return out


def test_identical_nodes_agree() -> None:
    nodes = [_node(f"node {i}", dict(BASE)) for i in range(4)]
    findings = judge_cluster(nodes, join_timeout_s=60)
    assert [f.id for f in findings] == ["cluster.consistent"]
    assert findings[0].severity == Severity.OK and "4 node(s) agree" in findings[0].summary


def test_version_and_hardware_outliers_are_named() -> None:
    nodes = [_node(f"node {i}", dict(BASE)) for i in range(4)]
    nodes[2].facts.update(nccl="2.18.1", gpu_count=7)
    nodes[3].facts.update(ib_rate="200 Gb/s", driver="535.161.08")
    by_id = _by_id(judge_cluster(nodes, join_timeout_s=60))
    nccl = by_id["cluster.mismatch.nccl"][0]
    assert nccl.severity == Severity.FAIL
    assert nccl.data["outliers"] == ["node 2"] and nccl.data["majority"] == "2.21.5"
    assert "node 2 has 2.18.1 where 3 of 4 nodes have 2.21.5" in nccl.summary
    gpus = by_id["cluster.outlier.gpu_count"][0]
    assert gpus.severity == Severity.FAIL and gpus.data["outliers"] == ["node 2"]
    assert by_id["cluster.outlier.ib_rate"][0].data["outliers"] == ["node 3"]
    assert by_id["cluster.mismatch.driver"][0].severity == Severity.WARN
    assert "cluster.consistent" not in by_id
    assert "cluster.mismatch.torch" not in by_id


def test_split_without_majority_lists_groups() -> None:
    nodes = [_node(f"node {i}", dict(BASE)) for i in range(4)]
    nodes[0].facts["torch"] = nodes[1].facts["torch"] = "2.3.1"
    f = _by_id(judge_cluster(nodes, 60))["cluster.mismatch.torch"][0]
    assert f.data["majority"] is None and "no majority" in f.summary
    assert "2.3.1 on node 0, node 1" in f.summary and "2.4.0 on node 2, node 3" in f.summary


def test_unknown_facts_everywhere_are_not_compared() -> None:
    cpu = {k: None for k in BASE}
    cpu.update(torch="2.4.0", kernel="6.1", python="3.11.7", gpu_count=0, env={})
    nodes = [_node(f"node {i}", dict(cpu)) for i in range(3)]
    assert [f.id for f in judge_cluster(nodes, 60)] == ["cluster.consistent"]
    # One node whose driver cannot be read among nodes that have one: that node is named.
    nodes = [_node(f"node {i}", dict(BASE)) for i in range(3)]
    nodes[1].facts["driver"] = None
    f = _by_id(judge_cluster(nodes, 60))["cluster.mismatch.driver"][0]
    assert f.data["outliers"] == ["node 1"] and "unknown" in f.summary


def test_env_mismatch_names_variable_and_node() -> None:
    nodes = [_node(f"node {i}", dict(BASE)) for i in range(3)]
    nodes[1].facts["env"] = {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth9"}
    findings = compare_env(nodes)
    assert len(findings) == 1 and findings[0].id == "cluster.env.mismatch"
    assert "NCCL_SOCKET_IFNAME on node 1 (eth9; most nodes: <unset>)" in findings[0].summary
    assert set(findings[0].data["variables"]) == {"NCCL_SOCKET_IFNAME"}


def test_collective_env_is_filtered_and_redacted() -> None:
    env = {
        "NCCL_DEBUG": "INFO",
        "HOME": "/root",
        "NCCL_COMM_ID": "h:1",
        "UCX_TLS": "rc",
        "FI_TOKEN": "s3cret",
    }
    assert read_collective_env(env) == {"FI_TOKEN": "<redacted>", "NCCL_DEBUG": "INFO", "UCX_TLS": "rc"}


SPEC = define("test.cluster.local", "Local thing", "why")


def test_failed_and_inconclusive_nodes_and_membership() -> None:
    bad = SPEC.finding(Severity.FAIL, "broken", evidence=[Evidence("x")])
    err = SPEC.finding(Severity.ERROR, "timed out")
    nodes = [
        _node("node 0", dict(BASE)),
        _node("node 1", dict(BASE), [bad]),
        _node("node 2", dict(BASE), [err]),
        NodeResult(label="node 3 (gpu04)", status=MISSING, detail="rank 3, expected on gpu04"),
        NodeResult(label="node 4 (h4)", status=LOST, identity=_ident(4, "h4"), detail="no heartbeat for 12s"),
    ]
    by_id = _by_id(judge_cluster(nodes, join_timeout_s=45))
    assert by_id["cluster.node.failed_checks"][0].data["node"] == "node 1"
    assert by_id["cluster.node.inconclusive"][0].severity == Severity.ERROR
    missing = by_id["cluster.node.missing"][0]
    assert missing.severity == Severity.FAIL and "node 3 (gpu04) never joined within 45s" in missing.summary
    lost = by_id["cluster.node.lost"][0]
    assert "node 4 (h4)" in lost.summary and lost.data["identity"]["hostname"] == "h4"


def test_finding_round_trip_and_report_exit_code() -> None:
    f = SPEC.finding(Severity.WARN, "s", evidence=[Evidence("cmd", "out")], data={"k": 1})
    assert finding_from_dict(f.to_dict()) == f
    assert finding_from_dict({"severity": "bogus"}).severity == Severity.ERROR
    report = ClusterReport(
        launcher="torchrun", world_size=2, nodes=[_node("node 0", dict(BASE), [f])], findings=[]
    )
    assert int(report.exit_code()) == 0 and int(report.exit_code(strict=True)) == 1
    data = report.to_dict()
    assert data["schema"] == "ddpdoctor.cluster/1" and data["counts"]["warn"] == 1
    json.dumps(data)


def test_cluster_json_writes_no_fix_as_null_like_check_json() -> None:
    ok = SPEC.finding(Severity.OK, "fine")
    warn = SPEC.finding(Severity.WARN, "s", fix="do this")
    report = ClusterReport(
        launcher="torchrun", world_size=2, nodes=[_node("node 0", dict(BASE), [ok, warn])], findings=[ok]
    )
    data = report.to_dict()
    assert data["findings"][0]["fix"] is None
    assert [f["fix"] for f in data["nodes"][0]["findings"]] == [None, "do this"]
    # A node's payload, or a report read back, with a null fix is a finding without one (not "None").
    assert finding_from_dict({**ok.to_json(), "fix": None}) == ok


# ---------------------------------------------------------------------------------------------
# Key facts from their sources


def test_summarize_nvml() -> None:
    ok = {
        "available": True,
        "driver_version": "550.90.07",
        "device_count": 2,
        "gpus": [{"name": "NVIDIA H100 80GB HBM3"}, {"name": "NVIDIA H100 80GB HBM3"}],
    }
    assert summarize_nvml(ok) == {"driver": "550.90.07", "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 2}
    none = {"available": False, "error": {"kind": "library_not_found"}}
    assert summarize_nvml(none)["gpu_count"] == 0
    broken = {"available": False, "error": {"kind": "driver_mismatch"}}
    assert summarize_nvml(broken)["gpu_count"] is None


def _write_port(root: Path, dev: str, port: int, state: str, rate: str, layer: str = "InfiniBand") -> None:
    d = root / "sys/class/infiniband" / dev
    (d / "ports" / str(port)).mkdir(parents=True, exist_ok=True)
    (d / "hca_type").write_text("MT4129\n")
    (d / "fw_ver").write_text("28.39.1002\n")
    (d / "ports" / str(port) / "state").write_text(state + "\n")
    (d / "ports" / str(port) / "rate").write_text(rate + "\n")
    (d / "ports" / str(port) / "link_layer").write_text(layer + "\n")
    (d / "ports" / str(port) / "phys_state").write_text("5: LinkUp\n")


def test_summarize_hca_from_sysfs_tree(tmp_path: Path) -> None:
    _write_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "400 Gb/sec (4X NDR)")
    _write_port(tmp_path, "mlx5_1", 1, "4: ACTIVE", "200 Gb/sec (4X HDR)")
    _write_port(tmp_path, "mlx5_2", 1, "1: DOWN", "10 Gb/sec (4X SDR)")
    _write_port(tmp_path, "mlx5_3", 1, "4: ACTIVE", "100 Gb/sec (4X EDR)", layer="Ethernet")
    facts = summarize_hca(read_infiniband_sysfs(tmp_path))
    assert facts == {
        "hca_model": "MT4129",
        "hca_firmware": "28.39.1002",
        "ib_rate": "200 Gb/s + 400 Gb/s",
        "ib_ports_active": 2,
    }
    assert summarize_hca(read_infiniband_sysfs(tmp_path / "none"))["ib_rate"] is None


# ---------------------------------------------------------------------------------------------
# Round-robin schedule


@pytest.mark.parametrize("n", list(range(0, 18)) + [31, 64])
def test_schedule_rounds_covers_every_pair_once(n: int) -> None:
    rounds = schedule_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for r in rounds:
        seen = [i for p in r for i in p]
        assert len(seen) == len(set(seen)), f"a node twice in round {r}"
    if n >= 2:
        assert len(rounds) == (n - 1 if n % 2 == 0 else n)


# ---------------------------------------------------------------------------------------------
# Pairwise outliers


def _matrix(n: int, fast: float = 10000.0, slow_pairs=(), slow_value: float = 800.0):
    m = [[None if i == j else fast for j in range(n)] for i in range(n)]
    for i, j in slow_pairs:
        m[i][j] = m[j][i] = slow_value
    return m


def test_bad_node_is_named_not_its_links() -> None:
    nodes = ["n0", "n1", "n2"]
    m = _matrix(3, slow_pairs=[(0, 2), (1, 2)])
    a = analyze_pairwise(nodes, m, {"n0": 50.0, "n1": 52.0, "n2": 49.0})
    assert a.reference_mbps == 10000.0
    assert a.slow_nodes == ["n2"] and a.bad_links == []
    ids = [f.id for f in a.findings]
    assert ids == ["cluster.pairwise.slow_node"]
    assert "compute rate is normal" in a.findings[0].summary


def test_bad_link_is_named_not_its_nodes() -> None:
    nodes = [f"n{i}" for i in range(4)]
    m = _matrix(4, slow_pairs=[(1, 3)])
    a = analyze_pairwise(nodes, m, {n: 50.0 for n in nodes})
    assert a.slow_nodes == [] and a.bad_links == [(1, 3)]
    assert [f.id for f in a.findings] == ["cluster.pairwise.slow_link"]
    assert "n1 <-> n3" in a.findings[0].summary


def test_asymmetric_direction_counts_as_slow() -> None:
    nodes = [f"n{i}" for i in range(4)]
    m = _matrix(4)
    m[0][2] = 500.0  # one direction only: a bad transmit path
    a = analyze_pairwise(nodes, m, {})
    assert a.bad_links == [(0, 2)]


def test_slow_node_with_slow_compute() -> None:
    nodes = [f"n{i}" for i in range(5)]
    m = _matrix(5, slow_pairs=[(4, j) for j in range(4)])
    a = analyze_pairwise(nodes, m, {"n0": 100.0, "n1": 98.0, "n2": 103.0, "n3": 101.0, "n4": 20.0})
    assert a.slow_nodes == ["n4"] and a.slow_compute == ["n4"]
    ids = sorted(f.id for f in a.findings)
    assert ids == ["cluster.pairwise.slow_compute", "cluster.pairwise.slow_node"]
    assert "compute is slow too" in next(f for f in a.findings if f.id.endswith("slow_node")).summary


def test_healthy_pairs_and_noise_below_threshold() -> None:
    nodes = [f"n{i}" for i in range(4)]
    m = _matrix(4)
    m[0][1] = m[1][0] = 6000.0  # 60% of the reference: above the 50% threshold
    a = analyze_pairwise(nodes, m, {n: 10.0 for n in nodes})
    assert [f.id for f in a.findings] == ["cluster.pairwise.ok"]
    assert a.findings[0].severity == Severity.OK


def test_two_nodes_cannot_localize_and_failed_pair() -> None:
    a = analyze_pairwise(["a", "b"], _matrix(2), {})
    assert [f.id for f in a.findings] == ["cluster.pairwise.too_few_nodes"]
    m = _matrix(3)
    m[0][1] = m[1][0] = None
    a = analyze_pairwise(["a", "b", "c"], m, {})
    failed = [f for f in a.findings if f.id == "cluster.pairwise.failed"]
    assert failed and failed[0].severity == Severity.ERROR and "a <-> b" in failed[0].summary


def test_assemble_from_gathered_results_ignores_garbage() -> None:
    gathered = [
        {"node": 0, "compute_gflops": 10.0, "to": {"1": 900.0, "2": 910.0}},
        {"node": 1, "compute_gflops": 11.0, "to": {"0": 905.0, "2": 100.0, "x": 1}},
        {"node": 2, "compute_gflops": None, "to": {"0": 899.0, "1": 90.0}},
        "garbage",
        {"node": 9},
    ]
    a = assemble(["a", "b", "c"], gathered, 0.5)
    assert a.matrix_mbps[1][2] == 100.0 and a.matrix_mbps[2][1] == 90.0
    assert a.compute_gflops == {"a": 10.0, "b": 11.0, "c": None}
    assert a.bad_links == [(1, 2)]


# ---------------------------------------------------------------------------------------------
# Topology


def test_group_by_node_keeps_agents_on_one_host_apart() -> None:
    idents = [
        {"rank": 3, "hostname": "vm", "node_rank": 1, "local_rank": 1},
        {"rank": 0, "hostname": "vm", "node_rank": 0, "local_rank": 0},
        {"rank": 2, "hostname": "vm", "node_rank": 1, "local_rank": 0},
        {"rank": 1, "hostname": "vm", "node_rank": 0, "local_rank": 1},
    ]
    topo = group_by_node(idents)
    assert topo.nodes == ((0, 1), (2, 3))
    assert topo.leaders == [0, 2] and topo.labels == ("node 0 (vm)", "node 1 (vm)")
    assert topo.node_of(3) == 1 and topo.spans_nodes


def test_group_by_node_without_node_rank_uses_hostname() -> None:
    idents = [{"rank": r, "hostname": "ab"[r % 2]} for r in range(4)]
    topo = group_by_node(idents)
    assert topo.nodes == ((0, 2), (1, 3)) and topo.labels == ("a", "b")


# ---------------------------------------------------------------------------------------------
# Rendering


def test_render_cluster_report_and_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    from ddpdoctor.render.cluster import render_cluster_report, render_pairwise

    nodes = [_node(f"node {i}", dict(BASE)) for i in range(3)]
    nodes[2].facts["nccl"] = "2.18.1"
    nodes.append(NodeResult(label="node 3 (gpu04)", status=MISSING, detail="rank 3, expected on gpu04"))
    report = ClusterReport("slurm", 4, nodes, judge_cluster(nodes, 30))
    render_cluster_report(report)
    out = capsys.readouterr().out
    assert "3 of 4 nodes reported" in out
    for label in ("node 0", "node 1", "node 2", "node 3 (gpu04)"):
        assert label in out
    assert "2.18.1" in out and "NCCL version differs" in out and "never joined" in out
    assert re.search(r"Summary: .*-> exit 1", out)
    a = analyze_pairwise(["n0", "n1", "n2"], _matrix(3, slow_pairs=[(0, 2), (1, 2)]), {"n0": 1.0})
    render_pairwise({**a.to_dict(), "bytes": 2**20}, a.findings)
    out = capsys.readouterr().out
    assert "10.00 GB/s" in out and "800 MB/s" in out and "Slow node" in out


def test_one_node_pairwise_is_inconclusive_not_a_1x1_pass(capsys: pytest.CaptureFixture[str]) -> None:
    from ddpdoctor.render.cluster import render_pairwise

    a = assemble(["node 0 (h)"], [{"node": 0, "compute_gflops": 12.5, "to": {}}], 0.5)
    assert [f.id for f in a.findings] == ["cluster.pairwise.one_node"]
    assert a.findings[0].severity == Severity.ERROR  # exit 3 (inconclusive) in run_pairwise
    assert "one node" in a.findings[0].summary and "no pair of nodes to measure" in a.findings[0].summary
    render_pairwise({**a.to_dict(), "bytes": 2**20}, a.findings)
    out = capsys.readouterr().out
    assert "reference -" not in out and "no pair of nodes to measure" in out


def test_expected_host_without_rank_is_named_without_a_wait() -> None:
    node = NodeResult(
        label="host a2",
        status=MISSING,
        detail="listed in --hosts but no rank from it joined",
        expected_only=True,
    )
    f = _by_id(judge_cluster([_node("node 0", dict(BASE)), node], 30))["cluster.node.missing"][0]
    assert f.summary == "host a2 never joined (listed in --hosts but no rank from it joined)"


def test_name_absent_when_node_names_are_not_host_names() -> None:
    # Slurm node names that are not host names (e.g. AWS ParallelCluster "queue-dy-p4d-1"): every rank
    # joined from host "ip-10-0-0-5", so no node is absent.
    joined = {0: _ident(0, "ip-10-0-0-5")}
    assert name_absent([], joined, ["queue-dy-p4d-1"], 1, "SLURM_JOB_NODELIST") == ({}, [])
    # A rank is missing: it is named by number, not by a node name that may be wrong.
    ranks, hosts = name_absent([1], joined, ["queue-dy-p4d-1", "queue-dy-p4d-2"], 2, "SLURM_JOB_NODELIST")
    assert ranks == {1: ("rank 1", "never published its identity")} and hosts == []


def test_bad_peer_payload_in_the_store_is_no_data_not_a_crash() -> None:
    import time

    torch_dist = pytest.importorskip("torch.distributed")
    from ddpdoctor.cluster.membership import Channel, payload_key
    from ddpdoctor.cluster.session import collect_from_store

    # A real store (torch's in-process HashStore, the same API as the TCPStore between nodes).
    channel = Channel(torch_dist.HashStore())
    channel.set(payload_key(1), "[" * 200_000)  # json.loads raises RecursionError on this
    channel.set(payload_key(2), "[" * 70 + "]" * 70)  # parses, but nests past the edge limit
    channel.set(payload_key(3), "{not json")
    channel.set_json(payload_key(4), {"facts": {}, "findings": []})
    assert channel.get_json(payload_key(1)) is None
    got = collect_from_store(channel, [1, 2, 3, 4], time.monotonic() + 0.3)
    assert got == {4: {"facts": {}, "findings": []}}


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (
            ClusterOutcome(1, None, 1),
            "ddpdoctor rank 1: exit 1, the verdict of the whole job: rank 0's output",
        ),
        (
            ClusterOutcome(2, None, 3, "rank 0 published no result"),
            "ddpdoctor rank 2: rank 0 published no result",
        ),
        (ClusterOutcome(3, None, 0), ""),
    ],
)
def test_a_rank_that_exits_non_zero_says_why_on_its_own_stderr(
    outcome: ClusterOutcome, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    print_rank_message(outcome)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(expected) and (expected or captured.err == "")
