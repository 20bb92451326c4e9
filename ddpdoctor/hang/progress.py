"""Is the job hung, or only slow? Several snapshots taken about a second apart, compared. Pure.

One snapshot cannot tell a hang from a job caught between two steps: every rank of a healthy job spends
most of its time in a collective, and a slow rank looks exactly like a stuck one. probe_io takes
`--samples` snapshots `--interval` seconds apart (each: the ranks' Python stacks, read without pausing
them, and their main threads' CPU time and voluntary context switches from /proc); this module says
what moved in between:

- a rank that waits in a collective in every snapshot but whose main thread woke up (and is not busy)
  finished a collective and entered the next one: the job progresses (a hung collective never wakes
  the thread that waits in it);
- a rank whose place changed (entered or left a collective, or moved to another line) progresses,
  unless it is busy without a pause (a loop passes through several lines);
- Flight Recorder sequence numbers or NCCL RAS operation counts that grew: the job progresses;
- a rank that burns a core (main thread on CPU most of the interval), never in a collective, while
  every other rank stands still: it spins (a loop that never ends), and it is the culprit;
- nothing moved: the job hangs, and the one-snapshot verdict (Flight Recorder, stacks, RAS) stands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ddpdoctor.hang.fr import Dump
from ddpdoctor.hang.stacks import RankStack

# A main thread on CPU at least this share of the interval is busy (a spinning loop shows ~1.0; on a
# machine shared with other work it gets less, hence not 0.9).
BUSY_CPU_SHARE = 0.5
# How long to keep looking before calling a job hung (or a rank spinning) when a rank is outside every
# collective (file I/O, short sleeps, a CPU-heavy step such as torch.save) while the others wait: a
# healthy job's rank 0 writing a checkpoint for 2-3 s between epochs looks hung for a second. Snapshots
# go on LONG_LOOK_STEP_S apart until something moves or LONG_LOOK_S have passed since the first.
LONG_LOOK_S = 6.0
LONG_LOOK_STEP_S = 0.5
# The long look counts as whole from here: the snapshots' own timing lands them a little short of LONG_LOOK_S.
LONG_LOOK_DONE_S = LONG_LOOK_S - 0.25


@dataclass(frozen=True)
class Activity:
    """One reading of a rank's main thread: CPU time and voluntary context switches (sleeps)."""

    cpu_ns: int
    switches: int


@dataclass
class Sample:
    """One snapshot of the job: when (monotonic seconds), each rank's stacks, each rank's activity
    (by pid, read just before its stack), and NCCL RAS operation counts (by communicator)."""

    t: float
    stacks: list[RankStack] = field(default_factory=list)
    activity: dict[int, Activity] = field(default_factory=dict)
    ras_counts: Optional[dict[str, int]] = None


@dataclass(frozen=True)
class RankMotion:
    """What one rank did across the snapshots."""

    rank: Optional[int]
    pid: int
    seen: int  # snapshots with a readable stack
    waiting: int  # snapshots in which it waited in a collective
    cpu_share: Optional[float]  # main-thread CPU time / wall time, None when /proc was unreadable
    woke: Optional[int]  # voluntary context switches of its main thread in between
    place_changed: bool  # its stack's place differed between snapshots
    state: str  # waiting | working | spinning | still | unknown
    data_waits: int = 0  # snapshots in which it waited for its DataLoader

    @property
    def key(self) -> int:
        """The rank, or -pid for a process whose rank is unknown (the stacks' grouping key)."""
        return self.rank if self.rank is not None else -self.pid


@dataclass
class Motion:
    """The job across the snapshots: `state` is progressing, spinning, hung (nothing moved) or unknown
    (fewer than two snapshots). `evidence` says what moved, one phrase each."""

    state: str
    samples: int
    span_s: float
    ranks: list[RankMotion] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    spinning: list[RankMotion] = field(default_factory=list)
    stragglers: list[RankMotion] = field(default_factory=list)
    # Only ranks outside any collective moved, while some rank waited in one without ever waking: their
    # steps (I/O between epochs) or a loop that polls for something that never comes. Progress over a
    # short look; a hang once the long look (LONG_LOOK_S) saw the waiters never wake.
    weak: bool = False


