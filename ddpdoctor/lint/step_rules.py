"""Rules about the training step every rank must take together (classes the held-out corpus 6 found
missed): DDP041 (a batch skipped on a rank's own data before the step's collectives), DDP042 (the
optimizer or learning-rate scheduler stepped on some ranks only) and DDP043 (a collective that leaves out
the process group its function was given). Registered through ruleset.py.

Each reads a fact of the code that holds on every launch: a skip decided by one rank's batch, a step
under a rank test, a group parameter the collective does not pass. So all belong to the default tier.
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
    Scope,
    classify_guard,
    dotted,
    final_identifier,
)
from ddpdoctor.lint.helpers import COLLECTIVE_NAMES, is_test_file, near_files, uses_distributed
from ddpdoctor.lint.rank_rules import none_checked
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import distributed_program, uses_ddp_wrapper

# --- DDP041: a batch skipped on this rank's data, before the step's collectives ---------------------------


def _uses_ddp(f: ModuleFacts) -> bool:
    """This file or a file of its program wraps a model in DistributedDataParallel (backward all-reduces)."""
    files = near_files(f)
    return any(b"DistributedDataParallel" in g.source and uses_ddp_wrapper(g) for g in files)


def _loop_data_names(loop: ast.For) -> set[str]:
    """The names a loop over batches binds to data: `for x, y in loader` -> {x, y};
    `for i, (x, y) in enumerate(loader)` -> {x, y} (the counter is the same on every rank)."""
    target = loop.target
    it = loop.iter
    kind = final_identifier(it) if isinstance(it, ast.Call) else ""
    if kind not in _COUNTERS and not _batch_source(it):
        return set()  # a loop over parameters, phases, files: the same on every rank
    if kind in _COUNTERS:
        # `for i in range(len(loader)): batch = next(it)`: the batch is what the loop draws with next().
        return {
            n.id
            for st in ast.walk(loop)
            if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and final_identifier(st.value) == "next"
            for t in st.targets
            for n in ast.walk(t)
            if isinstance(n, ast.Name)
        }
    if kind == "enumerate" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        target = target.elts[1]
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


_COUNTERS = frozenset({"range", "count", "trange"})
# What a loop over batches iterates: a DataLoader or an iterator over one (`train_loader`, `enumerate(dl)`,
# `tqdm(data_iter)`, `self.batches`), by the names in the loop's iterable.
_BATCH_SOURCE_RE = re.compile(r"loader|batch|\bdl\b|_dl\b|\bdl_|data|iterator|\biter\b|_iter\b|prefetch|feeder|stream")


def _batch_source(it: ast.AST) -> bool:
    names = [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(it) if isinstance(n, (ast.Name, ast.Attribute))]
    return any(_BATCH_SOURCE_RE.search(name.lower()) for name in names)


def _derived(f: ModuleFacts, loop: ast.For, data: set[str], before: int) -> set[str]:
    """`data` and the names the loop assigns from them before line `before` (`loss = model(x).sum()`), less
    those a collective has made the same on every rank by then (`dist.all_reduce(loss)`)."""
    out = set(data)
    for node in sorted((n for n in ast.walk(loop) if isinstance(n, ast.Assign) and n.lineno < before),
                       key=lambda n: n.lineno):
        if any(isinstance(n, ast.Name) and n.id in out for n in ast.walk(node.value)):
            out.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
    for cs in f.calls:
        if loop.lineno < cs.node.lineno < before and cs.attr in COLLECTIVE_NAMES and cs.node.args:
            out.difference_update(n.id for n in ast.walk(cs.node.args[0]) if isinstance(n, ast.Name))
    return out


def _none_tested(test: ast.AST) -> set[str]:
    """Names the test only checks for None or truth (`if result is None:`, `if not out:`): a helper's
    "nothing this time" answer (gradient accumulation's micro-steps), not a property of the batch."""
    bare: set[str] = set()
    valued: set[str] = set()
    for n in ast.walk(test):
        if isinstance(n, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in n.ops):
            bare.update(x.id for x in (n.left, *n.comparators) if isinstance(x, ast.Name))
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and isinstance(n.operand, ast.Name):
            bare.add(n.operand.id)
        elif isinstance(n, (ast.Call, ast.Attribute, ast.Subscript, ast.BinOp)) or (
            isinstance(n, ast.Compare) and not all(isinstance(op, (ast.Is, ast.IsNot)) for op in n.ops)
        ):
            valued.update(x.id for x in ast.walk(n) if isinstance(x, ast.Name))
    if isinstance(test, ast.Name):
        bare.add(test.id)
    return bare - valued


def _skips(body: list[ast.stmt], outer: tuple[ast.If, ...] = ()) -> Iterator[tuple[tuple[ast.If, ...], ast.stmt]]:
    """(the `if`s around it, innermost last; a `continue`) directly in this loop's body (not in a nested loop
    or function). The outer tests count too: `if not isfinite(loss): if args.skip_nan: continue` skips on
    the loss, whatever the inner option says."""
    for st in body:
        if isinstance(st, ast.If):
            chain = (*outer, st)
            for inner in st.body:
                if isinstance(inner, ast.Continue):
                    yield chain, inner
            yield from _skips(st.body, chain)
            yield from _skips(st.orelse, chain)
        elif isinstance(st, (ast.With, ast.AsyncWith, ast.Try)):
            yield from _skips(st.body, outer)


# Objects whose backward() all-reduces gradients and whose barrier() / wait_for_everyone() is a barrier when
# the run is distributed: Accelerate's Accelerator, Lightning's Fabric and its predecessor LightningLite.
_STEP_WRAPPERS = frozenset({"Accelerator", "Fabric", "LightningLite"})
_WRAPPER_SYNCS = {"backward": "its gradient all-reduce", "barrier": "a barrier", "wait_for_everyone": "a barrier"}


def _wrapper_receivers(f: ModuleFacts) -> set[str]:
    """Names this file binds to such an object (`accelerator = Accelerator()`, `self.fabric = Fabric(...)`), and
    `self` inside a class deriving from one (`class Lite(LightningLite)`: facebookresearch/co-tracker)."""
    key = "step_wrapper_receivers"
    if key not in f.memo:
        found: set[str] = set()
        if any(word.encode() in f.source for word in _STEP_WRAPPERS):
            makers = {id(cs.node) for cs in f.calls if cs.attr in _STEP_WRAPPERS}
            for node in ast.walk(f.tree):
                if isinstance(node, ast.Assign) and id(node.value) in makers:
                    found.update(name for t in node.targets if (name := dotted(t)))
                elif isinstance(node, ast.ClassDef) and any(final_identifier(b) in _STEP_WRAPPERS for b in node.bases):
                    found.add("self")
        f.memo[key] = found
    return f.memo[key]  # type: ignore[no-any-return]


def _step_sync(f: ModuleFacts, loop: ast.For, after: int, ddp: bool) -> Optional[str]:
    """The first call after line `after` in the loop that every rank must make together: a
    torch.distributed collective, `backward()` when the model is DDP's (its gradient all-reduce), or the
    backward / barrier of an Accelerator, Fabric or LightningLite."""
    best: Optional[tuple[int, str]] = None
    end = loop.end_lineno or loop.lineno
    wrappers = _wrapper_receivers(f)
    for cs in f.calls:
        line = cs.node.lineno
        if not after < line <= end:
            continue
        func = cs.node.func if isinstance(cs.node, ast.Call) else None
        receiver = dotted(func.value) if isinstance(func, ast.Attribute) else None
        if cs.qual.startswith("torch.distributed.") and cs.attr in COLLECTIVE_NAMES:
            what = f"{cs.attr}() (line {line})"
        elif wrappers and receiver in wrappers and cs.attr in _WRAPPER_SYNCS:
            what = f"{receiver}.{cs.attr}() (line {line}: {_WRAPPER_SYNCS[cs.attr]})"
        elif ddp and cs.attr == "backward":
            what = f"backward() (line {line}: DDP's gradient all-reduce)"
        else:
            continue
        if best is None or line < best[0]:
            best = (line, what)
    return best[1] if best else None


@rule(
    "DDP041",
    "batch-dependent-skip",
    "a training step skipped on a test of this rank's own batch, before the step's collectives: the other "
    "ranks wait in the all-reduce the skipping rank never joins",
    "filter such samples in the dataset or collate_fn; or decide together: all_reduce a skip flag and skip "
    "on every rank at once (or run the step with a zero loss)",
    "Each rank draws its own batch, so a test of its contents (an empty target, a NaN loss) is true on some "
    "ranks only. The rank that `continue`s skips the backward's gradient all-reduce (or the collective) the "
    "others issue: they pair with its next step's collectives or hang until the timeout.",
)
def check_batch_dependent_skip(f: ModuleFacts) -> Iterator[Hit]:
    if b"continue" not in f.source or not distributed_program(f):
        return
    ddp = _uses_ddp(f)
    for loop in ast.walk(f.tree):
        if not isinstance(loop, ast.For):
            continue
        data = _loop_data_names(loop)
        if not data:
            continue
        bound = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        for chain, skip in _skips(loop.body):
            for test_if in reversed(chain):
                names = {n.id for n in ast.walk(test_if.test) if isinstance(n, ast.Name)}
                derived = _derived(f, loop, data, test_if.lineno) - _none_tested(test_if.test)
                read = sorted(names & (data | derived))
                # An inner test of the loop's counter (`if batch_idx < start: continue`, a resume) decides the
                # skip itself; only a test of no loop value (an option) leaves it to the test around it.
                if read or names & bound:
                    break
            else:
                continue
            if not read:
                continue
            sync = _step_sync(f, loop, skip.lineno, ddp)
            if sync is None:
                continue
            whose = "this rank's own batch" if read[0] in data else "computed from this rank's own batch"
            yield (
                skip,
                f"`continue` on `{read[0]}`, {whose} (the test on line {test_if.lineno}), skips "
                f"the {sync} the other ranks still run: the collectives fall out of step and the job hangs",
            )


# --- DDP042: the optimizer or the learning-rate scheduler stepped on some ranks only -----------------------

def _names_stepper(name: str) -> bool:
    """`scheduler`, `lr_scheduler`, `sched`, `optimizer`, `optim_g`, `opt`, `d_opt`: an optimizer or a
    learning-rate scheduler by its name."""
    low = name.lower()
    if "sched" in low or "optim" in low:
        return True
    return any(tok in ("opt", "opts") for tok in low.split("_"))


def _stepper(cs: CallSite) -> Optional[str]:
    """`scheduler.step()`, `self.lr_scheduler.step()`, `optimizer.step()`: the receiver's name, if it names
    an optimizer or a learning-rate scheduler."""
    if cs.attr != "step" or cs.node.args or (cs.node.keywords and not _epoch_kwarg(cs)):
        return None
    func = cs.node.func
    if not isinstance(func, ast.Attribute):
        return None
    name = final_identifier(func.value)
    return name if name and _names_stepper(name) else None


def _epoch_kwarg(cs: CallSite) -> bool:
    return all(kw.arg in ("epoch", "metrics") for kw in cs.node.keywords)


def _other_side_steps(scope: Scope, cs: CallSite, branch: RankBranch, name: str) -> bool:
    """The same object is stepped on the other side of the rank test (or outside every rank test)."""
    for o in scope.calls:
        if o is cs or _stepper(o) != name:
            continue
        b = o.rank_if
        if b is None or (b.stmt is branch.stmt and b.body != branch.body):
            return True
    return False


@rule(
    "DDP042",
    "rank-only-optimizer-step",
    "optimizer or learning-rate scheduler stepped only under a rank check: the ranks' learning rates or "
    "weights drift apart while DDP keeps averaging their gradients",
    "step the scheduler (and the optimizer) on every rank; keep only logging and saving under the rank check",
    "DDP averages gradients, not weights: every rank must apply the same update. A scheduler stepped on "
    "rank 0 only leaves the others at the initial learning rate; an optimizer stepped on rank 0 only leaves "
    "their weights untouched. No error is raised; the replicas silently diverge.",
)
def check_rank_only_optimizer_step(f: ModuleFacts) -> Iterator[Hit]:
    if b".step(" not in f.source or not distributed_program(f):
        return
    for scope in f.scopes:
        for cs in scope.calls:
            branch = cs.rank_if
            if branch is None or branch.kind not in (ZERO, NONZERO):
                continue
            name = _stepper(cs)
            if name is None or _other_side_steps(scope, cs, branch, name):
                continue
            who = "rank 0" if branch.kind == ZERO else "ranks other than 0"
            yield (
                cs.node,
                f"{name}.step() runs only on {who} (the check on line {branch.stmt.lineno}): the other ranks "
                "keep their old learning rate or weights and the replicas drift apart",
            )


# --- DDP043: a collective that leaves out the group its function was given --------------------------------

# torch.distributed functions and the position of their `group` argument.
_GROUP_POS = {
    "all_reduce": 2, "broadcast": 2, "all_gather": 2, "all_gather_object": 2, "all_gather_into_tensor": 2,
    "broadcast_object_list": 2, "all_to_all": 2, "all_to_all_single": 4, "reduce": 3, "gather": 3,
    "gather_object": 3, "scatter": 3, "scatter_object_list": 3, "reduce_scatter": 3,
    "reduce_scatter_tensor": 3, "barrier": 0, "monitored_barrier": 0, "get_world_size": 0, "get_rank": 0,
}  # fmt: skip
_GROUP_PARAMS = frozenset({"group", "pg", "process_group", "dist_group", "comm_group"})
# `<prefix>_group` names a process group only with a parallelism prefix: `param_group` is the optimizer's.
_GROUP_PREFIXES = frozenset({
    "dp", "tp", "pp", "mp", "ep", "cp", "sp", "fsdp", "ddp", "data_parallel", "tensor_parallel", "model_parallel",
    "pipeline_parallel", "expert_parallel", "context_parallel", "world", "node", "local", "intra_node",
    "inter_node", "replicate", "shard", "sharding", "replica", "reduce", "sync", "nccl", "gloo", "subgroup",
})  # fmt: skip


def _is_group_param(name: str) -> bool:
    if name in _GROUP_PARAMS or name.endswith("_pg") or name.endswith("process_group"):
        return True
    return name.endswith("_group") and name[: -len("_group")] in _GROUP_PREFIXES


def _group_params(scope: Scope) -> set[str]:
    """The function's parameters that hold a process group. A bare `group` must show it: annotated as a
    ProcessGroup, or handed as the group to some torch.distributed call of the function (`group` is also
    what optimizers call a parameter group: DeBERTa's `_reduce(group)` iterates parameter names)."""
    node = scope.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    a = node.args
    out: set[str] = set()
    for p in (*a.posonlyargs, *a.args, *a.kwonlyargs):
        if not _is_group_param(p.arg):
            continue
        if p.arg != "group" or "ProcessGroup" in ast.dump(p.annotation or ast.Constant(None)):
            out.add(p.arg)
            continue
        for cs in scope.calls:
            if cs.qual.startswith("torch.distributed.") and cs.attr in _GROUP_POS:
                given = cs.arg(_GROUP_POS[cs.attr], "group")
                if isinstance(given, ast.Name) and given.id == p.arg:
                    out.add(p.arg)
                    break
    return out


def _none_side(test: ast.AST, params: set[str]) -> Optional[bool]:
    """True when the `if` body runs with a group parameter None (`if pg is None:`, `if not pg:`), False when
    its `else` does (`if pg is not None:`, `if pg:`), None when the test is about something else."""
    if none_checked(test) in params:
        return True
    if none_checked(test, negated=True) in params:
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name):
        return True if test.operand.id in params else None
    if isinstance(test, ast.Name) and test.id in params:
        return False
    return None


