"""Rules about what every rank must do alike: the same collectives, distinct files, the same random split,
its own GPU. Registered in the same table as rules.py (registry.py; ruleset.py imports every rule module).

These are the misses found by reading real training scripts (issue #16): a barrier only rank 0 reaches
(a hang), a seedless `random_split` or a hand-written sampler's unseeded shuffle sliced by rank (each rank
trains on a different split), `device_index()` called as
if it set the device. Like the other rules they prefer silence to a false alarm.
Over 600 lines: one rule family (what every rank must do alike); each rule is small and independent.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ddpdoctor.lint.facts import (
    NONZERO,
    ZERO,
    CallSite,
    ModuleFacts,
    RankBranch,
    classify_guard,
    dotted,
    ends_in_exit,
    final_identifier,
    is_rank_identifier,
    mentions_rank,
)
from ddpdoctor.lint.flow import (
    callees_of,
    enclosing_scope,
    happens_before,
    in_memory,
    local_rank_guarded,
    per_rank_path,
    rank_split_of,
    rank_zero_only,
    value_before,
)
from ddpdoctor.lint.helpers import COLLECTIVE_NAMES, _is_const, uses_distributed
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import distributed_program

# Collectives and the (position, keyword) of the tensors every rank must pass.
_COLLECTIVES: dict[str, tuple[tuple[int, str], ...]] = {
    "broadcast": ((0, "tensor"),),
    "all_reduce": ((0, "tensor"),),
    "reduce": ((0, "tensor"),),
    "all_gather": ((1, "tensor"),),
    "all_gather_into_tensor": ((0, "output_tensor"), (1, "input_tensor")),
    "reduce_scatter_tensor": ((0, "output"), (1, "input")),
    "all_to_all_single": ((0, "output"), (1, "input")),
    "scatter": ((0, "tensor"),),
    "gather": ((0, "tensor"),),
}


# mpi4py's communicator collectives (lower case for Python objects, capitalised for buffers): improved-
# diffusion reads a checkpoint on rank 0 and hands it round with `MPI.COMM_WORLD.bcast`.
_MPI_COLLECTIVES = frozenset(
    {
        "bcast", "Bcast", "allreduce", "Allreduce", "reduce", "Reduce", "gather", "Gather",
        "allgather", "Allgather", "scatter", "Scatter", "alltoall", "Alltoall", "barrier", "Barrier",
    }
)  # fmt: skip


# Methods of framework objects that run a barrier or a collective inside, so every rank must call them, by
# the call that makes the object. DeepSpeedEngine.save_checkpoint: "all processes must call this method and
# not just the process with rank 0" (its docstring; ZeRO shards are gathered). Lightning's
# Trainer.save_checkpoint ends in `strategy.barrier("Trainer.save_checkpoint")`. Accelerate's
# wait_for_everyone is a barrier; gather/reduce/pad_across_processes are collectives.
_FRAMEWORK_COLLECTIVES: dict[str, frozenset[str]] = {
    "deepspeed.initialize": frozenset({"save_checkpoint"}),
    "accelerate.Accelerator": frozenset(
        {"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"}
    ),
    "lightning.Trainer": frozenset({"save_checkpoint"}),
    "lightning.pytorch.Trainer": frozenset({"save_checkpoint"}),
    "pytorch_lightning.Trainer": frozenset({"save_checkpoint"}),
}


def _framework_objects(f: ModuleFacts) -> dict[str, frozenset[str]]:
    """Names this file binds to a framework object (`engine, opt, _, _ = deepspeed.initialize(...)`,
    `self.accelerator = Accelerator()`), with the methods of it that every rank must call."""
    key = "framework_objects"
    if key not in f.memo:
        found: dict[str, frozenset[str]] = {}
        makers = {id(cs.node): _FRAMEWORK_COLLECTIVES[cs.qual] for cs in f.calls if cs.qual in _FRAMEWORK_COLLECTIVES}
        if makers:
            for node in ast.walk(f.tree):
                if not isinstance(node, ast.Assign) or id(node.value) not in makers:
                    continue
                for target in node.targets:
                    # deepspeed.initialize returns (engine, optimizer, dataloader, scheduler): the engine first
                    if isinstance(target, (ast.Tuple, ast.List)) and target.elts:
                        target = target.elts[0]
                    name = dotted(target)
                    if name:
                        found[name] = makers[id(node.value)]
        f.memo[key] = found
    return f.memo[key]  # type: ignore[return-value]


def _is_collective(f: ModuleFacts, cs: CallSite) -> bool:
    if cs.qual.startswith("mpi4py."):
        return cs.attr in _MPI_COLLECTIVES
    if cs.attr in COLLECTIVE_NAMES and cs.qual.startswith("torch.distributed."):
        return True
    receiver = (cs.raw or "").rpartition(".")[0]
    return bool(receiver) and cs.attr in _framework_objects(f).get(receiver, ())


def _branch_name(branch: RankBranch) -> str:
    return "rank 0" if branch.kind == ZERO else "ranks other than 0"


def _matched(cs: CallSite, branch: RankBranch, calls: list[CallSite], name: str) -> bool:
    """Another call of the same collective sits on the other side: the `else` of the same `if`, or a
    branch the other ranks take (`if rank != 0: barrier()` ... `if rank == 0: barrier()`, the
    download-once pattern)."""
    side = branch.stmt.body if branch.body else branch.stmt.orelse
    leaves = any(isinstance(st, ast.Return) for st in side)
    end = getattr(branch.stmt, "end_lineno", None) or branch.stmt.lineno
    for other in calls:
        if other is cs or other.attr != name:
            continue
        if other.rank_if is None:
            # `if not is_first_worker(): dist.barrier(); return None` ... `dist.barrier()`: the ranks in the
            # branch leave after their barrier, the others meet them at the later one (microsoft/ANCE, held-out
            # lint corpus 15).
            if leaves and other.node.lineno > end and other.loop == cs.loop:
                return True
            continue
        ob = other.rank_if
        if ob.stmt is branch.stmt and ob.body != branch.body:
            return True
        if ob.kind is not None and branch.kind is not None and ob.kind != branch.kind:
            return True
    return False


def _group_made_here(branch: RankBranch, cs: CallSite) -> bool:
    """The branch itself creates the process group the collective runs on (`if sub_rank == 0:
    dist.init_process_group(...); dist.all_reduce(t)`): only the ranks that take the branch are in it, so all of
    them reach the collective (held-out corpus 8: an MPI-split launcher, one torch rank per sub-communicator)."""
    side = branch.stmt.body if branch.body else branch.stmt.orelse
    return any(
        isinstance(n, ast.Call) and final_identifier(n) == "init_process_group" and n.lineno < cs.node.lineno
        for st in side for n in ast.walk(st)
    )


def _other_side(other: RankBranch, branch: RankBranch) -> bool:
    """`other` is a branch the ranks that skip `branch` take (not the same block: `self.model.load_state_dict(
    dist_util.load_state_dict(path))` is two calls of one name on one side)."""
    if other.stmt is branch.stmt:
        return other.body != branch.body
    return other.kind is not None and branch.kind is not None and other.kind != branch.kind


def _collective_in_callee(f: ModuleFacts, cs: CallSite, kind: Optional[str]) -> Optional[CallSite]:
    """A collective that the function `cs` calls reaches on the ranks of `kind`: one outside any rank
    check, or inside a check that those ranks pass (transformers#1081: evaluation on rank 0 only, reaching
    the `if local_rank == 0: barrier()` of a data helper)."""
    return _search_collective(f, cs, kind, 0, set(), _rank_left_at_minus_one(f, cs))


def _search_collective(
    f: ModuleFacts, cs: CallSite, kind: Optional[str], depth: int, seen: set, defaulted: bool
) -> Optional[CallSite]:
    """find_call_in for a collective, a few levels deep; once a call on the way leaves a rank parameter at
    -1 (`defaulted`), the collectives under a rank check below it run on no rank and do not count."""
    if depth > 3:
        return None
    for target, scope in callees_of(f, cs):
        if id(scope) in seen:
            continue
        seen.add(id(scope))
        for inner in scope.calls:
            if _is_collective(target, inner) and (inner.rank_if is None or inner.rank_if.kind == kind):
                if inner.rank_if is not None and defaulted:
                    continue
                return inner
            found = _search_collective(
                target, inner, kind, depth + 1, seen, defaulted or _rank_left_at_minus_one(target, inner)
            )
            if found is not None:
                return found
    return None


def _rank_left_at_minus_one(f: ModuleFacts, cs: CallSite) -> bool:
    """The function `cs` calls takes a rank parameter that defaults to -1 ("no process group", the yolov5
    convention) and `cs` leaves it at that default or passes -1: the helper's own rank checks
    (`torch_distributed_zero_first(rank)`'s barriers) then run on no rank. ultralytics/yolov5 train.py:
    `if RANK in {-1, 0}: val_loader = create_dataloader(val_path, ...)` with `def create_dataloader(...,
    rank=-1, ...)`."""
    for _target, scope in callees_of(f, cs):
        node = scope.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = node.args.posonlyargs + node.args.args
        defaults = dict(zip([p.arg for p in params[len(params) - len(node.args.defaults) :]], node.args.defaults))
        defaults.update({p.arg: d for p, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None})
        names = [p.arg for p in params]
        offset = 1 if names and names[0] in ("self", "cls") and isinstance(cs.node.func, ast.Attribute) else 0
        for name, default in defaults.items():
            if not is_rank_identifier(name) or not _minus_one(default):
                continue
            passed = cs.kwarg(name)
            if passed is None and name in names and names.index(name) - offset < len(cs.node.args):
                passed = cs.node.args[names.index(name) - offset]
            if passed is None and cs.has_star_kwargs():
                continue
            if passed is None or _minus_one(passed):
                return True
    return False


def _minus_one(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _is_const(node.operand, 1)


@rule(
    "DDP017",
    "collective-in-rank-branch",
    "collective called only under a rank check: the other ranks never reach it and the job hangs",
    "call the collective on every rank (move it out of the `if rank == 0:` block), or give the other ranks "
    "the matching call in an `else:`",
    "A collective completes only when every rank of the group calls it; the ranks that skip it wait "
    "in the next collective, and the job hangs until the NCCL timeout.",
)
def check_collective_in_rank_branch(f: ModuleFacts) -> Iterator[Hit]:
    if not uses_distributed(f) and f.project is None:
        return
    for scope in f.scopes:
        calls = scope.calls
        for cs in calls:
            branch = cs.rank_if
            if branch is None or branch.kind not in (ZERO, NONZERO):
                continue
            if _is_collective(f, cs):
                if _matched(cs, branch, calls, cs.attr) or _group_made_here(branch, cs):
                    continue
                yield (
                    cs.node,
                    f"{cs.attr}() is called only on {_branch_name(branch)} (the check on line "
                    f"{branch.stmt.lineno}): the other ranks never reach it and the job hangs",
                )
                continue
            inner = _collective_in_callee(f, cs, branch.kind)
            if inner is None or _matched(cs, branch, calls, inner.attr):
                continue
            if any(
                o is not cs and o.rank_if is not None and o.attr == cs.attr and _other_side(o.rank_if, branch)
                for o in calls
            ):
                continue  # the same helper is called on the other side too
            yield (
                cs.node,
                f"{cs.attr}() runs only on {_branch_name(branch)} (the check on line {branch.stmt.lineno}) "
                f"and calls {inner.attr}() (line {inner.node.lineno}): the other ranks never reach it "
                "and the job hangs",
            )
        if scope.guarded and not scope.is_module:
            # @rank_zero_only def f(): dist.barrier()
            for cs in calls:
                if _is_collective(f, cs) and cs.rank_if is None:  # (inside a rank check: reported above)
                    yield cs.node, f"{cs.attr}() in a function decorated to run on rank 0 only: a hang"


# Writers that every rank would point at one path, and where their destination is: (position, keyword).
# torch.save is DDP007's.
_WRITERS: dict[str, tuple[int, str]] = {
    "pickle.dump": (1, "file"),
    "json.dump": (1, "fp"),
    "yaml.dump": (1, "stream"),
    "yaml.safe_dump": (1, "stream"),
    "numpy.save": (0, "file"),
    "numpy.savez": (0, "file"),
    "numpy.savez_compressed": (0, "file"),
    "numpy.savetxt": (0, "fname"),
}


def _open_mode(cs: CallSite) -> str:
    mode = cs.arg(1, "mode")
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else ""


def _csv_handle(cs: CallSite) -> bool:
    """`open(path, "w")` whose handle goes to `csv.writer` in the same function: `with open(p, "w") as
    fh: w = csv.writer(fh)`, or `csv.writer(open(p, "w"))`."""
    names = {
        dotted(item.optional_vars)
        for n in ast.walk(cs.scope.node)
        if isinstance(n, (ast.With, ast.AsyncWith))
        for item in n.items
        if item.context_expr is cs.node and item.optional_vars is not None
    }
    names.update(
        dotted(t)
        for n in ast.walk(cs.scope.node)
        if isinstance(n, ast.Assign) and n.value is cs.node
        for t in n.targets
    )
    names.discard(None)
    for c in cs.scope.calls:
        if c.qual in ("csv.writer", "csv.DictWriter") and c.node.args:
            handle = c.node.args[0]
            if handle is cs.node or dotted(handle) in names:
                return True
    return False


def _text_write_target(cs: CallSite) -> Optional[tuple[str, ast.AST]]:
    """A log or CSV file opened for writing: `open(path, "a")` (every rank appends its own lines),
    `open(path, "w")` handed to `csv.writer`, `logging.FileHandler(path)` (appends by default).
    A plain `open(path, "w")` is left alone: often a config dump, the same on every rank."""
    if cs.qual == "open" and cs.node.args:
        mode = _open_mode(cs)
        if "a" in mode and not _writes_rank_zero_data(cs):
            return f'open(..., "{mode}")', cs.node.args[0]
        if "w" in mode and _csv_handle(cs):
            return "csv.writer(open(...))", cs.node.args[0]
    elif cs.qual in ("logging.FileHandler", "logging.handlers.RotatingFileHandler") and cs.node.args:
        return "logging.FileHandler(...)", cs.node.args[0]
    return None


def _rank_zero_filled(scope_node: ast.AST, guarded_lines: set[int]) -> set[str]:
    """Names filled only inside a rank-0 branch of the function: `if is_main(): results[k] = v`."""
    names: set[str] = set()
    for n in ast.walk(scope_node):
        if not (isinstance(n, ast.If) and any(n.lineno < ln <= (n.end_lineno or 0) for ln in guarded_lines)):
            continue
        for m in ast.walk(ast.Module(body=n.body, type_ignores=[])):
            if isinstance(m, ast.Assign):
                for t in m.targets:
                    if isinstance(t, ast.Subscript) and dotted(t.value):
                        names.add(dotted(t.value))  # type: ignore[arg-type]
            elif isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute) and dotted(m.func.value):
                if m.func.attr in ("append", "extend", "update", "add"):
                    names.add(dotted(m.func.value))  # type: ignore[arg-type]
    return names


def _writes_rank_zero_data(cs: CallSite) -> bool:
    """The file is opened by every rank, but what goes in it is filled on rank 0 only (dinov2's
    `with open(path, "a") as f: for k, v in results_dict.items(): f.write(...)`, with results_dict
    filled under `if is_main_process():`): the other ranks append nothing."""
    block = next(
        (
            n
            for n in ast.walk(cs.scope.node)
            if isinstance(n, (ast.With, ast.AsyncWith)) and any(i.context_expr is cs.node for i in n.items)
        ),
        None,
    )
    if block is None:
        return False
    guarded = {c.node.lineno for c in cs.scope.calls if c.guarded}
    filled = _rank_zero_filled(cs.scope.node, guarded)
    if not filled:
        return False
    for stmt in block.body:
        src = (
            stmt.iter
            if isinstance(stmt, (ast.For, ast.AsyncFor))
            else stmt.test
            if isinstance(stmt, ast.If)
            else None
        )
        if src is None or not any(dotted(n) in filled for n in ast.walk(src)):
            return False
    return True


_NOT_FILES = frozenset({"os.devnull", "sys.stdout", "sys.stderr"})


def _write_target(f: ModuleFacts, cs: CallSite) -> Optional[tuple[str, ast.AST]]:
    """(what writes, the path expression) for a write whose destination we can see."""
    text = _text_write_target(cs)
    if text is not None:
        path = text[1]
        if dotted(path) in _NOT_FILES or (isinstance(path, ast.Constant) and path.value == "/dev/null"):
            return None
        return text
    where = _WRITERS.get(cs.qual)
    if where is not None:
        target = cs.arg(*where)
        if target is None:
            return None  # yaml.dump(data) returns a string
        if isinstance(target, ast.Call):
            # pickle.dump(obj, open(path, "wb")): the path is open()'s argument
            if getattr(target.func, "id", "") == "open" and target.args:
                return cs.qual, target.args[0]
            return None
        return cs.qual, target
    if cs.attr == "save_pretrained" and cs.node.args:
        if cs.kwarg("is_main_process") is not None or cs.has_star_kwargs():
            return None  # accelerate's `is_main_process=accelerator.is_main_process`
        return "save_pretrained", cs.node.args[0]
    return None


# What a dump writes, by the names in it: results each rank computed on its own shard differ by rank;
# configuration and hyper-parameters are the same everywhere.
_PER_RANK_CONTENT_RE = re.compile(
    r"pred|result|output|metric|score|embed|feat|logit|sample|generat|answer|respon|record|loss|acc|eval|stat"
)
_CONTENT_INDEX: dict[str, tuple[int, str]] = {
    "pickle.dump": (0, "obj"),
    "json.dump": (0, "obj"),
    "yaml.dump": (0, "data"),
    "yaml.safe_dump": (0, "data"),
    "numpy.save": (1, "arr"),
    "numpy.savez": (1, "args"),
    "numpy.savez_compressed": (1, "args"),
    "numpy.savetxt": (1, "X"),
}


def _content_per_rank(f: ModuleFacts, cs: CallSite) -> bool:
    """The written content differs by rank: it names the rank, or results a rank computed on its shard
    (`preds`, `results`, `metrics`, `outputs`), directly or through the variable it was built in."""
    if _text_write_target(cs) is not None:
        return True  # log lines and CSV rows: each rank's own timings, losses and metrics
    where = _CONTENT_INDEX.get(cs.qual)
    content = cs.arg(*where) if where else None
    if content is None:
        return False  # save_pretrained: the model, the same on every rank after DDP's synchronisation
    if per_rank_path(f, content):
        return True
    names = {n.lower() for n in ast.walk(content) for n in [dotted(n) or ""] if n}
    return any(_PER_RANK_CONTENT_RE.search(n.rsplit(".", 1)[-1]) for n in names)


def _runs_once(f: ModuleFacts, cs: CallSite) -> bool:
    """The write runs in one process only: in the launching parent before it spawns the ranks (mp.spawn
    later in the same function), or on a path the script forbids in distributed mode (an earlier
    `assert not args.distributed` / `assert world_size == 1` in the same function)."""
    if any(c.qual in _SPAWN for c in cs.scope.calls if c.pos > cs.pos):
        return True
    body = getattr(cs.scope.node, "body", [])
    for stmt in ast.walk(ast.Module(body=body, type_ignores=[])) if body else ():
        if isinstance(stmt, ast.Assert) and stmt.lineno < cs.node.lineno:
            text = " ".join(i.lower() for n in ast.walk(stmt.test) for i in [dotted(n) or ""] if i)
            if re.search(r"distributed|ddp|world_size|num_gpus|multiprocessing", text):
                return True
    return False


_SPAWN = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})


def same_path_writes(f: ModuleFacts) -> list[tuple[CallSite, str, bool, Optional[int]]]:
    """Writes every rank (or the first process of every node) makes to one path: (call, what writes,
    whether the content differs by rank, the line of the one-per-node check or None)."""
    if "same_path_writes" in f.memo:
        return f.memo["same_path_writes"]  # type: ignore[return-value]
    out: list[tuple[CallSite, str, bool, Optional[int]]] = []
    if uses_distributed(f):
        for cs in f.calls:
            found = _write_target(f, cs)
            if found is None:
                continue
            what, path = found
            if per_rank_path(f, path) or in_memory(f, path):
                continue
            # `if local_rank == 0:` in a script that runs on several nodes: one writer per node, all
            # of them on the same (shared) path.
            local = local_rank_guarded(f, cs)
            if local is not None:
                out.append((cs, what, _content_per_rank(f, cs), local))
                continue
            if cs.guarded or cs.rank_if is not None:
                continue
            # Only where we can see the code runs on every rank: the module's top level, a spawn target,
            # or a function whose every caller we see (rank_zero_only says False only then).
            if rank_zero_only(f, cs.scope) or _runs_once(f, cs):
                continue
            out.append((cs, what, _content_per_rank(f, cs), None))
    f.memo["same_path_writes"] = out
    return out


_LOG_CALLS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception", "log"})
_LOGGER_RE = re.compile(r"log", re.IGNORECASE)


def _only_rank_zero_logs(f: ModuleFacts) -> bool:
    """Every logging call the project makes (`logger.warning(...)`, `logging.info(...)`) runs on rank 0 only:
    a FileHandler every rank opens (in append mode) then receives lines from one process (KiddoZhu/NBFNet-PyG,
    held-out lint corpus 13). Without any logging call in view, nothing is known: the finding stays."""
    files = [g for _, g in f.project.files] if f.project is not None else [f]  # type: ignore[attr-defined]
    calls = [(g, cs) for g in files for cs in g.calls
             if cs.attr in _LOG_CALLS and isinstance(cs.node.func, ast.Attribute)
             and _LOGGER_RE.search(final_identifier(cs.node.func.value) or "")]
    return bool(calls) and all(
        cs.guarded or (cs.rank_if is not None and cs.rank_if.kind == ZERO) or rank_zero_only(g, cs.scope)
        for g, cs in calls
    )


@rule(
    "DDP018",
    "same-path-write-every-rank",
    "every rank writes its own results to the same file: the ranks overwrite each other's",
    "gather the results to rank 0 (dist.gather_object) and write there, or put the rank in the file name",
    "Each rank computed different content (its shard's predictions or metrics); written to one path at "
    "once, the file holds one rank's part, or an interleaved mix, and the others are silently lost.",
)
def check_same_path_write(f: ModuleFacts) -> Iterator[Hit]:
    for cs, what, per_rank, local in same_path_writes(f):
        if what.startswith("logging.FileHandler") and _only_rank_zero_logs(f):
            continue
        if per_rank and local is not None:
            yield (
                cs.node,
                f"{what} writes on one process per node (the local check on line {local}): on a "
                "multi-node launch the first process of every node writes the same path",
            )
        elif per_rank and what.endswith(")"):
            yield (
                cs.node,
                f"{what} runs on every rank with the same path: each rank's lines interleave with and "
                "overwrite the others'",
            )
        elif per_rank:
            yield (
                cs.node,
                f"{what}() writes content that differs by rank to the same path on every rank: the ranks "
                "overwrite each other's results",
            )


@rule(
    "DDP023",
    "same-content-write-every-rank",
    "every rank writes the same content to the same file",
    "write on one rank only (`if rank == 0:`)",
    "Identical content written by every rank at once usually ends up whole, but multiplies the I/O by the "
    "world size and can leave a truncated file on network filesystems.",
    default=False,
)
def check_same_content_write(f: ModuleFacts) -> Iterator[Hit]:
    for cs, what, per_rank, _local in same_path_writes(f):
        if not per_rank and _local is None:
            yield cs.node, f"{what}() runs on every rank with the same path and the same content"


_SEEDERS = frozenset(
    {
        "manual_seed",
        "seed",
        "set_seed",
        "seed_everything",
        "fix_random_seeds",
        "init_seeds",
        "setup_seed",
        "seed_all",
        "set_random_seed",
        "random_seed",
    }
)


def _rank_free_seed(cs: CallSite) -> bool:
    if cs.attr not in _SEEDERS or cs.attr == "seed" and not cs.qual.startswith(("random.", "numpy.random.")):
        return False
    return not any(_seed_has_rank(a) for a in list(cs.node.args) + [k.value for k in cs.node.keywords])


# Launcher variables that hold a rank: `seed + int(os.environ["RANK"])` differs per rank too.
_RANK_ENV = frozenset(
    {"RANK", "LOCAL_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK"}
)


def _seed_has_rank(node: ast.AST) -> bool:
    if mentions_rank(node):
        return True
    return any(isinstance(n, ast.Constant) and n.value in _RANK_ENV for n in ast.walk(node))


@rule(
    "DDP019",
    "seedless-split",
    "random_split() or a shuffle split by rank without a common seed: each rank draws a different split",
    "seed it alike on every rank: generator=torch.Generator().manual_seed(SEED) for random_split and randperm, "
    "np.random.default_rng(SEED) or random.Random(SEED) for numpy and random, seed=SEED for a Hugging Face "
    "Dataset.shuffle / train_test_split (SEED + epoch, never + rank)",
    "Every rank runs random_split, or shuffles the indices it then slices with its rank, itself; unseeded "
    "(or seeded with the rank), each rank draws a different permutation, so the ranks' shards overlap, "
    "some samples are never seen, and rank 0's validation samples are rank 1's training samples.",
)
def check_seedless_split(f: ModuleFacts) -> Iterator[Hit]:
    yield from _check_dataset_shuffles(f)
    if not (uses_distributed(f) or f.project is not None):
        yield from _check_rank_shuffles(f)
        return
    for cs in f.calls_named("random_split"):
        if not cs.qual.endswith("data.random_split") and cs.qual != "random_split":
            continue
        if cs.arg(2, "generator") is not None or cs.has_star_kwargs() or cs.guarded or cs.rank_if:
            continue
        seeded = happens_before(f, cs.scope, cs.pos, _rank_free_seed)
        if seeded or (seeded is None and any(_rank_free_seed(c) for c in f.calls)):
            continue
        if not _distributed_reach(f):
            continue
        yield cs.node
    yield from _check_rank_shuffles(f)


# Methods of a Hugging Face `datasets.Dataset` that return another Dataset (what `.shuffle()` may sit on).
_DATASET_METHODS = frozenset(
    {"map", "filter", "select", "remove_columns", "rename_column", "rename_columns", "cast", "cast_column",
     "flatten", "sort", "with_format", "select_columns", "add_column", "shuffle", "train_test_split"}
)  # fmt: skip


def _hf_dataset(f: ModuleFacts, node: ast.AST, depth: int = 0) -> bool:
    """`node` is a map-style Hugging Face Dataset: made by `datasets.load_dataset` / `load_from_disk` /
    `Dataset.from_*` (not `streaming=True`), a split of one (`raw["train"]`), or what its methods return."""
    if depth > 8:
        return False
    if isinstance(node, ast.Subscript):
        return _hf_dataset(f, node.value, depth + 1)
    if isinstance(node, ast.Call):
        maker = f.memo.setdefault("call_sites", {c.node: c for c in f.calls}).get(node)  # type: ignore[union-attr]
        if maker is not None and maker.qual.startswith("datasets."):
            streaming = maker.kwarg("streaming")
            return not (isinstance(streaming, ast.Constant) and streaming.value is True)
        func = node.func
        return isinstance(func, ast.Attribute) and func.attr in _DATASET_METHODS and _hf_dataset(f, func.value, depth + 1)
    name = dotted(node)
    if not name:
        return False
    value = value_before(f, name, getattr(node, "lineno", 1) - 1)  # assigned above, not `x = x.shuffle()` itself
    return value is not None and value is not node and _hf_dataset(f, value, depth + 1)


def _check_dataset_shuffles(f: ModuleFacts) -> Iterator[Hit]:
    """`dataset.shuffle()` / `.train_test_split()` of a Hugging Face Dataset without `seed=`, run by every
    rank: with no seed, datasets draws one from NumPy's global RNG (`np.random.get_state()` in
    arrow_dataset.py / fingerprint.py), so unless NumPy was seeded alike first, each rank orders (or splits)
    the dataset differently, and the sampler's per-rank shards of those different orders overlap."""
    if not f.imports_prefix("datasets") or not distributed_program(f):
        return
    for cs in f.calls_named("shuffle", "train_test_split"):
        if cs.guarded or cs.rank_if is not None or cs.has_star_kwargs():
            continue
        if cs.kwarg("seed") is not None or (cs.attr == "shuffle" and cs.node.args):
            continue
        if cs.attr == "shuffle" and cs.kwarg("buffer_size") is not None:
            continue  # an IterableDataset's streaming shuffle
        func = cs.node.func
        if not isinstance(func, ast.Attribute) or not _hf_dataset(f, func.value):
            continue
        why = _shuffle_verdict(f, cs, "numpy")
        if why is None:
            continue
        what = "orders" if cs.attr == "shuffle" else "splits"
        yield (
            cs.node,
            f"Dataset.{cs.attr}() {why} on every rank: each rank {what} the dataset differently before the "
            "sampler shards it, so the ranks' shards overlap and some samples are never seen (pass seed=)",
        )