def _place(stack: RankStack) -> tuple[object, ...]:
    """Where a rank is, for telling whether it moved: the collective it waits in and its user frames."""
    main = stack.main
    if main is None:
        return ()
    return (stack.waiting_in(), tuple(f"{f.name}@{f.where()}" for f in main.frames if f.is_user))


# Lines of one poll loop: its header and its sleep, a line or two apart (`while not ready(): time.sleep(0.05)`).
_TIGHT_LOOP_LINES = 3


def _tight_loop(stacks: Sequence[RankStack]) -> bool:
    """Every snapshot has the same call chain and the innermost user frame on one of at most two lines of one
    function, at most _TIGHT_LOOP_LINES apart, outside any collective: a poll loop caught at its condition in one
    snapshot and at its sleep in the next (the condition's store read took longer on a loaded machine), which is
    no move."""
    chains = set()
    lines: set[tuple[str, int]] = set()
    for stack in stacks:
        main = stack.main
        user = [f for f in main.frames if f.is_user] if main is not None else []
        if not user or stack.waiting_in():
            return False
        chains.add((user[0].filename, user[0].name, tuple(f"{f.name}@{f.where()}" for f in user[1:])))
        lines.add((user[0].filename, user[0].line))
    numbers = sorted(n for _, n in lines)
    return len(chains) == 1 and len(lines) <= 2 and numbers[-1] - numbers[0] <= _TIGHT_LOOP_LINES


def _in_python(stack: RankStack) -> bool:
    main = stack.main
    if main is None or not main.frames:
        return False
    return main.owns_gil or main.frames[0].is_user


def _rank_motion(pid: int, samples: Sequence[Sample]) -> RankMotion:
    stacks = [s for sample in samples for s in sample.stacks if s.pid == pid and s.main is not None]
    rank = next((s.rank for sample in samples for s in sample.stacks if s.pid == pid), None)
    readings = [(sample.t, sample.activity[pid]) for sample in samples if pid in sample.activity]
    cpu_share: Optional[float] = None
    woke: Optional[int] = None
    if len(readings) >= 2 and readings[-1][0] > readings[0][0]:
        (t0, first), (t1, last) = readings[0], readings[-1]
        cpu_share = max(0.0, (last.cpu_ns - first.cpu_ns) / 1e9 / (t1 - t0))
        woke = max(0, last.switches - first.switches)
    waiting = sum(1 for s in stacks if s.waiting_in())
    place_changed = len({_place(s) for s in stacks}) > 1 and not _tight_loop(stacks)
    busy = cpu_share is not None and cpu_share >= BUSY_CPU_SHARE
    if not stacks and cpu_share is None:
        state = "unknown"
    elif busy and waiting == 0 and (not stacks or any(_in_python(s) for s in stacks)):
        # On CPU nearly all the time, never in a collective, running Python (holding the GIL, or its
        # innermost frame is the user's): a loop that never ends. A thread busy in C without the GIL (a
        # GPU sync spinning on a hung NCCL kernel) is not a Python loop, and is no sign of progress either.
        state = "spinning"
    elif stacks and waiting == len(stacks):
        state = "waiting" if not (woke or place_changed) else "working"
    elif place_changed:
        state = "working"
    else:
        state = "still"
    data_waits = sum(1 for s in stacks if s.data_wait())
    return RankMotion(rank, pid, len(stacks), waiting, cpu_share, woke, place_changed, state, data_waits)


def _last_seqs(dumps: Sequence[Dump]) -> dict[tuple[object, str], int]:
    """(rank, process group) -> the highest collective sequence number a set of dumps recorded."""
    out: dict[tuple[object, str], int] = {}
    for dump in dumps:
        for entry in dump.entries:
            key = (dump.rank if dump.rank is not None else dump.source, entry.pg)
            out[key] = max(out.get(key, -1), entry.seq)
        for pg, status in dump.pg_status.items():
            key = (dump.rank if dump.rank is not None else dump.source, pg)
            out[key] = max(out.get(key, -1), status.last_enqueued)
    return out


