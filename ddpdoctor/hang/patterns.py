"""What the shape of a hang adds to its verdict. Pure: the verdict's context in, notes and fixes out.

- a named thread most ranks run and some do not ("rank 1 has no `prefetch` thread"): it died;
- a rank waiting on its DataLoader: the stacks of its worker processes, where the batch is stuck;
- a rank in loss.backward(): DDP/FSDP's gradient all-reduce (unused parameters, uneven data);
- a lock taken twice: the line that takes it and the caller that already holds it (read from the
  source text of the caller chain, never imported);
- why a culprit outside every collective waits (waits.explain_wait): `verdict["mechanism"]`.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from ddpdoctor.hang.findings import plural_ranks
from ddpdoctor.hang.source import loop_around
from ddpdoctor.hang.spin import loop_reason
from ddpdoctor.hang.stacks import RankStack, describe_stack, normal_thread_name
from ddpdoctor.hang.waits import Mechanism, explain_wait

_WITH = re.compile(r"^\s*with\s+([A-Za-z_][\w.]{0,200})(?:\(\))?\s*(?::|as\b)")
_ACQUIRE = re.compile(r"([A-Za-z_][\w.]{0,200})\.acquire\(")


def add_pattern_notes(ctx: Any, verdict: dict[str, Any]) -> None:
    """What the pattern of the hang adds to a verdict: why the culprit waits (its `mechanism`), threads
    some ranks lack, a DataLoader worker that is stuck, a gradient all-reduce in backward (unused
    parameters, uneven data)."""
    if verdict["kind"] in ("progressing", "none", "not_distributed"):
        return
    notes, fixes = [], []
    mechanism = wait_mechanism(ctx, verdict)
    if mechanism is not None:
        verdict["mechanism"] = mechanism.to_dict()
        notes.append(f"why it waits: {mechanism.summary}")
        # The reason's own fix leads: the generic one ("look at that line") is what it makes specific.
        verdict["fix"] = " ".join([mechanism.fix, verdict["fix"]]).strip()
        first = next((r for r in verdict["culprits"] if r.get("line") is None), None)
        if mechanism.threads and mechanism.threads[0].get("role") in (
                "raised", "hands a call", "callback waits on its own pool") and verdict["culprits"]:
            # The script ended: the line that raised is the one to fix; a call meant for a thread runs in
            # the main thread: the line that made it (`Thread(target=f(...))`) is; a Pool callback that waits
            # on its pool: the callback's call, not the main thread's wait.
            first = verdict["culprits"][0]
        if first is not None and mechanism.threads and mechanism.threads[0].get("line"):
            # No line of the user's on its main thread (it waits in the interpreter's shutdown): the line the
            # mechanism points at is where to look (the thread that keeps the process alive).
            first["file"], first["line"] = mechanism.threads[0].get("file"), mechanism.threads[0]["line"]
    culprit_keys = verdict["culprit_ranks"] or [
        r["rank"] if r["rank"] is not None else -r["pid"] for r in verdict["culprits"] if r.get("pid")]
    missing = _missing_threads(ctx.facts.stacks, culprit_keys)
    if missing:
        notes.append(missing)
        fixes.append(
            "A thread the other ranks run is gone on that rank: it died (an exception in a thread is only "
            "printed) or was never started, and whatever waits for it waits forever; look at its log."
        )
    for key in verdict["culprit_ranks"] or []:
        stack = ctx.stack_by_rank.get(key)
        if stack is not None and stack.data_wait():
            workers = ctx.facts.worker_stacks.get(stack.pid) or []
            stuck = stuck_worker(workers)
            shown = [f"worker pid {w.pid} is in {describe_stack(w)}" + _code_of(ctx, w) for w in workers if w.main]
            if stuck is not None:
                frame = stuck.user_frame()
                shown = [f"its worker pid {stuck.pid} is stuck at {describe_stack(stuck)}{_code_of(ctx, stuck)}"] + [
                    f"worker pid {w.pid} is in {describe_stack(w)}" for w in workers if w.main and w is not stuck]
                for record in verdict["culprits"]:
                    if record.get("pid") == stack.pid and frame is not None:
                        # The line that does not deliver is the worker's, not the rank's `for batch in loader`.
                        record.update(rank_where=record.get("where") or "", worker_pid=stuck.pid, file=frame.filename,
                                      line=frame.line, where=f"{describe_stack(stuck)}{_code_of(ctx, stuck)} "
                                      f"(DataLoader worker pid {stuck.pid})")
            notes.append(
                f"{ctx.who(key)} waits for a batch from its DataLoader"
                + (f": {'; '.join(shown[:3])}" if shown else " (its workers' stacks could not be read)")
            )
            fixes.append(
                "A DataLoader worker does not deliver: look at the dataset's __getitem__ / collate_fn at the "
                "worker's line (a lock, a network read, a deadlock after fork); DataLoader(timeout=...) turns "
                "the wait into an error."
            )
            break
    for key in verdict["culprit_ranks"] or [r["rank"] if r["rank"] is not None else -r["pid"] for r in verdict["culprits"]]:
        twice = _lock_taken_twice(ctx, key)
        if twice:
            notes.append(twice)
            fixes.append(
                "Do not call code that takes the lock while holding it (release it first, or split the function "
                "into a locked and an unlocked part), or make it a threading.RLock."
            )
            break
    waits = {s.waiting_in() or "" for s in ctx.facts.stacks}
    culprits = [ctx.stack_by_rank.get(k) for k in verdict["culprit_ranks"]]
    # The culprit waits outside torch.distributed (a signal, a pipe, a queue): DDP's unused-parameter and
    # uneven-data advice says nothing about it (held-out hang set 8: it trailed every such fix).
    outside = mechanism is not None or (bool(culprits) and all(
        s is not None and not s.waiting_in() for s in culprits))
    # A rank that crashed while its forked child lives on: the exception, not the data, is the cause.
    outside = outside or any(r in verdict["culprit_ranks"] for _, r, _ in ctx.facts.orphans)
    if any(w.startswith("backward") for w in waits) and not outside:
        fixes.append(
            "A rank in loss.backward() waits in the DDP/FSDP gradient all-reduce. If some parameters get no "
            "gradient on some ranks (a branch that skips a layer), pass find_unused_parameters=True to "
            "DistributedDataParallel or make every rank use every parameter; if ranks run different numbers of "
            "steps (uneven data), use DistributedSampler(drop_last=True) or the "
            "torch.distributed.algorithms.Join context manager."
        )
    if notes:
        verdict["summary"] += "; " + "; ".join(notes)
    if fixes:
        verdict["fix"] = " ".join([verdict["fix"], *fixes]).strip()


def wait_mechanism(ctx: Any, verdict: dict[str, Any]) -> Optional[Mechanism]:
    """Why the first culprit that waits in no collective waits (waits.explain_wait), from all its threads,
    its earlier snapshots, its main thread's wake-ups over the look and its child processes."""
    keys = verdict["culprit_ranks"] or [
        r["rank"] if r["rank"] is not None else -r["pid"] for r in verdict["culprits"] if r.get("pid")]
    if verdict["kind"] in ("stopped", "exited", "spinning"):
        return None  # a stopped or gone process waits on nothing; a spinning one is running
    for key in keys:
        stack = ctx.stack_by_rank.get(key)
        if stack is None or stack.main is None:
            continue
        if stack.data_wait():
            # The rank waits for its DataLoader: the reason is in the worker that does not deliver, the one in
            # the user's code. The others idle in torch's worker loop waiting for their next index (a
            # multiprocessing queue get): that is normal and explains nothing.
            stuck = stuck_worker(ctx.facts.worker_stacks.get(stack.pid) or [])
            if stuck is None:
                continue
            found = explain_wait(stuck, ctx.facts.sources, (), None, ctx.facts.children.get(stuck.pid, []))
            if found is not None:
                found.summary = f"its DataLoader worker pid {stuck.pid}: {found.summary}"
                found.pids = [stuck.pid, *found.pids]
                return found
            frame = stuck.user_frame()
            code = _code_of(ctx, stuck)
            looping = loop_reason(ctx.facts, stuck.pid, frame) if frame is not None else None
            return Mechanism(
                "dataloader.worker_stuck",
                f"its DataLoader worker pid {stuck.pid} is in the dataset's own code at {describe_stack(stuck)}{code} "
                "and has not delivered the batch the rank waits for: "
                + (str(looping["summary"]) if looping is not None else
                   "a loop that does not end there (its exit condition never becomes true for this sample), or a "
                   "wait inside __getitem__ / collate_fn"),
                (f"{looping['fix']} " if looping is not None else "")
                + "Look at that line for this sample (`py-spy dump --pid WORKER`); DataLoader(timeout=...) turns a "
                "stuck worker into an error, and a bounded loop (a maximum number of iterations) into a skip.",
                [{"thread": "MainThread", "file": frame.filename, "line": frame.line, "code": code.strip(" `"),
                  "role": "stuck_worker"}] if frame is not None else [],
                [stuck.pid],
            )
        history = [s for sample in ctx.facts.samples for s in sample.stacks if s.pid == stack.pid]
        readings = [a for sample in ctx.facts.samples if (a := sample.activity.get(stack.pid)) is not None]
        woke = max(0, readings[-1].switches - readings[0].switches) if len(readings) > 1 else None
        children = ctx.facts.children.get(stack.pid, [])
        found = explain_wait(stack, ctx.facts.sources, history, woke, children, ctx.facts.sleep_locals.get(stack.pid),
                             ctx.facts.child_wchans, ctx.facts.exit_tracebacks.get(stack.pid),
                             ctx.facts.io_peers.get(stack.pid, ()))
        if found is not None and found.id == "loop.poll_retry":
            found = _circular(ctx, key, found)
        if found is not None:
            return _with_children(ctx, stack, found)
    return None


