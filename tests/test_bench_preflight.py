"""Pre-launch decisions of bench-nccl (pure, fed through a fake runner) and the expected-busbw table."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.bench.expected import (
    TABLE,
    expected_busbw,
    ib_interconnect,
    nvlink_interconnect,
    parse_nvlink_speeds,
    pcie_interconnect,
    read_ib_ports,
)
from ddpdoctor.bench.preflight import (
    NVIDIA_SMI_APPS,
    NVIDIA_SMI_GPUS,
    gather_launch_facts,
    parse_gpu_query,
    plan_launch,
    read_torch_build,
)
from ddpdoctor.edge.ports import PortHolder
from ddpdoctor.edge.runner import Command, CommandResult

FIX = Path(__file__).parent / "fixtures" / "bench"

# Rows in the layout of NVIDIA_SMI_GPUS (--format=csv,noheader,nounits). Constructed: the shared
# fixtures hold no capture of this exact query; names/modes/values follow the real captures
# (nvidia-smi__rtx-geforce-fan-ERR-exclusive-process-525.txt shows "E. Process" in the table view).
TWO_GPUS = (
    "0, GPU-5269b708-678a-b1a8-60f0-c90406537486, NVIDIA A100-SXM4-80GB, Default, 4, 16, 535.161.08\n"
    "1, GPU-a7605225-d684-1f65-4ad4-ee2ab39338b4, NVIDIA A100-SXM4-80GB, Default, 4, 16, 535.161.08\n"
)
ONE_GPU_EXCLUSIVE = "0, GPU-22b2c6ac-2d49-4863-197c-9c469071178a, GeForce RTX 2080, Exclusive_Process, [N/A], [N/A], 525.125.06\n"


def fake_runner(outputs: dict[str, CommandResult]):
    def run(cmd: Command) -> CommandResult:
        return outputs.get(
            cmd.id, CommandResult(argv=cmd.argv, found=False, error=f"{cmd.argv[0]}: not found")
        )

    return run


def ok(cmd: Command, stdout: str) -> CommandResult:
    return CommandResult(argv=cmd.argv, returncode=0, stdout=stdout)


def facts_for(outputs, env=None, cuda="12.4", holder=None):
    facts = gather_launch_facts(fake_runner(outputs), env or {}, find_holder=lambda port: holder)
    facts.torch_version, facts.torch_cuda = "2.5.1+cu124", cuda
    return facts


def test_auto_without_gpus_is_gloo_on_cpu() -> None:
    d = plan_launch(facts_for({}, cuda=None), "auto", None, cpu_count=2)
    assert (d.backend, d.nproc, d.refusals) == ("gloo", 2, ())
    assert "CPU-only" in d.notes[0]


def test_nccl_without_cuda_refused() -> None:
    d = plan_launch(facts_for({}, cuda=None), "nccl", None)
    assert [f.id for f in d.refusals] == ["bench.nccl.no_cuda"]
    assert "CPU-only build" in d.refusals[0].summary
    d = plan_launch(facts_for({}), "nccl", None)  # CUDA build, but nvidia-smi absent
    assert "no GPU found" in d.refusals[0].summary


def test_auto_with_gpus_is_one_nccl_rank_per_gpu() -> None:
    d = plan_launch(facts_for({NVIDIA_SMI_GPUS.id: ok(NVIDIA_SMI_GPUS, TWO_GPUS)}), "auto", None)
    assert (d.backend, d.nproc, d.gpu_indices, d.refusals) == ("nccl", 2, (0, 1), ())


def test_more_ranks_than_gpus_refused() -> None:
    outputs = {NVIDIA_SMI_GPUS.id: ok(NVIDIA_SMI_GPUS, TWO_GPUS)}
    d = plan_launch(facts_for(outputs), "nccl", 4)
    assert [f.id for f in d.refusals] == ["gpu.ranks_per_node"]
    # CUDA_VISIBLE_DEVICES=1 leaves one GPU: --nproc 2 refused.
    d = plan_launch(facts_for(outputs, env={"CUDA_VISIBLE_DEVICES": "1"}), "nccl", 2)
    assert "2 rank(s) per node (--nproc 2) but 1 GPU(s) visible" in d.refusals[0].summary


def test_duplicate_visible_devices_refused() -> None:
    outputs = {NVIDIA_SMI_GPUS.id: ok(NVIDIA_SMI_GPUS, TWO_GPUS)}
    d = plan_launch(facts_for(outputs, env={"CUDA_VISIBLE_DEVICES": "0,0"}), "nccl", 2)
    assert "bench.cuda_visible_devices.duplicate" in [f.id for f in d.refusals]


def test_exclusive_process_gpu_in_use_refused() -> None:
    outputs = {
        NVIDIA_SMI_GPUS.id: ok(NVIDIA_SMI_GPUS, ONE_GPU_EXCLUSIVE),
        NVIDIA_SMI_APPS.id: ok(NVIDIA_SMI_APPS, "GPU-22b2c6ac-2d49-4863-197c-9c469071178a, 4242, python\n"),
    }
    d = plan_launch(facts_for(outputs), "nccl", 1)
    assert [f.id for f in d.refusals] == ["bench.gpu.exclusive_process"]
    assert "4242" in d.refusals[0].summary
    free = {NVIDIA_SMI_GPUS.id: ok(NVIDIA_SMI_GPUS, ONE_GPU_EXCLUSIVE)}
    assert plan_launch(facts_for(free), "nccl", 1).refusals == ()


def test_pinned_master_port_taken_refused_with_pid() -> None:
    holder = PortHolder(port=29500, pid=4321, name="python", cmdline="python train.py")
    d = plan_launch(facts_for({}, env={"MASTER_PORT": "29500"}, holder=holder, cuda=None), "gloo", 2)
    assert [f.id for f in d.refusals] == ["bench.master_port.in_use"]
    assert "PID 4321" in d.refusals[0].summary and "train.py" in d.refusals[0].summary


def test_invalid_master_port_refused_not_replaced() -> None:
    for raw in ("0", "99999", "abc", "-1"):
        d = plan_launch(facts_for({}, env={"MASTER_PORT": raw}, cuda=None), "gloo", 2)
        assert [f.id for f in d.refusals] == ["bench.master_port.invalid"], raw
        assert "1 to 65535" in d.refusals[0].summary
    assert plan_launch(facts_for({}, env={"MASTER_PORT": "65535"}, cuda=None), "gloo", 2).refusals == ()


def test_gpu_query_garbage_and_na() -> None:
    gpus = parse_gpu_query(ONE_GPU_EXCLUSIVE + "garbage\n\n1, x\n")
    assert len(gpus) == 1 and gpus[0].pcie_gen is None and gpus[0].compute_mode == "Exclusive_Process"


def test_torch_build_read_without_import() -> None:
    import subprocess
    import sys

    version, _cuda = read_torch_build()
    assert version is not None and version.startswith("2.")
    probe = (
        "import sys; from ddpdoctor.bench.preflight import read_torch_build; "
        "v = read_torch_build(); print(v[0], 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    ).stdout.split()
    assert out == [version, "False"]


def test_nvlink_a100_fixture_expected_range() -> None:
    speeds = parse_nvlink_speeds(
        (FIX / "nvidia-smi-nvlink-s__8xa100-sxm4-80gb-12-links-25GBps.txt").read_text()
    )
    assert len(speeds) == 8 and all(len(links) == 12 for _, links in speeds.values())
    ic = nvlink_interconnect(speeds, list(range(8)))
    assert ic is not None and (ic.links, ic.line_rate_gbps) == (12, 300.0)
    rng = expected_busbw(ic)
    assert rng is not None and (rng.low, rng.high, rng.basis) == (190.0, 240.0, "reported")
    assert any("nccl-tests#149" in s for s in rng.sources)


def test_nvlink_h800_fixture_picks_h800_row() -> None:
    speeds = parse_nvlink_speeds(
        (FIX / "nvidia-smi-nvlink-s__8xh800-all-links-26GBps-elided.txt").read_text()
    )
    ic = nvlink_interconnect(speeds, sorted(speeds))
    assert ic is not None and ic.links == 8 and "H800" in ic.gpu_name
    rng = expected_busbw(ic)
    assert rng is not None and "H800" in rng.note
    # GPUs elided from the paste have no links listed: no NVLink claim for them.
    assert nvlink_interconnect(speeds, [0, 3]) is None


def test_pcie_and_ib_ranges() -> None:
    gen4 = pcie_interconnect(4, 16)
    assert gen4 is not None and expected_busbw(gen4).note == "PCIe Gen4 x16"
    x8 = pcie_interconnect(3, 8)
    assert x8 is not None and expected_busbw(x8).basis == "derived"
    assert pcie_interconnect(None, 16) is None
    ib = ib_interconnect([200.0, 200.0, 200.0, 200.0])
    rng = expected_busbw(ib)
    assert rng is not None and rng.low == pytest.approx(25 * 0.75 * 4)
    assert read_ib_ports("/nonexistent") == []


def test_table_entries_are_sourced() -> None:
    for e in TABLE:
        assert e.sources and e.low < e.high <= e.line_rate_gbps * 1.1


def test_gloo_nproc_above_four_per_cpu_refused_and_at_the_ceiling_allowed() -> None:
    facts = facts_for({}, cuda=None)
    refused = plan_launch(facts, "gloo", 9, cpu_count=2)
    assert [f.id for f in refused.refusals] == ["bench.nproc.too_many"]
    assert "on 2 usable CPU(s)" in refused.refusals[0].summary
    assert plan_launch(facts, "gloo", 8, cpu_count=2).refusals == ()
    assert plan_launch(facts, "gloo", None, cpu_count=2).refusals == ()


def test_buffer_memory_judged_from_the_op_that_needs_most() -> None:
    from ddpdoctor.bench.math import rank_buffer_bytes
    from ddpdoctor.bench.preflight import MAX_BYTES_CEILING, judge_buffer_memory

    gib = 1024**3
    # all_reduce works in place; all_to_all holds a send and a receive buffer of the full size.
    assert rank_buffer_bytes("all_reduce", gib, 4, 2, check=False) == gib
    assert rank_buffer_bytes("all_to_all", gib, 4, 2, check=False) == 2 * gib
    assert rank_buffer_bytes("all_gather", gib, 4, 2, check=False) == gib + gib // 2
    ops = ("all_reduce", "all_to_all")
    refusal = judge_buffer_memory(ops, gib, 4, 2, 2, False, 3 * gib, "free")
    assert refusal is not None and refusal.id == "bench.max_bytes.too_large"
    assert refusal.data["op"] == "all_to_all" and refusal.data["needed_bytes"] == 4 * gib
    assert judge_buffer_memory(ops, gib, 4, 2, 2, False, 4 * gib, "free") is None
    assert judge_buffer_memory(ops, gib, 4, 2, 2, False, None, "unknown") is None  # unknown: no guess
    absurd = judge_buffer_memory(ops, MAX_BYTES_CEILING * 2, 4, 2, 1, False, None, "--max-bytes")
    assert absurd is not None and "ceiling" in absurd.summary


def test_available_memory_is_the_smallest_free_gpu_for_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpdoctor.edge.nvml as nvml
    from ddpdoctor.bench.preflight import read_available_memory

    # free_mib 81079 of the real H100 snapshot (/work/shared/fixtures/real-h100, nvml.json), and a
    # second GPU with less free memory: the smallest bounds every rank.
    specs = [{"index": 0, "free_memory_bytes": 81079 * 2**20}, {"index": 1, "free_memory_bytes": 2**30}]
    monkeypatch.setattr(nvml, "read_memory_specs", lambda indices=None, lib=None: specs)
    assert read_available_memory("nccl", [0, 1]) == (
        2**30,
        "nvmlDeviceGetMemoryInfo (free, smallest of the GPUs used)",
    )
    monkeypatch.setattr(nvml, "read_memory_specs", lambda indices=None, lib=None: [])
    assert read_available_memory("nccl", [0])[0] is None  # NVML unusable: no guess, only the ceiling
    available, source = read_available_memory("gloo", [])
    assert isinstance(available, int) and available > 0 and "available" in source
