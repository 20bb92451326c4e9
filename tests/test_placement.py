"""Ranks per node against GPUs (gpu.ranks_per_node): the pure judgement, and `check` live and on replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.core.model import ExitCode, Severity, exit_code_for
from ddpdoctor.core.placement import (
    GpuSupply,
    LocalRanks,
    choose_cuda_index,
    judge_placement,
    read_local_ranks,
    supply_from_gpus,
    tasks_on_node,
)

FIX = Path(__file__).parent / "fixtures"
REPLAY = FIX / "check" / "real-h100-torchrun-2ranks"
H100_GPUS = json.loads((REPLAY / "nvml.json").read_text())["gpus"]


def one(findings):
    assert len(findings) == 1, findings
    return findings[0]


@pytest.mark.parametrize(
    "text,node,expected",
    [
        ("2(x3),1", 0, 2),
        ("2(x3),1", 2, 2),
        ("2(x3),1", 3, 1),
        ("2(x3),1", 4, None),
        ("2(x3),1", None, None),  # differs per node and the node is not known
        ("4(x2)", None, 4),
        ("8", None, 8),
        ("8", 5, 8),
        ("", None, None),
        ("0", None, None),
        ("2(x)", 0, None),
        ("abc", 0, None),
    ],
)
def test_tasks_on_node(text, node, expected) -> None:
    assert tasks_on_node(text, node) == expected


def test_local_ranks_sources_in_order() -> None:
    assert read_local_ranks({}).count is None
    env = {"LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x", "SLURM_NTASKS_PER_NODE": "1"}
    r = read_local_ranks(env)
    assert (r.count, r.launcher, r.source) == (2, "torchrun", "LOCAL_WORLD_SIZE=2")
    assert read_local_ranks(env, nproc_per_node=8).count == 8
    pet = read_local_ranks({"PET_NPROC_PER_NODE": "4", "SLURM_NTASKS_PER_NODE": "1"})
    assert (pet.count, pet.launcher, pet.source) == (4, "torchrun", "PET_NPROC_PER_NODE=4")
    assert read_local_ranks({"PET_NPROC_PER_NODE": "gpu"}).count is None
    slurm = {"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3", "SLURM_STEP_ID": "0"}
    r = read_local_ranks(slurm)
    assert (r.count, r.launcher, r.per_task_binding) == (1, "slurm", False)
    r = read_local_ranks({**slurm, "SLURM_GPUS_PER_TASK": "a100:1", "SLURM_GPUS_ON_NODE": "1"})
    assert (r.gpus_per_task, r.gpus_on_node, r.per_task_binding) == (1, 1, True)
    # srun --gpu-bind gave each task one of the step's four GPUs: not four ranks on one GPU.
    bound = {"SLURM_NTASKS_PER_NODE": "4", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "0,1,2,3"}
    assert read_local_ranks({**bound, "CUDA_VISIBLE_DEVICES": "2"}).per_task_binding
    assert not read_local_ranks({**bound, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}).per_task_binding
    r = read_local_ranks({"LOCAL_WORLD_SIZE": "abc", "SLURM_NTASKS_PER_NODE": "4"})
    assert r.count == 4 and "LOCAL_WORLD_SIZE" in r.problems[0]


def test_two_ranks_one_gpu_fails_with_the_consequence() -> None:
    ranks = read_local_ranks({"LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"})
    supply = supply_from_gpus(H100_GPUS, None, "NVML")
    f = one(judge_placement(ranks, supply, None))
    assert f.id == "gpu.ranks_per_node" and f.severity == Severity.FAIL
    assert "2 rank(s) per node" in f.summary and "1 GPU(s) visible" in f.summary
    assert "invalid device ordinal" in f.summary and "Duplicate GPU detected" in f.summary
    assert "torchrun --nproc-per-node 1" in (f.fix or "")
    assert one(judge_placement(ranks, supply, "nccl")).severity == Severity.FAIL
    gloo = one(judge_placement(ranks, supply, "gloo"))
    assert gloo.severity == Severity.OK and "fine for gloo on CPU" in gloo.summary


def test_visible_devices_narrow_the_supply() -> None:
    two = [dict(H100_GPUS[0]), dict(H100_GPUS[0], index=1, uuid="GPU-11111111-2222-3333-4444-555555555555")]
    ranks = LocalRanks(2, "LOCAL_WORLD_SIZE=2", "torchrun")
    assert one(judge_placement(ranks, supply_from_gpus(two, None, "NVML"))).severity == Severity.OK
    assert supply_from_gpus(two, "1", "NVML").visible == 1
    assert supply_from_gpus(two, "GPU-11111111", "NVML").visible == 1
    assert supply_from_gpus(two, "MIG-GPU-11111111-2222-3333-4444-555555555555/1/0", "NVML").visible == 1
    assert supply_from_gpus(two, "", "NVML").visible == 0
    assert one(judge_placement(ranks, supply_from_gpus(two, "1", "NVML"))).severity == Severity.FAIL


def test_no_gpu_here_is_inconclusive_when_asked_and_a_skip_under_a_launcher() -> None:
    # `check --nproc-per-node 8` asked the question: unanswerable is inconclusive (exit 3), never a pass.
    ranks = LocalRanks(8, "--nproc-per-node 8", "preflight")
    unknown = GpuSupply(None, "NVML", why_unknown="no NVIDIA GPU or driver found on this machine")
    f = one(judge_placement(ranks, unknown, None))
    assert f.severity == Severity.ERROR and "cannot be read here" in f.summary and f.fix
    assert exit_code_for([f]) == ExitCode.INCONCLUSIVE
    assert one(judge_placement(ranks, unknown, "nccl")).severity == Severity.FAIL
    hidden = GpuSupply(0, "NVML")
    assert one(judge_placement(ranks, hidden, None)).severity == Severity.ERROR
    # Under torchrun the count is context only: gloo on CPU is fine, so it stays a skip.
    launched = LocalRanks(8, "LOCAL_WORLD_SIZE=8", "torchrun")
    assert one(judge_placement(launched, unknown, None)).severity == Severity.SKIP
    assert one(judge_placement(launched, hidden, None)).severity == Severity.SKIP
    assert one(judge_placement(ranks, hidden, "nccl")).severity == Severity.FAIL
    assert one(judge_placement(ranks, hidden, "gloo")).severity == Severity.OK


def test_slurm_gave_fewer_gpus_than_asked_names_both_numbers() -> None:
    env = {"SLURM_NTASKS_PER_NODE": "4", "SLURM_GPUS_PER_TASK": "1", "SLURM_GPUS_ON_NODE": "2"}
    findings = judge_placement(read_local_ranks(env), GpuSupply(4, "NVML"), None)
    short = [f for f in findings if f.id == "gpu.slurm.gpus_short"]
    assert short and short[0].severity == Severity.FAIL
    assert "= 4 GPU(s)" in short[0].summary and "allocated 2" in short[0].summary
    # Judged from Slurm's numbers alone where the GPUs cannot be read.
    findings = judge_placement(read_local_ranks(env), GpuSupply(None, "NVML", why_unknown="none"), None)
    assert [(f.id, f.severity) for f in findings] == [
        ("gpu.slurm.gpus_short", Severity.FAIL),
        ("gpu.ranks_per_node", Severity.SKIP),
    ]
    # Bound per task: each task sees its own GPU; one task seeing none fails naming 1 and 0.
    bound = {**env, "SLURM_GPUS_ON_NODE": "4", "SLURM_STEP_ID": "0"}
    assert one(judge_placement(read_local_ranks(bound), GpuSupply(1, "NVML"))).severity == Severity.OK
    f = one(judge_placement(read_local_ranks(bound), GpuSupply(0, "NVML")))
    assert f.id == "gpu.slurm.gpus_short" and "1 GPU(s) per task" in f.summary and "sees 0" in f.summary


def test_gpu_held_by_another_job_is_a_warning() -> None:
    gpus = [dict(H100_GPUS[0], processes=[{"pid": 4242, "name": "python", "type": "C"}])]
    supply = supply_from_gpus(gpus, None, "NVML", job_pids=frozenset({1, 2}))
    assert supply.held_gpus == 1 and "pid 4242" in supply.held_by_others[0]
    f = one(judge_placement(LocalRanks(1, "LOCAL_WORLD_SIZE=1", "torchrun"), supply))
    assert f.severity == Severity.WARN and "another job" in f.summary
    mine = supply_from_gpus(gpus, None, "NVML", job_pids=frozenset({4242}))
    assert mine.held_gpus == 0


@given(text=st.text(max_size=40), node=st.one_of(st.none(), st.integers(0, 10**9)))
def test_tasks_on_node_takes_any_text(text: str, node) -> None:
    value = tasks_on_node(text, node)
    assert value is None or value > 0


_VALUE = st.one_of(
    st.integers(-3, 20).map(str),
    st.sampled_from(["", "abc", "2(x3),1", "4(x2)", "1,2", "٣", "1_0", "9" * 40, "a100:2", "2(x0)"]),
    st.text(max_size=12),
)
_NAMES = [
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "GROUP_RANK",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_STEP_ID",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPUS_ON_NODE",
    "SLURM_STEP_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "PET_NPROC_PER_NODE",
]


@given(
    env=st.dictionaries(st.sampled_from(_NAMES), _VALUE, max_size=8),
    visible=st.one_of(st.none(), st.integers(0, 16)),
    backend=st.sampled_from([None, "nccl", "gloo"]),
)
def test_any_launcher_environment_gives_a_consistent_verdict(env, visible, backend) -> None:
    ranks = read_local_ranks(env)
    findings = judge_placement(ranks, GpuSupply(visible, "NVML", why_unknown="none here"), backend)
    if ranks.count is None:
        assert findings == []
        return
    assert ranks.count > 0
    worst = max(f.severity for f in findings)
    if backend == "gloo":
        assert worst == Severity.OK
    elif visible is None:
        short = any(f.id == "gpu.slurm.gpus_short" for f in findings)
        assert worst == (Severity.FAIL if backend == "nccl" or short else Severity.SKIP)
    elif ranks.per_task_binding:
        assert worst in (Severity.OK, Severity.FAIL)
    elif visible == 0 and backend is None:
        assert worst in (Severity.SKIP, Severity.FAIL)
        assert (worst == Severity.FAIL) == any(f.id == "gpu.slurm.gpus_short" for f in findings)
    elif ranks.count > visible:
        assert any(f.id == "gpu.ranks_per_node" and f.severity == Severity.FAIL for f in findings)
    else:
        placement = [f for f in findings if f.id == "gpu.ranks_per_node"]
        assert placement and placement[0].severity == Severity.OK


@given(
    env=st.dictionaries(st.sampled_from(_NAMES), _VALUE, max_size=8),
    visible=st.integers(1, 16),
    local_rank=st.integers(0, 31),
)
def test_a_rank_the_judgement_passes_pins_a_gpu_it_can_see(env, visible, local_rank) -> None:
    ranks = read_local_ranks(env)
    if ranks.count is None or local_rank >= ranks.count:
        return
    findings = judge_placement(ranks, GpuSupply(visible, "NVML"), "nccl")
    if max(f.severity for f in findings) == Severity.OK:
        assert 0 <= choose_cuda_index(local_rank, visible, env) < visible


def test_srun_per_task_binding_pins_the_tasks_own_gpu() -> None:
    # srun --ntasks-per-node=4 --gpus-per-task=1: task 3 sees one GPU, as device 0.
    bound = {"SLURM_NTASKS_PER_NODE": "4", "SLURM_STEP_ID": "0", "SLURM_GPUS_PER_TASK": "1"}
    assert one(judge_placement(read_local_ranks(bound), GpuSupply(1, "NVML"), "nccl")).severity == Severity.OK
    assert choose_cuda_index(3, 1, bound) == 0
    # --gpus-per-task=2: task 3 sees its own two GPUs as 0 and 1.
    assert choose_cuda_index(3, 2, {**bound, "SLURM_GPUS_PER_TASK": "2"}) == 0
    # Not bound (torchrun, or srun with every GPU visible): LOCAL_RANK, as before.
    torchrun = {"LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}
    assert [choose_cuda_index(r, 4, torchrun) for r in range(4)] == [0, 1, 2, 3]
    assert choose_cuda_index(1, None, torchrun) == 1
    # Two ranks, two GPUs but LOCAL_RANK 3: the judgement fails it; the index stays what CUDA rejects.
    assert choose_cuda_index(3, 2, torchrun) == 3
    # One GPU visible per rank (a wrapper narrowing CUDA_VISIBLE_DEVICES): the only GPU there is.
    assert choose_cuda_index(5, 1, torchrun) == 0


def test_bench_worker_pins_the_device_the_judgement_expects(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from ddpdoctor.bench import worker

    pinned: list[int] = []
    # Fake only the CUDA boundary: one GPU visible to this task, set_device recorded.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: pinned.append(index))
    for name, value in {
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_STEP_ID": "0",
        "SLURM_GPUS_PER_TASK": "1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "PET_NPROC_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert worker.select_device("nccl", 2) == torch.device("cuda", 0)
    assert pinned == [0]
    assert worker.select_device("gloo", 2) == torch.device("cpu")


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LOCAL_", "TORCHELASTIC_"))}
    base.update({"COLUMNS": "120", "NO_COLOR": "1"})
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def placement_of(stdout: str) -> dict:
    doc = json.loads(stdout)
    return next(f for f in doc["findings"] if f["id"] == "gpu.ranks_per_node")


def test_replay_of_a_torchrun_rank_on_the_real_one_gpu_node_fails() -> None:
    out = run_cli("check", "--replay", str(REPLAY), "--only", "gpu,launch", "--json")
    assert out.returncode == 1, out.stderr
    f = placement_of(out.stdout)
    assert f["severity"] == "fail" and "LOCAL_WORLD_SIZE=2" in f["summary"] and "1 GPU(s)" in f["summary"]


def test_nproc_per_node_preflight_on_a_replay_fails() -> None:
    out = run_cli("check", "--replay", str(REPLAY), "--only", "gpu", "--json", "--nproc-per-node", "8")
    assert out.returncode == 1, out.stderr
    assert "8 rank(s) per node (--nproc-per-node 8)" in placement_of(out.stdout)["summary"]


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="judges a machine without GPUs")
def test_nproc_per_node_without_gpus_says_why_it_cannot_judge() -> None:
    out = run_cli("check", "--only", "gpu", "--json", "--nproc-per-node", "8", "--no-smoke")
    f = placement_of(out.stdout)
    assert f["severity"] == "error" and "cannot be read here" in f["summary"], f
    assert out.returncode == 3  # asked and unanswerable: inconclusive, never a pass


@pytest.mark.parametrize("local_rank,why", [("1", "local rank 0 runs it"), ("0", "do not fit its GPUs")])
def test_smoke_test_inside_a_job_runs_once_per_node_and_only_where_ranks_fit(
    local_rank: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    # The real one-GPU H100 facts stand in for this node's GPUs (test-only, at the edge).
    monkeypatch.setenv("DDPDOCTOR_FAKE_GPU_DIR", str(REPLAY))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    result = CliRunner().invoke(app, ["check", "--only", "nccl", "--json", "--smoke"])
    (smoke,) = json.loads(result.output)["findings"]
    assert smoke["id"] == "nccl.smoke" and smoke["severity"] == "skip" and why in smoke["summary"]


def test_pairwise_backend_is_chosen_from_every_rank_alike() -> None:
    from ddpdoctor.cluster.pairwise import choose_backend

    def entry(host: str, local_rank: int, visible: int | None, cuda: bool = True) -> dict:
        return {"host": host, "local_rank": local_rank, "visible": visible, "cuda": cuda}

    two_nodes = [entry("a", 0, 8), entry("b", 0, 8)]
    assert choose_backend(two_nodes, "auto") == ("nccl", [], [])
    # Three agents on one 8-GPU host, each with LOCAL_RANK 0: all would use cuda:0 (issue #15 item 3).
    agents = [entry("h", 0, 8), entry("h", 0, 8), entry("h", 0, 8)]
    backend, notes, refusals = choose_backend(agents, "auto")
    assert backend == "gloo" and "share LOCAL_RANK 0" in notes[0] and refusals == []
    backend, notes, refusals = choose_backend(agents, "nccl")
    assert backend == "nccl" and [f.id for f in refusals] == ["gpu.ranks_per_node"]
    # Two ranks on a one-GPU host.
    crowded = [entry("h", 0, 1), entry("h", 1, 1)]
    assert "1 GPU(s) visible" in choose_backend(crowded, "auto")[1][0]
    assert choose_backend(crowded, "gloo") == ("gloo", [], [])
    # A node without CUDA: auto is gloo for everyone.
    assert choose_backend([entry("a", 0, 8), entry("b", 0, 0, cuda=False)], "auto")[0] == "gloo"


def test_fake_gpu_dir_is_read_through_the_bounded_edge_reader(tmp_path: Path) -> None:
    from ddpdoctor.bench.preflight import read_fake_gpus

    result, gpus, version, cuda = read_fake_gpus(str(REPLAY))
    assert result.ok and len(gpus) == 1 and version
    # Garbage in the stand-in directory is an unusable GPU reading, never a traceback or a hang.
    (tmp_path / "torch-info.txt").write_text("{}")
    (tmp_path / "nvml.json").write_text("[" * 200_000)  # RecursionError in json.loads
    result, gpus, _, _ = read_fake_gpus(str(tmp_path))
    assert not result.found and gpus == [] and "nested" in result.error
    if hasattr(os, "mkfifo"):
        (tmp_path / "nvml.json").unlink()
        os.mkfifo(tmp_path / "nvml.json")  # read_text() would wait for a writer forever
        result, gpus, _, _ = read_fake_gpus(str(tmp_path))
        assert not result.found and "FIFO" in result.error
