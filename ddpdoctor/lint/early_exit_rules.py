"""Rules about a rank that leaves, alone, a loop or the job the ranks run together, on a value only it
computed (classes the held-out corpora found missed): DDP038 (a loop left early, around a collective) and
DDP050 (an exit, a raise, a return or a break on a NaN test of this rank's own loss). Registered through
ruleset.py.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Mapping, Optional

from ddpdoctor.lint.facts import (
    ModuleFacts,
    classify_guard,
    dotted,
    final_identifier,
)
from ddpdoctor.lint.helpers import _SPAWN_FUNCS, is_test_file, multi_node, uses_distributed
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import distributed_program

# --- DDP038: a loop left early on a value each rank computes alone, around a collective ----------------


def _own_statements(loop: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `loop`'s body, not those of functions defined inside it."""
    stack: list[ast.AST] = list(getattr(loop, "body", []))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _breaks_of(loop: ast.AST) -> Iterator[tuple[ast.If, ast.Break]]:
    """(the `if`, its `break`) that leave `loop` itself (not a loop nested in it)."""

    def visit(body: list[ast.stmt], test: Optional[ast.If]) -> Iterator[tuple[ast.If, ast.Break]]:
        for st in body:
            if isinstance(st, ast.Break) and test is not None:
                yield test, st
            elif isinstance(st, ast.If):
                yield from visit(st.body, st)
                yield from visit(st.orelse, st)
            elif isinstance(st, (ast.With, ast.AsyncWith, ast.Try)):
                yield from visit(st.body, test)
                for h in getattr(st, "handlers", []):
                    yield from visit(h.body, test)

    yield from visit(getattr(loop, "body", []), None)


def _computed_in(loop: ast.AST) -> dict[str, int]:
    """Names the loop's body assigns from a call (`approx_kl = (ratio - 1).mean()`, `loss = crit(out, y)`):
    values computed from this rank's data. Counters (`step += 1`, `i = i + 1`) are not among them."""
    out: dict[str, int] = {}
    for node in _own_statements(loop):
        if isinstance(node, ast.Assign) and any(isinstance(n, ast.Call) for n in ast.walk(node.value)):
            for target in node.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, node.lineno)
        elif (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)
              and any(isinstance(n, ast.Call) for n in ast.walk(node.value))):
            out.setdefault(node.target.id, node.lineno)  # `loss += bz_loss.data.float()`: a running sum
    return out


@rule(
    "DDP038",
    "rank-local-early-exit",
    "a loop that calls a collective is left early on a value each rank computes on its own data: the "
    "ranks that stay call the collective alone",
    "decide together: all_reduce the value (or a stop flag) before the test, so every rank breaks at once",
    "Each rank's early-stop statistic (a KL estimate, a loss) comes from its own minibatch. A rank that "
    "breaks skips the all_reduce the other ranks still issue: the collectives pair up wrongly or hang. "
    "Opinionated: the value may happen to be the same everywhere (a scheduler's learning rate).",
    default=False,
)
def check_rank_local_early_exit(f: ModuleFacts) -> Iterator[Hit]:
    if b"break" not in f.source or not uses_distributed(f):
        return
    collectives = [cs for cs in f.calls if cs.qual.startswith("torch.distributed.") and cs.attr in _SYNC_NAMES]
    if not collectives:
        return
    for loop in ast.walk(f.tree):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        end = loop.end_lineno or loop.lineno
        inside = [c for c in collectives if loop.lineno < c.node.lineno <= end]
        if not inside:
            continue
        parents = {id(c): p for p in ast.walk(loop) for c in ast.iter_child_nodes(p)}
        computed = _computed_in(loop)
        # A value handed to a collective in the loop is the same on every rank afterwards.
        reduced = {n.id for c in inside for a in c.node.args for n in ast.walk(a) if isinstance(n, ast.Name)}
        for test_if, brk in _breaks_of(loop):
            local = sorted(
                n.id
                for n in ast.walk(test_if.test)
                if isinstance(n, ast.Name) and n.id in computed and n.id not in reduced
            )
            together = [c for c in inside if not _exclusive(parents, brk, c.node)]
            if not local or not together:
                continue  # (open_clip: the collective is on the other side of `if use_fsdp_eval:`)
            first = min(together, key=lambda c: c.node.lineno)
            yield (
                brk,
                f"`break` on `{local[0]}`, computed by each rank on its own data (line {computed[local[0]]}), "
                f"skips the {first.attr}() (line {first.node.lineno}) the other ranks still call: the "
                "collectives fall out of step and the job hangs",
            )


