"""Cluster mode across real separate "hosts" on one machine: network namespaces joined by a bridge.

Each node is a network namespace with its own veth (named ddp0 inside), an address from the test-only
range 10.213.0.0/24 (only inside these namespaces: the bridge has no address, nothing is routed to the
host or beyond) and its own host name (a UTS namespace). One torchrun agent (or one srun-style task)
runs per namespace. `tc tbf` shapes one node's link; taking a node's link down drops its traffic.
Needs root; skipped with the reason where namespaces cannot be created. Namespaces and the bridge are
always deleted, also when a test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import pytest
from _cluster_agents import Agents, agent_env, describe, find_json, torchrun_argv

pytestmark = pytest.mark.netns

SUBNET = "10.213.0"
IFACE = "ddp0"
RUN_TIMEOUT_S = 120
# 40 Mbit/s is 5 MB/s: two orders of magnitude below a veth pair, far beyond any measurement noise.
SHAPED_RATE = "40mbit"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


@dataclass
class Net:
    tag: str
    bridge: str
    namespaces: list[str] = field(default_factory=list)
    host_ifaces: list[str] = field(default_factory=list)

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def hostname(self, i: int) -> str:
        return f"{self.tag}-{i}"

    def nodelist(self) -> str:
        return f"{self.tag}-[0-{len(self.namespaces) - 1}]"

    def wrap(self, i: int, argv: Sequence[str]) -> list[str]:
        """argv run in namespace i, under its own host name."""
        return [
            "ip",
            "netns",
            "exec",
            self.namespaces[i],
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            self.hostname(i),
            *argv,
        ]

    def shape(self, i: int, rate: str) -> None:
        """Rate-limit node i both ways: into it (host side of its veth) and out of it (inside)."""
        tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        subprocess.run(["tc", "qdisc", "add", "dev", self.host_ifaces[i], *tbf], check=True, timeout=20)
        subprocess.run(
            ["ip", "netns", "exec", self.namespaces[i], "tc", "qdisc", "add", "dev", IFACE, *tbf],
            check=True,
            timeout=20,
        )


ETC_NETNS = Path("/etc/netns")
# Removed again at teardown only when it did not exist before these tests (and only when empty).
ETC_NETNS_EXISTED = ETC_NETNS.exists()


def _write_hosts(net: Net, count: int) -> None:
    """Name resolution for the test host names: `ip netns exec NS` bind-mounts /etc/netns/NS/hosts over
    /etc/hosts inside that namespace only (the machine's own /etc/hosts is untouched)."""
    lines = ["127.0.0.1 localhost"] + [f"{net.addr(i)} {net.hostname(i)}" for i in range(count)]
    for ns in net.namespaces:
        d = ETC_NETNS / ns
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts").write_text("\n".join(lines) + "\n")


def _teardown(net: Net) -> None:
    for ns in net.namespaces:
        _ip("netns", "del", ns, check=False)  # deletes the veth pair with it
        shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
    for iface in net.host_ifaces:
        _ip("link", "del", iface, check=False)
    _ip("link", "del", net.bridge, check=False)
    if not ETC_NETNS_EXISTED:
        try:
            ETC_NETNS.rmdir()
        except OSError:
            pass


def _leftovers(tag: str) -> str:
    """Links or namespaces of this test still present; the kernel removes veth peers asynchronously."""
    deadline = time.monotonic() + 10
    while True:
        text = _ip("link", "show", check=False).stdout + _ip("netns", "list", check=False).stdout
        if tag not in text or time.monotonic() > deadline:
            return "\n".join(line for line in text.splitlines() if tag in line)
        time.sleep(0.2)


def _check_reachable(net: Net) -> None:
    """A TCP connection from the last namespace to the first, or skip: bridged traffic is filtered here."""
    port = 40000 + os.getpid() % 20000
    server = subprocess.Popen(
        net.wrap(
            0,
            [
                sys.executable,
                "-c",
                "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                f"s.bind(('{net.addr(0)}', {port})); s.listen(); s.settimeout(10); s.accept()",
            ],
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        last = len(net.namespaces) - 1
        probe = (
            "import socket, time\n"
            "for _ in range(50):\n"
            "    try:\n"
            f"        socket.create_connection(('{net.addr(0)}', {port}), timeout=1).close(); break\n"
            "    except OSError: time.sleep(0.1)\n"
            "else: raise SystemExit(1)\n"
        )
        res = subprocess.run(net.wrap(last, [sys.executable, "-c", probe]), timeout=30)
        if res.returncode != 0:
            pytest.skip(
                "namespaces were created but bridged traffic between them is filtered on this machine"
            )
    finally:
        server.kill()
        server.wait(timeout=10)


@pytest.fixture
def netns3() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    # Unique per test run: interface names are at most 15 characters.
    tag = f"ddp{os.getpid() % 100000}{uuid.uuid4().hex[:2]}"
    net = Net(tag=tag, bridge=f"{tag}br")
    try:
        probe = _ip("netns", "add", f"{tag}n0", check=False)
        if probe.returncode != 0:
            pytest.skip(f"cannot create network namespaces here: {probe.stderr.strip()}")
        net.namespaces.append(f"{tag}n0")
        _ip("link", "add", net.bridge, "type", "bridge")
        _ip("link", "set", net.bridge, "up")
        for i in range(3):
            ns = f"{tag}n{i}"
            if i:
                _ip("netns", "add", ns)
                net.namespaces.append(ns)
            host_if, peer = f"{tag}h{i}", f"{tag}p{i}"
            _ip("link", "add", host_if, "type", "veth", "peer", "name", peer)
            net.host_ifaces.append(host_if)
            _ip("link", "set", peer, "netns", ns)
            _ip("link", "set", host_if, "master", net.bridge)
            _ip("link", "set", host_if, "up")
            _ip("-n", ns, "link", "set", peer, "name", IFACE)
            _ip("-n", ns, "addr", "add", f"{net.addr(i)}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        _write_hosts(net, 3)
        _check_reachable(net)
        yield net
    finally:
        _teardown(net)
        left = _leftovers(tag)
        assert not left, f"namespaces or links left behind: {left}"


def _torchrun_in_namespaces(net: Net, agents: Agents, args: list[str]) -> None:
    """One torchrun agent per namespace, --local-addr its own address; node 0's agent hosts the store."""
    port = 29400 + os.getpid() % 1000
    endpoint = f"{net.addr(0)}:{port}"
    run_id = f"netns-{uuid.uuid4().hex[:8]}"
    env = agent_env({"GLOO_SOCKET_IFNAME": IFACE})
    for i in range(len(net.namespaces)):
        argv = torchrun_argv(len(net.namespaces), endpoint, run_id, args)
        argv[argv.index("--nnodes") : argv.index("--nnodes")] = ["--local-addr", net.addr(i)]
        agents.start(net.wrap(i, argv), env)
        if i == 0:
            _wait_listening_in(net, 1, net.addr(0), port)


def _wait_listening_in(net: Net, i: int, host: str, port: int) -> None:
    code = f"from _cluster_agents import wait_listening; wait_listening({host!r}, {port})"
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    res = subprocess.run(
        net.wrap(i, [sys.executable, "-c", code]),
        env={**os.environ, "PYTHONPATH": tests_dir},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


def test_pairwise_names_the_shaped_node(netns3: Net) -> None:
    netns3.shape(2, SHAPED_RATE)
    args = ["bench-nccl", "--pairwise", "--max-bytes", "1M", "--iters", "2", "--warmup", "1"]
    args += ["--timeout", "60", "--format", "json"]
    with Agents() as agents:
        _torchrun_in_namespaces(netns3, agents, args)
        runs = agents.wait_all(RUN_TIMEOUT_S)
    _, data = find_json(runs, "ddpdoctor.pairwise/")
    # Separate hosts: each node is named by its own host name.
    assert data["nodes"] == [f"node {i} ({netns3.hostname(i)})" for i in range(3)], describe(runs)
    slow = data["nodes"][2]
    assert data["slow_nodes"] == [slow], data
    assert data["bad_links"] == []
    findings = {f["id"]: f for f in data["findings"]}
    assert findings["cluster.pairwise.slow_node"]["data"]["node"] == slow
    m = data["matrix_mbps"]
    # 40 Mbit/s is 5 MB/s: every direction touching node 2 is below 10 MB/s, the fast pair far above.
    assert all(m[i][j] < 10 for i, j in ((0, 2), (2, 0), (1, 2), (2, 1))), m
    assert min(m[0][1], m[1][0]) > 50, m
    assert data["exit_code"] == 1
    assert {r.returncode for r in runs} == {1}, describe(runs)


def test_missing_node_is_named_within_the_join_timeout(netns3: Net) -> None:
    # srun-style tasks (no rendezvous of their own, as under Slurm); node 2's link is down, so its
    # task never reaches the master: rank 0 must name it from SLURM_JOB_NODELIST.
    _ip("link", "set", netns3.host_ifaces[2], "down")
    join_timeout = 8
    port = str(29400 + os.getpid() % 1000 + 1)
    args = [sys.executable, "-m", "ddpdoctor", "check", "--cluster", "--json", "--only", "system"]
    args += ["--timeout", "10", "--join-timeout", str(join_timeout)]
    with Agents() as agents:
        started = time.monotonic()
        for i in range(3):
            env = agent_env(
                {
                    "SLURM_JOB_ID": "4242",
                    "SLURM_STEP_ID": "0",
                    "SLURM_PROCID": str(i),
                    "SLURM_NTASKS": "3",
                    "SLURM_NODEID": str(i),
                    "SLURM_LOCALID": "0",
                    "SLURM_JOB_NODELIST": netns3.nodelist(),
                    # The test host names do not resolve: give rank 0's address, as many sites do.
                    "MASTER_ADDR": netns3.addr(0),
                    "MASTER_PORT": port,
                    "GLOO_SOCKET_IFNAME": IFACE,
                }
            )
            agents.start(netns3.wrap(i, args), env)
        runs = agents.wait_all(RUN_TIMEOUT_S)
        elapsed = time.monotonic() - started
    _, report = find_json(runs, "ddpdoctor.cluster/")
    by_status: dict[str, list[dict]] = {}
    for node in report["nodes"]:
        by_status.setdefault(node["status"], []).append(node)
    assert [n["label"] for n in by_status.get("missing", [])] == [f"node 2 ({netns3.hostname(2)})"], describe(
        runs
    )
    reported = sorted(n["identity"]["hostname"] for n in by_status["reported"])
    assert reported == [netns3.hostname(0), netns3.hostname(1)]
    missing = next(f for f in report["findings"] if f["id"] == "cluster.node.missing")
    assert missing["severity"] == "fail" and f"within {join_timeout}s" in missing["summary"]
    assert "SLURM_JOB_NODELIST" in missing["summary"]
    assert report["exit_code"] == 1
    # Bounded by the join timeout (plus start-up), never a hang; loose on purpose.
    assert elapsed < join_timeout + 60, describe(runs)
    # The cut-off task itself gives up within its join timeout and says why on stderr.
    cut_off = runs[2]
    assert cut_off.returncode == 3 and "could not reach the TCP store" in cut_off.stderr, describe(runs)
