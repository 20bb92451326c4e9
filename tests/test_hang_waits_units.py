"""hang.waits on real py-spy dumps (tests/fixtures/hang_waits/, captured by tests/_capture_waits.py from
the real gloo jobs of tests/_hang_waits_job.py): why the last rank waits, when its wait is no collective.
Pure: the dumps and the job's source text as it was when they were recorded in, a mechanism out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from ddpdoctor.hang.patterns import _missing_threads
from ddpdoctor.hang.stacks import RankStack, parse_pyspy_json
from ddpdoctor.hang.waits import Mechanism, blocked_in, explain_wait

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures" / "hang_waits"
# The job file as it was when the dumps were recorded (the dumps' line numbers are its lines).
LINES = (FIXTURES / "job_as_recorded.py.txt").read_text().splitlines()


def marker(tag: str) -> int:
    return next(n for n, text in enumerate(LINES, 1) if f"HANG-LINE {tag}" in text)


def load(scenario: str, rank: int = 1) -> tuple[RankStack, dict[str, list[str]]]:
    text = (FIXTURES / f"{scenario}.rank{rank}.json").read_text()
    threads = parse_pyspy_json(text)
    pid = json.loads(text)[0]["pid"]
    # The dumps name the job script /home/user/train/_hang_waits_job.py (paths rewritten after capture).
    names = {f.filename for t in threads for f in t.frames if f.filename.endswith("/_hang_waits_job.py")}
    assert names == {"/home/user/train/_hang_waits_job.py"}
    return RankStack(rank, pid, threads=threads), {name: LINES for name in names}


def explain(scenario: str, woke: Optional[int] = None, helpers=()) -> Mechanism:
    stack, sources = load(scenario)
    found = explain_wait(stack, sources, [stack], woke, helpers)
    assert found is not None, scenario
    return found


def test_lock_order_deadlock_names_both_threads_and_lines():
    found = explain("lock_order")
    assert found.id == "lock.order_deadlock"
    assert "lock-order deadlock between thread MainThread" in found.summary and "thread saver" in found.summary
    assert f"_hang_waits_job.py:{marker('lock-order')}" in found.summary
    assert f"_hang_waits_job.py:{marker('saver')}" in found.summary
    # Read from the `with` blocks around each thread's callers: who holds what.
    assert "MainThread holds `LOCK_A`" in found.summary and "saver holds `LOCK_B`" in found.summary
    assert {t["thread"] for t in found.threads} == {"MainThread", "saver"}


def test_lock_nothing_else_holds():
    found = explain("self_lock")
    assert found.id == "lock.self_deadlock"
    assert "waits on a lock nothing else in this process holds or releases" in found.summary
    assert f":{marker('self-lock')}" in found.summary and "`STATE_LOCK`" in found.summary


def test_queue_join_without_task_done():
    found = explain("queue_join")
    assert found.id == "queue.join_without_task_done"
    assert "Queue.join()" in found.summary and "consumer" in found.summary and "task_done()" in found.summary
    assert f":{marker('queue-join')}" in found.summary


def test_queue_get_without_producer_thread():
    found = explain("queue_get")
    assert found.id == "queue.get_no_producer"
    assert "Queue.get()" in found.summary and "no live producer thread" in found.summary
    assert f":{marker('queue-get')}" in found.summary


def test_multiprocessing_queue_get_without_producer_process():
    found = explain("mp_queue_get")
    assert found.id == "queue.get_no_producer" and "multiprocessing.Queue.get()" in found.summary
    # A live child process could still put: then it is named, not called missing.
    alive = explain("mp_queue_get", helpers=[(4242, "multiprocessing fork child", "python job.py")])
    assert alive.id == "queue.mp_get_waiting" and "pid 4242" in alive.summary


def test_poll_loop_sleeping_between_tries():
    found = explain("poll", woke=5)
    assert found.id == "loop.poll_retry"
    assert f"polls/retries in a loop at line {marker('poll-loop')}" in found.summary
    assert f"sleeping between tries at line {marker('poll-sleep')}" in found.summary


def test_plain_sleep_is_no_poll():
    # The writer scenario's culprit sleeps once, outside any loop of its own function; and a sleep that
    # never woke over the look is no retry either.
    stack, sources = load("writer")
    found = explain_wait(stack, sources, [stack], 0)
    # ...but an hour-long sleep (a literal 3600) holds the rank out of the job by itself.
    assert found is not None and found.id == "sleep.long" and "it sleeps 3,600 s (about 1.0 hours" in found.summary
    stack, sources = load("poll")
    assert explain_wait(stack, sources, [stack], 0) is None


def test_event_barrier_and_children():
    event = explain("event")
    assert event.id == "event.never_set" and "threading.Event.wait()" in event.summary
    assert f":{marker('event')}" in event.summary
    barrier = explain("barrier")
    assert barrier.id == "barrier.parties_missing" and "threading.Barrier.wait()" in barrier.summary
    join = explain("proc_join", helpers=[(777, "multiprocessing fork child", "python job.py")])
    assert join.id == "process.join_child" and "Process.join()" in join.summary and "pid 777" in join.summary
    assert join.pids == [777]
    wait = explain("popen_wait", helpers=[(888, "process", "sleep 3600")])
    assert wait.id == "subprocess.wait_child" and "pid 888 `sleep 3600`" in wait.summary
    assert f":{marker('popen-wait')}" in wait.summary


def test_calls_into_c_read_from_the_line():
    # flock, os.read, open() of a FIFO and the c10d store's get() leave no Python frame below the user's
    # line: the line's text names the call.
    store = explain("store_get")
    assert store.id == "store.key_never_set" and "for key \"never-set\"" in store.summary
    assert f":{marker('store-get')}" in store.summary
    flock = explain("flock")
    assert flock.id == "file.lock_held" and f":{marker('flock')}" in flock.summary
    read = explain("pipe_read")
    assert read.id == "io.read_no_writer" and f":{marker('pipe-read')}" in read.summary
    fifo = explain("fifo_open")
    assert fifo.id == "io.open_blocked" and "FIFO" in fifo.summary and f":{marker('fifo-open')}" in fifo.summary


def test_ranks_in_a_collective_have_no_wait_mechanism():
    stack, sources = load("lock_order", rank=0)
    assert stack.waiting_in() == "all_reduce"
    assert explain_wait(stack, sources) is None


@pytest.mark.parametrize("scenario", ["lock_order", "queue_join", "queue_get", "event", "popen_wait"])
def test_each_thread_is_read(scenario):
    stack, sources = load(scenario)
    assert blocked_in(stack.main, sources) is not None


def test_a_thread_one_rank_runs_by_design_is_not_missing():
    # Real dumps: rank 0 runs a `tb-writer` thread by design, rank 1 does not.
    stacks = [load("writer", 0)[0], load("writer", 1)[0]]
    assert _missing_threads(stacks, [1]) == ""
    # Two ranks of three run a user thread the culprit lacks: that is the hint.
    third = load("queue_join", 1)[0]  # rank 1 with a `consumer` thread
    with_consumer = [RankStack(0, 1, threads=third.threads), RankStack(1, 2, threads=third.threads),
                     RankStack(2, 3, threads=[t for t in third.threads if t.thread_name == "MainThread"])]
    assert "rank 2 has no `consumer` thread" in _missing_threads(with_consumer, [2])
    assert _missing_threads(with_consumer, [0]) == ""


def test_any_stack_and_source_text_gives_an_answer_or_none():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ddpdoctor.hang.fr import Frame
    from ddpdoctor.hang.stacks import ThreadStack

    names = st.sampled_from(["Event.wait", "Queue.get", "Queue.join", "run", "wait", "f", "BaseProcess.join"])
    files = st.sampled_from(["/usr/lib/python3.11/threading.py", "/usr/lib/python3.11/queue.py", "/app/a.py",
                             "/usr/lib/python3.11/subprocess.py", "/usr/lib/python3.11/multiprocessing/queues.py"])
    frames = st.lists(st.builds(Frame, files, st.integers(-2, 8), names), max_size=6)
    threads = st.lists(st.builds(ThreadStack, st.sampled_from(["MainThread", "a", "b"]), frames.map(tuple)),
                       max_size=4)
    code = st.lists(st.sampled_from(["with L:", "  with M:", "    x.get()", "while True:", "  time.sleep(1)",
                                     "def f():", "", "# c", "L.acquire()"]), max_size=9)

    @settings(max_examples=300, deadline=None)
    @given(threads, code, st.one_of(st.none(), st.integers(0, 5)))
    def check(threads, lines, woke):
        stack = RankStack(1, 10, threads=threads)
        found = explain_wait(stack, {"/app/a.py": lines}, [stack], woke, [(5, "process", "sleep 1")])
        assert found is None or (found.id.count(".") >= 1 and found.summary)

    check()


def test_a_retry_loop_caught_between_its_sleeps():
    # The real poll dump, and the same stack moved to the loop's header (`while not os.path.exists(...)`),
    # as a later snapshot catches it between two sleeps: the earlier snapshot's sleep names the loop.
    from dataclasses import replace

    from ddpdoctor.hang.stacks import ThreadStack

    slept, sources = load("poll")
    main = slept.main
    header = replace(main.frames[0], line=marker("poll-loop"))
    checking = RankStack(1, slept.pid, threads=[ThreadStack(main.thread_name, (header, *main.frames[1:]))])
    assert explain_wait(checking, sources, [], 3) is None  # alone, a loop header says nothing
    found = explain_wait(checking, sources, [slept, checking], 3)
    assert found is not None and found.id == "loop.poll_retry"
    assert f"sleeping between tries at line {marker('poll-sleep')}" in found.summary


def test_poll_loop_probing_a_pid_with_kill_zero():
    """Held-out hang set 14 (j12): `while self.busy(): time.sleep(...)` where busy() is `os.kill(self.pid, 0)`:
    a child that exited stays a zombie until reaped, and kill(pid, 0) goes on succeeding. The captured poll stack,
    with its loop's condition rewritten (line numbers kept) to call such a helper appended to the file."""
    stack, sources = load("poll")
    name = next(iter(sources))
    lines = list(LINES)
    loop = marker("poll-loop")
    lines[loop - 1] = "    while exporter_busy(flag):  # HANG-LINE poll-loop"
    lines += ["", "", "def exporter_busy(pid):", "    try:", "        os.kill(pid, 0)", "    except OSError:",
              "        return False", "    return True"]
    found = explain_wait(stack, {name: lines}, [stack], 5)
    assert found is not None and found.id == "loop.kill_zero_zombie", found
    assert f"tested with `os.kill(pid, 0)` (line {len(LINES) + 5})" in found.summary, found.summary
    assert "stays a zombie" in found.summary and "os.waitpid(pid, os.WNOHANG)" in found.fix
    # The same loop on a file test keeps the generic poll reading.
    assert explain_wait(stack, sources, [stack], 5).id == "loop.poll_retry"
