"""`ddpdoctor hang` on real 2-rank gloo jobs under a real torchrun agent whose last rank hangs in a wait
that is no collective (tests/_hang_waits_job.py): the verdict names the rank and line, and says why it
waits (`verdict.mechanism`): a lock-order deadlock between two threads, a lock nothing else holds, a
Queue.join whose consumer never calls task_done(), a get() with no producer, a poll loop, an Event or
Barrier nothing completes, a child process it joins, a file lock, a pipe or FIFO nobody writes, a store
key nobody sets, a delay in milliseconds given to time.sleep. A thread only rank 0 runs by design is not called missing. Each job runs in its own session and is SIGKILLed as a group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _hang_harness import HungJob, marker_line, started
from test_hang_evidence import hang_on

SCRIPT = Path(__file__).with_name("_hang_waits_job.py")
SERVER = Path(__file__).with_name("_hang_frame_server.py")
CULPRIT = 1

# scenario -> (mechanism id, the culprit's HANG-LINE marker, words the summary must hold)
EXPECTED = {
    "lock_order": ("lock.order_deadlock", "lock-order", ["lock-order deadlock between thread MainThread", "thread saver"]),
    # A call meant for a thread runs in the main thread: the line that hands it is the one to fix (held-out
    # hang set 10, j06's class).
    "target_called": ("thread.target_called", "target-called", [
        "calls heartbeat_loop() right there, in the main thread", "hands its return value to the thread"]),
    # select() on a pipe whose next line a readline() already buffered (held-out hang set 10, j10's class).
    "select_buffered": ("io.select_after_buffered_read", "select-buffered", [
        "on `self.proc.stdout`, which this code also reads through Python's buffered file object",
        "self.banner = self.proc.stdout.readline()"]),
    # A side store served for the whole world, opened by one process (held-out hang set 10, j01's class).
    "side_store": ("store.waits_for_workers", "side-store", [
        "inside the c10d TCPStore constructor", "serving the store (is_master) for `world` processes",
        "this function lets only some processes reach it (`if rank != world - 1:"]),
    # A multiprocessing lock whose holder was killed (held-out hang set 10, j09's class).
    "mp_lock_killed": ("mp_lock.holder_gone", "mp-lock", [
        "it waits to acquire a multiprocessing lock at", "not released when the process holding it dies",
        "this file kills a process (`builder.kill()  # over budget` at line"]),
    "self_lock": ("lock.self_deadlock", "self-lock", ["waits on a lock nothing else in this process holds or releases"]),
    # The lock is held by a suspended generator that yields inside its `with` (held-out hang set 7, j02's class).
    "generator_lock": ("lock.held_by_generator", "generator-lock", ["the generator batches() yields inside `with`",
                                                                    "stays held"]),
    "queue_join": ("queue.join_without_task_done", "queue-join", ["Queue.join()", "task_done()", "`consumer`"]),
    "queue_get": ("queue.get_no_producer", "queue-get", ["Queue.get()", "no live producer thread"]),
    # Held-out hang set 8's classes (j08, j10, j06), written again here.
    "signal_wait": ("signal.never_sent", "sigwait", ["it waits for SIGUSR1", "os.getppid()"]),
    "child_banner": ("subprocess.output_never_written", "child-readline", ["has not written it to the pipe",
                                                                        "block-buffers stdout"]),
    # The child blocks writing its stderr (a full pipe) while the rank reads its stdout to the end (held-out hang
    # set 9, j12's class): the child's wchan says pipe_write.
    # The executor's `with` exit joins a worker that waits for an Event set after the block (held-out hang set 9,
    # j09's class).
    "join_before_set": ("thread.join_before_set", "pool-exit", ["waits in Event.wait() for `sealed`",
                                                               "after the join: each waits for the other"]),
    # alarm(int(0.5)) is alarm(0): no SIGALRM comes (held-out hang set 9, j14's class).
    "alarm_zero": ("signal.alarm_zero", "alarm-pause", ["`signal.alarm(int(self.interval))`",
                                                        "signal.alarm() takes whole seconds"]),
    "child_stderr_full": ("subprocess.pipe_full", "child-stdout", ["while the child is blocked writing to a pipe",
                                                                   "its other output pipe"]),
    "put_holding_lock": ("queue.put_holding_lock", "put-holding", ["while it holds `AGG_LOCK`",
                                                                    "thread `quality-agg`", "a circular wait"]),
    # The consumer reads a re-created queue; the producer blocks on the old, full one (held-out set 7, j12's class).
    "swapped_queue": ("queue.different_queues", "swapped-get", ["(its queue is empty)", "thread `prefetch` waits in "
                                                                 "Queue.put()", "different queue objects"]),
    "mp_queue_get": ("queue.get_no_producer", "mp-queue-get", ["multiprocessing.Queue.get()", "no live producer"]),
    # ... and what it polls for, with the value py-spy --locals read.
    "poll": ("loop.poll_retry", "poll-sleep", ["polls/retries in a loop at line", "sleeping between tries",
                                               "it loops while `not os.path.exists(flag)` (flag = "]),
    "event": ("event.never_set", "event", ["threading.Event.wait()"]),
    "barrier": ("barrier.parties_missing", "barrier", ["threading.Barrier.wait()"]),
    "proc_join": ("process.join_child", "proc-join", ["Process.join()", "for its child process pid",
                  f"is at {SCRIPT}:{marker_line('child-sleep', SCRIPT)} in sleep_forever()"]),
    "popen_wait": ("subprocess.wait_child", "popen-wait", ["for its child process pid", "`sleep 3600`"]),
    "writer": ("sleep.long", "writer", ["it sleeps 3,600 s (about 1.0 hours", "rather than waits for a peer"]),
    "flock": ("file.lock_held", "flock", ["fcntl file lock"]),
    "pipe_read": ("io.read_no_writer", "pipe-read", ["for data nobody writes"]),
    "fifo_open": ("io.open_blocked", "fifo-open", ["opening a FIFO blocks"]),
    "store_get": ("store.key_never_set", "store-get", ["c10d store's get()", "never-set"]),
    "accept": ("io.accept_no_client", "accept", ["accept()", "a client that never connects"]),
    "pool_lost": ("pool.task_lost", "pool-map", ["multiprocessing.Pool", "the task is lost", "is an idle pool worker"]),
    "lost_wakeup": ("condition.lost_wakeup", "lost-wakeup", ["no loop that re-checks", "is lost"]),
    # Notified on every item, but the predicate compares a copy taken before the wait (held-out set 12, j04).
    "frozen_predicate": ("condition.predicate_frozen", "frozen-predicate", [
        "`lambda: have >= self.warm`", "it compares `have`, a local variable of wait_until_warm()",
        "can never become true"]),
    "pipe_held": ("subprocess.pipe_held", "pipe-held", ["holds it open, so EOF never comes"]),
    # One regex call that never returns (a spinning rank on one line in every snapshot).
    "regex_spin": ("regex.backtracking", "regex", ["one regular-expression call", "backtracks exponentially"]),
    # The rank waits for a batch; the worker in the user's collate_fn is the one that does not deliver (the
    # idle worker waiting for its next index explains nothing).
    "worker_stuck": ("dataloader.worker_stuck", "collate-loop", ["is in the dataset's own code", "trim_to_budget"]),
    # A one-worker pool busy with a heartbeat: the task waited for never starts.
    "pool_busy": ("future.pool_busy", "pool-busy", ["Future.result()", "`ckpt-io_0` at", "in heartbeat()",
                                                     "never starts"]),
    # The child the rank waits for is blocked writing to a full pipe the rank reads only afterwards.
    "popen_pipe_full": ("subprocess.pipe_full", "popen-pipe-full", ["is blocked writing to a pipe",
                                                                "reads only after wait() returns"]),
    "join_before_get": ("process.queue_not_drained", "join-before-get", ["is blocked writing to a pipe",
                                                                         "joins it before it reads them"]),
    # The task waited for runs, and waits on an Event: not a starved pool.
    "future_blocked": ("future.task_blocked", "future-blocked", ["runs but does not finish", "`fetch_0` at",
                                                                 "in fetch_shard()", "is blocked (event)"]),
    # Its own O_EXCL lock file, left behind by an exception before the removal.
    "lock_file": ("file.stale_lock", "lock-sleep", ["to create a lock file exclusively",
                                                    "not in a `finally:`", "a stale lock"]),
    # Spinning: py-spy --locals read twice says why the loop does not end.
    "float_loop": ("loop.float_equality", "float-loop", ["equals `target` exactly", "floating-point numbers",
                                                         "target = 0.3"]),
    "stuck_loop": ("loop.no_progress", "stuck-loop", ["did not change between two reads", "i = 1",
                                                      f"the `continue` at line {marker_line('stuck-loop', SCRIPT) + 2}"]),
    # Its service reads the length header in the other byte order: both ends of the socket wait to read (held-out
    # hang set 10, j11's class); the service's stack and locals (py-spy --locals) say so.
    "length_header": ("io.both_ends_read", "client-recv", [
        "which waits to read too, at", f"_hang_frame_server.py:{marker_line('server-recv', SERVER)}",
        "the other end expects n = ", "wrong byte order"]),
    # An int16 doubled past its largest value wraps to 0, and 0 doubled stays 0 (held-out hang set 10, j12's class).
    "doubling_overflow": ("loop.no_progress", "doubling", ["(edge = 0, top = 30000)", "a product that is now edge = 0",
                                                           "wraps round to a negative number, then to 0"]),
    # Rank 1 polls for the file rank 0 writes after the barrier it waits in.
    "circular": ("wait.circular_file_collective", "circular-poll", ["a circular wait", "rank 0 writes files only after"]),
    # A coroutine on the loop waits synchronously on that loop (held-out hang set 7, j07's class).
    "loop_self_wait": ("asyncio.loop_blocks_on_itself", "loop-flush", ["`metrics-loop` runs an asyncio event loop",
                                                                     "waits synchronously in Future.result()"]),
    # A delay of about the Unix time: time.time() mixed with time.monotonic() (held-out set 7, j10's class).
    "clocks_mixed": ("sleep.clocks_mixed", "clocks-mixed", ["the size of a Unix timestamp", "time.monotonic()"]),
    # Its main thread raised and ended; a non-daemon heartbeat thread keeps the process alive (held-out set 7, j06).
    # The culprit line is the raise that ended the script (the job's log is the rank's stderr), not the heartbeat.
    "kept_alive": ("thread.non_daemon_keeps_alive", "kept-raise", [
        "its main thread has ended", "the script raised `KeyError: 'missing shard'` at ", "threading._shutdown",
        "`heartbeat`", "the launcher sees no failure"]),
    "queue_put": ("queue.put_full", "queue-put", ["Queue.put()", "the queue is full", "nothing takes items"]),
    "manager_lock": ("manager.proxy_call_blocked", "manager-lock", ["multiprocessing Manager", "a call on a proxy"]),
    # The rank's asyncio loop sleeps in select(): a thread completed its future with call_soon, not threadsafe.
    "asyncio_unsafe": ("asyncio.loop_never_woken", "asyncio-run", [
        "is idle in select() with nothing ready", f"_hang_waits_job.py:{marker_line('call-soon', SCRIPT)} `loop.call_soon(",
        "call_soon_threadsafe"]),
    # Its HTTP server's one thread waits, inside the handler, for a reply from that same server.
    "self_request": ("server.handler_waits_on_itself", "self-request", [
        "`settings-svc` serves requests on a single-threaded server", "do_GET()", "is never answered"]),
    "sleep_ms": ("sleep.milliseconds_as_seconds", "sleep-ms",
                 ["a value in milliseconds passed as seconds?", "rather than waits for a peer"]),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def hung(request, tmp_path_factory):
    with started(HungJob(request.param, tmp_path_factory.mktemp(request.param), nproc=2, script=SCRIPT)) as job:
        yield request.param, job


def test_why_the_rank_waits(hung):
    scenario, job = hung
    report = hang_on(job)
    verdict = report["verdict"]
    mechanism, tag, words = EXPECTED[scenario]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [CULPRIT], verdict
    line = marker_line(tag, SCRIPT)
    # A worker looping on one line is caught on the loop's header or its body, whichever the one dump saw.
    lines = (line - 1, line) if scenario == "worker_stuck" else (line, line + 1, line + 2) if scenario in (
        "float_loop", "stuck_loop", "doubling_overflow", "circular") else (line,)
    assert verdict["culprits"][0]["line"] in lines, verdict["culprits"][0]
    # rank 0's own writer thread is there by design: no "rank 1 has no `tb-writer` thread".
    assert "tb-writer" not in verdict["summary"], verdict["summary"]
    assert verdict["mechanism"]["id"] == mechanism, verdict
    assert f"why it waits: {verdict['mechanism']['summary']}" in verdict["summary"]
    for word in words:
        assert word in verdict["summary"], (word, verdict["summary"])
    if scenario == "sleep_ms":
        # py-spy --locals read `delay_ms`: the sleep's length is said, in seconds and days.
        assert verdict["mechanism"]["threads"][0]["seconds"] == 3_600_000, verdict["mechanism"]
        assert "it sleeps 3,600,000 s (about 41.7 days" in verdict["summary"], verdict["summary"]
    if scenario == "lock_order":
        assert f"_hang_waits_job.py:{marker_line('saver', SCRIPT)}" in verdict["summary"]
    if scenario in ("proc_join", "popen_wait"):
        import psutil

        # The pid named is the culprit's own child (the forked Process; the `sleep` it runs).
        children = [c.pid for c in psutil.Process(verdict["culprits"][0]["pid"]).children()]
        assert verdict["mechanism"]["pids"] and set(verdict["mechanism"]["pids"]) <= set(children), children


def test_a_thread_joined_inside_an_import_that_it_waits_for(tmp_path):
    """Held-out hang set 10 (j07's class): the rank's import of a module whose top level joins a thread that
    imports the same module: the join and the module's import lock wait for each other."""
    kit = Path(__file__).with_name("_hang_import_kit.py")
    with started(HungJob("import_join", tmp_path, nproc=2, script=SCRIPT)) as job:
        report = hang_on(job)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [CULPRIT], verdict
    assert verdict["mechanism"]["id"] == "import.lock_deadlock", verdict
    assert verdict["culprits"][0]["line"] == marker_line("import-join", kit), verdict["culprits"]
    for word in ("in the top-level code of _hang_import_kit.py while _hang_import_kit.py is still being imported",
                 "thread `kit-prime`, which waits for a module's import lock",
                 f"_hang_import_kit.py:{marker_line('import-in-thread', kit)}"):
        assert word in verdict["summary"], (word, verdict["summary"])


def test_a_world_size_the_launch_did_not_start_is_named(tmp_path):
    """Held-out hang set 7 (j14's class): every rank passes init_process_group a world size from its own settings,
    one more than torchrun started. The joining verdict reads that argument from the init_process_group frame
    (py-spy --locals) and names it, not the network."""
    with started(HungJob("world_too_big", tmp_path, nproc=2, script=SCRIPT)) as job:
        report = hang_on(job)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["kind"] == "joining" and verdict["culprit_ranks"] == [0, 1], verdict
    assert "calls init_process_group with world_size=3" in verdict["summary"], verdict["summary"]
    assert "the launch started 2 process(es)" in verdict["summary"] and "network" not in verdict["summary"]
    assert verdict["culprits"][0]["line"] == marker_line("init-world", SCRIPT), verdict["culprits"]


def test_a_rank_kept_alive_by_its_child_at_exit(tmp_path):
    """Held-out hang set 8 (j02's class): the last rank raised; multiprocessing's exit handler joins its
    non-daemon log-sink child, which waits for a sentinel. Its stack holds no line of the script (only
    Popen.poll under _exit_function): the reason names the exit handler and the child's pid."""
    with started(HungJob("exit_joins_child", tmp_path, nproc=2, script=SCRIPT)) as job:
        report = hang_on(job)
    verdict = report["verdict"]
    assert report["exit_code"] == 1 and verdict["culprit_ranks"] == [CULPRIT], verdict
    mechanism = verdict["mechanism"]
    assert mechanism["id"] == "process.exit_joins_child", verdict
    assert "multiprocessing.util._exit_function" in mechanism["summary"] and mechanism["pids"], mechanism
    # The rank's stderr is the job's log file: its last traceback says what ended the script, and where.
    assert "the script raised `KeyError: 'label_smoothing'` at " in mechanism["summary"], mechanism["summary"]
    assert str(tmp_path / "job.log") in mechanism["summary"]
    raised = mechanism["threads"][0]
    assert raised["role"] == "raised" and raised["line"] == marker_line("raise", SCRIPT), mechanism
    assert verdict["culprits"][0]["line"] == marker_line("raise", SCRIPT), verdict["culprits"]
    assert verdict["fix"].startswith("Fix the `KeyError` at "), verdict["fix"]