def _lines_where_none(fn: ast.AST, params: set[str]) -> set[int]:
    """Lines of `fn` that run only when its group parameter is None (ignite's `if group is not None:
    dist.all_reduce(t, op, group=group) else: dist.all_reduce(t, op)`, kept for old PyTorch)."""
    out: set[int] = set()
    for n in ast.walk(fn):
        if not isinstance(n, ast.If):
            continue
        side = _none_side(n.test, params)
        if side is None:
            continue
        for st in n.body if side else n.orelse:
            out.update(range(st.lineno, (st.end_lineno or st.lineno) + 1))
    return out


def _passes_group(cs: CallSite, pos: int) -> bool:
    if cs.has_star_kwargs() or any(isinstance(a, ast.Starred) for a in cs.node.args):
        return True  # **kwargs may carry group=
    return cs.arg(pos, "group") is not None


@rule(
    "DDP043",
    "collective-ignores-group",
    "a function given a process group calls a collective without it: the collective runs over every rank "
    "of the job, not the group",
    "pass the group through: dist.all_reduce(t, op=..., group=pg) (every collective and get_world_size/"
    "get_rank the function calls)",
    "Without group= a collective uses the default group (all ranks). Called with a subgroup, the function "
    "then waits for ranks outside it (a hang) or reduces over the wrong ranks (a wrong result), while its "
    "other calls do use the group.",
)
def check_collective_ignores_group(f: ModuleFacts) -> Iterator[Hit]:
    if not uses_distributed(f) or is_test_file(f.path):
        return
    for scope in f.scopes:
        params = _group_params(scope)
        if not params:
            continue
        none_lines = _lines_where_none(scope.node, params)
        missing = []
        for cs in scope.calls:
            if not cs.qual.startswith("torch.distributed.") or cs.attr not in _GROUP_POS:
                continue
            if _passes_group(cs, _GROUP_POS[cs.attr]) or cs.node.lineno in none_lines:
                continue
            missing.append(cs)
        missing = [cs for cs in missing if cs.attr not in ("get_world_size", "get_rank")]
        if missing:
            # One finding per function, at its first such call: one fix (pass the group through) covers all.
            first, more = missing[0], len(missing) - 1
            also = f" (and {more} more call{'s' if more > 1 else ''} in it)" if more else ""
            yield (
                first.node,
                f"{first.attr}() without group= in {scope.name}(), which takes `{sorted(params)[0]}`{also}: it "
                "runs over every rank of the job, not that group",
            )


