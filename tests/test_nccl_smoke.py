"""The `nccl` area of `check`: the gloo path on CPU with --smoke (real ranks), skips, failure judging."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ddpdoctor.bench.outcome import LaunchResult, RankFailure, RankState
from ddpdoctor.checks.nccl import SmokeFacts, check_nccl
from ddpdoctor.cli import app
from ddpdoctor.core.model import Severity

# These tests are about the CPU-only behaviour (the gloo path, the skip without GPUs): hide any GPU
# so that they hold on a GPU node too. CUDA_VISIBLE_DEVICES="" is what users would set, and the ranks
# the smoke test spawns inherit it. The NCCL path itself is covered by tests/test_bench_gpu.py.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def _check(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(
        app, ["check", "--only", "nccl", "--json", "--timeout", "60", *args], env=CPU_ONLY
    )
    return result.exit_code, json.loads(result.output)


def test_smoke_on_cpu_proves_the_gloo_path() -> None:
    code, report = _check("--smoke")
    assert code == 0, report
    by_id: dict[str, list] = {}
    for f in report["findings"]:
        by_id.setdefault(f["id"], []).append(f)
    (smoke,) = by_id["nccl.smoke"]
    assert smoke["severity"] == "ok" and smoke["summary"].startswith("gloo on 2 rank(s)")
    ranks = sorted(by_id["nccl.smoke.rank"], key=lambda f: f["data"]["rank"])
    assert [f["data"]["rank"] for f in ranks] == [0, 1]
    for f in ranks:
        assert f["severity"] == "ok"
        assert f["data"]["all_reduce"] == {"expected": 3.0, "wrong": 0}
        assert f["data"]["broadcast"] == {"expected": 7.0, "wrong": 0}


def test_smoke_skipped_without_gpus_or_when_disabled() -> None:
    for args in ((), ("--no-smoke",)):
        code, report = _check(*args)
        assert code == 0
        assert [(f["id"], f["severity"]) for f in report["findings"]] == [("nccl.smoke", "skip")]


def _failed_launch() -> LaunchResult:
    result = LaunchResult(world_size=2, backend="nccl", timeout_s=20)
    result.ranks = {0: RankState(rank=0), 1: RankState(rank=1)}
    dead = RankFailure(rank=1, kind="signal", op="init", size=0, host="node7", signal="SIGSEGV", exitcode=-11)
    result.failures = [dead]
    result.root_cause = dead
    return result


def test_failed_smoke_is_a_fail_naming_the_root_cause() -> None:
    findings = check_nccl(SmokeFacts("ran", backend="nccl", nproc=2, launch=_failed_launch()))
    assert findings[0].id == "nccl.smoke" and findings[0].severity == Severity.FAIL
    assert "rank 1 on node7 in init: killed by SIGSEGV" in findings[0].summary


def test_wrong_values_on_a_rank_fail() -> None:
    launch = LaunchResult(world_size=2, backend="nccl")
    launch.ranks = {
        0: RankState(
            rank=0,
            done=True,
            result={"device": "cuda:0", "host": "h", "all_reduce": {"wrong": 0}, "broadcast": {"wrong": 0}},
        ),
        1: RankState(
            rank=1,
            done=True,
            result={"device": "cuda:1", "host": "h", "all_reduce": {"wrong": 5}, "broadcast": {"wrong": 0}},
        ),
    }
    findings = check_nccl(SmokeFacts("ran", backend="nccl", nproc=2, launch=launch))
    assert findings[0].severity == Severity.FAIL and "1 rank(s) received wrong values" in findings[0].summary
    assert [f.severity for f in findings[1:]] == [Severity.OK, Severity.FAIL]


def test_gpu_query_of_the_smoke_test_starts_with_the_check() -> None:
    """On a GPU node the smoke test is the longest path: its GPU query must not wait for the areas."""
    from ddpdoctor.bench.preflight import NVIDIA_SMI_GPUS
    from ddpdoctor.cli.check import start_live_sources

    with start_live_sources(30, ["nccl"], [], None) as sources:
        assert NVIDIA_SMI_GPUS.id in sources._cache  # started (or done) already
    with start_live_sources(30, ["nccl"], [], False) as sources:
        assert NVIDIA_SMI_GPUS.id not in sources._cache  # --no-smoke: nothing to prepare
    with start_live_sources(30, ["gpu"], [], None) as sources:
        assert NVIDIA_SMI_GPUS.id not in sources._cache