# A blocking call with no timeout on the user's line: `fut.result()`, `queue.get()`, `event.wait()`. Its thread
# wakes only when what it waits for arrives (no poll, no timeout), so each wake-up is a delivery.
_UNTIMED_WAIT = re.compile(r"\.(?:result|get|wait|join|acquire|recv)\(\s*\)")


def _untimed_wait(pid: int, samples: Sequence[Sample], sources: Mapping[str, Sequence[str]]) -> Optional[str]:
    """'file:line' when the rank's main thread, in every snapshot, is in a library wait called from one user
    line that waits with no timeout; None otherwise."""
    where: set[tuple[str, int]] = set()
    for sample in samples:
        for stack in sample.stacks:
            main = stack.main
            if stack.pid != pid or main is None or not main.frames:
                continue
            user = next((f for f in main.frames if f.is_user), None)
            lines = sources.get(user.filename) if user is not None else None
            if user is None or main.frames[0].is_user or not lines or not 0 < user.line <= len(lines):
                return None
            if not _UNTIMED_WAIT.search(lines[user.line - 1].split("#", 1)[0]):
                return None
            where.add((user.filename, user.line))
    return f"{next(iter(where))[0]}:{next(iter(where))[1]}" if len(where) == 1 else None


def judge_motion(samples: Sequence[Sample], earlier_dumps: Sequence[Dump] = (), dumps: Sequence[Dump] = (),
                 sources: Optional[Mapping[str, Sequence[str]]] = None) -> Motion:
    """Compare the snapshots (and two reads of the Flight Recorder dumps, when the files changed in
    between): progressing, spinning, hung, or unknown with fewer than two snapshots. With the `sources` of
    the ranks' files, a rank that woke in a wait with no timeout on one line (`fut.result()`) received what it
    waited for: progress, not a poll loop."""
    if len(samples) < 2:
        return Motion("unknown", len(samples), 0.0)
    span = samples[-1].t - samples[0].t
    pids = sorted({s.pid for sample in samples for s in sample.stacks})
    ranks = [_rank_motion(pid, samples) for pid in pids]
    motion = Motion("hung", len(samples), span, ranks)
    for rank in ranks:
        label = _label(rank)
        if rank.state != "working":
            continue
        if rank.waiting == rank.seen and rank.woke:
            motion.evidence.append(f"{label} finished collectives (its main thread woke {rank.woke} time(s) "
                                   f"in {span:.1f}s while it waits in them)")
        elif rank.place_changed:
            motion.evidence.append(f"{label} moved between snapshots")
        else:
            motion.evidence.append(f"{label} ran")
    woke_only: list[RankMotion] = []
    if not any(r.state == "waiting" for r in ranks):
        # No rank waits in a collective without ever waking: a rank whose main thread wakes on its own
        # line is running its steps (sleeps, I/O, compute between collectives). With a rank that does
        # wait, unwoken, in a collective, the same wake-ups are a poll loop of the culprit: no progress.
        for rank in ranks:
            if rank.state == "still" and rank.woke and rank.data_waits < rank.seen:
                woke_only.append(rank)
                motion.evidence.append(f"{_label(rank)} ran (its main thread woke {rank.woke} time(s) in {span:.1f}s)")
    delivered = {r.pid: at for r in woke_only if (at := _untimed_wait(r.pid, samples, sources or {}))}
    if woke_only and len(delivered) == len(woke_only):
        # Held-out hang set 11, j15: every rank waits in `asyncio.run_coroutine_threadsafe(...).result()` for
        # its next batch and wakes when it comes (0.35 s a step): the same line every time, and progress.
        motion.evidence = [f"{_label(r)} woke {r.woke} time(s) in {span:.1f}s in a wait with no timeout at "
                           f"{delivered[r.pid]} (each wake-up is a result delivered, not a poll)" for r in woke_only]
    elif woke_only and len(woke_only) == len(motion.evidence) and all(r.state == "still" for r in ranks if r.seen):
        # Every rank woke, but on the same line in every snapshot: a step of their own (a short sleep, I/O) or
        # poll loops that never see what they wait for (held-out hang set 7: ranks polling a store counter every
        # 50 ms). Only a longer look tells them apart: still on the same lines after it, nobody made progress.
        motion.weak = True
        if span >= LONG_LOOK_DONE_S:
            motion.evidence = []
            return motion  # hung: the verdict reads what each loop waits for
    if earlier_dumps and dumps:
        before, after = _last_seqs(earlier_dumps), _last_seqs(dumps)
        grown = sorted(str(k[0]) for k, v in after.items() if v > before.get(k, v))
        if grown:
            motion.evidence.append(f"Flight Recorder sequence numbers grew (rank(s) {', '.join(grown[:8])})")
    counts = [s.ras_counts for s in samples if s.ras_counts]
    if len(counts) >= 2 and any(v > counts[0].get(k, v) for k, v in counts[-1].items()):
        motion.evidence.append("NCCL RAS operation counts grew")
    spinning = [r for r in ranks if r.state == "spinning"]
    unwoken = [r for r in ranks if r.state == "waiting"]
    strong = len(motion.evidence) > sum(1 for r in ranks if r.state == "working" and r.waiting < r.seen)
    if motion.evidence and unwoken and not strong:
        motion.weak = True
        if span >= LONG_LOOK_DONE_S:
            # For the whole long look the waiters never woke: what moved is a loop on the other rank(s).
            motion.evidence = [
                f"{'; '.join(motion.evidence[:2])}, but {', '.join(_label(r) for r in unwoken[:4])} waited in a "
                f"collective for {span:.1f}s without waking: no collective completed"
            ]
            motion.state = "hung"
            return motion
    if motion.evidence:
        motion.state = "progressing"
    elif spinning and len(spinning) < len(ranks):
        motion.state, motion.spinning = "spinning", spinning
    elif spinning:
        # Every rank busy and none in a collective: computing (a hang leaves some rank waiting).
        motion.state = "progressing"
        motion.evidence.append("every rank is busy on CPU and none waits in a collective")
    if motion.state == "progressing":
        motion.stragglers = _stragglers(ranks)
    return motion


