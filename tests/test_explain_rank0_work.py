"""`watchdog.rank0_work`: the other ranks timed out at one of the job's first collectives and rank 0 never did,
with something in the log saying rank 0 was busy (an unfinished progress bar the reports cut off, or a
one-element all-reduce entered after earlier collectives had completed). The class of spent explain sets 13 and
14 (d05, d01, d07); the near misses keep the answers the spent sets 8 and 13 expect (b01, e02: SeqNum 1)."""

from __future__ import annotations

from test_explain_reasoning import WATCHDOG, run


def test_bar_cut_off_by_the_others_timeouts_blames_rank0s_own_work() -> None:
    # The shape of ultralytics/yolov5#9163: rank 0's label scan, its bar cut off mid-draw by rank 2's report.
    bar = "train: Scanning 'labels/train' images and labels...113162 found, 0 missing:   6%|▋ "
    lines = [bar + WATCHDOG.format(r=2, seq=2, op="ALLREDUCE", n=1), WATCHDOG.format(r=1, seq=2, op="ALLREDUCE", n=1)]
    ex = run({"job.log": lines})
    assert ex.root is not None and ex.root.id == "watchdog.rank0_work"
    assert ex.root.ranks == [0]
    assert "6%" in ex.root.reasoning and "Not a network hang" in ex.root.reasoning


def test_one_element_all_reduce_after_earlier_collectives_blames_rank0() -> None:
    ex = run({"job.log": [WATCHDOG.format(r=1, seq=5, op="ALLREDUCE", n=1)]})
    assert ex.root is not None and ex.root.id == "watchdog.rank0_work"
    assert "after 4 collective(s)" in ex.root.reasoning


def test_first_collective_of_the_group_stays_unconfirmed() -> None:
    # SeqNum 1 is where NCCL connects the ranks: a transport hang there reads the same from rank 1.
    ex = run({"job.log": [WATCHDOG.format(r=1, seq=1, op="ALLREDUCE", n=1)]})
    assert ex.root is None
    assert "watchdog.unconfirmed" in [d.id for d in ex.consequences]


def test_rank0_among_the_reports_or_a_late_collective_is_not_rank0_work() -> None:
    both = run({"job.log": [WATCHDOG.format(r=r, seq=5, op="ALLREDUCE", n=1) for r in (0, 1)]})
    assert both.root is None or both.root.id != "watchdog.rank0_work"
    late = run({"job.log": [WATCHDOG.format(r=1, seq=1580, op="ALLREDUCE", n=1)]})
    assert late.root is None or late.root.id != "watchdog.rank0_work"
    big = run({"job.log": [WATCHDOG.format(r=1, seq=5, op="ALLREDUCE", n=466119168)]})
    assert big.root is None or big.root.id != "watchdog.rank0_work"


def test_a_finished_bar_is_no_evidence() -> None:
    bar = "Map: 100%|██████████| 5000/5000 [00:03<00:00, 1400.1 examples/s]"
    ex = run({"job.log": [bar, WATCHDOG.format(r=1, seq=1, op="ALLREDUCE", n=1)]})
    assert ex.root is None or ex.root.id != "watchdog.rank0_work"


def test_every_rank_but_rank0_reporting_a_late_collective_blames_rank0() -> None:
    # The shape of spent set 15's g01 (torchtune): ranks 1-3 time out at SeqNum 15037, rank 0 is silent.
    lines = [WATCHDOG.format(r=r, seq=15037, op="_ALLGATHER_BASE", n=131072512) for r in (3, 1, 2)]
    ex = run({"job.log": lines})
    assert ex.root is not None and ex.root.id == "watchdog.rank0_work"
    assert "Every rank but rank 0 (ranks 1-3)" in ex.root.reasoning
    # Twin: ranks 2 and 3 only (rank 1 left no line either): the paste may be partial.
    partial = run({"job.log": lines[::2]})
    assert partial.root is None or partial.root.id != "watchdog.rank0_work"