def _exclusive(parents: dict[int, ast.AST], a: ast.AST, b: ast.AST) -> bool:
    """`a` and `b` sit on the two sides of one `if`: no pass of the loop runs both."""
    chain_a: list[ast.AST] = [a]
    while id(chain_a[-1]) in parents:
        chain_a.append(parents[id(chain_a[-1])])
    on_a = {id(n): i for i, n in enumerate(chain_a)}
    below, node = b, b
    while id(node) not in on_a and id(node) in parents:
        below, node = node, parents[id(node)]
    if not isinstance(node, ast.If) or id(node) not in on_a:
        return False
    i = on_a[id(node)]
    side_a = chain_a[i - 1] if i > 0 else a
    return (side_a in node.body) != (below in node.body)


_SYNC_NAMES = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier"}
)


# --- DDP050: a process exits on a value only it computed, inside a loop the ranks run together ---------------

_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
# What makes the ranks wait for each other in a training loop: backward's all-reduce under DDP, a collective,
# a hand-made `all_reduce_mean` / `reduce_loss` helper.
_STEP_SYNC_RE = re.compile(r"backward|reduce|gather|broadcast|barrier|scaler")


def _exit_stmt(st: ast.stmt) -> bool:
    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
        return (dotted(st.value.func) or "") in _EXITS
    if isinstance(st, ast.Raise) and st.exc is not None:
        exc = st.exc.func if isinstance(st.exc, ast.Call) else st.exc
        return final_identifier(exc) == "SystemExit"
    return False


# A test of a value's finiteness: a NaN or an overflow on one rank's batch is that rank's alone.
_FINITE_RE = re.compile(r"isfinite|isnan|isinf|\bnan\b|\binf\b", re.IGNORECASE)


_FINITE_SOURCE_RE = re.compile(rb"isfinite|isnan|isinf")
_REDUCED_RE = re.compile(r"reduce|gather|broadcast")


