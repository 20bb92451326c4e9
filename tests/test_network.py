"""Network and ports: real sockets for MASTER_PORT, pure judges over recorded facts."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.checks import network
from ddpdoctor.checks.network import (
    NetFacts,
    check_network,
    nccl_default_interfaces,
    resolve_names,
    select_nccl_interfaces,
)
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import ExitCode, Severity
from ddpdoctor.edge.sources import LiveSources, RecordingSources, ReplaySources

IFACES = {
    "interfaces": [
        {
            "name": "lo",
            "up": True,
            "mtu": 65536,
            "speed_mbps": 0,
            "addresses": [{"family": "ipv4", "address": "127.0.0.1"}],
        },
        {
            "name": "eth0",
            "up": True,
            "mtu": 1500,
            "speed_mbps": 25000,
            "addresses": [{"family": "ipv4", "address": "10.1.2.3"}],
        },
        {"name": "eth1", "up": False, "mtu": 1500, "speed_mbps": 0, "addresses": []},
        {
            "name": "docker0",
            "up": True,
            "mtu": 1500,
            "speed_mbps": 0,
            "addresses": [{"family": "ipv4", "address": "172.17.0.1"}],
        },
        {
            "name": "ib0",
            "up": True,
            "mtu": 2044,
            "speed_mbps": 200000,
            "addresses": [{"family": "ipv4", "address": "192.168.10.3"}],
        },
    ]
}
NAMES = [i["name"] for i in IFACES["interfaces"]]
MULTI_NODE = {
    "WORLD_SIZE": "16",
    "LOCAL_WORLD_SIZE": "8",
    "RANK": "0",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
}


def facts(env=None, resolve=None, port=None, interfaces=IFACES, hostname="node0") -> NetFacts:
    return NetFacts(
        env=dict(env or {}),
        hostname=hostname,
        resolve=resolve if resolve is not None else {"node0": {"addresses": ["10.1.2.3"]}},
        interfaces=interfaces,
        port=port,
    )


def only(findings, fid: str):
    (f,) = [f for f in findings if f.id == fid]
    return f


# ------------------------------------------------------------------ real sockets


def test_master_port_bound_in_this_test_fails_naming_our_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        report = run_checks(LiveSources(), [network.AREA], timeout_s=20)
    f = only(report.findings, "net.master_port.in_use")
    assert f.severity == Severity.FAIL
    assert f.data["pid"] == os.getpid()
    assert f"PID {os.getpid()}" in f.summary and str(port) in f.summary
    assert f"kill {os.getpid()}" in f.fix
    assert report.exit_code() == ExitCode.FAILED


def test_free_master_port_is_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_PORT", str(port))
    report = run_checks(LiveSources(), [network.AREA], timeout_s=20)
    assert only(report.findings, "net.master_port.in_use").severity == Severity.OK


def test_live_network_area_replays_identically(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
        monkeypatch.setenv("MASTER_ADDR", "localhost")
        monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^docker,lo")
        rec = RecordingSources()
        live = run_checks(rec, [network.AREA], timeout_s=20)
        rec.write(tmp_path)
    replayed = run_checks(ReplaySources(tmp_path), [network.AREA], timeout_s=20)
    assert [(f.id, f.severity, f.summary) for f in live.findings] == [
        (f.id, f.severity, f.summary) for f in replayed.findings
    ]
    assert (tmp_path / "net-master-port.json").is_file() and (tmp_path / "net-interfaces.json").is_file()


def test_hung_resolver_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def slow(host, *args, **kwargs):
        if host == "hangs.example":
            time.sleep(5)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    start = time.monotonic()
    out = resolve_names(["hangs.example", "localhost"], timeout_s=0.3)
    assert time.monotonic() - start < 3
    assert "no answer" in out["hangs.example"]["error"]
    assert "127.0.0.1" in out["localhost"]["addresses"] or "::1" in out["localhost"]["addresses"]


# ------------------------------------------------------------------ pure judges


def test_port_held_by_another_process_and_inside_ephemeral_range() -> None:
    port = {
        "port": 45000,
        "holder": {
            "pid": 4242,
            "name": "python",
            "cmdline": "python train.py",
            "address": "0.0.0.0:45000",
            "is_our_launcher": False,
        },
        "ephemeral_range": [32768, 60999],
    }
    findings = check_network(facts({"MASTER_PORT": "45000"}, port=port))
    f = only(findings, "net.master_port.in_use")
    assert f.severity == Severity.FAIL and "PID 4242 (python train.py)" in f.summary
    e = only(findings, "net.master_port.ephemeral")
    assert e.severity == Severity.WARN and "32768-60999" in e.summary


def test_port_holder_with_a_multiline_command_stays_a_one_line_summary() -> None:
    script = "import socket, time\ns = socket.socket()\n" + "x = 1\n" * 60 + "time.sleep(60)"
    port = {
        "port": 45001,
        "holder": {"pid": 99, "name": "python3", "cmdline": f"python3 -c {script}", "is_our_launcher": False},
        "ephemeral_range": None,
    }
    f = only(check_network(facts({"MASTER_PORT": "45001"}, port=port)), "net.master_port.in_use")
    assert "\n" not in f.summary and "PID 99 (python3 -c import socket, time s = socket.socket()" in f.summary
    assert f.summary.endswith("...)") and len(f.summary) < 200
    assert f.data["cmdline"] == f"python3 -c {script}"  # the full command line is kept as data
    assert "sport = :45001" in f.fix and "kill 99" in f.fix


def test_port_held_by_our_own_launcher_is_info() -> None:
    port = {
        "port": 29500,
        "holder": {"pid": 7, "cmdline": "torchrun", "is_our_launcher": True},
        "ephemeral_range": [32768, 60999],
    }
    findings = check_network(facts({"MASTER_PORT": "29500"}, port=port))
    assert only(findings, "net.master_port.in_use").severity == Severity.INFO
    assert only(findings, "net.master_port.ephemeral").severity == Severity.OK


def test_invisible_holder_still_fails() -> None:
    port = {"port": 29500, "holder": {"pid": None, "address": "*:29500"}, "ephemeral_range": None}
    f = only(check_network(facts({"MASTER_PORT": "29500"}, port=port)), "net.master_port.in_use")
    assert f.severity == Severity.FAIL and "cannot identify" in f.summary


def test_hostname_loopback_warns_single_node_fails_multi_node() -> None:
    resolve = {"node0": {"addresses": ["127.0.1.1"]}}
    assert only(check_network(facts({}, resolve=resolve)), "net.hostname.loopback").severity == Severity.WARN
    env = dict(MULTI_NODE)
    resolve["node0"] = {"addresses": ["127.0.1.1"]}
    assert only(check_network(facts(env, resolve=resolve)), "net.hostname.loopback").severity == Severity.FAIL


def test_unresolvable_names() -> None:
    resolve = {
        "node0": {"error": "[Errno -2] Name or service not known"},
        "nowhere": {"error": "[Errno -2] Name or service not known"},
    }
    findings = check_network(facts({"MASTER_ADDR": "nowhere"}, resolve=resolve))
    assert only(findings, "net.hostname.resolve").severity == Severity.WARN
    assert only(findings, "net.master_addr.resolve").severity == Severity.FAIL


def test_loopback_master_addr_in_multi_node_job_fails() -> None:
    env = dict(MULTI_NODE, MASTER_ADDR="127.0.0.1")
    resolve = {"node0": {"addresses": ["10.1.2.3"]}, "127.0.0.1": {"addresses": ["127.0.0.1"]}}
    f = only(check_network(facts(env, resolve=resolve)), "net.master_addr.loopback")
    assert f.severity == Severity.FAIL and "routable" in f.fix
    single = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert "net.master_addr.loopback" not in {f.id for f in check_network(facts(single, resolve=resolve))}


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("eth", ["eth0", "eth1"]),
        ("=eth0", ["eth0"]),
        ("=eth", []),
        ("^docker,lo", ["eth0", "eth1", "ib0"]),
        ("^=docker0", ["lo", "eth0", "eth1", "ib0"]),
        ("eth0:1234,ib", ["eth0", "ib0"]),
        ("", []),
    ],
)
def test_nccl_socket_ifname_syntax(spec: str, expected: list[str]) -> None:
    assert select_nccl_interfaces(spec, NAMES) == expected


def test_nccl_default_prefers_ib_then_skips_docker_and_lo() -> None:
    assert nccl_default_interfaces(NAMES) == ["ib0"]
    assert nccl_default_interfaces(["lo", "docker0", "eth0"]) == ["eth0"]
    assert nccl_default_interfaces(["lo"]) == ["lo"]


def test_nccl_ifname_matching_nothing_usable_fails() -> None:
    f = only(check_network(facts({"NCCL_SOCKET_IFNAME": "=eth1"})), "net.socket_ifname.nccl")
    assert f.severity == Severity.FAIL and "eth1 down" in f.summary
    f = only(check_network(facts({"NCCL_SOCKET_IFNAME": "enp"})), "net.socket_ifname.nccl")
    assert f.severity == Severity.FAIL and "selects no usable interface" in f.summary
    f = only(check_network(facts({"NCCL_SOCKET_IFNAME": "^lo"})), "net.socket_ifname.nccl")
    assert f.severity == Severity.OK and "eth0" in f.summary and "eth1" in f.summary  # eth1 listed as ignored
    f = only(check_network(facts(dict(MULTI_NODE, NCCL_SOCKET_IFNAME="lo"))), "net.socket_ifname.nccl")
    assert f.severity == Severity.FAIL and "loopback" in f.summary


def test_gloo_ifname_needs_exact_names() -> None:
    f = only(check_network(facts({"GLOO_SOCKET_IFNAME": "^docker"})), "net.socket_ifname.gloo")
    assert f.severity == Severity.FAIL and "NCCL's ^/= syntax" in f.summary
    f = only(check_network(facts({"GLOO_SOCKET_IFNAME": "eth"})), "net.socket_ifname.gloo")
    assert f.severity == Severity.FAIL and "exact names" in f.summary
    f = only(check_network(facts({"GLOO_SOCKET_IFNAME": "eth0,eth1"})), "net.socket_ifname.gloo")
    assert f.severity == Severity.FAIL and "eth1 is down" in f.summary
    assert (
        only(check_network(facts({"GLOO_SOCKET_IFNAME": "eth0"})), "net.socket_ifname.gloo").severity
        == Severity.OK
    )


def test_only_loopback_interfaces() -> None:
    lo_only = {"interfaces": [IFACES["interfaces"][0]]}
    assert only(check_network(facts({}, interfaces=lo_only)), "net.interfaces").severity == Severity.WARN
    assert (
        only(check_network(facts(MULTI_NODE, interfaces=lo_only)), "net.interfaces").severity == Severity.FAIL
    )


def test_hand_built_snapshot_without_network_facts_skips(tmp_path: Path) -> None:
    (tmp_path / "env.json").write_text(json.dumps({"MASTER_PORT": "29500"}))
    report = run_checks(ReplaySources(tmp_path), [network.AREA], timeout_s=10)
    sev = {f.severity for f in report.findings}
    assert sev == {Severity.SKIP} and report.exit_code() == ExitCode.HEALTHY


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "MASTER_ADDR",
                "MASTER_PORT",
                "NCCL_SOCKET_IFNAME",
                "GLOO_SOCKET_IFNAME",
                "WORLD_SIZE",
                "LOCAL_WORLD_SIZE",
            ]
        ),
        st.text(max_size=15),
    ),
    st.text(max_size=20),
)
def test_any_env_and_ifname_spec_is_judged_without_error(env: dict[str, str], spec: str) -> None:
    assert isinstance(select_nccl_interfaces(spec, NAMES), list)
    findings = check_network(facts(env))
    assert all(f.id.startswith("net.") for f in findings)


def test_link_local_only_interfaces_are_listed_apart() -> None:
    bridge = {
        "name": "br0",
        "up": True,
        "addresses": [{"family": "ipv6", "address": "fe80::10d0:fff:fec1:2f31"}],
    }
    f = only(
        check_network(facts({}, interfaces={"interfaces": [*IFACES["interfaces"], bridge]})), "net.interfaces"
    )
    assert f.data["link_local_only"] == ["br0"] and "br0" not in f.data["usable"]
    assert "link-local only: br0" in f.summary