_CHECKS_FILE = re.compile(r"\b(?:exists|isfile|is_file|isdir|glob|listdir|iterdir|getsize|stat)\(")
_WRITES_FILE = re.compile(r"\b(?:torch\.save|json\.dump|np\.save|pickle\.dump|shutil\.(?:copy\w*|move)|os\.(?:rename|replace)|"
                          r"\w+\.(?:write_text|write_bytes|touch|save_pretrained|to_csv))\(|open\([^)]{0,200},\s*['\"][wax]")


def _circular(ctx: Any, key: int, found: Mechanism) -> Mechanism:
    """A rank polling for a file while the other ranks wait in a collective they reach before writing files:
    each side waits for the other (the file comes only after the collective the poller never joins)."""
    record = found.threads[0] if found.threads else {}
    lines = ctx.facts.sources.get(str(record.get("file", "")))
    loop_line = record.get("loop_line")
    if not lines or not isinstance(loop_line, int):
        return found
    body = loop_around(lines, int(record.get("line", loop_line)))  # type: ignore[arg-type]
    span = range(loop_line, (body.end if body is not None else loop_line) + 1)
    if not any(_CHECKS_FILE.search(lines[n - 1]) for n in span if 0 < n <= len(lines)):
        return found
    for other, stack in ctx.stack_by_rank.items():
        wait = stack.waiting_in() if other != key else None
        frame = stack.user_frame() if wait else None
        theirs = ctx.facts.sources.get(frame.filename) if frame is not None else None
        if frame is None or not theirs:
            continue
        for number in range(frame.line + 1, min(len(theirs), frame.line + 80) + 1):
            text = theirs[number - 1]
            if text.strip() and (len(text) - len(text.lstrip()) == 0 or text.lstrip().startswith(("def ", "async def "))):
                break  # left the function
            if _WRITES_FILE.search(text):
                found.id = "wait.circular_file_collective"
                found.summary += (
                    f"; a circular wait: what it polls for is a file, and {plural_ranks([other])} writes files only "
                    f"after the {wait} it waits in at line {frame.line} (line {number} `{text.strip()[:100]}`), "
                    "which this rank never joins while it polls: each waits for the other")
                found.fix = ("Break the cycle: let the rank that writes the file do it before the collective, or make "
                             "every rank join the collective before anyone waits for the file. " + found.fix)
                return found
    return found


