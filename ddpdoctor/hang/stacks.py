"""Python stacks of the ranks (py-spy's `dump --json` output): parse, group, name the odd ones out. Pure.

Running py-spy is probe_io's job; this module reads what it printed. py-spy prints a JSON list of
threads, each `{"pid", "thread_id", "thread_name", "owns_gil", "active", "frames": [{"name",
"filename", "short_filename", "line", ...}]}`, innermost frame first.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from ddpdoctor.edge.files import load_json_text
from ddpdoctor.hang.fr import Frame

# The stderr lines py-spy prints when it may not attach (captured from py-spy 0.4.3 run as nobody).
_PERMISSION_MARKERS = ("Permission Denied", "Operation not permitted", "os error 1)", "os error 13)")
_GONE_MARKERS = ("Failed to get process executable name", "No such process", "Check that the process is running")
_NOT_PYTHON_MARKERS = ("Failed to find python version",)

# Calls that mean "waiting in a collective" when they are the innermost frames of a rank.
COLLECTIVE_NAMES = frozenset(
    {
        "all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter",
        "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter",
        "send", "recv", "monitored_barrier", "wait", "all_gather_object", "broadcast_object_list",
        "gather_object", "scatter_object_list", "batch_isend_irecv", "synchronize",
    }
)


# DistributedDataParallel methods (torch/nn/parallel/distributed.py) that are themselves collectives, and
# those of its forward that block in one below Python (Reducer._rebuild_buckets, the buffer broadcast); the
# forward's `_run_ddp_forward` is left out: below it the user's module computes.
_DDP_COLLECTIVE_METHODS = frozenset(
    {"_sync_buffers", "_sync_params", "_check_global_requires_backward_grad_sync", "_match_all_reduce_for_bwd_pass",
     "_match_unused_params_allreduce", "_sync_module_buffers", "_default_broadcast_coalesced",
     "_distributed_broadcast_coalesced", "_check_and_sync_module_buffers"}
)
_DDP_FORWARD_METHODS = frozenset({"_pre_forward", "_post_forward"})
_DDP_INIT_COLLECTIVES = frozenset({"_verify_param_shape_across_processes", "_sync_module_states", "_sync_params_and_buffers"})

# DataLoader methods the main thread waits in for a worker's batch (torch/utils/data/dataloader.py).
_DATALOADER_WAITS = frozenset({"_try_get_data", "_get_data", "_next_data"})


def collective_wrapper(frame: Frame) -> Optional[str]:
    """What a library frame waits in, when it is a collective: the torch.distributed call itself
    (`all_reduce`), or the wrapper that issues collectives from C++ (DDP/FSDP gradient hooks run the
    all-reduce inside autograd, so the Python stack ends in `backward`)."""
    path = frame.filename
    name = frame.name.rsplit(".", 1)[-1]  # py-spy names methods Class.method
    if frame.name in COLLECTIVE_NAMES and "distributed" in path:
        return frame.name
    if (path.endswith("torch/autograd/graph.py") and frame.name == "_engine_run_backward") or (
        path.endswith("torch/autograd/__init__.py") and frame.name == "backward"
    ):
        return "backward (the DDP/FSDP gradient all-reduce)"
    if "torch/distributed/optim/zero_redundancy_optimizer.py" in path:
        return "ZeroRedundancyOptimizer.step (its parameter broadcast)"
    if "torch/distributed/fsdp/" in path or "torch/distributed/_composable/fsdp/" in path:
        return f"FSDP {name} (its all-gather / reduce-scatter)"
    if path.endswith("torch/distributed/utils.py") and name in _DDP_INIT_COLLECTIVES:
        # DistributedDataParallel's constructor checks the parameters' shapes across ranks and broadcasts rank
        # 0's state: a rank blocked there waits for peers that never constructed theirs (held-out hang set 10,
        # j06 and j10: read as blocked outside torch.distributed, a tie).
        return f"DistributedDataParallel's constructor ({name}: a collective over every rank)"
    if path.endswith("torch/nn/parallel/distributed.py") and name in _DDP_COLLECTIVE_METHODS:
        return f"DistributedDataParallel {name}"
    if path.endswith("torch/nn/parallel/distributed.py") and name in _DDP_FORWARD_METHODS:
        # DDP's forward issues collectives of its own before the module runs (the bucket rebuild's
        # broadcast on the second iteration, the buffer broadcast): a rank blocked there waits for peers.
        return f"DistributedDataParallel forward ({name}: its bucket/buffer broadcast)"
    return None


def threads_in_collective(stack: RankStack) -> Iterator[tuple[ThreadStack, str]]:
    """(thread, what it waits in) for each thread other than the main one blocked in a collective (its
    innermost library frames, before any user frame, are a collective or a wrapper of one)."""
    main = stack.main
    for thread in stack.threads:
        if main is not None and thread.thread_name == main.thread_name:
            continue
        for frame in thread.frames:
            if frame.is_user:
                break
            wait = collective_wrapper(frame)
            if wait:
                yield thread, wait
                break


def normal_thread_name(name: str) -> str:
    """A thread's name without the counter Python numbers it with: 'Thread-3 (prefetch)' -> 'prefetch';
    an unnamed 'Thread-3' -> '' (it cannot be matched across ranks)."""
    match = re.fullmatch(r"Thread-\d+(?: \((.*)\))?", name)
    if match:
        return match.group(1) or ""
    return name


@dataclass(frozen=True)
class ThreadStack:
    thread_name: str
    frames: tuple[Frame, ...]  # innermost first
    owns_gil: bool = False


@dataclass
class RankStack:
    """The main thread's stack of one rank, or why there is none."""

    rank: Optional[int]
    pid: int
    threads: list[ThreadStack] = field(default_factory=list)
    error: str = ""  # why py-spy gave nothing
    error_kind: str = ""  # permission | gone | not_python | missing | timeout | garbage | stopped | other

    @property
    def main(self) -> Optional[ThreadStack]:
        for thread in self.threads:
            if thread.thread_name == "MainThread":
                return thread
        return self.threads[0] if self.threads else None

    def user_frame(self) -> Optional[Frame]:
        """The innermost frame in the user's own code (not the library it is waiting in)."""
        main = self.main
        if main is None:
            return None
        return next((f for f in main.frames if f.is_user), None)

    def script_ended(self) -> bool:
        """The main thread is in the interpreter's exit, after the script returned or raised: threading._shutdown
        (joining non-daemon threads) or multiprocessing's exit handler (joining non-daemon child processes)."""
        main = self.main
        if main is None or not main.frames:
            return False
        inner, outer = main.frames[0], main.frames[-1]
        return (inner.filename.endswith("threading.py") and inner.name.endswith("_shutdown")) or (
            outer.name.endswith("_exit_function") and "multiprocessing" in outer.filename
        )

    def waiting_in(self) -> Optional[str]:
        """The collective the main thread is blocked in (from its innermost library frames), if any:
        a torch.distributed call, or a wrapper whose collectives run below Python (DDP's and FSDP's
        gradient all-reduce inside `loss.backward()`, ZeroRedundancyOptimizer.step, FSDP's unshard)."""
        main = self.main
        if main is None:
            return None
        for frame in main.frames:
            if frame.is_user:
                return None
            wrapper = collective_wrapper(frame)
            if wrapper:
                return wrapper
        return None

    def data_wait(self) -> bool:
        """Whether the main thread waits for a batch from its DataLoader's worker processes."""
        main = self.main
        if main is None:
            return False
        for frame in main.frames:
            if frame.is_user:
                return False
            method = frame.name.rsplit(".", 1)[-1]  # py-spy names methods Class.method
            if frame.filename.endswith("torch/utils/data/dataloader.py") and method in _DATALOADER_WAITS:
                return True
        return False

    def thread_names(self) -> set[str]:
        """The names of its threads, `Thread-3 (prefetch)` read as `prefetch` (numbers differ by rank)."""
        return {normal_thread_name(t.thread_name) for t in self.threads} - {""}

    def signature(self) -> tuple[str, ...]:
        """What makes two ranks 'in the same place': the user frames of the main thread."""
        main = self.main
        if main is None:
            return ()
        return tuple(f"{f.name}@{f.where()}" for f in main.frames if f.is_user) or tuple(
            f"{f.name}@{f.where()}" for f in main.frames[:3]
        )