# --- DDP048: the ranks other than 0 skip the counter the loop stops on --------------------------------------


def _counter_names(node: ast.AST) -> Iterator[tuple[str, int]]:
    """(the base name, line) of what a statement advances: `step += 1`, `self.step = self.step + 1`,
    `pbar.update(1)` (tqdm's counter pbar.n)."""
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
        name = dotted(node.target)
        if name:
            yield name.split(".")[-1] if name.startswith("self.") else name.split(".")[0], node.lineno
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.BinOp):
        name = dotted(node.targets[0])
        if name and isinstance(node.value.op, ast.Add) and dotted(node.value.left) == name:
            yield name.split(".")[-1] if name.startswith("self.") else name.split(".")[0], node.lineno
    elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
          and node.value.func.attr == "update" and isinstance(node.value.func.value, ast.Name)):
        yield node.value.func.value.id, node.lineno


def _stop_names(test: ast.AST) -> set[str]:
    """Base names a loop's stop test reads (`pbar.n < pbar.total` -> pbar; `self.step >= max_steps` -> step,
    max_steps)."""
    out: set[str] = set()
    for n in ast.walk(test):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            out.add(n.attr if n.value.id == "self" else n.value.id)
        elif isinstance(n, ast.Name) and n.id != "self":
            out.add(n.id)
    return out