def stuck_worker(workers: Sequence[RankStack]) -> Optional[RankStack]:
    """The DataLoader worker whose stack is in the user's code (a dataset's __getitem__, a collate_fn), not
    idle in torch's worker loop waiting for its next index; the first such one."""
    for worker in workers:
        # A forked worker's stack also holds the rank's frames below torch's _worker_loop (the fork copied
        # them): only a user frame inside the loop's call is the worker's own work.
        for frame in worker.main.frames if worker.main is not None else ():
            if frame.name.rsplit(".", 1)[-1] == "_worker_loop" and "torch/utils/data" in frame.filename:
                break
            if frame.is_user:
                return worker
    return None


def _code_of(ctx: Any, stack: RankStack) -> str:
    frame = stack.user_frame()
    code = ctx.code(frame.filename, frame.line) if frame is not None else ""
    return f" `{code}`" if code else ""


def _missing_threads(stacks: Sequence[RankStack], culprits: Sequence[int] = ()) -> str:
    """'rank 1 has no `prefetch` thread (ranks 0, 2 have one)', for a named thread of the user's code that
    a majority of at least two ranks run and a culprit lacks. A thread one rank runs by design (rank 0's
    logging, checkpoint or TensorBoard writer) is no majority; a thread only libraries run (pin memory,
    event writers, queue feeders) comes and goes with the library's own state."""
    readable = [s for s in stacks if s.threads]
    if len(readable) < 2:
        return ""
    names: dict[str, list[int]] = {}
    for stack in readable:
        for thread in stack.threads:
            name = normal_thread_name(thread.thread_name)
            if name and any(f.is_user for f in thread.frames):
                key = stack.rank if stack.rank is not None else -stack.pid
                if key not in names.setdefault(name, []):
                    names[name].append(key)
    everyone = sorted(s.rank if s.rank is not None else -s.pid for s in readable)
    for name, having in sorted(names.items()):
        lacking = [r for r in everyone if r not in having]
        if culprits and not set(lacking) & set(culprits):
            continue
        if lacking and len(having) >= 2 and len(having) > len(lacking) and name != "MainThread":
            return (
                f"{plural_ranks(lacking)} {'has' if len(lacking) == 1 else 'have'} no `{name}` thread "
                f"({plural_ranks(sorted(having))} {'has' if len(having) == 1 else 'have'} one)"
            )
    return ""


