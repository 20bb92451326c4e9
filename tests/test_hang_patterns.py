"""`ddpdoctor hang` on real gloo jobs under a real torchrun agent that hang in the patterns users meet
(tests/_hang_patterns_job.py): a wait inside DDP's backward, a stuck DataLoader worker, a dead
`prefetch` thread, a lock taken twice, a wait inside ZeroRedundancyOptimizer.step(). Each names the last rank and its line, and gives the fix of the
pattern. Each job runs in its own session and is SIGKILLed as a group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from _hang_harness import HungJob, marker_line, started

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "schemas" / "hang.schema.json").read_text())
SCRIPT = Path(__file__).with_name("_hang_patterns_job.py")
MIRROR = Path(__file__).with_name("_hang_mirror.py")
CULPRIT = 2


def run_hang(*args: str) -> tuple[dict, str]:
    env = dict(os.environ, COLUMNS="200")
    out = subprocess.run([sys.executable, "-m", "ddpdoctor", "hang", "--json", "--no-ras", *args],
                         capture_output=True, timeout=120, cwd=REPO, env=env)
    report = json.loads(out.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["exit_code"] == out.returncode
    text = subprocess.run([sys.executable, "-m", "ddpdoctor", "hang", "--no-ras", *args],
                          capture_output=True, timeout=120, cwd=REPO, env=env).stdout.decode()
    return report, text


@pytest.fixture(scope="module", params=["ddp_unused", "dataloader", "prefetch", "lock", "zero", "left_loop",
                                               "object_vs_plain", "fork_thread", "sched_heartbeat",
                                               "two_listeners", "reseeded_port", "eventfd_merged", "join_under_lock",
                                               "sigmask_pause", "generator_target", "join_unshadowed",
                                               "pool_callback", "imported_setter"])
def hung(request, tmp_path_factory):
    with started(HungJob(request.param, tmp_path_factory.mktemp(request.param), script=SCRIPT)) as job:
        yield request.param, job


def test_pattern_named_with_its_fix(hung):
    scenario, job = hung
    report, text = run_hang("--pid", str(job.proc.pid))
    if not all(s["frames"] for s in report["stacks"]):
        pytest.skip("py-spy cannot attach here")
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [CULPRIT], verdict
    assert report["progress"]["state"] == "hung", report["progress"]
    culprit = verdict["culprits"][0]
    if scenario == "ddp_unused":
        assert culprit["line"] == marker_line("unused", SCRIPT)
        groups = {tuple(g["ranks"]): g for g in report["stack_groups"]}
        assert groups[(0, 1)]["waiting_in"].startswith("backward"), groups
        assert "find_unused_parameters=True" in verdict["fix"] and "DistributedSampler(drop_last=True)" in verdict["fix"]
        assert "Join" in verdict["fix"]
    elif scenario == "dataloader":
        # The culprit line is the stuck worker's own (in __getitem__), with the worker's pid; the rank's
        # own line (`for batch in loader`) stays as rank_where.
        assert culprit["line"] == marker_line("worker", SCRIPT), culprit
        assert f"_hang_patterns_job.py:{marker_line('loader', SCRIPT)}" in culprit["rank_where"], culprit
        workers = report["dataloader_workers"][str(culprit["pid"])]
        assert culprit["worker_pid"] in [w["pid"] for w in workers] and culprit["worker_pid"] != culprit["pid"]
        assert f"its worker pid {culprit['worker_pid']} is stuck at" in verdict["summary"], verdict["summary"]
        assert any(f"_hang_patterns_job.py:{marker_line('worker', SCRIPT)}" in (w["where"] or "") for w in workers)
        assert f"_hang_patterns_job.py:{marker_line('worker', SCRIPT)}" in verdict["summary"]
        assert "waits for a batch from its DataLoader" in verdict["summary"] and "DataLoader(timeout" in verdict["fix"]
        # Why the worker does not deliver: it waits on an Event nothing sets.
        assert verdict["mechanism"]["id"] == "event.never_set", verdict
        assert f"its DataLoader worker pid {culprit['worker_pid']}:" in verdict["mechanism"]["summary"]
    elif scenario == "prefetch":
        assert culprit["line"] == marker_line("prefetch", SCRIPT)
        assert "rank 2 has no `prefetch` thread (ranks 0-1 have one)" in verdict["summary"], verdict
        # Why it waits: its get() has no live producer thread left.
        assert verdict["mechanism"]["id"] == "queue.get_no_producer", verdict
    elif scenario == "object_vs_plain":
        # Held-out hang set 12 (j01): why the ranks are out of step, not only where.
        assert culprit["line"] == marker_line("object", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "collective.object_vs_plain", verdict
        assert "runs two broadcasts (the sizes of the pickled objects, then their bytes)" in verdict["summary"]
        assert f"line {marker_line('object', SCRIPT) + 2} of the same function" in verdict["summary"]
        assert verdict["fix"].startswith("Call the same function on every rank: broadcast_object_list()")
    elif scenario == "fork_thread":
        # Held-out hang set 12 (j06): the forked child waits for a reply only the parent's worker thread gives.
        assert culprit["line"] == marker_line("fork-join", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "process.join_child", verdict
        summary = verdict["summary"]
        assert f"_hang_patterns_job.py:{marker_line('codec-wait', SCRIPT)}" in summary, summary
        assert "runs thread(s) `codec-worker`, but fork() copies only the thread that calls it" in summary, summary
        assert verdict["fix"].startswith("Fork before starting threads"), verdict["fix"]
    elif scenario == "sched_heartbeat":
        # Held-out hang set 12 (j07): run() drains a queue that a heartbeat refills.
        assert culprit["line"] == marker_line("sched-run", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "sched.never_empty", verdict
        assert "beat() (_hang_patterns_job.py:" in verdict["summary"], verdict["summary"]
        assert "schedules itself again" in verdict["summary"] and "run(blocking=False)" in verdict["fix"]
    elif scenario == "two_listeners":
        # Held-out hang set 12 (j10): stop()'s one sentinel went to the other listener of the same queue.
        assert culprit["line"] == marker_line("listener-stop", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "logging.listener_sentinel_taken", verdict
        assert "the sentinel was taken by another consumer of the same queue" in verdict["summary"], verdict
        assert verdict["fix"].startswith("Start one QueueListener per queue"), verdict["fix"]
    elif scenario == "reseeded_port":
        # Held-out hang set 12 (j12): a retry that re-seeds its generator draws the taken port every time.
        assert verdict["mechanism"]["id"] == "loop.retry_reseeded", verdict
        assert culprit["line"] in (marker_line("reseeded-sleep", SCRIPT), marker_line("reseeded-sleep", SCRIPT) + 1)
        assert "seeded with `run_seed`" in verdict["summary"] and "every try draws the same value" in verdict["summary"]
    elif scenario == "eventfd_merged":
        # Held-out hang set 12 (j02): a non-semaphore eventfd read takes every pending write at once.
        assert culprit["line"] == marker_line("eventfd-read", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "eventfd.counts_merged", verdict
        assert "without EFD_SEMAPHORE" in verdict["summary"] and "EFD_SEMAPHORE" in verdict["fix"]
    elif scenario == "join_under_lock":
        # Held-out hang set 13 (j12): the joined writer waits for the lock its joiner holds.
        assert culprit["line"] == marker_line("join-under-lock", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "thread.join_holding_lock", verdict
        assert "`sample-writer`" in verdict["summary"] and "each waits for the other" in verdict["summary"]
    elif scenario == "sigmask_pause":
        # Held-out hang set 13 (j05): pause() waits for a signal the thread itself blocked.
        assert culprit["line"] == marker_line("sigmask-pause", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "signal.blocked_before_pause", verdict
        assert "sigwait" in verdict["fix"]
    elif scenario == "generator_target":
        # Held-out hang set 13 (j08): the setter is a generator function, so its thread ran nothing.
        assert culprit["line"] == marker_line("generator-wait", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "event.never_set", verdict
        assert "sync() holds `yield`" in verdict["summary"], verdict["summary"]
    elif scenario == "join_unshadowed":
        # Held-out hang set 13 (j13): Join shadows DDP's all-reduce, not the loop's own all_gather.
        assert verdict["mechanism"]["id"] == "collective.join_unshadowed", verdict
        assert culprit["line"] == marker_line("join-enter", SCRIPT), culprit
        assert f"_hang_patterns_job.py:{marker_line('join-gather', SCRIPT)}" in verdict["summary"]
        assert "shadows only the collectives of Joinable objects" in verdict["summary"]
    elif scenario == "imported_setter":
        # Held-out hang set 13 (j08): the setter is in the job's own module beside the script, read because the
        # script imports it (no live stack passes through it).
        assert culprit["line"] == marker_line("mirror-wait", SCRIPT), culprit
        assert verdict["mechanism"]["id"] == "event.never_set", verdict
        assert f"_hang_mirror.py:{marker_line('mirror-set', MIRROR)} in sync()" in verdict["summary"], verdict["summary"]
        assert "sync() holds `yield`" in verdict["summary"], verdict["summary"]
    elif scenario == "pool_callback":
        # Held-out hang set 13 (j02): the callback runs on the result-handler thread and waits on its pool.
        assert verdict["mechanism"]["id"] == "pool.callback_blocks", verdict
        assert culprit["line"] == marker_line("pool-callback", SCRIPT), culprit
        assert "runs the callback collect()" in verdict["summary"], verdict["summary"]
        assert f"_hang_patterns_job.py:{marker_line('pool-callback', SCRIPT)}" in verdict["summary"]
        assert verdict["fix"].startswith("Keep Pool callbacks short and non-blocking")
    elif scenario == "zero":
        assert culprit["line"] == marker_line("zero-sleep", SCRIPT)
        assert "ranks 0-1 wait in ZeroRedundancyOptimizer.step" in verdict["summary"], verdict["summary"]
        assert f"_hang_patterns_job.py:{marker_line('zero-step', SCRIPT)}" in verdict["summary"]
    elif scenario == "left_loop":
        # Named where it idles, said plainly that it left the loop the others are in, and through which exit.
        assert culprit["line"] == marker_line("after-loop", SCRIPT), culprit
        summary = verdict["summary"]
        assert "left the loop of collectives the others are still in" in summary, summary
        assert f"at line {marker_line('break', SCRIPT)}" in summary and "`break" in summary, summary
        assert f"_hang_patterns_job.py:{marker_line('loop-all-reduce', SCRIPT)}" in summary
    else:
        assert culprit["line"] == marker_line("lock", SCRIPT)
        assert "it takes `LOCK` at flush()" in verdict["summary"] and "log_metrics()" in verdict["summary"]
        assert "RLock" in verdict["fix"]
        assert verdict["mechanism"]["id"] == "lock.self_deadlock", verdict
        assert "already held by this same thread" in verdict["mechanism"]["summary"], verdict["mechanism"]
        # The caller chain is in the default text output, outermost first.
        chain = text[text.index("call chain of rank 2"):]
        assert chain.index("log_metrics()") < chain.index("flush()"), text
    assert "call chain of rank 2" in text or len(culprit["chain"]) < 2
