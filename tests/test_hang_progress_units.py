"""The pure parts of `hang`'s multi-snapshot verdict and its wording, fed with real py-spy stacks of the
hung test job (tests/fixtures/py-spy, see tests/fixtures/README.md) and /proc readings as probe_io
takes them (CPU nanoseconds and voluntary context switches of the main thread)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from ddpdoctor.hang.progress import Activity, Sample, judge_motion
from ddpdoctor.hang.stacks import RankStack, parse_pyspy_result
from ddpdoctor.hang.verdict import HangFacts, judge_hang

FIX = Path(__file__).parent / "fixtures"
SCHEMA = json.loads((Path(__file__).parent.parent / "docs" / "schemas" / "hang.schema.json").read_text())
DENIED = "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n"


def _stacks(scenario: str = "sleep") -> list[RankStack]:
    return [
        parse_pyspy_result(rank, 1000 + rank, (FIX / "py-spy" / scenario / f"rank_{rank}.json").read_text(), "", True)
        for rank in range(3)
    ]


def _samples(readings: list[dict[int, tuple[int, int]]], stacks: list[RankStack] | None = None) -> list[Sample]:
    stacks = stacks or _stacks()
    return [
        Sample(t=float(i), stacks=stacks, activity={pid: Activity(*r) for pid, r in reading.items()})
        for i, reading in enumerate(readings)
    ]


def _job():
    from ddpdoctor.hang.procs import Job, Worker

    return Job(4242, ("torchrun",), [Worker(1000 + r, r, r, ("python",), {"RANK": str(r)}) for r in range(3)], 3)


STILL = {1000: (5_000_000, 40), 1001: (5_000_000, 40), 1002: (5_000_000, 40)}


def test_nothing_moved_is_hung_and_the_one_snapshot_verdict_stands():
    samples = _samples([STILL, STILL])
    motion = judge_motion(samples)
    assert motion.state == "hung" and motion.evidence == []
    report = judge_hang(HangFacts(host="h", job=_job(), stacks=samples[-1].stacks, samples=samples))
    assert report.verdict["kind"] == "stack_outlier" and report.verdict["culprit_ranks"] == [2]
    assert report.exit_code() == 1
    jsonschema.validate(report.to_dict(), SCHEMA)


def test_waiters_that_wake_make_the_job_progressing_with_the_sleeper_as_straggler():
    # A slow job: ranks 0-1 finish an all_reduce and enter the next (their main threads wake), rank 2
    # sleeps between steps; the stacks look exactly like a hang in both snapshots.
    later = {1000: (6_000_000, 44), 1001: (6_100_000, 43), 1002: (5_200_000, 42)}
    samples = _samples([STILL, later])
    motion = judge_motion(samples)
    assert motion.state == "progressing" and [r.rank for r in motion.stragglers] == [2]
    report = judge_hang(HangFacts(host="h", job=_job(), stacks=samples[-1].stacks, samples=samples))
    verdict = report.verdict
    assert verdict["kind"] == "progressing" and verdict["culprit_ranks"] == [] and report.exit_code() == 0
    assert "a straggler, not a culprit" in verdict["summary"] and verdict["stragglers"][0]["rank"] == 2
    assert report.findings[0].severity.label == "warn"
    jsonschema.validate(report.to_dict(), SCHEMA)


def test_a_polling_culprit_does_not_make_a_hung_job_progress():
    # Rank 2 wakes (a poll loop, a DataLoader's 5 s status check) but stays on its line, and the ranks
    # waiting in the collective never wake: hung.
    later = {**STILL, 1002: (5_300_000, 52)}
    assert judge_motion(_samples([STILL, later])).state == "hung"


def test_a_busy_rank_never_in_a_collective_spins():
    later = {**STILL, 1002: (5_000_000 + 990_000_000, 40)}
    samples = _samples([STILL, later])
    motion = judge_motion(samples)
    assert motion.state == "spinning" and [r.rank for r in motion.spinning] == [2]
    report = judge_hang(HangFacts(host="h", job=_job(), stacks=samples[-1].stacks, samples=samples))
    assert report.verdict["kind"] == "spinning" and report.verdict["culprit_ranks"] == [2]
    assert "ranks 0-1 wait in all_reduce" in report.verdict["summary"] and report.exit_code() == 1


def test_ras_counts_that_grow_are_progress():
    samples = _samples([STILL, STILL])
    samples[0].ras_counts, samples[1].ras_counts = {"c1": 10}, {"c1": 14}
    motion = judge_motion(samples)
    assert motion.state == "progressing" and "NCCL RAS operation counts grew" in motion.evidence


def test_one_snapshot_is_unknown_not_progress():
    assert judge_motion(_samples([STILL])).state == "unknown"


def test_ptrace_refused_fix_does_not_say_install_pyspy():
    stack = parse_pyspy_result(0, 42, "", DENIED, False)
    facts = HangFacts(host="h", stacks=[stack], ptrace_scope=1, cap_sys_ptrace=False, pyspy_found=True)
    finding = next(f for f in judge_hang(facts).findings if f.id == "hang.stacks")
    assert "Install py-spy" not in (finding.fix or "") and "ptrace_scope=0" in (finding.fix or "")


def test_plural_culprits_get_plural_verbs():
    stacks = _stacks()
    extra = [RankStack(r, 1000 + r, stacks[src].threads) for r, src in ((3, 0), (4, 0), (5, 2), (6, 0))]
    verdict = judge_hang(HangFacts(host="h", stacks=stacks + extra)).verdict
    assert verdict["culprit_ranks"] == [2, 5]
    assert "ranks 2, 5 have left the sequence of collectives" in verdict["summary"], verdict["summary"]
    assert " has left" not in verdict["summary"] and "they are in no collective" in verdict["summary"]


def test_the_jobs_dump_path_set_but_empty_is_said_as_such():
    facts = HangFacts(host="h", stacks=_stacks(), fr_spec="/var/tmp/fr_", fr_from_job=True)
    finding = next(f for f in judge_hang(facts).findings if f.id == "hang.flight_recorder")
    assert finding.severity.label == "skip" and "no dump given" not in finding.summary
    assert "TORCH_FR_DUMP_TEMP_FILE (/var/tmp/fr_) holds no dump yet" in finding.summary


def test_unknown_ranks_are_never_negative_in_json_or_text():
    stacks = _stacks()
    for stack in stacks:
        stack.rank = None  # mp.spawn: RANK set in code, not in the environment
    report = judge_hang(HangFacts(host="h", stacks=stacks)).to_dict()
    jsonschema.validate(report, SCHEMA)
    for group in report["stack_groups"]:
        assert all(r >= 0 for r in group["ranks"]) and "rank -" not in group["label"]
    assert all(c["rank"] is None and c["pid"] > 0 for c in report["verdict"]["culprits"])
    assert "rank -" not in report["verdict"]["summary"] and "pid 1002" in report["verdict"]["summary"]


def test_a_local_rank_that_exited_while_the_others_wait_is_named():
    # Uneven data under torchrun: rank 2 ran out of batches and returned; ranks 0-1 wait in all_reduce.
    from ddpdoctor.hang.procs import Job, Worker

    stacks = _stacks()[:2]
    env = {"LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3"}
    workers = [Worker(1000 + r, r, r, ("python",), {**env, "RANK": str(r)}) for r in range(2)]
    report = judge_hang(HangFacts(host="h", job=Job(4242, ("torchrun",), workers, 3), stacks=stacks))
    verdict = report.verdict
    assert verdict["kind"] == "exited" and verdict["culprit_ranks"] == [2], verdict
    assert "rank 2 has exited" in verdict["summary"] and "ranks 0-1 wait in all_reduce" in verdict["summary"]
    assert "drop_last=True" in verdict["fix"] and "Join" in verdict["fix"]
    assert report.exit_code() == 1
    jsonschema.validate(report.to_dict(), SCHEMA)


def test_only_the_rank_outside_collectives_moving_is_weak_and_hung_after_the_long_look():
    # Rank 2 moves between lines (I/O in short steps, or a loop polling for something) while ranks 0-1
    # wait in all_reduce without waking: progress over one second, a hang once the long look saw the
    # waiters never wake.
    from ddpdoctor.hang.progress import LONG_LOOK_S, look_longer

    moved = _stacks("mismatch")[1]  # another place (rank 1's broadcast line of the mismatch job)
    other = RankStack(2, 1002, moved.threads)
    first, second = _stacks(), _stacks()[:2] + [other]
    readings = {1000: (5_000_000, 40), 1001: (5_000_000, 40), 1002: (5_000_000, 40)}
    short = [Sample(0.0, first, {p: Activity(*r) for p, r in readings.items()}),
             Sample(1.0, second, {p: Activity(*r) for p, r in readings.items()})]
    motion = judge_motion(short)
    assert motion.weak and motion.state == "progressing", motion
    # Rank 2 is outside any collective in the last snapshot: look longer before judging.
    still_outside = [Sample(0.0, first), Sample(1.0, first)]
    assert look_longer(judge_motion(still_outside), still_outside)
    long = [short[0], Sample(LONG_LOOK_S, second, short[1].activity)]
    motion = judge_motion(long)
    assert motion.weak and motion.state == "hung" and "without waking" in motion.evidence[0], motion
    assert not look_longer(motion, long)


def test_every_rank_in_a_collective_needs_no_longer_look():
    from ddpdoctor.hang.progress import look_longer

    stacks = _stacks("mismatch")
    samples = [Sample(0.0, stacks), Sample(1.0, stacks)]
    assert all(s.waiting_in() for s in stacks)
    assert judge_motion(samples).state == "hung" and not look_longer(judge_motion(samples), samples)


def test_left_loop_from_source_text():
    from ddpdoctor.hang.source import left_loop

    lines = [
        "def main():",
        "    for step in range(10):",
        "        if rank == 1 and step == 3:",
        "            break",
        "        dist.all_reduce(grad)",
        "    time.sleep(3600)",
    ]
    found = left_loop(lines, inside=5, after=6)
    assert found is not None and (found.header, found.end, found.exits) == (2, 5, (4,))
    assert left_loop(lines, inside=5, after=4) is None  # still inside the loop


def _poll_stack(rank: int, line: int) -> RankStack:
    from ddpdoctor.hang.fr import Frame
    from ddpdoctor.hang.stacks import ThreadStack

    frames = (Frame("/job/coord.py", line, "Coordinator.wait_all"), Frame("/job/job.py", 40, "main"),
              Frame("/job/job.py", 60, "<module>"))
    return RankStack(rank, 1000 + rank, [ThreadStack("MainThread", frames)])


def test_a_while_loop_that_ends_on_a_clock():
    """clock_condition follows the names a `while` tests back to a clock read: in the header, through the
    function (`deadline = start + budget`), or at the module's top level; a counter loop reads none."""
    from ddpdoctor.hang.source import clock_condition

    lines = [
        "import time",
        "END = time.time() + 600",
        "def train(rank, budget):",
        "    start = time.perf_counter()",
        "    deadline = start + budget",
        "    step = 0",
        "    while step < 10 and not_yet(deadline):",
        "        step += 1",
        "    while datetime.datetime.now() < cutoff:",
        "        pass",
        "    while step < 100:",
        "        step += 1",
        "    while alive(END):",
        "        pass",
    ]
    assert clock_condition(lines, 7) == 4
    assert clock_condition(lines, 9) == 9
    assert clock_condition(lines, 11) is None
    assert clock_condition(lines, 13) == 2
    assert clock_condition(lines, 8) is None  # not a while