def _lock_taken_twice(ctx: Any, key: int) -> Optional[str]:
    """'it takes `LOCK` at flush() line 57 that it already holds since log_metrics() line 62', when the
    innermost user line takes a lock and an outer frame of the same thread is inside `with` that lock."""
    stack = ctx.stack_by_rank.get(key)
    if stack is None or stack.main is None:
        return None
    frames = [f for f in stack.main.frames if f.is_user][:12]
    if len(frames) < 2:
        return None
    inner = frames[0]
    code = ctx.code(inner.filename, inner.line)
    match = _WITH.match(code) or _ACQUIRE.search(code)
    if not match:
        return None
    name = match.group(1)
    for outer in frames[1:]:
        lines = ctx.facts.sources.get(outer.filename)
        if not lines or not 0 < outer.line <= len(lines):
            continue
        indent = len(lines[outer.line - 1]) - len(lines[outer.line - 1].lstrip())
        for number in range(outer.line - 1, max(0, outer.line - 200), -1):
            text = lines[number - 1]
            if not text.strip():
                continue
            depth = len(text) - len(text.lstrip())
            if depth >= indent:
                continue
            indent = depth
            held = _WITH.match(text)
            if held and held.group(1) == name:
                return (
                    f"it takes `{name}` at {inner.name}() line {inner.line} while it already holds it since "
                    f"{outer.name}() line {number} ({outer.filename}): a lock taken twice by one thread waits for itself"
                )
            if text.lstrip().startswith(("def ", "async def ", "class ")):
                break
    return None


