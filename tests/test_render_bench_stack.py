"""Which lines of a stuck rank's faulthandler dump bench-nccl prints (render.bench.stack_excerpt).

The dumps are real: a Python process with the shape of a rank (its frames under `rank_main`) and two
more Python threads, deep enough that a plain cut of the text would show only them, dumps itself with
faulthandler as a rank does on SIGUSR1 (faulthandler lists the newest thread first, the main thread last).
"""

from __future__ import annotations

import subprocess
import sys

from ddpdoctor.render.bench import OWN_STACK_LINES, stack_excerpt

THREADED_RANK = """
import faulthandler, sys, threading
ready, release = threading.Barrier(3), threading.Event()
def deep(n):
    if n:
        return deep(n - 1)
    ready.wait()
    release.wait()
def worker_thread():
    deep(40)
def _maybe_fault():
    ready.wait()
    faulthandler.dump_traceback(file=sys.stdout, all_threads=__ALL__)
    release.set()
def rank_main():
    _maybe_fault()
for _ in range(2):
    threading.Thread(target=worker_thread, daemon=True).start()
rank_main()
"""


def _dump(all_threads: bool = True, entry: str = "rank_main") -> str:
    code = THREADED_RANK.replace("__ALL__", str(all_threads)).replace("rank_main", entry)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_main_thread_listed_last_is_rendered_first_with_its_frames() -> None:
    dump = _dump()
    lines = dump.strip().splitlines()
    # The input is what the old cut failed on: three threads, the rank's own last and past line 25.
    assert sum(line.startswith(("Thread 0x", "Current thread 0x")) for line in lines) == 3
    assert lines[-1].endswith("in <module>") and "_maybe_fault" not in "\n".join(lines[:OWN_STACK_LINES])
    shown = stack_excerpt(dump)
    assert shown[0].startswith("Current thread 0x"), shown
    assert "in _maybe_fault" in shown[1] and any(line.endswith("in rank_main") for line in shown[:6]), shown
    # The other threads follow, bounded: a few lines each, said to be cut.
    assert sum(line.startswith("Thread 0x") for line in shown) == 2
    assert sum("more lines" in line for line in shown) == 2 and len(shown) < 30


def test_other_threads_beyond_the_limit_are_counted() -> None:
    shown = stack_excerpt(_dump(), other_threads=1)
    assert sum(line.startswith("Thread 0x") for line in shown) == 1
    assert shown[-1] == "... 1 more threads"


def test_without_rank_main_the_interpreter_s_thread_is_the_rank_s() -> None:
    # A joined rank (torchrun) has no rank_main: the thread that began in <module> is the main one.
    shown = stack_excerpt(_dump(entry="train_step"))
    assert shown[0].startswith("Current thread 0x") and "in _maybe_fault" in shown[1], shown


def test_single_thread_dump_and_empty_text() -> None:
    dump = _dump(all_threads=False)
    assert dump.startswith("Stack (most recent call first):")
    shown = stack_excerpt(dump)
    assert shown == dump.strip().splitlines()
    assert stack_excerpt("") == []


def test_a_long_own_stack_is_cut_and_says_so() -> None:
    shown = stack_excerpt(_dump(), own_lines=3)
    assert shown[0].startswith("Current thread 0x") and shown[3].startswith("  ... ") and "more lines" in shown[3]
