"""Two ranks on a one-GPU node under real torchrun agents: every rank refuses before init_process_group.

The agents are real (`python -m torch.distributed.run --standalone`, CPU, gloo where anything runs); only
the GPUs are faked, at the I/O edge: DDPDOCTOR_FAKE_GPU_DIR points the launch-fact gatherer at the real
`nvml.json` and `torch-info.txt` of the one-GPU H100 node (tests/fixtures/check/real-h100-torchrun-2ranks,
provenance in tests/fixtures/README.md). The GPU-marked tests at the end replay the two commands of
issue #13 on a real GPU node, without the stand-in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import psutil
import pytest
from _cluster_agents import agent_env

REPO = Path(__file__).resolve().parents[1]
ONE_GPU = REPO / "tests" / "fixtures" / "check" / "real-h100-torchrun-2ranks"
BENCH_SCHEMA = json.loads((REPO / "docs" / "schemas" / "bench.schema.json").read_text())
RUN_TIMEOUT_S = 120  # a refusal takes seconds; the bound only proves that nothing hangs


@dataclass
class RankLogs:
    returncode: int
    agent_output: str
    stdout: dict[int, str]
    stderr: dict[int, str]


def survivors(marker: str) -> list[psutil.Process]:
    """Processes still carrying this run's marker in their environment (none may outlive the agent)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("DDPDOCTOR_TEST_MARKER") == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def torchrun(
    tmp_path: Path, nproc: int, args: list[str], fake: bool = True, env: dict[str, str] | None = None
) -> RankLogs:
    """One standalone torchrun agent with per-rank logs (--redirects 3), killed at RUN_TIMEOUT_S."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    extra = {"DDPDOCTOR_TEST_MARKER": marker, **(env or {})}
    if fake:
        extra["DDPDOCTOR_FAKE_GPU_DIR"] = str(ONE_GPU)
    logs = tmp_path / "logs"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    argv += ["--redirects", "3", "--log-dir", str(logs), "--max-restarts", "0", "-m", "ddpdoctor", *args]
    proc = subprocess.Popen(
        argv,
        env=agent_env(extra),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {RUN_TIMEOUT_S}s:\n{out}")
    assert survivors(marker) == [], "a rank outlived its agent"
    stdout, stderr = {}, {}
    for rank_dir in logs.glob("*/attempt_0/*"):
        stdout[int(rank_dir.name)] = (rank_dir / "stdout.log").read_text()
        stderr[int(rank_dir.name)] = (rank_dir / "stderr.log").read_text()
    return RankLogs(proc.returncode, out, stdout, stderr)


def assert_every_rank_refused(run: RankLogs, nproc: int) -> None:
    assert run.returncode != 0, run.agent_output
    assert sorted(run.stderr) == list(range(nproc)), run.agent_output
    # torchrun names each rank's exit code: 2 (refused), or SIGTERM from the agent once a sibling had
    # refused; never a crash or another code.
    codes = re.findall(r"exitcode  : (-?\d+)", run.agent_output)
    assert "2" in codes and set(codes) <= {"2", "-15"}, run.agent_output
    explained = run.stderr[0]
    assert "refused before launch: Ranks per node and GPUs" in explained, explained
    assert "2 rank(s) per node (LOCAL_WORLD_SIZE=2) but 1 GPU(s) visible" in explained
    assert "why:" in explained and "fix:" in explained and "torchrun --nproc-per-node 1" in explained
    for rank in range(1, nproc):
        lines = [line for line in run.stderr[rank].splitlines() if line.strip()]
        assert any("gpu.ranks_per_node" in line and "local rank 0" in line for line in lines), run.stderr[
            rank
        ]
        assert "why:" not in run.stderr[rank]


def test_bench_nccl_two_ranks_on_one_gpu_every_rank_refuses(tmp_path: Path) -> None:
    run = torchrun(
        tmp_path, 2, ["bench-nccl", "--ops", "all_reduce", "--max-bytes", "1M", "--json", "out.json"]
    )
    assert_every_rank_refused(run, 2)
    doc = json.loads((tmp_path / "out.json").read_text())  # rank 0 wrote the JSON refusal
    jsonschema.validate(doc, BENCH_SCHEMA)
    assert [f["id"] for f in doc["refusals"]] == ["gpu.ranks_per_node"] and doc["exit_code"] == 2
    assert doc["rows"] == []


def test_bench_nccl_with_gloo_on_the_same_node_runs(tmp_path: Path) -> None:
    args = ["bench-nccl", "--backend", "gloo", "--ops", "all_reduce", "--max-bytes", "64", "--iters", "1"]
    run = torchrun(tmp_path, 2, [*args, "--warmup", "0", "--json", "out.json"])
    assert run.returncode == 0, run.agent_output + str(run.stderr)
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["refusals"] == [] and doc["rows"] and doc["config"]["backend"] == "gloo"


def test_check_cluster_two_ranks_on_one_gpu_every_rank_refuses(tmp_path: Path) -> None:
    run = torchrun(tmp_path, 2, ["check", "--cluster", "--only", "system", "--join-timeout", "30"])
    assert_every_rank_refused(run, 2)


def test_pairwise_nccl_refused_and_auto_picks_gloo_with_a_note(tmp_path: Path) -> None:
    args = [
        "bench-nccl",
        "--pairwise",
        "--max-bytes",
        "64K",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--format",
        "json",
    ]
    run = torchrun(tmp_path / "nccl", 2, [*args, "--backend", "nccl"])
    assert "exitcode  : 2 " in run.agent_output, run.agent_output
    assert "counted on host" in run.stderr[0] and "fix:" in run.stderr[0]
    refusal = json.loads(run.stdout[0])
    assert [f["id"] for f in refusal["refusals"]] == ["gpu.ranks_per_node"] and refusal["exit_code"] == 2
    run = torchrun(tmp_path / "auto", 2, args)
    # Both ranks on one node: no pair of nodes, so inconclusive (exit 3), with the matrix still printed.
    assert "exitcode  : 3 " in run.agent_output, run.agent_output + str(run.stderr)
    data = json.loads(run.stdout[0])
    assert [f["id"] for f in data["findings"]] == ["cluster.pairwise.one_node"] and data["exit_code"] == 3
    assert data["backend"] == "gloo" and "1 GPU(s) visible" in data["notes"][0]
    assert "note: backend gloo on CPU" in run.stderr[0]


def test_a_rank_that_fails_names_its_reason_on_its_own_stderr(tmp_path: Path) -> None:
    # Rank 1 raises inside the benchmark (the test-only fault hook): both logs must say why.
    from ddpdoctor.bench.plan import FAULT_ENV

    fault = {FAULT_ENV: "rank=1,op=all_reduce,action=raise"}
    args = ["bench-nccl", "--backend", "gloo", "--ops", "all_reduce", "--max-bytes", "64", "--iters", "1"]
    run = torchrun(tmp_path, 2, [*args, "--warmup", "0", "--timeout", "20"], fake=False, env=fault)
    assert run.returncode != 0
    assert "ddpdoctor rank 1:" in run.stderr[1], run.stderr
    assert "root cause" in run.stderr[0], run.stderr


def _real_torchrun(nproc: int, args: list[str], tmp_path: Path) -> RankLogs:
    return torchrun(tmp_path, nproc, args, fake=False)


@pytest.mark.gpu
def test_real_one_gpu_node_bench_nccl_refused_on_every_rank(tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() != 1:
        pytest.skip("replays issue #13 on a node with exactly one GPU")
    run = _real_torchrun(2, ["bench-nccl", "--ops", "all_reduce", "--max-bytes", "1M"], tmp_path)
    assert_every_rank_refused(run, 2)


@pytest.mark.gpu
def test_real_one_gpu_node_check_fails_on_every_rank(tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() != 1:
        pytest.skip("replays issue #13 on a node with exactly one GPU")
    run = _real_torchrun(2, ["check", "--only", "launch,gpu", "--json", "--no-smoke"], tmp_path)
    codes = re.findall(r"exitcode  : (-?\d+)", run.agent_output)
    assert "1" in codes and set(codes) <= {"1", "-15"}, run.agent_output
    for rank in (0, 1):
        doc = json.loads(run.stdout[rank])
        f = next(f for f in doc["findings"] if f["id"] == "gpu.ranks_per_node")
        assert f["severity"] == "fail" and "LOCAL_WORLD_SIZE=2" in f["summary"]


def test_failing_check_under_torchrun_reports_on_every_rank(tmp_path: Path) -> None:
    # torchrun SIGTERMs the other ranks once one exits non-zero; a failing check lingers briefly so
    # that every rank's report is printed (CUDA_VISIBLE_DEVICES=0,0 fails the launch area on CPU too).
    run = torchrun(tmp_path, 2, ["check", "--only", "launch", "--json"], env={"CUDA_VISIBLE_DEVICES": "0,0"})
    codes = re.findall(r"exitcode  : (-?\d+)", run.agent_output)
    assert "1" in codes and set(codes) <= {"1", "-15"}, run.agent_output
    for rank in (0, 1):
        doc = json.loads(run.stdout[rank])
        assert any(f["id"] == "launch.cuda_visible_devices.duplicate" for f in doc["findings"]), rank


def test_last_resort_handler_names_exception_rank_and_host(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    import ddpdoctor.cli as cli

    def crash() -> None:
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(cli, "app", crash)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError):
        cli.main()  # re-raised: Python still prints the traceback after the line
    err = capsys.readouterr().err
    assert (
        f"ddpdoctor rank 3 (local rank 1) on {socket.gethostname()} died: RuntimeError: disk on fire\n" in err
    )
