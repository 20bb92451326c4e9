"""NCCL / torch.distributed environment variables: killers, deprecated names, typos, config files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.checks import nccl_env
from ddpdoctor.checks.nccl_env import (
    KNOWN_NCCL_NAMES,
    NcclEnvFacts,
    check_nccl_env,
    effective_settings,
    parse_nccl_conf,
    suggest_name,
)
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import ExitCode, Severity, exit_code_for
from ddpdoctor.edge.sources import ReplaySources


def judge(env: dict[str, str], conf=None):
    return check_nccl_env(NcclEnvFacts(env=env, conf=conf))


def by_id(findings, fid: str):
    return [f for f in findings if f.id == fid]


def test_nothing_set_is_healthy() -> None:
    findings = judge({"PATH": "/usr/bin", "HOME": "/root"})
    assert [f.id for f in findings] == ["nccl_env.set"]
    assert "No NCCL_*" in findings[0].summary
    assert exit_code_for(findings) == ExitCode.HEALTHY


@pytest.mark.parametrize(
    "name, value",
    [
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_IB_DISABLE", "1"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_P2P_LEVEL", "LOC"),
    ],
)
def test_transport_killers_warn(name: str, value: str) -> None:
    (f,) = by_id(judge({name: value}), "nccl_env.transport_disabled")
    assert f.severity == Severity.WARN and f"{name}={value}" in f.summary
    assert f.evidence[0].source == "environment"


def test_transport_enabled_values_do_not_warn() -> None:
    assert not by_id(judge({"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "NVL"}), "nccl_env.transport_disabled")


def test_deprecated_torch_names_suggest_the_new_one() -> None:
    (f,) = by_id(judge({"NCCL_ASYNC_ERROR_HANDLING": "1"}), "nccl_env.deprecated")
    assert f.severity == Severity.WARN
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in f.summary and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in f.fix
    (f,) = by_id(judge({"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_BLOCKING_WAIT": "0"}), "nccl_env.deprecated")
    assert "is also set and wins" in f.summary
    (f,) = by_id(judge({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}), "nccl_env.deprecated")
    assert "TORCH_FR_BUFFER_SIZE" in f.summary


def test_removed_nccl_names() -> None:
    (f,) = by_id(judge({"NCCL_IB_GDR_LEVEL": "PHB"}), "nccl_env.deprecated")
    assert "NCCL_NET_GDR_LEVEL" in f.summary


@pytest.mark.parametrize(
    "typo, right",
    [
        ("NCCL_SOCKET_IFNAMES", "NCCL_SOCKET_IFNAME"),
        ("NCCL_IB_DISABLED", "NCCL_IB_DISABLE"),
        ("NCCL_DEBUG_SUBSYSTEM", "NCCL_DEBUG_SUBSYS"),
        ("NCCL_SOCKET_IFACE", "NCCL_SOCKET_IFNAME"),
        ("NCCL_FASTRAK_CTRL_DEV", None),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLNG", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ],
)
def test_typos_get_the_closest_name(typo: str, right: str | None) -> None:
    assert suggest_name(typo) == right


def test_unknown_names_warn_only_when_they_look_like_typos() -> None:
    findings = judge({"NCCL_IB_DISABLED": "1", "NCCL_FASTRAK_IFNAME": "eth1"})
    unknown = {f.data["name"]: f for f in by_id(findings, "nccl_env.unknown")}
    assert unknown["NCCL_IB_DISABLED"].severity == Severity.WARN
    assert unknown["NCCL_IB_DISABLED"].data["suggestion"] == "NCCL_IB_DISABLE"
    assert unknown["NCCL_FASTRAK_IFNAME"].severity == Severity.INFO


def test_known_names_are_quiet() -> None:
    env = {
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "mlx5_0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "NCCL_BUFFSIZE": "4194304",
    }
    assert [f.id for f in judge(env)] == ["nccl_env.set"]


def test_debug_values() -> None:
    (f,) = by_id(judge({"TORCH_DISTRIBUTED_DEBUG": "verbose"}), "nccl_env.bad_value")
    assert f.severity == Severity.FAIL and "ValueError" in f.summary
    assert "OFF, INFO or DETAIL" in f.fix
    (f,) = by_id(judge({"NCCL_DEBUG": "LOUD"}), "nccl_env.bad_value")
    assert f.severity == Severity.WARN
    assert "NCCL_DEBUG=WARN" in f.fix
    assert by_id(judge({"NCCL_DEBUG": "info"}), "nccl_env.debug")[0].severity == Severity.INFO
    assert by_id(judge({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}), "nccl_env.debug")[0].severity == Severity.INFO
    assert not by_id(judge({"NCCL_DEBUG": "WARN"}), "nccl_env.debug")


def test_async_error_handling_off_warns() -> None:
    (f,) = by_id(judge({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}), "nccl_env.error_handling")
    assert f.severity == Severity.WARN and "hangs" in f.summary


def test_topology_override_is_reported() -> None:
    (f,) = by_id(judge({"NCCL_GRAPH_FILE": "/opt/microsoft/ncv4/graph.xml"}), "nccl_env.topology_override")
    assert f.severity == Severity.INFO


def test_settings_from_nccl_conf_count_and_env_wins() -> None:
    conf = {
        "files": {
            "/etc/nccl.conf": "# site defaults\nNCCL_IB_DISABLE=1\nNCCL_SOCKET_IFNAME==ens1f0\nnot a setting\n"
        }
    }
    settings_ = effective_settings({"NCCL_SOCKET_IFNAME": "eth0"}, conf)
    assert settings_["NCCL_IB_DISABLE"] == ("1", "/etc/nccl.conf")
    assert settings_["NCCL_SOCKET_IFNAME"] == ("eth0", "environment")
    (f,) = by_id(judge({}, conf), "nccl_env.transport_disabled")
    assert f.evidence[0].source == "/etc/nccl.conf"


def test_parse_nccl_conf_keeps_value_with_equals() -> None:
    assert parse_nccl_conf("NCCL_SOCKET_IFNAME==ens1f0\n  NCCL_DEBUG = WARN \n#NCCL_X=1\n") == {
        "NCCL_SOCKET_IFNAME": "=ens1f0",
        "NCCL_DEBUG": "WARN",
    }


def test_replay_from_hand_built_snapshot(tmp_path: Path) -> None:
    (tmp_path / "env.json").write_text(json.dumps({"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAMES": "eth0"}))
    (tmp_path / "nccl-conf.json").write_text(
        json.dumps({"files": {"/etc/nccl.conf": "NCCL_SHM_DISABLE=1\n"}})
    )
    report = run_checks(ReplaySources(tmp_path), [nccl_env.AREA], timeout_s=10)
    ids = [f.id for f in report.findings]
    assert ids.count("nccl_env.transport_disabled") == 2 and "nccl_env.unknown" in ids


def test_known_list_is_nccl_names() -> None:
    assert "NCCL_SOCKET_IFNAME" in KNOWN_NCCL_NAMES and "NCCL_NET_GDR_LEVEL" in KNOWN_NCCL_NAMES
    assert all(n.startswith("NCCL_") and n.upper() == n for n in KNOWN_NCCL_NAMES)


NAME = st.one_of(
    st.sampled_from(
        sorted(KNOWN_NCCL_NAMES)[:20] + list(nccl_env.DEPRECATED_TORCH) + ["TORCH_DISTRIBUTED_DEBUG"]
    ),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", max_size=20).map(lambda s: "NCCL_" + s),
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(NAME, st.text(max_size=10), max_size=6), st.text(max_size=200))
def test_any_settings_are_judged_without_error(env: dict[str, str], conf_text: str) -> None:
    findings = judge(env, {"files": {"/etc/nccl.conf": conf_text}})
    assert findings[0].id == "nccl_env.set"
    assert all(f.id.startswith("nccl_env.") for f in findings)


def test_image_metadata_is_info_not_a_typo() -> None:
    # As NVIDIA's CUDA images set them (`ENV NCCL_VERSION 2.7.8` in nvidia/cuda-derived Dockerfiles, e.g.
    # deezer/spleeter docker/cuda-10-1.dockerfile; 2.28.3-1 seen on a real H100 node's image).
    env = {
        "NCCL_VERSION": "2.28.3-1",
        "NV_LIBNCCL_PACKAGE": "libnccl2=2.28.3-1+cuda13.0",
        "NV_LIBNCCL_PACKAGE_VERSION": "2.28.3-1",
        "NCCL_DEBUG": "WARN",
    }
    findings = judge(env)
    assert not by_id(findings, "nccl_env.unknown")
    (meta,) = by_id(findings, "nccl_env.image_metadata")
    assert meta.severity == Severity.INFO and "NCCL_VERSION=2.28.3-1" in meta.summary
    assert set(meta.data["variables"]) == {"NCCL_VERSION", "NV_LIBNCCL_PACKAGE", "NV_LIBNCCL_PACKAGE_VERSION"}
    (listed,) = by_id(findings, "nccl_env.set")
    assert listed.summary == "1 set: NCCL_DEBUG=WARN"
    assert exit_code_for(findings) == ExitCode.HEALTHY


def test_nccl_version_that_is_not_a_version_is_still_judged() -> None:
    # Not package bookkeeping: a value no image writes, from a config file or not version-like.
    assert not by_id(judge({"NCCL_VERSION": "INFO"}), "nccl_env.image_metadata")
    conf = {"files": {"/etc/nccl.conf": "NCCL_VERSION=2.28.3-1\n"}}
    assert not by_id(judge({}, conf), "nccl_env.image_metadata")