def _with_children(ctx: Any, stack: Any, found: Mechanism) -> Mechanism:
    """A wait on child processes, completed by where each Python child stands (its own wait explained the
    same way when it is one: a lock inherited locked across fork, a queue): the child's line is the cause."""
    if found.id not in ("process.join_child", "subprocess.wait_child", "pool.task_lost"):
        return found
    notes = []
    for child in ctx.facts.helper_stacks.get(stack.pid) or []:
        frame = child.user_frame()
        if frame is None:
            continue
        main = child.main
        if main is not None and _idle_pool_worker(main.frames):
            notes.append(f"child pid {child.pid} is an idle pool worker (waiting for a task)")
            continue
        inner = explain_wait(child, ctx.facts.sources, (), None, ctx.facts.children.get(child.pid, []))
        code = ctx.code(frame.filename, frame.line)
        where = f"{frame.where()} in {frame.name}()" + (f" `{code}`" if code else "")
        why = f" ({inner.summary})" if inner is not None else ""
        if inner is not None and inner.id.startswith("lock.") and found.id != "subprocess.wait_child":
            # fork copies a lock in the state another thread held it, but not that thread: nothing
            # in the child will ever release it.
            why += (" - a forked child inherits a lock in whatever state it had at fork(): if another thread "
                    "of the parent held it then, it stays locked in the child forever; fork before starting "
                    "threads, or use the 'spawn'/'forkserver' start method")
            if not found.fix.startswith("Fork"):
                found.fix = ("Fork before starting threads that take locks, or start the child with the 'spawn' or "
                             "'forkserver' method (it inherits no lock state). " + found.fix)
        forked = _forked_without_threads(ctx, stack, child, inner)
        if forked:
            why += forked
            if not found.fix.startswith("Fork"):
                found.fix = ("Fork before starting threads, or start the child with the 'spawn' or 'forkserver' "
                             "method and start its own threads in it. " + found.fix)
        notes.append(f"child pid {child.pid} is at {where}{why}")
        found.threads.append({"thread": f"child pid {child.pid}", "file": frame.filename, "line": frame.line,
                              "code": code, "role": "child"})
    if notes:
        found.summary += "; " + "; ".join(notes[:3])
    return found


# Waits another thread of the same process would end (set, notify, put, release).
_THREAD_ENDED = ("event.never_set", "condition.never_notified", "queue.get_no_producer", "queue.get_waiting",
                 "semaphore.count_zero")


def _forked_without_threads(ctx: Any, stack: Any, child: Any, inner: Optional[Mechanism]) -> str:
    """A forked child (multiprocessing's fork start method) with only the thread that called fork(), waiting on
    something another thread would end, while the parent runs threads of its own: fork() copies only the calling
    thread, so the parent's helper threads (and what they would set) do not exist in the child, though the objects
    that point at them were copied (held-out hang set 12's j06: a codec whose worker thread the child lacks)."""
    if inner is None or inner.id not in _THREAD_ENDED or len(child.threads) != 1:
        return ""
    kinds = {pid: kind for pid, kind, _ in ctx.facts.children.get(stack.pid, [])}
    if kinds.get(child.pid) != "multiprocessing fork child":
        return ""
    parent = [t.thread_name for t in stack.threads
              if t is not stack.main and any(f.is_user for f in t.frames)]
    if not parent:
        return ""
    names = ", ".join(f"`{n}`" for n in parent[:4])
    return (f" - the child was forked from a process that runs thread(s) {names}, but fork() copies only the thread "
            "that calls it: those threads do not exist in the child, so nothing there will end this wait, though "
            "the objects that refer to them were copied")


def _idle_pool_worker(frames: Any) -> bool:
    """A multiprocessing Pool worker between tasks: in pool.py's worker loop, blocked getting the next task
    (no frame of a task function below it)."""
    names = [f.name.rsplit(".", 1)[-1] for f in frames if f.filename.endswith("multiprocessing/pool.py")]
    if "worker" not in names:
        return False
    for frame in frames:  # innermost first: anything before pool.py's worker runs the task
        if frame.filename.endswith("multiprocessing/pool.py"):
            return True
        if frame.is_user:
            return False
    return False
