"""Launch environment: parsing (hypothesis) and the judges for torchrun, Slurm and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.checks.launch import (
    ENV_INIT_VARS,
    SLURM_INT_VARS,
    TORCH_INT_VARS,
    check_launch_env,
    is_multi_node,
    parse_int,
    parse_launch_env,
    parse_port,
)
from ddpdoctor.core.model import ExitCode, Severity, exit_code_for

TORCHRUN = {
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "RANK": "5",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "4",
    "ROLE_RANK": "5",
    "ROLE_WORLD_SIZE": "16",
    "TORCHELASTIC_RUN_ID": "job42",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
}


def ids(findings, severity=None) -> set[str]:
    return {f.id for f in findings if severity is None or f.severity == severity}


def only(findings, fid: str):
    (f,) = [f for f in findings if f.id == fid]
    return f


def test_no_launcher_is_healthy_info() -> None:
    findings = check_launch_env({"PATH": "/usr/bin"})
    assert exit_code_for(findings) == ExitCode.HEALTHY
    assert "No launcher variables" in only(findings, "launch.launcher").summary
    assert only(findings, "launch.cuda_visible_devices").severity == Severity.INFO


def test_consistent_torchrun_env_has_no_problem() -> None:
    findings = check_launch_env(TORCHRUN)
    assert max(f.severity for f in findings) <= Severity.INFO
    assert only(findings, "launch.launcher").summary.startswith("torchrun")
    assert only(findings, "launch.rank.out_of_range").severity == Severity.OK


def test_rank_at_or_beyond_world_size_fails_with_fix() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "5", "WORLD_SIZE": "4"}
    f = only(check_launch_env(env), "launch.rank.out_of_range")
    assert f.severity == Severity.FAIL
    assert "RANK=5 but WORLD_SIZE=4" in f.summary and "0 to 3" in f.summary
    assert "--nproc_per_node" in f.fix
    assert only(check_launch_env(dict(env, RANK="4")), "launch.rank.out_of_range").severity == Severity.FAIL
    assert only(check_launch_env(dict(env, RANK="3")), "launch.rank.out_of_range").severity == Severity.OK


def test_local_rank_beyond_local_world_size_fails() -> None:
    f = only(check_launch_env(dict(TORCHRUN, LOCAL_RANK="4")), "launch.local_rank.out_of_range")
    assert f.severity == Severity.FAIL and "LOCAL_RANK=4" in f.summary


def test_malformed_values_fail_each() -> None:
    env = dict(TORCHRUN, RANK="abc", MASTER_PORT="99999", MASTER_ADDR="tcp://10.0.0.1:29500", WORLD_SIZE="0")
    findings = check_launch_env(env)
    bad = {f.data["name"]: f for f in findings if f.id == "launch.var.malformed"}
    assert set(bad) == {"RANK", "MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE"}
    assert all(f.severity == Severity.FAIL for f in bad.values())
    assert "not a TCP port" in bad["MASTER_PORT"].summary and "29500" in bad["MASTER_PORT"].fix
    assert "no tcp://" in bad["MASTER_ADDR"].fix
    # The other variables get a fix that names them and who should set them.
    assert bad["RANK"].fix.startswith("Set RANK to a whole number") and "torchrun" in bad["RANK"].fix
    slurm = only(check_launch_env({"SLURM_NTASKS": "four"}), "launch.var.malformed")
    assert "SLURM_NTASKS" in slurm.fix and "srun" in slurm.fix


def test_partial_env_init_set_is_missing() -> None:
    f = only(check_launch_env({"RANK": "0", "WORLD_SIZE": "2"}), "launch.var.missing")
    assert f.severity == Severity.FAIL
    assert f.data["missing"] == ["MASTER_ADDR", "MASTER_PORT"]
    assert "torchrun" in f.fix


def test_group_rank_arithmetic_and_sizes() -> None:
    assert (
        only(check_launch_env(dict(TORCHRUN, RANK="6")), "launch.world_size.inconsistent").severity
        == Severity.WARN
    )
    assert (
        only(check_launch_env(dict(TORCHRUN, WORLD_SIZE="10")), "launch.world_size.inconsistent").severity
        == Severity.WARN
    )
    f = only(
        check_launch_env(dict(TORCHRUN, LOCAL_WORLD_SIZE="32", LOCAL_RANK="1")),
        "launch.world_size.inconsistent",
    )
    assert f.severity == Severity.FAIL


def test_slurm_one_task_per_rank_must_agree() -> None:
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "3",
        "SLURM_NNODES": "2",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "29500",
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "3",
    }
    assert "launch.slurm.mismatch" not in ids(check_launch_env(env))
    findings = check_launch_env(dict(env, RANK="0", WORLD_SIZE="4"))
    mismatches = [f for f in findings if f.id == "launch.slurm.mismatch"]
    assert {f.summary.split("=")[0] for f in mismatches} == {"RANK", "WORLD_SIZE"}
    assert all(f.severity == Severity.FAIL for f in mismatches)


def test_several_torchrun_agents_per_node_under_slurm_warn() -> None:
    env = dict(TORCHRUN, SLURM_JOB_ID="1", SLURM_PROCID="1", SLURM_NTASKS="16", SLURM_NNODES="4")
    f = only(check_launch_env(env), "launch.slurm.torchrun_per_task")
    assert f.severity == Severity.WARN and "4 torchrun agents per node" in f.summary
    ok = dict(env, SLURM_NTASKS="4")
    assert "launch.slurm.torchrun_per_task" not in ids(check_launch_env(ok))


def test_elastic_restart_warns() -> None:
    f = only(
        check_launch_env(dict(TORCHRUN, TORCHELASTIC_RESTART_COUNT="2", TORCHELASTIC_MAX_RESTARTS="3")),
        "launch.elastic.restarted",
    )
    assert f.severity == Severity.WARN and "2 time(s) of 3" in f.summary


def test_duplicate_visible_device_is_the_gpu_sharing_deadlock() -> None:
    f = only(check_launch_env({"CUDA_VISIBLE_DEVICES": "0,0"}), "launch.cuda_visible_devices.duplicate")
    assert f.severity == Severity.FAIL
    assert "share one GPU" in f.summary and "deadlock" in f.summary
    assert "set_device" in f.fix


def test_invalid_and_empty_visible_devices() -> None:
    f = only(check_launch_env({"CUDA_VISIBLE_DEVICES": "0,1,,2"}), "launch.cuda_visible_devices.invalid")
    assert f.severity == Severity.FAIL and "only 0, 1 stay visible" in f.summary
    f = only(check_launch_env({"CUDA_VISIBLE_DEVICES": "0,gpu1"}), "launch.cuda_visible_devices.invalid")
    assert "'gpu1'" in f.summary
    assert (
        only(check_launch_env({"CUDA_VISIBLE_DEVICES": ""}), "launch.cuda_visible_devices.empty").severity
        == Severity.WARN
    )
    ok = only(check_launch_env({"CUDA_VISIBLE_DEVICES": "2,3"}), "launch.cuda_visible_devices")
    assert ok.severity == Severity.OK and "2 GPU(s)" in ok.summary


def test_local_rank_without_a_visible_gpu_warns() -> None:
    env = dict(TORCHRUN, CUDA_VISIBLE_DEVICES="0")
    f = only(check_launch_env(env), "launch.local_rank.no_device")
    assert f.severity == Severity.WARN and "cuda:1" in f.summary


def test_multi_node_detection() -> None:
    assert is_multi_node(TORCHRUN)
    assert not is_multi_node({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"})
    assert is_multi_node({"SLURM_NNODES": "2"})
    assert not is_multi_node({})


def test_int_and_port_parsing() -> None:
    assert (
        parse_int(" 7 ") == 7
        and parse_int("7.0") is None
        and parse_int("") is None
        and parse_int("٣") is None
    )
    assert parse_port("29500") == 29500
    assert parse_port("0") is None and parse_port("65536") is None and parse_port("99999") is None


# ------------------------------------------------------------------ properties

NAMES = st.sampled_from(
    TORCH_INT_VARS + SLURM_INT_VARS + ENV_INIT_VARS + ("CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RUN_ID")
)
VALUES = st.one_of(st.text(max_size=12), st.integers(-5, 70000).map(str))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(NAMES, VALUES, max_size=12))
def test_any_environment_is_judged_without_error(env: dict[str, str]) -> None:
    findings = check_launch_env(env)
    assert all(f.id.startswith("launch.") and f.summary for f in findings)
    parsed = parse_launch_env(env)
    assert set(parsed.ints).isdisjoint(parsed.malformed)
    assert all(v >= 0 for v in parsed.ints.values())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 4096), st.integers(1, 4096))
def test_rank_out_of_range_iff_rank_not_below_world(rank: int, world: int) -> None:
    env = {"MASTER_ADDR": "h", "MASTER_PORT": "29500", "RANK": str(rank), "WORLD_SIZE": str(world)}
    f = only(check_launch_env(env), "launch.rank.out_of_range")
    assert (f.severity == Severity.FAIL) == (rank >= world)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=10))
def test_port_parse_matches_definition(text: str) -> None:
    port = parse_port(text)
    stripped = text.strip()
    expected = int(stripped) if stripped.isascii() and stripped.lstrip("+-").isdigit() else None
    if expected is not None and not 1 <= expected <= 65535:
        expected = None
    assert port == expected