def test_a_for_loop_over_rank_local_values_names_where_they_come_from():
    """loop_origin: a loop over keys or bounds each rank computes (held-out hang set 10's j03 and j04); a
    loop over a loader keeps the "uneven batches" reading."""
    from ddpdoctor.hang.source import loop_origin

    lines = [
        "def evaluate(model, loader, rank):",
        "    stats = {}",
        "    for x, y in loader:",
        "        s = stats.setdefault(int(y), [0, 0])",
        "    for label in sorted(stats):",
        "        reduce(stats[label])",
        "    state = latest_state(rank)",
        "    for step in range(state['step'], TOTAL_STEPS):",
        "        train_step(step)",
    ]
    assert loop_origin(lines, 5) == ("sorted(stats)", "stats", 4)
    assert loop_origin(lines, 8) == ("range(state['step'], TOTAL_STEPS)", "state", 7)
    assert loop_origin(lines, 3) is None  # a loader: batches


def test_ranks_polling_on_the_two_lines_of_one_loop_are_hung_after_the_long_look():
    # Held-out hang set 7, j03's class: every rank polls a store counter (`while self.arrived(phase) !=
    # self.world:` at :21, `time.sleep(0.05)` at :22); under load a snapshot catches the condition, the next the
    # sleep. That is no move: weak over the short look, hung after the long look (6 s).
    woke = [{1000 + r: (5_000_000 + i * 1000, 40 + 20 * i) for r in range(3)} for i in range(13)]
    samples = [
        Sample(t=0.5 * i, stacks=[_poll_stack(r, 21 if (i + r) % 3 == 0 else 22) for r in range(3)],
               activity={pid: Activity(*reading) for pid, reading in woke[i].items()})
        for i in range(13)
    ]
    short = judge_motion(samples[:3])
    assert short.weak and short.state == "progressing", short
    long = judge_motion(samples)
    assert long.state == "hung" and long.evidence == [], long
    # Lines further apart (a step of the training loop and the next) are a move: progress.
    apart = [Sample(t=s.t, stacks=[_poll_stack(r, 21 if (i + r) % 2 else 35) for r in range(3)],
                    activity=s.activity) for i, s in enumerate(samples)]
    assert judge_motion(apart).state == "progressing"