def _rank_skips(loop: ast.AST, main_vars: frozenset[str]) -> Iterator[tuple[ast.If, ast.Continue]]:
    """(the rank test, its `continue`) taken on the ranks other than 0: `if not is_main(): continue`, or the
    `else: continue` of `if rank == 0:`, directly in this loop (not a nested one)."""

    def visit(body: list[ast.stmt]) -> Iterator[tuple[ast.If, ast.Continue]]:
        for st in body:
            if isinstance(st, ast.If):
                kind = classify_guard(st.test, main_vars)
                side = st.body if kind == NONZERO else st.orelse if kind == ZERO else []
                yield from ((st, c) for c in side if isinstance(c, ast.Continue))
                if kind is None:
                    yield from visit(st.body)
                    yield from visit(st.orelse)
            elif isinstance(st, (ast.With, ast.AsyncWith, ast.Try)):
                yield from visit(st.body)

    yield from visit(getattr(loop, "body", []))


@rule(
    "DDP048",
    "rank-skips-step-counter",
    "the ranks other than 0 `continue` before the loop's step counter is advanced, and the loop stops on that "
    "counter: they never stop when rank 0 does, and wait in the next step's collectives forever",
    "advance the counter before the rank test (or put only the logging/saving under `if rank == 0:`), so every "
    "rank counts the same steps",
    "A rank-0-only block written as `if not is_main: continue` also skips the counter update after it "
    "(`pbar.update(1)`, `step += 1`). When the loop ends on that counter (`while pbar.n < total`, `if step >= "
    "max_steps: break`), rank 0 stops after N steps and the others go on training: their next backward or "
    "collective has no partner and the job hangs (or, with no collective, the ranks train different numbers of "
    "steps).",
)
def check_rank_skips_step_counter(f: ModuleFacts) -> Iterator[Hit]:
    if b"continue" not in f.source or not distributed_program(f) or is_test_file(f.path):
        return
    loops = [n for n in ast.walk(f.tree) if isinstance(n, (ast.For, ast.While))]
    for loop in loops:
        # What stops this loop or one around it: while tests and the tests of `if ...: break` in them.
        around = [o for o in loops if o.lineno <= loop.lineno and (o.end_lineno or o.lineno) >= (loop.end_lineno or 0)]
        stops: set[str] = set()
        for o in around:
            if isinstance(o, ast.While):
                stops |= _stop_names(o.test)
            for node in ast.walk(o):
                if isinstance(node, ast.If) and any(isinstance(s, ast.Break) for s in node.body):
                    stops |= _stop_names(node.test)
        if not stops:
            continue
        for test_if, skip in _rank_skips(loop, f.main_vars):
            later = [
                (name, line)
                for st in getattr(loop, "body", [])
                if st.lineno > skip.lineno
                for node in ast.walk(st)
                for name, line in _counter_names(node)
                if name in stops
            ]
            earlier = {
                name
                for st in getattr(loop, "body", [])
                if st.lineno < test_if.lineno
                for node in ast.walk(st)
                for name, _ in _counter_names(node)
            }
            later = [(name, line) for name, line in later if name not in earlier]
            if later:
                name, line = later[0]
                yield (
                    skip,
                    f"`continue` on the ranks other than 0 (the test on line {test_if.lineno}) skips `{name}`'s "
                    f"update (line {line}), which the loop stops on: those ranks never stop when rank 0 does",
                )