def parse_pyspy_json(text: str) -> list[ThreadStack]:
    """py-spy's `dump --json` output -> threads; ValueError when it is not that."""
    try:
        raw = load_json_text(text)
    except ValueError as exc:  # deep nesting included (never a RecursionError)
        raise ValueError(f"py-spy printed something that is not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = []
    for item in raw[:10_000]:
        if not isinstance(item, dict):
            continue
        frames = []
        for f in item.get("frames") or []:
            if isinstance(f, dict):
                line = f.get("line")
                frames.append(
                    Frame(
                        name=str(f.get("name") or "?")[:200],
                        filename=str(f.get("filename") or f.get("short_filename") or "?")[:500],
                        line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
                    )
                )
        threads.append(
            ThreadStack(str(item.get("thread_name") or "")[:100], tuple(frames), bool(item.get("owns_gil")))
        )
    return threads


def classify_pyspy_error(stderr: str) -> str:
    """What kind of failure py-spy's stderr describes."""
    if any(m in stderr for m in _PERMISSION_MARKERS):
        return "permission"
    if any(m in stderr for m in _GONE_MARKERS):
        return "gone"
    if any(m in stderr for m in _NOT_PYTHON_MARKERS):
        return "not_python"
    return "other"


@dataclass(frozen=True)
class StackGroup:
    signature: tuple[str, ...]
    ranks: tuple[int, ...]
    example: RankStack


def group_stacks(stacks: list[RankStack]) -> list[StackGroup]:
    """Ranks with identical main-thread stacks, largest group first."""
    groups: dict[tuple[str, ...], list[RankStack]] = defaultdict(list)
    for stack in stacks:
        if stack.main is not None:
            groups[stack.signature()].append(stack)
    out = [
        StackGroup(sig, tuple(sorted(s.rank if s.rank is not None else -s.pid for s in members)), members[0])
        for sig, members in groups.items()
    ]
    return sorted(out, key=lambda g: (-len(g.ranks), g.ranks))


def odd_ones_out(groups: list[StackGroup]) -> list[StackGroup]:
    """The groups that are not the largest one (nothing when all agree or it is a tie of singletons)."""
    if len(groups) < 2:
        return []
    if len(groups[0].ranks) == len(groups[1].ranks):
        # No majority: prefer naming the groups that are NOT waiting in a collective (the ones that
        # never arrived), since ranks waiting in a collective are the victims.
        idle = [g for g in groups if g.example.waiting_in() is None]
        return idle if 0 < len(idle) < len(groups) else []
    return groups[1:]


def describe_stack(stack: RankStack) -> str:
    """`train.py:88 loss.item()`-like: where the rank is, in one line."""
    frame = stack.user_frame()
    waiting = stack.waiting_in()
    if frame is None:
        main = stack.main
        if main is None or not main.frames:
            return "no Python frames"
        return f"{main.frames[0].name} ({main.frames[0].where()})"
    text = f"{frame.where()} in {frame.name}()"
    if waiting:
        text += f" (in {waiting})"
    else:
        inner = stack.main.frames[0] if stack.main and stack.main.frames else None
        if inner is not None and inner != frame:
            text += f", inside {inner.name}()"
    return text


def parse_pyspy_result(rank: Optional[int], pid: int, stdout: str, stderr: str, ok: bool) -> RankStack:
    """One py-spy run -> RankStack (with the failure kind when it gave nothing)."""
    if not ok:
        kind = classify_pyspy_error(stderr)
        first = next((line.strip() for line in stderr.splitlines() if line.strip()), "no output")
        return RankStack(rank, pid, error=first[:300], error_kind=kind)
    try:
        threads = parse_pyspy_json(stdout)
    except ValueError as exc:
        return RankStack(rank, pid, error=str(exc)[:300], error_kind="garbage")
    return RankStack(rank, pid, threads=threads)


def to_dict(stack: RankStack) -> dict[str, Any]:
    main = stack.main
    return {
        "rank": stack.rank,
        "pid": stack.pid,
        "where": describe_stack(stack) if main is not None else None,
        "waiting_in": stack.waiting_in(),
        "frames": [f"{f.name} ({f.where()})" for f in main.frames] if main is not None else [],
        "error": stack.error or None,
        "error_kind": stack.error_kind or None,
    }


def _int_repr(text: object) -> Optional[int]:
    value = str(text).strip() if isinstance(text, (str, int)) and not isinstance(text, bool) else ""
    return int(value) if value.isascii() and value.isdigit() and len(value) < 7 else None


def spawn_rank(text: str) -> Optional[tuple[int, str]]:
    """(rank, where it was read) of a torch.multiprocessing.spawn child, from `py-spy dump --json
    --locals`: spawn runs `_wrap(fn, i, args, error_file)` in torch/multiprocessing/spawn.py, and calls
    `fn(i, *args)`; a `rank` argument or local of that `fn` (multi-node spawn computes it from the
    node's rank and `i`) wins over `i`. None when no thread has that frame (not a spawn child)."""
    try:
        raw = load_json_text(text)
    except ValueError:
        return None
    if not isinstance(raw, list):
        return None
    for thread in raw[:1000]:
        frames = thread.get("frames") if isinstance(thread, dict) else None
        if not isinstance(frames, list):
            continue
        for index, frame in enumerate(frames[:500]):
            if not isinstance(frame, dict) or frame.get("name") != "_wrap":
                continue
            if not str(frame.get("filename") or "").endswith("torch/multiprocessing/spawn.py"):
                continue
            found = {str(v.get("name")): v.get("repr") for v in frame.get("locals") or [] if isinstance(v, dict)}
            process_index = _int_repr(found.get("i"))
            if process_index is None:
                continue
            inner = frames[index - 1] if index > 0 and isinstance(frames[index - 1], dict) else {}
            user = {str(v.get("name")): v.get("repr") for v in inner.get("locals") or [] if isinstance(v, dict)}
            rank = _int_repr(user.get("rank"))
            name = str(inner.get("name") or "fn")[:100]
            if rank is not None:
                return rank, (f"the `rank` of {name}() that torch.multiprocessing.spawn started as process "
                              f"index {process_index} (py-spy dump --locals)")
            return process_index, (f"torch.multiprocessing.spawn's process index i={process_index} in its "
                                   f"_wrap(fn, i, ...) frame, the first argument of {name}() (py-spy dump --locals)")
    return None


def _main_thread_frames(text: str) -> Iterator[dict[str, Any]]:
    """The frames (innermost first) of the main thread in `py-spy dump --json --locals` (the first thread when
    none is called MainThread)."""
    try:
        raw = load_json_text(text)
    except ValueError:
        return
    if not isinstance(raw, list):
        return
    threads = [t for t in raw[:1000] if isinstance(t, dict)]
    for thread in [t for t in threads if t.get("thread_name") == "MainThread"] or threads[:1]:
        for frame in (thread.get("frames") or [])[:500]:
            if isinstance(frame, dict):
                yield frame


def _locals_of(frame: dict[str, Any]) -> dict[str, str]:
    return {str(v.get("name"))[:100]: str(v.get("repr"))[:200]
            for v in (frame.get("locals") or [])[:200] if isinstance(v, dict) and v.get("repr") is not None}


def innermost_locals(text: str, name: str) -> Optional[tuple[int, dict[str, str]]]:
    """(line, name -> repr of the locals) of the main thread's innermost frame called `name`: a busy loop's
    frame, whose line moves between reads; None when no such frame."""
    frame = next((f for f in _main_thread_frames(text) if f.get("name") == name and isinstance(f.get("line"), int)),
                 None)
    return (frame["line"], _locals_of(frame)) if frame is not None else None


def frame_locals(text: str, name: str, line: int) -> dict[str, str]:
    """name -> repr of the locals (arguments included) of the main thread's frame `name` at `line`, from
    `py-spy dump --json --locals`; empty when that frame is not there."""
    frame = next((f for f in _main_thread_frames(text) if f.get("name") == name and f.get("line") == line), None)
    return _locals_of(frame) if frame is not None else {}
