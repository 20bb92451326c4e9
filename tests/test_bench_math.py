"""Pure parts of bench-nccl: sizes, nccl-tests byte counts and busbw factors, verdicts, root cause."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.bench.external import detect_external_launch
from ddpdoctor.bench.math import OPS, bandwidths, bus_factor, coll_counts
from ddpdoctor.bench.outcome import RankFailure, is_peer_failure, pick_root_cause
from ddpdoctor.bench.plan import parse_fault_hook
from ddpdoctor.bench.results import (
    compare_baseline,
    exit_code_for,
    judge_baseline,
    judge_correctness,
    judge_min_busbw,
    load_baseline_rows,
    summarize,
)
from ddpdoctor.bench.sizes import format_size, parse_size, size_sequence

GiB = 1024**3


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", 8),
        ("1K", 1024),
        ("1k", 1024),
        ("4M", 4194304),
        ("1G", 1073741824),
        ("1GiB", 1073741824),
        ("64KB", 65536),
        (" 2 M ", 2 * 1024**2),
        ("0.5K", 512),
        ("1.5M", 1572864),
        # Whole numbers are exact, however large (a float rounded these).
        ("9007199254740993", 2**53 + 1),
        ("99999999999999999999", 99999999999999999999),
    ],
)
def test_parse_size_powers_of_1024(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1", "1X", "1.3", "K", "1 0"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@given(st.text(max_size=20))
def test_parse_size_any_text_value_error_or_int(text: str) -> None:
    try:
        assert parse_size(text) >= 0
    except ValueError:
        pass


def test_format_size_round_trips() -> None:
    for n in (8, 1000, 1024, 4 * 1024**2, GiB, 3 * 1024):
        assert parse_size(format_size(n)) == n
    assert format_size(4194304) == "4M"


def test_size_sequence_like_nccl_tests() -> None:
    assert size_sequence(8, 128, 2) == [8, 16, 32, 64, 128]
    assert size_sequence(8, 100, 4) == [8, 32]
    assert size_sequence(1024, 1024, 2) == [1024]
    with pytest.raises(ValueError):
        size_sequence(64, 8, 2)
    with pytest.raises(ValueError):
        size_sequence(0, 8, 2)


def test_bus_factors() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bus_factor("all_reduce", 1) == 0.0
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, 4) == pytest.approx(3 / 4)
    for op in ("broadcast", "reduce", "sendrecv"):
        assert bus_factor(op, 8) == 1.0


def test_all_reduce_1gib_8_ranks_hand_computed() -> None:
    # 1 GiB float32 over 8 ranks in 100 ms: algbw = 1073741824 / 1e9 / 0.1 = 10.73741824 GB/s,
    # busbw = algbw * 2*7/8 = 18.79048192 GB/s.
    c = coll_counts("all_reduce", GiB, 4, 8)
    assert (c.count, c.size_bytes) == (268435456, GiB)
    algbw, busbw = bandwidths(c, 0.1)
    assert algbw == pytest.approx(10.73741824)
    assert busbw == pytest.approx(18.79048192)


def test_fixture_row_matches_nccl_tests_numbers() -> None:
    # From the RTX 2080 Ti fixture: 1 GiB all_reduce on 2 GPUs took 268588 us -> 4.00 GB/s both.
    c = coll_counts("all_reduce", GiB, 4, 2)
    algbw, busbw = bandwidths(c, 268588e-6)
    assert round(algbw, 2) == 4.00 and round(busbw, 2) == 4.00


def test_all_gather_counts_per_rank_and_full_buffer() -> None:
    # 1 MiB float32 on 4 ranks: 65536 elements per rank; size column is the whole 1 MiB buffer.
    c = coll_counts("all_gather", 1024**2, 4, 4)
    assert (c.count, c.send_count, c.recv_count, c.size_bytes) == (65536, 65536, 262144, 1024**2)
    algbw, busbw = bandwidths(c, 1e-3)
    assert algbw == pytest.approx(1024**2 / 1e9 / 1e-3)
    assert busbw == pytest.approx(algbw * 3 / 4)


def test_chunked_ops_align_to_16_bytes_like_nccl_tests() -> None:
    # 1000 B float32 on 3 ranks: 250 elements -> 83 per rank -> aligned down to 80 (16 B = 4 floats).
    c = coll_counts("reduce_scatter", 1000, 4, 3)
    assert (c.count, c.send_count, c.recv_count, c.size_bytes) == (80, 240, 80, 960)
    # Too small for one aligned chunk per rank: nccl-tests prints size 0.
    assert coll_counts("all_to_all", 8, 4, 2).size_bytes == 0
    # half: 16 B = 8 elements per alignment unit.
    assert coll_counts("all_gather", 1024, 2, 4).count == 128


def test_every_op_has_counts() -> None:
    for op in OPS:
        c = coll_counts(op, 4096, 2, 4)
        assert c.size_bytes <= 4096 and c.count > 0
    with pytest.raises(ValueError):
        coll_counts("gather", 8, 4, 2)


def _row(op: str, size: int, busbw: float, wrong: int = 0, dtype: str = "float32") -> dict:
    return {"op": op, "size": size, "dtype": dtype, "busbw": busbw, "wrong": wrong}


def test_summary_peak_and_average() -> None:
    rows = [_row("all_reduce", 8, 1.0), _row("all_reduce", 16, 3.0), _row("broadcast", 8, 2.0)]
    ar, bc = summarize(rows, ["all_reduce", "broadcast"])
    assert (ar.peak_busbw, ar.avg_busbw, ar.peak_size, ar.wrong) == (3.0, 2.0, 16, 0)
    assert bc.peak_busbw == 2.0


def test_wrong_elements_fail_whatever_the_bandwidth() -> None:
    rows = [_row("all_reduce", 8, 100.0), _row("all_reduce", 16, 100.0, wrong=3)]
    v = judge_correctness(rows)
    assert v.failed and "3 wrong" in v.summary
    assert exit_code_for([v], launch_failed=False) == 1
    assert exit_code_for([judge_correctness(rows[:1])], launch_failed=False) == 0
    assert exit_code_for([], launch_failed=True) == 1
    assert exit_code_for([], launch_failed=False, interrupted=True) == 130


def test_min_busbw_verdict() -> None:
    summaries = summarize([_row("all_reduce", 8, 5.0)], ["all_reduce"])
    assert judge_min_busbw(summaries, 10.0).failed
    assert not judge_min_busbw(summaries, 5.0).failed


def test_baseline_regression_per_op() -> None:
    base = [_row("all_reduce", 8, 10.0), _row("all_reduce", 16, 20.0), _row("broadcast", 8, 10.0)]
    now = [_row("all_reduce", 8, 9.0), _row("all_reduce", 16, 15.0), _row("broadcast", 8, 9.5)]
    ratios = compare_baseline(now, base, ["all_reduce", "broadcast"], tolerance=0.1)
    ar, bc = ratios
    assert ar.ratio == pytest.approx(15.0 / 20.0) and ar.regressed
    assert bc.ratio == pytest.approx(0.95) and not bc.regressed
    v = judge_baseline(ratios, 0.1)
    assert v.failed and "all_reduce" in v.summary and "broadcast" not in v.summary
    # Another dtype is not comparable.
    other = compare_baseline([_row("all_reduce", 8, 1.0, dtype="float16")], base, ["all_reduce"])
    assert other[0].ratio is None
    with pytest.raises(ValueError):
        load_baseline_rows({"findings": []})


def test_root_cause_prefers_the_dead_rank_over_its_peers() -> None:
    peer = RankFailure(
        rank=0,
        kind="exception",
        op="all_reduce",
        size=8,
        message="Connection closed by peer",
        at=1.0,
        peer_failure=True,
    )
    dead = RankFailure(rank=2, kind="signal", op="all_reduce", size=8, signal="SIGKILL", at=2.0)
    assert pick_root_cause([peer, dead]) is dead
    raised = RankFailure(
        rank=1, kind="exception", op="init", size=0, message="CUDA error: out of memory", at=3.0
    )
    assert pick_root_cause([peer, raised]) is raised
    assert pick_root_cause([]) is None


def test_root_cause_of_a_hang_is_the_straggler() -> None:
    waiting = RankFailure(
        rank=0,
        kind="stuck",
        op="all_reduce",
        size=8,
        step=3,
        stack='File "/x/torch/distributed/distributed_c10d.py", line 1 in all_reduce',
    )
    stopped = RankFailure(rank=1, kind="stuck", op="all_reduce", size=8, step=3, status="stopped")
    behind = RankFailure(rank=2, kind="stuck", op="broadcast", size=8, step=2)
    assert pick_root_cause([waiting, stopped]) is stopped
    assert pick_root_cause([waiting, behind]) is behind
    outside = RankFailure(rank=3, kind="stuck", op="all_reduce", size=8, step=3, stack='File "x.py" in sleep')
    assert pick_root_cause([waiting, outside]) is outside


def test_peer_failure_messages() -> None:
    assert is_peer_failure("[pair.cc:553] Connection closed by peer [127.0.0.1]:2479")
    assert is_peer_failure("ncclRemoteError: remote process exited or there was a network error")
    assert not is_peer_failure("CUDA error: an illegal memory access was encountered")


def test_external_launch_detection() -> None:
    ext = detect_external_launch(
        {"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    )
    assert ext is not None and (ext.launcher, ext.rank, ext.world_size, ext.local_rank) == (
        "torchrun",
        3,
        16,
        3,
    )
    srun = detect_external_launch(
        {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"}
    )
    assert srun is not None and (srun.launcher, srun.rank, srun.local_rank, srun.master_addr) == (
        "slurm",
        5,
        1,
        None,
    )
    # An sbatch script / salloc shell is not a launch.
    assert detect_external_launch({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
    assert detect_external_launch({}) is None


def test_fault_hook_parsing() -> None:
    hook = parse_fault_hook("rank=1,op=all_reduce,size=1024,action=kill")
    assert (
        hook is not None and hook.matches(1, "all_reduce", 1024) and not hook.matches(0, "all_reduce", 1024)
    )
    assert parse_fault_hook("garbage") is None and parse_fault_hook(None) is None