def _fetch_stack(rank: int, line: int = 37) -> RankStack:
    from ddpdoctor.hang.fr import Frame
    from ddpdoctor.hang.stacks import ThreadStack

    frames = (Frame("/usr/lib/python3.11/threading.py", 327, "Condition.wait"),
              Frame("/usr/lib/python3.11/concurrent/futures/_base.py", 451, "Future.result"),
              Frame("/job/train.py", line, "RemoteBatches.get"), Frame("/job/train.py", 51, "worker"))
    return RankStack(rank, 1000 + rank, [ThreadStack("MainThread", frames)])


FETCH_SOURCE = {"/job/train.py": ["pass"] * 36 + [
    "        return asyncio.run_coroutine_threadsafe(self._fetch_batch(step), self.loop).result()",
    "        return asyncio.run_coroutine_threadsafe(self._fetch_batch(step), self.loop).result(timeout=1.0)",
] + ["pass"] * 20}


def test_wakes_in_a_wait_with_no_timeout_are_deliveries_not_a_poll():
    # Held-out hang set 11, j15 (healthy, graded "hung"): both ranks wait ~0.35 s a step in `.result()` for the
    # next batch, so every snapshot shows the same line; their main threads woke at each delivery.
    woke = [{1000 + r: (5_000_000 + i * 100_000, 40 + 2 * i) for r in range(2)} for i in range(13)]
    samples = [Sample(t=0.5 * i, stacks=[_fetch_stack(r) for r in range(2)],
                      activity={pid: Activity(*reading) for pid, reading in woke[i].items()}) for i in range(13)]
    assert judge_motion(samples).state == "hung"  # without the source line: the long look's poll-loop rule
    motion = judge_motion(samples, sources=FETCH_SOURCE)
    assert motion.state == "progressing" and not motion.weak, motion
    assert "in a wait with no timeout at /job/train.py:37" in motion.evidence[0], motion.evidence
    # Near miss: `.result(timeout=1.0)` wakes at every timeout too: a poll, hung after the long look.
    timed = [Sample(t=s.t, stacks=[_fetch_stack(r, 38) for r in range(2)], activity=s.activity) for s in samples]
    assert judge_motion(timed, sources=FETCH_SOURCE).state == "hung"
