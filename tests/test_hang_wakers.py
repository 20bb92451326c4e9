"""hang.wakers: where the line that would end a wait is, the `if` that guards it, and whether any thread is in
its function now. Pure: source lines and thread stacks in, a phrase out. The shapes are those of held-out hang
set 12 (spent): a c10d store key set only when `compare_set`'s bytes equal a str, a semaphore released in a
function no thread runs, an event set only in a branch."""

from __future__ import annotations

from ddpdoctor.hang.fr import Frame
from ddpdoctor.hang.stacks import ThreadStack
from ddpdoctor.hang.wakers import bytes_vs_str, waker_phrase, wakers

CACHE = """\
import torch.distributed as dist


class Cache:
    def __init__(self, store, rank):
        self.store = store
        self.me = f"rank{rank}"

    def claim(self):
        won = self.store.compare_set("owner", "", self.me)
        if won == self.me:
            self.build()
            self.store.set("ready", "1")

    def wait_ready(self):
        self.store.wait(["ready"])
""".splitlines()

LOADER = """\
import threading

ready = threading.Event()


def loader(batches):
    for batch in batches:
        if batch is None:
            ready.set()


def main():
    ready.wait()
""".splitlines()


def test_store_key_set_only_under_a_bytes_vs_str_comparison() -> None:
    sources = {"/job/cache.py": CACHE}
    found = wakers(sources, "", ("set", "add", "compare_set"), key='"ready"')
    assert [(w.line, w.guard_line) for w in found] == [(13, 11)]
    assert bytes_vs_str(sources, found[0]) == ("won == self.me", 10)
    phrase = waker_phrase(sources, [], found, "sets the key", "/job/cache.py", 16)
    assert "cache.py:13 in claim()" in phrase and "under `if won == self.me:` (line 11)" in phrase
    assert "compares the bytes a c10d store returns" in phrase and "no thread is in claim() now" in phrase


def test_a_comparison_with_bytes_is_not_called_mixed() -> None:
    lines = [line.replace('f"rank{rank}"', 'f"rank{rank}".encode()') for line in CACHE]
    found = wakers({"/job/cache.py": lines}, "", ("set",), key='"ready"')
    assert bytes_vs_str({"/job/cache.py": lines}, found[0]) is None


def test_event_set_in_a_branch_names_the_thread_inside_that_function() -> None:
    sources = {"/job/loader.py": LOADER}
    found = wakers(sources, "ready", ("set",))
    assert [(w.line, w.function, w.guard) for w in found] == [(9, "loader", "if batch is None:")]
    threads = [
        ThreadStack("MainThread", (Frame("/job/loader.py", 13, "main"),)),
        ThreadStack("prefetch", (Frame("/usr/lib/python3.12/queue.py", 171, "Queue.get"),
                                 Frame("/job/loader.py", 7, "loader"))),
    ]
    phrase = waker_phrase(sources, threads, found, "sets it", "/job/loader.py", 13)
    assert "thread `prefetch` is in loader() at line 7" in phrase
    assert waker_phrase(sources, threads[:1], found, "sets it") .endswith("no thread is in loader() now")


def test_no_waker_in_the_files_the_threads_run() -> None:
    sources = {"/job/loader.py": [line for line in LOADER if "ready.set()" not in line]}
    phrase = waker_phrase(sources, [], wakers(sources, "ready", ("set",)), "sets it")
    assert phrase == "; no line of the files its threads run (loader.py) sets it"


UPLOADER = """\
import threading


class Uploader:
    def __init__(self, targets):
        self.targets = targets
        self._slots = threading.BoundedSemaphore(sum(1 for _ in targets))

    def put(self, blob):
        self._slots.acquire()
        self.send(blob)

    def done(self):
        self._slots.release()
""".splitlines()


def test_semaphore_wait_names_where_it_was_made_and_what_releases_it() -> None:
    from ddpdoctor.hang.stacks import RankStack
    from ddpdoctor.hang.waits import explain_wait

    main = ThreadStack("MainThread", (
        Frame("/usr/lib/python3.12/threading.py", 507, "Semaphore.acquire"),
        Frame("/job/uploader.py", 10, "put"),
        Frame("/job/train.py", 40, "main"),
    ))
    stack = RankStack(1, 4242, threads=[main])
    found = explain_wait(stack, {"/job/uploader.py": UPLOADER}, [stack], None, ())
    assert found is not None and found.id == "semaphore.count_zero"
    assert "made at uploader.py:7 `self._slots = threading.BoundedSemaphore(sum(1 for _ in targets))`" in found.summary
    assert "uploader.py:14 in done() `self._slots.release()`" in found.summary
    assert "no thread is in done() now" in found.summary


def test_the_jobs_own_imported_modules_are_found_beside_the_importer(tmp_path):
    """hang reads the modules a stack file imports when they sit beside it (held-out hang set 13, j08: the Event's
    set() was in mirror.py, which no live thread was in); installed packages and missing names are not files."""
    from ddpdoctor.hang.probe_io import local_imports

    (tmp_path / "mirror.py").write_text("x = 1\n")
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("")
    (tmp_path / "utils" / "io.py").write_text("y = 2\n")
    lines = ["import os, mirror", "from utils.io import y", "from . import utils", "import torch.distributed as dist",
             "    from mirror import x  # inside a function", "print('import nothing')"]
    found = local_imports(str(tmp_path / "train.py"), lines)
    assert found == [str(tmp_path / "mirror.py"), str(tmp_path / "utils" / "io.py"),
                     str(tmp_path / "utils" / "__init__.py")], found