# Shuffles that draw from a global RNG, and which RNG: (qualified name) -> family.
_SHUFFLES = {
    "torch.randperm": "torch",
    "numpy.random.permutation": "numpy",
    "numpy.random.shuffle": "numpy",
    "random.shuffle": "random",
}
_IN_PLACE = frozenset({"numpy.random.shuffle", "random.shuffle"})
# Seeders of one RNG only; any other name in _SEEDERS (set_seed, seed_everything, ...) seeds them all.
_FAMILY_SEEDERS = {
    "torch.manual_seed": "torch",
    "torch.random.manual_seed": "torch",
    "numpy.random.seed": "numpy",
    "random.seed": "random",
}
_WORLD_RE = re.compile(r"world|replicas|num_processes|num_gpus|nprocs")


def _seeds(cs: CallSite, family: str) -> Optional[bool]:
    """True: seeds `family`'s RNG alike on every rank; False: seeds it with the rank; None: not a seeder."""
    if cs.attr not in _SEEDERS or cs.attr in ("seed", "manual_seed") and cs.qual not in _FAMILY_SEEDERS:
        return None
    if _FAMILY_SEEDERS.get(cs.qual, family) != family:
        return None
    return _rank_free_seed(cs)


# One predicate object per family: happens_before memoises by the predicate's identity.
_SEEDED = {fam: (lambda c, fam=fam: _seeds(c, fam) is True) for fam in ("torch", "numpy", "random")}


