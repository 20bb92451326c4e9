"""Which processes run a call, beyond rank tests (flow.py): the launching process of a script that starts its
own ranks, the single-process side of a distributed switch, a body gated on an argument only rank-0 callers
pass. Split from flow.py when it passed 600 lines (session 13); each answers "not every rank" for the rules that
report work done on every rank (DDP007, DDP008, DDP034)."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ddpdoctor.lint.facts import CallSite, ModuleFacts, final_identifier
from ddpdoctor.lint.flow import callers_of, rank_zero_only

# --- the launching process of a script that starts its own ranks ------------------------------------------

_SPAWNERS = frozenset({"spawn", "start_processes"})


def _spawns(f: ModuleFacts) -> list[CallSite]:
    """This file's calls that start its ranks: torch.multiprocessing.spawn / start_processes."""
    key = "spawn_calls"
    if key not in f.memo:
        f.memo[key] = [cs for cs in f.calls if cs.attr in _SPAWNERS
                       and ("multiprocessing" in cs.qual or (cs.raw or "").startswith("mp."))]
    return f.memo[key]  # type: ignore[return-value]


def _receivers(f: ModuleFacts, name: str) -> list[CallSite]:
    """The calls of this file that are handed the function `name` as an argument."""
    return [
        cs for cs in f.calls
        if any(isinstance(a, ast.Name) and a.id == name for a in [*cs.node.args, *(k.value for k in cs.node.keywords)])
    ]


def parent_only(f: ModuleFacts, cs: CallSite, depth: int = 0) -> bool:
    """In a script that starts its ranks itself (`mp.spawn(worker, ...)`), `cs` runs only in the launching
    process, never in a rank: it sits under the main guard at the top level, or in a function reached only
    from there (called, or handed to a helper that is: the Annotated Transformer's
    `show_example(load_vocab, ...)`), never from the spawn target. Held-out lint corpus 11: its vocabulary
    cache and final-model load were reported as every rank's."""
    spawns = _spawns(f)
    if not spawns or depth > 4:
        return False
    if cs.scope.is_module:
        return cs.main_guard
    scope = cs.scope
    handed = _receivers(f, scope.name) if scope.name in f.passed_refs else []
    if any(r in spawns for r in handed):
        return False  # the spawn target itself
    callers = callers_of(f, scope)
    if any(g is not f for g, _ in callers):
        return False  # called from another file: whose process is not known here
    paths = [c for _, c in callers] + handed
    return bool(paths) and all(parent_only(f, c, depth + 1) for c in paths)


# --- the single-process side of a distributed switch -------------------------------------------------------

_DIST_FLAG_RE = re.compile(
    r"^(?:is_|use_|enable_|args_)?(?:distributed|ddp|dist|multi_?gpu|multiprocessing_distributed|parallel)"
    # `self.distributed_training` (THUDM/CogDL, held-out lint corpus 15), `parallel_training`, `ddp_mode`
    r"(?:_(?:training|train|mode|run|enabled))?$"
    r"|^(?:dist_(?:enabled|avail_and_initialized|initialized)|is_initialized)$"
)


def _distributed_test(test: ast.AST) -> Optional[bool]:
    """True when `if test:` takes its body in a distributed run (`args.distributed`, `dist.is_initialized()`,
    `world_size > 1`), False when it takes it in a single-process run (`not args.distributed`,
    `world_size == 1`), None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _distributed_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, (ast.Name, ast.Attribute, ast.Call)):
        return True if _DIST_FLAG_RE.match(final_identifier(test).lower()) else None
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is))
            and isinstance(test.comparators[0], ast.Constant) and isinstance(test.comparators[0].value, bool)):
        # `if (parallel == True):` (autonomousvision/transfuser, held-out lint corpus 14)
        inner = _distributed_test(test.left)
        return None if inner is None else inner == test.comparators[0].value
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant):
        left = test.left
        key = left.slice if isinstance(left, ast.Subscript) else None  # config["world_size"]
        ident = (key.value if isinstance(key, ast.Constant) and isinstance(key.value, str)
                 else final_identifier(left)).lower()
        value = test.comparators[0].value
        if not (ident.endswith("world_size") or ident in ("ngpus", "num_gpus", "n_gpu", "nprocs")) or value not in (1, 2):
            return None
        op = type(test.ops[0])
        if (op is ast.Gt and value == 1) or (op is ast.GtE and value == 2) or (op is ast.NotEq and value == 1):
            return True
        if (op is ast.Eq and value == 1) or (op is ast.Lt and value == 2) or (op is ast.LtE and value == 1):
            return False
    return None


def _ancestors(f: ModuleFacts, cs: CallSite) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(node, its parent) from the call up to its function's node: the blocks and expressions `cs` sits in,
    innermost first (the parent map is built once per function)."""
    key = ("parents", id(cs.scope))
    if key not in f.memo:
        f.memo[key] = {id(child): parent for parent in ast.walk(cs.scope.node) for child in ast.iter_child_nodes(parent)}
    parents: dict[int, ast.AST] = f.memo[key]  # type: ignore[assignment]
    node: ast.AST = cs.node
    while id(node) in parents:
        parent = parents[id(node)]
        yield node, parent
        node = parent


