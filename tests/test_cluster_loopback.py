"""Cluster mode end to end: 2-3 "nodes" as separate real torchrun agents on 127.0.0.1 (c10d rendezvous).

Each agent is a real `python -m torch.distributed.run ... -m ddpdoctor ...`; the ranks join over a real
TCPStore and gloo. Nothing leaves loopback.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import time
import uuid
from pathlib import Path

import jsonschema
import psutil
from _cluster_agents import Agents, agent_env, describe, find_json, torchrun_argv, wait_listening

from ddpdoctor.edge.ports import pick_free_port

# Bounds on a whole multi-agent run: generous for a loaded 2-core CI machine, far below a hang.
RUN_TIMEOUT_S = 120
BENCH_SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "schemas" / "bench.schema.json"


def start_agents(
    agents: Agents, n: int, args: list[str], envs: list[dict[str, str]], nproc: int = 1, script: str = ""
) -> None:
    """Agent 0 first, and only once its rendezvous store listens: it hosts the store and, with the
    lowest pid on this host, becomes node 0 (the c10d rendezvous orders nodes by host, then pid)."""
    port = pick_free_port()
    endpoint = f"127.0.0.1:{port}"
    run_id = f"ddpdoctor-test-{uuid.uuid4().hex[:8]}"
    for i in range(n):
        agents.start(torchrun_argv(n, endpoint, run_id, args, nproc, script), agent_env(envs[i]))
        if i == 0:
            wait_listening("127.0.0.1", port)


def test_cluster_check_lists_every_node_and_flags_the_odd_one() -> None:
    # Agent 2 reports an older torch and NCCL through the test-only fact override; agent 1 has a
    # NCCL_SOCKET_IFNAME the others lack (a real environment difference).
    envs = [{"DDPDOCTOR_FAKE_FACTS": json.dumps({"test_agent": i})} for i in range(3)]
    envs[2]["DDPDOCTOR_FAKE_FACTS"] = json.dumps({"test_agent": 2, "torch": "2.1.0+old", "nccl": "2.18.1"})
    envs[1]["NCCL_SOCKET_IFNAME"] = "lo"
    args = ["check", "--cluster", "--json", "--only", "system", "--timeout", "15", "--join-timeout", "60"]
    # --hosts names one more host than took part: it must be reported as missing by name.
    args += ["--hosts", f"{socket.gethostname()},ddpdoctor-absent[1-1]"]
    with Agents() as agents:
        start_agents(agents, 3, args, envs)
        runs = agents.wait_all(RUN_TIMEOUT_S)
    _, report = find_json(runs, "ddpdoctor.cluster/")
    absent = [n for n in report["nodes"] if n["status"] == "missing"]
    assert [n["label"] for n in absent] == ["host ddpdoctor-absent1"], describe(runs)
    missing_f = [f for f in report["findings"] if f["id"] == "cluster.node.missing"]
    assert len(missing_f) == 1 and "ddpdoctor-absent1" in missing_f[0]["summary"]
    nodes = [n for n in report["nodes"] if n["status"] != "missing"]
    assert len(nodes) == 3, describe(runs)
    assert all(n["status"] == "reported" for n in nodes)
    # Every agent is its own node although all share one host name.
    assert sorted(n["identity"]["node_rank"] for n in nodes) == [0, 1, 2]
    assert {n["identity"]["hostname"] for n in nodes} == {socket.gethostname()}
    assert len({n["label"] for n in nodes}) == 3
    by_agent = {n["facts"]["test_agent"]: n for n in nodes}
    assert set(by_agent) == {0, 1, 2}
    for node in nodes:
        assert node["facts"]["torch"] and node["facts"]["kernel"]
        assert any(f["area"] == "system" for f in node["findings"]), "per-node findings missing"
    findings = {f["id"]: f for f in report["findings"]}
    torch_f = findings["cluster.mismatch.torch"]
    assert torch_f["severity"] == "fail"
    assert torch_f["data"]["outliers"] == [by_agent[2]["label"]]
    assert torch_f["data"]["majority"] == by_agent[0]["facts"]["torch"]
    # NCCL: "2.18.1" on agent 2, none (CPU build) or the real version elsewhere: it is named either way.
    assert by_agent[2]["label"] in findings["cluster.mismatch.nccl"]["data"]["outliers"]
    env_f = findings["cluster.env.mismatch"]
    assert "NCCL_SOCKET_IFNAME" in env_f["data"]["variables"]
    assert by_agent[1]["label"] in env_f["summary"]
    assert report["exit_code"] == 1
    # Every agent exits with the cluster's verdict (so no torchrun agent waits in its exit barrier).
    assert [r.returncode for r in runs] == [1, 1, 1], describe(runs)


def test_healthy_cluster_table_output() -> None:
    args = ["check", "--cluster", "--only", "system", "--timeout", "15", "--join-timeout", "60"]
    with Agents() as agents:
        start_agents(agents, 2, args, [{}, {}])
        runs = agents.wait_all(RUN_TIMEOUT_S)
    printed = [r for r in runs if r.stdout.strip()]
    assert len(printed) == 1, "only rank 0 prints; srun merges every task's stdout\n" + describe(runs)
    out = printed[0].stdout
    host = socket.gethostname()
    assert "2 of 2 nodes reported" in out
    assert f"node 0 ({host})" in out and f"node 1 ({host})" in out
    assert "2 node(s) agree" in out
    codes = {r.returncode for r in runs}
    assert len(codes) == 1 and codes <= {0, 1}, describe(runs)


def test_node_that_dies_after_joining_is_named(tmp_path: Path) -> None:
    # Rank 2's `df` blocks (a fake df first in PATH, as a stuck NFS mount would), so rank 2 has joined
    # but not reported; then its whole agent is SIGKILLed, as when a node dies.
    real_df = shutil.which("df")
    assert real_df
    marker = tmp_path / "rank2-df.pid"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "df"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$RANK" = "2" ]; then echo $PPID > {marker}; exec sleep 60; fi\n'
        f'exec {real_df} "$@"\n'
    )
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    args = ["check", "--cluster", "--json", "--only", "system", "--timeout", "40", "--join-timeout", "60"]
    with Agents() as agents:
        start_agents(agents, 3, args, [env, env, env])
        deadline = time.monotonic() + 60
        while not marker.exists() or not marker.read_text().strip():
            assert time.monotonic() < deadline, "rank 2 never started its checks"
            time.sleep(0.1)
        worker = psutil.Process(int(marker.read_text()))
        agent = worker.parent()
        assert agent is not None and agent.pid != agents.procs[0].pid, "rank 2 must not host the store"
        killed_at = time.monotonic()
        os.killpg(agent.pid, signal.SIGKILL)
        for proc in (worker, *worker.children(recursive=True)):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        runs = agents.wait_all(RUN_TIMEOUT_S)
        named_after = time.monotonic() - killed_at
    _, report = find_json(runs, "ddpdoctor.cluster/")
    lost = [n for n in report["nodes"] if n["status"] == "lost"]
    assert len(lost) == 1, describe(runs)
    assert lost[0]["identity"]["rank"] == 2 and lost[0]["identity"]["node_rank"] == 2
    assert lost[0]["label"] == f"node 2 ({socket.gethostname()})"
    finding = next(f for f in report["findings"] if f["id"] == "cluster.node.lost")
    assert (
        finding["severity"] == "fail" and "node 2" in finding["summary"] and "heartbeat" in finding["summary"]
    )
    assert sorted(n["status"] for n in report["nodes"]) == ["lost", "reported", "reported"]
    # Named by the heartbeat bound (10 s), not by the 40 s probe timeout: loose, it only proves no hang.
    assert named_after < 35, describe(runs)
    assert report["exit_code"] == 1


def test_pairwise_across_agents() -> None:
    # Three agents on one host share its GPUs: on a GPU node NCCL would put all three ranks on cuda:0
    # (issue #15 item 3: a matrix of nulls). The backend is forced to gloo and asserted below; auto now
    # picks gloo on such a host by itself (tests/test_gpu_sharing_launch.py).
    args = ["bench-nccl", "--pairwise", "--backend", "gloo", "--max-bytes", "256K", "--iters", "2"]
    args += ["--warmup", "1", "--timeout", "30", "--format", "json"]
    with Agents() as agents:
        start_agents(agents, 3, args, [{}, {}, {}])
        runs = agents.wait_all(RUN_TIMEOUT_S)
    printer, data = find_json(runs, "ddpdoctor.pairwise/")
    # --pairwise is the whole command: rank 0 printed the matrix as one JSON document and no rank
    # carried on into the collective benchmark (its tables or its ddpdoctor.bench/1 document).
    assert json.loads(printer.stdout) == data
    for run in runs:
        assert "ddpdoctor.bench/" not in run.stdout and "Collective test" not in run.stdout, describe(runs)
        assert run is printer or not run.stdout.strip(), describe(runs)
    host = socket.gethostname()
    assert data["nodes"] == [f"node {i} ({host})" for i in range(3)]
    matrix = data["matrix_mbps"]
    for i in range(3):
        assert matrix[i][i] is None
        for j in range(3):
            if i != j:
                assert isinstance(matrix[i][j], float) and matrix[i][j] > 0, matrix
    assert all(isinstance(v, float) and v > 0 for v in data["compute_gflops"].values())
    assert data["bytes"] == 256 * 1024 and data["backend"] == "gloo"
    assert data["failed_pairs"] == []
    # Loopback on a shared 2-core machine is noisy: outliers may or may not be named, but every agent
    # exits with rank 0's verdict.
    codes = {r.returncode for r in runs}
    assert codes == {data["exit_code"]}, describe(runs)


def test_pairwise_on_one_node_is_inconclusive() -> None:
    # One torchrun agent with two ranks: one node, so no pair; exit 3 and a finding, not a 1x1 "pass".
    args = ["bench-nccl", "--pairwise", "--backend", "gloo", "--max-bytes", "64K", "--iters", "1"]
    args += ["--warmup", "0", "--timeout", "30", "--format", "json"]
    with Agents() as agents:
        start_agents(agents, 1, args, [{}], nproc=2)
        runs = agents.wait_all(RUN_TIMEOUT_S)
    _, data = find_json(runs, "ddpdoctor.pairwise/")
    assert len(data["nodes"]) == 1
    assert [f["id"] for f in data["findings"]] == ["cluster.pairwise.one_node"], data
    assert data["exit_code"] == 3
    # torchrun's agent exits 1 for any failed child; the ranks' own code is in its report.
    assert runs[0].returncode != 0 and "(exitcode: 3)" in runs[0].stderr, describe(runs)



def test_bench_under_torchrun_refuses_buffers_that_cannot_fit_on_every_rank(tmp_path: Path) -> None:
    # The ranks of a node judge --max-bytes before init_process_group and refuse together (exit 2).
    out = tmp_path / "refused.json"
    args = ["bench-nccl", "--backend", "gloo", "--max-bytes", "2T", "--json", str(out)]
    with Agents() as agents:
        start_agents(agents, 1, args, [{}], nproc=2)
        runs = agents.wait_all(RUN_TIMEOUT_S)
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["refusals"]] == ["bench.max_bytes.too_large"], data
    assert data["exit_code"] == 2 and data["rows"] == []
    assert runs[0].returncode != 0 and "(exitcode: 2)" in runs[0].stderr, describe(runs)

def test_scoped_benchmark_intra_and_inter_node(tmp_path: Path) -> None:
    # 2 "nodes" x 2 ranks: each node's pair runs intra-node, one rank per node runs inter-node.
    script = str(Path(__file__).with_name("_scoped_bench_rank.py"))
    env = {"SCOPED_EVENTS_DIR": str(tmp_path)}
    with Agents() as agents:
        start_agents(agents, 2, [], [env, env], nproc=2, script=script)
        runs = agents.wait_all(RUN_TIMEOUT_S)
    _, data = find_json(runs, "test.scoped/")
    host = socket.gethostname()
    rows = data["rows"]
    seen = sorted((r["scope"], r["node"], r["op"]) for r in rows)
    assert seen == [
        ("inter-node", "all nodes", "all_gather"),
        ("inter-node", "all nodes", "all_reduce"),
        ("intra-node", f"node 0 ({host})", "all_gather"),
        ("intra-node", f"node 0 ({host})", "all_reduce"),
        ("intra-node", f"node 1 ({host})", "all_gather"),
        ("intra-node", f"node 1 ({host})", "all_reduce"),
    ], describe(runs)
    assert all(r["nranks"] == 2 and r["wrong"] == 0 and r["busbw"] > 0 for r in rows)
    assert [r.returncode for r in runs] == [0, 0], describe(runs)
    # Every step goes through the caller's reporter (the joined rank's watchdog and progress bar), named
    # by its scope; a rank with nothing to run waits under a bound of the whole phase: (2 steps + 1) x 30 s.
    events = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)}
    wait_intra = ["wait", "intra-node: waiting for the other nodes", 90.0]
    wait_inter = ["wait", "inter-node: waiting for the node leaders", 90.0]
    for rank in range(4):
        node = f"node {rank // 2} ({host})"
        intra = [
            ["step", "intra-node all_reduce", 4096],
            ["row", "intra-node", node, "all_reduce"],
            ["step", "intra-node all_gather", 4096],
            ["row", "intra-node", node, "all_gather"],
        ]
        inter = [
            ["step", "inter-node all_reduce", 4096],
            ["row", "inter-node", "all nodes", "all_reduce"],
            ["step", "inter-node all_gather", 4096],
            ["row", "inter-node", "all nodes", "all_gather"],
        ]
        leader = rank % 2 == 0
        expected = [["step", "topology", 0], *intra, wait_intra, *(inter if leader else []), wait_inter]
        assert events[rank] == [*expected, ["step", "gather scoped results", 0]], (rank, events[rank])


def _scoped_bench_args(*extra: str) -> list[str]:
    return [
        "bench-nccl",
        "--backend",
        "gloo",
        "--ops",
        "all_reduce,sendrecv",
        "--min-bytes",
        "1K",
        "--max-bytes",
        "4K",
        "--step-factor",
        "4",
        "--iters",
        "2",
        "--warmup",
        "1",
        *extra,
    ]


def test_bench_nccl_across_agents_reports_each_scope(tmp_path: Path) -> None:
    # bench-nccl joined as 4 ranks on 2 "nodes": the whole-world run, then each node's intra-node run,
    # then the inter-node run, in the human tables, --json and --csv; verdicts judge the whole world.
    out_json, out_csv = tmp_path / "bench.json", tmp_path / "bench.csv"
    args = _scoped_bench_args("--timeout", "30", "--min-busbw", "0.000001")
    args += ["--json", str(out_json), "--csv", str(out_csv)]
    with Agents() as agents:
        start_agents(agents, 2, args, [{}, {}], nproc=2)
        runs = agents.wait_all(RUN_TIMEOUT_S)
    assert [r.returncode for r in runs] == [0, 0], describe(runs)
    host = socket.gethostname()
    data = json.loads(out_json.read_text())
    jsonschema.validate(data, json.loads(BENCH_SCHEMA.read_text()))
    assert data["environment"]["world_size"] == 4 and data["environment"]["launcher"] == "torchrun"
    rows = data["rows"]
    sizes = [1024, 4096]
    tables = [
        ("world", None, 4),
        ("intra-node", f"node 0 ({host})", 2),
        ("intra-node", f"node 1 ({host})", 2),
    ]
    tables += [("inter-node", "all nodes", 2)]
    # Every scope's table, in this order, with every op at every size, each correct.
    assert [(r["scope"], r["node"], r["nranks"], r["op"], r["requested_bytes"]) for r in rows] == [
        (*table, op, size) for table in tables for op in ("all_reduce", "sendrecv") for size in sizes
    ], describe(runs)
    assert all(r["wrong"] == 0 and r["busbw"] > 0 for r in rows)
    # Summary and --min-busbw: whole-world rows only; each other scope has its own summary.
    world_ar = [r["busbw"] for r in rows if r["scope"] == "world" and r["op"] == "all_reduce"]
    summary = {s["op"]: s for s in data["summary"]}
    assert summary["all_reduce"]["peak_busbw"] == max(world_ar) and summary["all_reduce"]["rows"] == 2
    min_busbw = next(v for v in data["verdicts"] if v["id"] == "bench.min_busbw")
    assert min_busbw["data"]["peak_busbw"] == max(world_ar) and not min_busbw["failed"]
    assert [(s["scope"], s["node"], s["nranks"]) for s in data["scope_summary"]] == [t for t in tables[1:]]
    inter_ar = [r["busbw"] for r in rows if r["scope"] == "inter-node" and r["op"] == "all_reduce"]
    assert data["scope_summary"][2]["summary"][0]["peak_busbw"] == max(inter_ar)
    # CSV: the same rows, scope and node columns included.
    with out_csv.open() as fh:
        csv_rows = list(csv.DictReader(fh))
    assert [(r["scope"], r["node"] or None, int(r["nranks"])) for r in csv_rows] == [
        table for table in tables for _ in range(4)
    ]
    # Human output: rank 0 alone prints one set of tables per scope, in order, with its peaks.
    printed = [r for r in runs if r.stdout.strip()]
    assert len(printed) == 1, describe(runs)
    out = printed[0].stdout
    headings = [line for line in out.splitlines() if line.startswith("# == ")]
    assert headings == [
        "# == whole world: 4 ranks ==",
        f"# == intra-node: node 0 ({host}), 2 ranks ==",
        f"# == intra-node: node 1 ({host}), 2 ranks ==",
        "# == inter-node: one rank per node, 2 ranks ==",
    ], out
    for heading, following in zip(headings, [*headings[1:], "# OK: every measured result"]):
        section = out[out.index(heading) : out.index(following)]
        assert (
            section.count("# Collective test: all_reduce") == 1 and "# Collective test: sendrecv" in section
        )
        assert "# all_reduce      peak busbw" in section, section
    assert "# OK: all_reduce peak busbw" in out


def test_hang_in_a_scoped_run_is_bounded_by_the_watchdog() -> None:
    # Global rank 2 (node 1's leader) hangs in the inter-node all_reduce: its per-step watchdog dumps
    # its stack and ends it, torchrun stops the rest. Ranks 1 and 3 wait out the inter-node phase
    # under the longer phase bound, so their own watchdog must not fire.
    fault = {"DDPDOCTOR_BENCH_FAULT": "rank=2,op=inter-node all_reduce,size=1024,action=hang"}
    started = time.monotonic()
    with Agents() as agents:
        start_agents(agents, 2, _scoped_bench_args("--timeout", "4", "--json", "-"), [fault, fault], nproc=2)
        runs = agents.wait_all(RUN_TIMEOUT_S)
    assert time.monotonic() - started < 60, "bounded, did not hang\n" + describe(runs)
    assert all(r.returncode not in (0, None) for r in runs), describe(runs)
    dumps = runs[1].stderr
    assert "Timeout (0:00:04)!" in dumps, describe(runs)
    assert "_maybe_fault" in dumps and "run_scoped_benchmark" in dumps, dumps[-3000:]
    assert all("_wait_for_peers" not in r.stderr for r in runs), describe(runs)


def test_rank_that_cannot_reach_the_store_says_so_in_one_line() -> None:
    # A rank started as srun starts it (no agent) whose master is not listening: one line with the cause,
    # not c10d's retry log with its C++ frames (66 lines before).
    import subprocess
    import sys

    port = pick_free_port()  # nothing listens there
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TORCH", "RANK", "WORLD", "LOCAL", "MASTER"))
    }
    env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "check", "--cluster", "--only", "system", "--join-timeout", "3"],
        capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 3, proc.stderr
    assert f"rank 1 could not reach the TCP store at 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "frame #" not in proc.stderr and "Exception raised from" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