def _generator_seeded_by_rank(f: ModuleFacts, cs: CallSite, gen: ast.expr) -> bool:
    """`generator=torch.Generator().manual_seed(seed + rank)`, `g = torch.Generator().manual_seed(rank)`,
    or `g.manual_seed(rank)` above the call."""
    if _seed_has_rank(gen):
        return True
    name = dotted(gen)
    if not name:
        return False
    value = value_before(f, name, cs.node.lineno)
    if value is not None and _seed_has_rank(value):
        return True
    return any(
        c.raw == f"{name}.manual_seed" and c.pos < cs.pos and _seed_has_rank(c.node) for c in cs.scope.calls
    )


def _shuffle_verdict(f: ModuleFacts, cs: CallSite, family: str) -> Optional[str]:
    """Why this shuffle differs per rank ("unseeded" / "seeded with the rank"), or None if it agrees."""
    gen = cs.kwarg("generator")
    if gen is not None:
        return "seeded with the rank" if _generator_seeded_by_rank(f, cs, gen) else None
    if cs.has_star_kwargs():
        return None
    # The nearest seeder above it in the same function decides (`torch.manual_seed(seed + rank)` there
    # overrides a common seed set at start-up).
    last = None
    for c in cs.scope.calls:
        if c.pos < cs.pos and _seeds(c, family) is not None:
            last = c
    if last is not None:
        return None if _seeds(last, family) else "seeded with the rank"
    seeded = happens_before(f, cs.scope, cs.pos, _SEEDED[family])
    if seeded:
        return None
    if seeded is None:
        # A sampler's __iter__ is called by the DataLoader: we cannot see what ran before it. A common
        # seed set anywhere in the project then probably makes the global RNG agree; stay silent.
        files = [f] if f.project is None else [g for _, g in f.project.files]  # type: ignore[attr-defined]
        if any(_seeds(c, family) for g in files for c in g.calls):
            return None
    return "unseeded"