def look_longer(motion: Motion, samples: Sequence[Sample]) -> bool:
    """Whether to take more snapshots before judging (probe_io goes on LONG_LOOK_STEP_S apart while this
    holds and LONG_LOOK_S have not passed): nothing completed yet (hung, spinning, or only ranks outside
    collectives moved) and some rank, in the last snapshot, is outside every collective and running (file
    I/O, a short sleep, a CPU-heavy step, a DataLoader wait): it may be a healthy step that ends soon.
    When every rank waits in a collective, or a rank is stopped, a longer look shows nothing new."""
    if len(samples) < 2 or not (motion.state in ("hung", "spinning") or motion.weak):
        return False
    if samples[-1].t - samples[0].t >= LONG_LOOK_DONE_S:
        return False
    last = samples[-1].stacks
    if any(s.error_kind == "stopped" for s in last):
        return False
    return any(s.main is not None and not s.waiting_in() for s in last)


def _stragglers(ranks: Sequence[RankMotion]) -> list[RankMotion]:
    """The rank(s) the others wait for: at most half of them, never in a collective in any snapshot, while every
    other rank was in one in every snapshot (a healthy job's ranks, caught at random moments, rarely
    line up like that twice)."""
    seen = [r for r in ranks if r.seen]
    if len(seen) < 2:
        return []
    idle = [r for r in seen if r.waiting == 0]
    others = [r for r in seen if r.waiting == r.seen]
    return idle if idle and len(idle) + len(others) == len(seen) and len(idle) <= len(others) else []


def _label(rank: RankMotion) -> str:
    return f"rank {rank.rank}" if rank.rank is not None else f"pid {rank.pid} (rank unknown)"


def motion_dict(motion: Motion) -> dict[str, Any]:
    """The `progress` part of `hang --json`."""
    return {
        "state": motion.state,
        "samples": motion.samples,
        "span_s": round(motion.span_s, 3),
        "evidence": list(motion.evidence),
        "weak": motion.weak,
        "ranks": [
            {"rank": r.rank, "pid": r.pid, "state": r.state, "snapshots": r.seen, "in_collective": r.waiting,
             "cpu_share": round(r.cpu_share, 3) if r.cpu_share is not None else None, "woke": r.woke}
            for r in motion.ranks
        ],
    }
