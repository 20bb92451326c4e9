"""Two ranks in different collectives and no majority: `hang` reads where their call chains part
(ddpdoctor/hang/diverge.py). Real 2-rank gloo jobs under torchrun (tests/_hang_patterns_job.py):
`seeded_probe`, a probe all_gather under `if torch.rand(()) < 0.3:` with the generator seeded by the rank
(held-out hang set 13, j07), and `stream_end`, an all_gather after a generator's last `yield` that
`zip(stream, range(steps))` reaches on the rank with the shortest shard (set 13, j04), and
`checkpoint_recompute`, a norm that all_gathers in its forward, checkpointed on one rank only, re-run in backward
(set 13, j10). Then the pure readings
on source text: what a condition reads, where a generator's tail starts, which side an `if` leaves out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _hang_harness import HungJob, marker_line, started

from ddpdoctor.hang.diverge import _generator_tail, _in_else, _only_under, condition_origin
from ddpdoctor.hang.source import enclosing_if

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).with_name("_hang_patterns_job.py")


def _hang(pid: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "ddpdoctor", "hang", "--json", "--no-ras", "--pid", str(pid)],
                         capture_output=True, timeout=120, cwd=REPO, env=dict(os.environ, COLUMNS="200"))
    report = json.loads(out.stdout)
    assert report["exit_code"] == out.returncode
    return report


@pytest.fixture(scope="module", params=["seeded_probe", "stream_end", "checkpoint_recompute"])
def parted(request, tmp_path_factory):
    with started(HungJob(request.param, tmp_path_factory.mktemp(request.param), nproc=2, script=SCRIPT)) as job:
        yield request.param, job


def test_the_side_that_parted_is_named_with_why(parted):
    scenario, job = parted
    report = _hang(job.proc.pid)
    if not all(s["frames"] for s in report["stacks"]):
        pytest.skip("py-spy cannot attach here")
    verdict = report["verdict"]
    # Before diverge.py both were a tie with no culprit: the rank that entered the branch or ran the
    # generator's tail is the one to fix.
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [1] and not verdict["tie"], verdict
    culprit = verdict["culprits"][0]
    if scenario == "seeded_probe":
        assert culprit["line"] == marker_line("probe-gather", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "mismatch.conditional_random_seeded", verdict["mechanism"]
        summary = verdict["summary"]
        assert f"under `if torch.rand(()) < 0.3:` (line {marker_line('probe-if', SCRIPT)})" in summary, summary
        assert f"seeded with the rank (line {marker_line('probe-seed', SCRIPT)}" in summary, summary
        assert "rank 0 skipped that branch and waits in all_reduce" in summary, summary
        assert "seeded the same on every rank" in verdict["fix"]
    elif scenario == "checkpoint_recompute":
        assert culprit["line"] == marker_line("pooled-gather", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "mismatch.checkpoint_recompute", verdict["mechanism"]
        summary = verdict["summary"]
        assert "run again in backward by activation checkpointing" in summary, summary
        assert f"_hang_patterns_job.py:{marker_line('ckpt-call', SCRIPT)} `h = checkpoint(self.norm" in summary, summary
        assert "rank 0, not recomputing, waits in backward" in summary, summary
    else:
        assert culprit["line"] == marker_line("stream-gather", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "mismatch.generator_end", verdict["mechanism"]
        summary = verdict["summary"]
        assert "after the generator's last `yield`" in summary and "asks shard_stream() for its next item" in summary
        assert f"(line {marker_line('stream-zip', SCRIPT)})" in summary, summary
        assert "rank 0 stopped pulling earlier and waits in all_reduce" in summary, summary


LOOP = """\
def train(model, batches, cfg, rank):
    torch.manual_seed(cfg.seed + rank)
    start = time.time()
    for step, batch in enumerate(batches):
        loss = model(batch)
        draw = random.random()
        if draw < cfg.rate:
            probe.record(model)
        elif cfg.verbose:
            log(loss)
        if time.time() - start > cfg.budget:
            checkpoint(model)
        if torch.isnan(loss):
            recover(model)
        ready = cfg.flag and step > 3
        if ready:
            publish(model)
        loss.backward()
"""


def _branch(text: str, line: int):
    lines = text.splitlines()
    branch = enclosing_if(lines, line)
    assert branch is not None
    return lines, branch


@pytest.mark.parametrize("line, kind, quoted", [
    (8, "random_seeded", "line 2: `torch.manual_seed(cfg.seed + rank)`"),  # through `draw = random.random()`
    (12, "clock", "time.time()"),
    (14, "local_data", "torch.isnan(loss)"),
    (17, "computed", "`ready` (line 15)"),
])
def test_what_a_condition_reads(line, kind, quoted):
    lines, branch = _branch(LOOP, line)
    origin, found = condition_origin(lines, branch)
    assert found == kind and quoted in origin, origin


def test_a_random_draw_without_a_rank_seed_is_said_as_such():
    text = LOOP.replace("torch.manual_seed(cfg.seed + rank)", "torch.manual_seed(cfg.seed)")
    lines, branch = _branch(text, 8)
    origin, kind = condition_origin(lines, branch)
    assert kind == "random" and "not seeded alike" in origin


def test_an_elif_arm_is_told_from_the_if_arm():
    lines = LOOP.splitlines()
    # probe.record (8) is in the `if` arm itself; log(loss) (10) in the `elif` arm, where the first test failed.
    assert not _in_else(lines, enclosing_if(lines, 8), 8)
    assert _in_else(lines, enclosing_if(lines, 10), 10)


def test_which_side_an_if_leaves_out():
    lines = LOOP.splitlines()
    # probe.record (8) under `if draw < cfg.rate:` leaves loss.backward (18) out; backward is under no if.
    assert _only_under(lines, 8, 18).if_line == 7
    assert _only_under(lines, 18, 8) is None
    # Two arms of one chain: the chain holds both lines, so it says nothing of one side alone.
    assert _only_under(lines, 8, 10) is None and _only_under(lines, 10, 8) is None


GENERATOR = """\
def shard_stream(dataset, batch):
    for i in range(0, len(dataset), batch):
        yield dataset[i:i + batch]
    counts = gather_counts()
    return counts


def between(dataset):
    for item in dataset:
        if item:
            yield item
        gather_counts()


def plain(dataset):
    for item in dataset:
        use(item)
    return gather_counts()
"""


def test_a_generators_tail():
    lines = GENERATOR.splitlines()
    assert _generator_tail(lines, 4) == 3  # after the last yield: runs once the stream is exhausted
    assert _generator_tail(lines, 12) is None  # inside the loop that yields: it runs on every pull
    assert _generator_tail(lines, 18) is None  # a plain function's end