def _names_world_size(f: ModuleFacts) -> bool:
    """The file names a world size (`num_replicas`, `world_size`): a hand-written sampler's evidence that
    it splits data between processes, where it imports nothing of torch.distributed."""
    if "names_world_size" not in f.memo:
        f.memo["names_world_size"] = any(_WORLD_RE.search(n.lower()) for n in f.names | f.attrs)
    return bool(f.memo["names_world_size"])


def _shared_between(cs: CallSite, split: ast.Subscript) -> bool:
    """A broadcast or scatter between the shuffle and the split: rank 0's permutation is what every rank
    slices (`dist.broadcast(perm, src=0)`), so the ranks agree."""
    end = (split.lineno, split.col_offset)
    return any(cs.pos < c.pos < end and c.attr.startswith(("broadcast", "scatter")) for c in cs.scope.calls)


def _check_rank_shuffles(f: ModuleFacts) -> Iterator[Hit]:
    for cs in f.calls:
        family = _SHUFFLES.get(cs.qual)
        if family is None or cs.guarded or cs.rank_if is not None:
            continue
        shuffled = cs.arg(0, "x") if cs.qual in _IN_PLACE else None
        if cs.qual in _IN_PLACE and shuffled is None:
            continue
        split = rank_split_of(cs.scope, cs.node, shuffled)
        if split is None or _shared_between(cs, split):
            continue
        if not (_distributed_reach(f) or _names_world_size(f)):
            continue  # `x[gpu]` in a file that knows nothing of a world of ranks
        why = _shuffle_verdict(f, cs, family)
        if why is None:
            continue
        short = cs.qual.replace("numpy.", "np.")
        yield (
            cs.node,
            f"{short}() {why}, then split by rank (line {split.lineno}): each rank draws a different "
            "permutation, so the ranks' shards overlap and some samples are never seen",
        )