def _reduced_before(loop: ast.AST, line: int, passed: set[str], computed: Optional[Mapping[str, int]] = None
                    ) -> set[str]:
    """Names that hold the same value on every rank by `line`: what a reduction returns (`reduced_loss =
    reduce_tensor(loss.data, n).item()`), the mapping whose values a loop all-reduced in place (`for v in
    loss_dict.values(): all_reduce(v)`), and what is computed from those alone (DINOv2's `loss_dict_reduced =
    {k: v.item() / world for k, v in loss_dict.items()}`, bench/lint-corpus). Names this rank did not compute
    from its batch (`computed`: Deformable-DETR's `weight_dict = criterion.weight_dict`, held-out corpus 13) are
    read the same on every rank too."""
    out = set(passed)
    earlier = [n for n in _own_statements(loop) if getattr(n, "lineno", line) < line]
    for node in earlier:
        if isinstance(node, ast.For) and {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)} & out:
            out |= {n.id for n in ast.walk(node.iter) if isinstance(n, ast.Name)}
    for _ in range(2):
        for node in sorted((n for n in earlier if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
            calls = [c for c in ast.walk(node.value) if isinstance(c, ast.Call)]
            read = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            bound = {n.id for c in ast.walk(node.value) if isinstance(c, ast.comprehension)
                     for n in ast.walk(c.target) if isinstance(n, ast.Name)}
            others = read - bound - out - _PLAIN_NAMES
            if computed is not None:
                others = {name for name in others if name in computed}
            if any(_REDUCED_RE.search(final_identifier(c.func).lower() or "") for c in calls) or (
                    read - bound and (read - bound) & out and not others):
                out |= {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    return out


# Names a computation from reduced values may also read: modules and builtins, the same on every rank.
_PLAIN_NAMES = frozenset({"torch", "math", "np", "numpy", "sum", "len", "float", "int", "abs", "max", "min",
                          "distributed", "dist", "world_size", "get_world_size", "args", "self"})


def _leaves(st: ast.stmt, finite_test: bool, in_loop: bool) -> bool:
    """An exit, or — under a finiteness test — a raise, a `return`, or (in the loop itself) a `break`."""
    if _exit_stmt(st):
        return True
    if not finite_test:
        return False
    return isinstance(st, (ast.Raise, ast.Return)) or (in_loop and isinstance(st, ast.Break))


def _exits_of(loop: ast.AST, in_loop: bool = True) -> Iterator[tuple[ast.If, ast.stmt]]:
    """(the `if`, the exit in its body) anywhere in `loop`'s (or a function's) own body: `if not
    math.isfinite(loss_value): print(...); sys.exit(1)`; under a NaN/inf test also `raise`, `return` and the
    loop's own `break` (held-out corpus 12: sam2's `return` from its step, audiocraft's `raise RuntimeError`,
    IDvs.MoRec's `if torch.isnan(loss.data): break`)."""
    for node in _own_statements(loop):
        if isinstance(node, ast.If):
            finite = bool(_FINITE_RE.search(ast.unparse(node.test)))
            body = list(node.body)
            for st in list(body) if finite else ():
                if isinstance(st, ast.If):  # `if raise_on_error: raise ... else: return` under a NaN test
                    body += [*st.body, *st.orelse]
            for st in body:
                if _leaves(st, finite, in_loop):
                    if isinstance(st, ast.Break) and not any(b is st for _, b in _breaks_of(loop)):
                        continue  # the break of a loop nested inside
                    yield node, st


def _fails(st: ast.stmt) -> bool:
    """The process ends with an error: a raise, or sys.exit() with a code other than 0 or None."""
    if isinstance(st, ast.Raise):
        return True
    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and _exit_stmt(st):
        code = st.value.args[0] if st.value.args else None
        return not (code is None or (isinstance(code, ast.Constant) and code.value in (0, None)))
    return False


def _torn_down_by_spawn(f: ModuleFacts) -> bool:
    """The program starts its ranks with mp.spawn on one node: when a rank dies with an error, the parent's
    join() terminates the others, so the failure is loud, not a hang (allennlp's NaN-loss raise, held-out lint
    corpus 14). A break, a return or exit(0) still leaves the others waiting."""
    files = [f] if f.project is None else [g for _, g in f.project.files]  # type: ignore[attr-defined]
    return any(cs.qual in _SPAWN_FUNCS for g in files for cs in g.calls) and not multi_node(f)


@rule(
    "DDP050",
    "rank-local-exit",
    "a process exits (sys.exit) inside the training loop on a value it computed from its own batch: the other "
    "ranks go on to the next step's all-reduce and wait for it",
    "decide together: all_reduce the check first (`bad = torch.tensor(float(not math.isfinite(loss_value)), "
    "device=device); dist.all_reduce(bad, op=dist.ReduceOp.MAX)`) and stop every rank on it",
    "Each rank's loss comes from its own batch: a NaN on one rank (a bad sample, an fp16 overflow in its "
    "shard) makes that rank exit while the others reach backward's all-reduce and wait for a peer that is "
    "gone. Without a launcher that tears the job down (srun, mpirun, a Kubernetes pod per rank) that is a "
    "hang until the NCCL timeout, after which a job restarted from the same checkpoint hits it again.",
)
def check_rank_local_exit(f: ModuleFacts) -> Iterator[Hit]:
    if (b"exit" not in f.source and b"SystemExit" not in f.source and not _FINITE_SOURCE_RE.search(f.source)) or (
            is_test_file(f.path)):
        return
    if not distributed_program(f):
        return
    seen: set[int] = set()
    for loop in ast.walk(f.tree):
        is_loop = isinstance(loop, (ast.For, ast.While))
        if not is_loop and not isinstance(loop, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        syncs = [n for n in _own_statements(loop) if isinstance(n, ast.Call)
                 and _STEP_SYNC_RE.search(final_identifier(n.func).lower() or "")]
        if not syncs:
            continue
        computed = _computed_in(loop)
        for test_if, exit_st in _exits_of(loop, in_loop=is_loop):
            if not is_loop and (not _FINITE_RE.search(ast.unparse(test_if.test)) or (
                    isinstance(exit_st, ast.Return) and not any(c.lineno > test_if.lineno for c in syncs))):
                # A function (a training step) that raises on its own NaN, or returns before the backward or the
                # all-reduce after the test; other exits from a function are its callers' business.
                continue
            if id(exit_st) in seen or id(test_if) in seen:
                continue  # one finding per test (sam2's `raise` under it and its `return` in the else)
            seen.update((id(exit_st), id(test_if)))
            # A value handed to a collective before the test is the same on every rank there.
            reduced = {n.id for c in syncs if c.lineno < test_if.lineno
                       for a in c.args for n in ast.walk(a) if isinstance(n, ast.Name)}
            reduced |= _reduced_before(loop, test_if.lineno, reduced, computed)
            local = sorted(n.id for n in ast.walk(test_if.test)
                           if isinstance(n, ast.Name) and n.id in computed and n.id not in reduced)
            if not local or classify_guard(test_if.test, f.main_vars) is not None:
                continue  # (a rank test: a rank-0-only exit is another rule's)
            if _fails(exit_st) and _torn_down_by_spawn(f):
                continue
            how = ("exits" if _exit_stmt(exit_st) else "raises" if isinstance(exit_st, ast.Raise)
                   else "returns" if isinstance(exit_st, ast.Return) else "leaves the loop")
            yield (
                exit_st,
                f"{how} when `{local[0]}` (computed by this rank from its own batch, line {computed[local[0]]}) "
                "fails the test: only this rank leaves, the others wait for it in the next step's all-reduce",
            )