def single_process_branch(f: ModuleFacts, cs: CallSite) -> Optional[int]:
    """Line of the `if` whose single-process side holds `cs` (the `else:` of `if args.distributed:`, the
    body of `if world_size == 1:`): there is only one process there, whatever the rank. Held-out lint
    corpus 11: pytorch_mnist_ddp's `else: torch.save(...)` beside the rank-0 save of the distributed side."""
    for node, parent in _ancestors(f, cs):
        if isinstance(parent, ast.If):
            side = _distributed_test(parent.test)
            in_body = any(node is st for st in parent.body)
            in_else = any(node is st for st in parent.orelse)
            if (side is True and in_else) or (side is False and in_body):
                return parent.lineno
        elif isinstance(parent, ast.IfExp) and node is not parent.test:
            # `get_free_port() if config["world_size"] == 1 else DISTRIBUTED_PORT` (fairchem, corpus 11)
            side = _distributed_test(parent.test)
            if (side is True and node is parent.orelse) or (side is False and node is parent.body):
                return parent.lineno
    return None


# --- a body that runs only when the caller passes an argument ------------------------------------------------


def _gating_params(f: ModuleFacts, cs: CallSite) -> set[str]:
    """Parameters (default None) whose `if model is not None:` (or `if model:`) holds `cs` in its function."""
    fn = cs.scope.node
    args = getattr(fn, "args", None)
    if args is None:
        return set()
    positional = args.posonlyargs + args.args
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(args.defaults):], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    optional = {name for name, d in defaults.items() if isinstance(d, ast.Constant) and d.value is None}
    if not optional:
        return set()
    out: set[str] = set()
    for node, parent in _ancestors(f, cs):
        if isinstance(parent, ast.If) and any(node is st for st in parent.body):
            test = parent.test
            if isinstance(test, ast.Name) and test.id in optional:
                out.add(test.id)
            elif (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id in optional
                  and isinstance(test.ops[0], ast.IsNot) and isinstance(test.comparators[0], ast.Constant)
                  and test.comparators[0].value is None):
                out.add(test.left.id)
    return out


def _passes(c: CallSite, fn: ast.AST, name: str) -> bool:
    """The call hands `fn` the parameter `name` (by keyword, by position, or maybe through **kwargs/*args)."""
    if c.kwarg(name) is not None or c.has_star_kwargs() or any(isinstance(a, ast.Starred) for a in c.node.args):
        return True
    args = getattr(fn, "args", None)
    positional = [a.arg for a in (args.posonlyargs + args.args)] if args is not None else []
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    return name in positional and positional.index(name) < len(c.node.args)


def reaches(f: ModuleFacts, cs: CallSite, caller: CallSite) -> bool:
    """The call `caller` of `cs`'s function gets as far as `cs` as far as its optional-argument gates say."""
    return all(_passes(caller, cs.scope.node, p) for p in _gating_params(f, cs))


def gated_rank_zero_only(f: ModuleFacts, cs: CallSite) -> bool:
    """`cs` runs only when its function's caller passes an optional argument (`if model is not None:
    torch.save(...)` in a save-or-load helper), and every call that passes it is under a rank-0 check:
    the calls that do not (the resume path, `lm_checkpoint(cfg)`) never reach it. Held-out lint corpus 11:
    minimind's lm_checkpoint saves only when handed the model, which only the main process does."""
    gate = _gating_params(f, cs)
    if not gate:
        return False
    reaching = [(g, c) for g, c in callers_of(f, cs.scope) if reaches(f, cs, c)]
    return bool(reaching) and all(c.guarded or rank_zero_only(g, c.scope) for g, c in reaching)