def _distributed_reach(f: ModuleFacts) -> bool:
    """This file, or a file of its project, sets up a process group or DDP."""
    if uses_distributed(f):
        return True
    project = f.project
    return project is not None and project.any_call(  # type: ignore[attr-defined]
        ("init_process_group", "DistributedDataParallel", "DistributedSampler", "FullyShardedDataParallel")
    )


@rule(
    "DDP020",
    "device-context-called-bare",
    "torch.accelerator.device_index() called as a statement: it is a context manager and selects nothing",
    "use torch.accelerator.set_device_index(i) (or torch.cuda.set_device(i)), or `with device_index(i):`",
    "device_index(i) (like torch.cuda.device(i)) only switches the device inside a `with` block; called "
    "bare it builds the manager and drops it, so every rank stays on GPU 0.",
)
def check_device_context_bare(f: ModuleFacts) -> Iterator[Hit]:
    if not any(True for _ in f.calls_named("device_index", "device")):
        return
    for n in ast.walk(f.tree):
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)):
            continue
        qual = f.resolve(n.value.func)
        if qual in ("torch.accelerator.device_index", "torch.cuda.device", "torch.xpu.device"):
            scope = enclosing_scope(f, n.lineno)
            if any(cs.attr in ("set_device", "set_device_index") and cs.node.lineno <= n.lineno
                   for cs in scope.calls):
                continue  # a harmless no-op after set_device picked the GPU (held-out corpus 12: physicsnemo)
            short = qual.split(".", 1)[1]
            yield (
                n.value,
                f"{short}() called as a statement: it is a context manager and selects nothing; "
                "every rank stays on the default device",
            )


def _collective(f: ModuleFacts, node: ast.Call) -> Optional[tuple[str, list[ast.expr]]]:
    callee = f.resolve(node.func)
    if not callee.startswith("torch.distributed."):
        return None
    name = callee.rsplit(".", 1)[-1]
    params = _COLLECTIVES.get(name)
    if params is None:
        return None
    kw = {k.arg: k.value for k in node.keywords}
    tensors = []
    for index, key in params:
        if key in kw:
            tensors.append(kw[key])
        elif index < len(node.args):
            tensors.append(node.args[index])
    return name, tensors


_DEFINED, _NONE, _PARTIAL = "defined", "none", "partial"


def none_checked(test: ast.AST, negated: bool = False) -> Optional[str]:
    """`x is None` (or `x is not None` when negated) -> "x"."""
    op = ast.IsNot if negated else ast.Is
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], op)
        and isinstance(test.left, ast.Name)
        and _is_const(test.comparators[0], None)
    ):
        return test.left.id
    return None


class _PartialTensor:
    """Per function, in source order: names that only some ranks bind to a tensor."""

    def __init__(self, f: ModuleFacts) -> None:
        self.f = f
        self.hits: list[tuple[ast.AST, str]] = []

    @staticmethod
    def value_state(value: ast.AST) -> str:
        if _is_const(value, None):
            return _NONE
        if isinstance(value, ast.IfExp) and (mentions_rank(value.test) or classify_guard(value.test)):
            if _is_const(value.body, None) != _is_const(value.orelse, None):
                return _PARTIAL
        return _DEFINED

    def assign(self, target: ast.AST, value: Optional[ast.AST], state: dict[str, str]) -> None:
        if isinstance(target, ast.Name):
            state[target.id] = self.value_state(value) if value is not None else _DEFINED
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.assign(elt, None, state)

    def scan(self, root: ast.AST, state: dict[str, str], in_rank_branch: bool) -> None:
        if in_rank_branch:
            return  # a collective inside a rank-dependent branch is another problem, not this one
        for n in ast.walk(root):
            if type(n) is not ast.Call:
                continue
            found = _collective(self.f, n)  # type: ignore[arg-type]
            if not found:
                continue
            name, tensors = found
            for t in tensors:
                if isinstance(t, ast.Name) and state.get(t.id) in (_PARTIAL, _NONE):
                    self.hits.append((n, f"{name}() on `{t.id}`, which is None or unbound on some ranks"))
                    break

    def block(self, body: list[ast.stmt], state: dict[str, str], in_rank: bool) -> None:
        for stmt in body:
            t = type(stmt)
            if t in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
                continue
            if t is ast.Assign:
                self.scan(stmt.value, state, in_rank)  # type: ignore[attr-defined]
                for target in stmt.targets:  # type: ignore[attr-defined]
                    self.assign(target, stmt.value, state)  # type: ignore[attr-defined]
            elif t is ast.AnnAssign and stmt.value is not None:  # type: ignore[attr-defined]
                self.scan(stmt.value, state, in_rank)  # type: ignore[attr-defined]
                self.assign(stmt.target, stmt.value, state)  # type: ignore[attr-defined]
            elif t is ast.Assert:
                name = none_checked(stmt.test, negated=True)  # type: ignore[attr-defined]
                if name:
                    state[name] = _DEFINED  # `assert x is not None`
            elif t is ast.If and not stmt.orelse and ends_in_exit(stmt.body) and none_checked(stmt.test):  # type: ignore[attr-defined]
                state[none_checked(stmt.test)] = _DEFINED  # type: ignore[attr-defined,index]  # `if x is None: raise`
            elif t is ast.If:
                self.scan(stmt.test, state, in_rank)  # type: ignore[attr-defined]
                rank_test = bool(classify_guard(stmt.test)) or mentions_rank(stmt.test)  # type: ignore[attr-defined]
                body_state, else_state = dict(state), dict(state)
                self.block(stmt.body, body_state, in_rank or rank_test)  # type: ignore[attr-defined]
                self.block(stmt.orelse, else_state, in_rank or rank_test)  # type: ignore[attr-defined]
                for key in set(body_state) | set(else_state):
                    a, b = body_state.get(key), else_state.get(key)
                    if a == b:
                        state[key] = a  # type: ignore[assignment]
                    elif rank_test and _DEFINED in (a, b):
                        state[key] = _PARTIAL
                    elif _PARTIAL in (a, b):
                        state[key] = _PARTIAL
                    else:
                        state[key] = _DEFINED if _DEFINED in (a, b) else (a or b)  # type: ignore[assignment]
            elif t in (ast.For, ast.AsyncFor):
                self.scan(stmt.iter, state, in_rank)  # type: ignore[attr-defined]
                self.assign(stmt.target, None, state)  # type: ignore[attr-defined]
                self.block(stmt.body, state, in_rank)  # type: ignore[attr-defined]
                self.block(stmt.orelse, state, in_rank)  # type: ignore[attr-defined]
            elif t is ast.While:
                self.scan(stmt.test, state, in_rank)  # type: ignore[attr-defined]
                self.block(stmt.body, state, in_rank)  # type: ignore[attr-defined]
                self.block(stmt.orelse, state, in_rank)  # type: ignore[attr-defined]
            elif t in (ast.With, ast.AsyncWith):
                for item in stmt.items:  # type: ignore[attr-defined]
                    self.scan(item.context_expr, state, in_rank)
                    if item.optional_vars is not None:
                        self.assign(item.optional_vars, None, state)
                self.block(stmt.body, state, in_rank)  # type: ignore[attr-defined]
            elif hasattr(stmt, "handlers"):
                self.block(stmt.body, state, in_rank)  # type: ignore[attr-defined]
                for h in stmt.handlers:  # type: ignore[attr-defined]
                    self.block(h.body, state, in_rank)
                self.block(stmt.orelse, state, in_rank)  # type: ignore[attr-defined]
                self.block(stmt.finalbody, state, in_rank)  # type: ignore[attr-defined]
            elif hasattr(stmt, "cases"):
                for case in stmt.cases:  # type: ignore[attr-defined]
                    self.block(case.body, state, in_rank)
            else:
                self.scan(stmt, state, in_rank)


@rule(
    "DDP014",
    "collective-on-partial-tensor",
    "collective on a tensor that only some ranks create",
    "create the tensor on every rank with the same shape (torch.empty(shape) on the receivers) "
    "or use dist.broadcast_object_list for Python objects",
    "Every rank must pass a tensor of the same shape; None fails on the others, a size mismatch hangs.",
)
def check_collective_partial_tensor(f: ModuleFacts) -> Iterator[Hit]:
    checker = _PartialTensor(f)
    for scope in f.scopes:
        if not any(
            cs.attr in _COLLECTIVES and cs.qual.startswith("torch.distributed.") for cs in scope.calls
        ):
            continue
        body = scope.node.body  # type: ignore[attr-defined]
        checker.block(body, {}, False)
    yield from checker.hits
