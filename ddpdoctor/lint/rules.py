"""The lint rules: DDP pitfalls visible in a training script.

Each rule is a small function over `ModuleFacts` registered with `@rule(...)`, which declares its stable
id (DDPnnn), a short name, the default message, a one-line fix and the reason it matters. A rule yields
the AST node to report at, optionally with a more specific message. Rules prefer silence to a false
alarm: when an argument is an expression they cannot judge (`backend=args.backend`), they say nothing.
docs/lint.md documents every rule with a bad and a good example; tests check both against this code.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Union

from ddpdoctor.lint.facts import (
    CallSite,
    ModuleFacts,
    Scope,
    classify_guard,
    dotted,
    ends_in_exit,
    final_identifier,
    is_rank_identifier,
    mentions_rank,
)

# What a rule yields: the node to report at, or (node, a message more specific than the default).
Hit = Union[ast.AST, "tuple[ast.AST, str]"]


@dataclass(frozen=True)
class Rule:
    """A lint rule: stable id, short name, default message, one-line fix, why it matters, the check."""

    id: str
    name: str
    message: str
    fix: str
    why: str
    check: Callable[[ModuleFacts], Iterable[Hit]]
    # The default tier reports likely bugs only; opinionated rules (timeouts, cleanup, style) run when
    # selected (--select / --extend-select / [tool.ddpdoctor.lint]).
    default: bool = True


RULES: dict[str, Rule] = {}


def rule(id: str, name: str, message: str, fix: str, why: str, default: bool = True) -> Callable:
    """Register a rule function under a stable id."""

    def register(fn: Callable[[ModuleFacts], Iterable[Hit]]) -> Callable[[ModuleFacts], Iterable[Hit]]:
        if id in RULES:
            raise ValueError(f"rule {id} declared twice")
        RULES[id] = Rule(id=id, name=name, message=message, fix=fix, why=why, check=fn, default=default)
        return fn

    return register


def default_rules() -> list[Rule]:
    """The rules a plain `ddpdoctor lint` runs: those that report likely bugs."""
    return [r for r in RULES.values() if r.default]


# --- shared helpers ---------------------------------------------------------------------------------

_MP_MODULES = ("multiprocessing.", "torch.multiprocessing.")
_SPAWN_FUNCS = frozenset(
    {
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        "torch.multiprocessing.spawn.spawn",
    }
)
_CHECKPOINT_FUNCS = frozenset(
    {"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"}
)
# torch.cuda calls that do not create a CUDA context (safe before a fork).
_CUDA_NO_INIT = frozenset(
    {
        "is_available",
        "device_count",
        "is_initialized",
        "manual_seed",
        "manual_seed_all",
        "empty_cache",
        "is_bf16_supported",
        "get_arch_list",
        "nccl",
    }
)
_GLOBAL_RANK_ENV = frozenset({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
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


def const_value(node: Optional[ast.AST]) -> object:
    """The value of a literal, or the sentinel `_UNKNOWN` for anything else (None means "no argument")."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    return _UNKNOWN


_UNKNOWN = object()


def _is_const(node: Optional[ast.AST], value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def uses_distributed(f: ModuleFacts) -> bool:
    """The file takes part in torch.distributed (imports it, builds DDP, inits a process group)."""
    if "uses_distributed" not in f.memo:
        f.memo["uses_distributed"] = (
            f.imports_prefix("torch.distributed")
            or "distributed" in f.attrs
            or "DistributedDataParallel" in f.names
            or any(
                True
                for _ in f.calls_named("init_process_group", "DistributedDataParallel", "DistributedSampler")
            )
        )
    return bool(f.memo["uses_distributed"])


def _cuda_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda")


def is_cuda_touch(cs: CallSite) -> bool:
    """A call that creates the CUDA context: x.cuda(), torch.cuda.synchronize(), x.to("cuda"), device="cuda"."""
    if cs.attr == "cuda" and cs.qual != "torch.cuda":
        return True
    if cs.qual.startswith("torch.cuda.") and cs.attr not in _CUDA_NO_INIT and cs.qual.count(".") == 2:
        return True
    if cs.attr == "to" and any(_cuda_string(a) for a in cs.node.args):
        return True
    return any(kw.arg == "device" and _cuda_string(kw.value) for kw in cs.node.keywords)


def uses_cuda(f: ModuleFacts) -> bool:
    if "uses_cuda" not in f.memo:
        found = False
        for cs in f.calls:
            if cs.qual.startswith("torch.cuda.") or cs.attr == "cuda" or cs.kwarg("device_ids") is not None:
                found = True
            elif any(_cuda_string(a) for a in cs.node.args) or any(
                _cuda_string(k.value) for k in cs.node.keywords
            ):
                found = True
            if found:
                break
        f.memo["uses_cuda"] = found or bool(f.cuda_strings)
    return bool(f.memo["uses_cuda"])


def _init_calls(f: ModuleFacts) -> list[CallSite]:
    """init_process_group calls, except the "fake" backend of dry runs and tests (no rendezvous, no GPU)."""
    out = []
    for cs in f.calls_named("init_process_group"):
        backend = cs.arg(0, "backend")
        if not (isinstance(backend, ast.Constant) and backend.value == "fake"):
            out.append(cs)
    return out


def _is_set_device(cs: CallSite) -> bool:
    q = cs.qual
    return (
        q.endswith("cuda.set_device")
        or q == "torch.accelerator.set_device_index"
        or (cs.attr == "set_device" and "cuda" in (cs.raw or ""))
    )


def callees_of(f: ModuleFacts, cs: CallSite) -> list[tuple[ModuleFacts, Scope]]:
    """The functions `cs` calls: in this file by name, or in another file of the project by import."""
    if cs.local:
        return [(f, s) for s in f.functions.get(cs.attr, ())]
    if f.project is not None:
        return f.project.callees(f, cs)  # type: ignore[attr-defined,no-any-return]
    return []


def callers_of(f: ModuleFacts, scope: Scope) -> list[tuple[ModuleFacts, CallSite]]:
    """The calls into `scope`: from this file by name, and from other files of the project by import."""
    out = [(f, c) for c in f.callers.get(scope.name, ()) if c.scope is not scope]
    if f.project is not None and scope.parent is not None and scope.parent.is_module:
        out += f.project.callers(f, scope)  # type: ignore[attr-defined]
    return out


def is_entry(f: ModuleFacts, scope: Scope) -> bool:
    """Module code and functions passed as values (spawn targets, callbacks) run on every rank."""
    return scope.is_module or scope.name in f.passed_refs


def find_call_in(
    f: ModuleFacts, cs: CallSite, pred: Callable[[CallSite], bool], depth: int = 0, seen: Optional[set] = None
) -> Optional[CallSite]:
    """A call matching `pred` made by the function(s) `cs` calls, a few levels deep (this file or project)."""
    seen = set() if seen is None else seen
    if depth > 3:
        return None
    for target, scope in callees_of(f, cs):
        if id(scope) in seen:
            continue
        seen.add(id(scope))
        for inner in scope.calls:
            if pred(inner):
                return inner
            found = find_call_in(target, inner, pred, depth + 1, seen)
            if found is not None:
                return found
    return None


def _function_contains(
    f: ModuleFacts, name: str, pred: Callable[[CallSite], bool], depth: int, seen: set
) -> bool:
    """Some function called `name` (or one it calls, a few levels deep) makes a call matching `pred`."""
    if depth > 4 or name in seen:
        return False
    seen.add(name)
    for scope in f.functions.get(name, ()):
        for cs in scope.calls:
            if pred(cs) or (cs.local and _function_contains(f, cs.attr, pred, depth + 1, seen)):
                return True
            if not cs.local and f.project is not None and find_call_in(f, cs, pred, depth + 1) is not None:
                return True
    return False


def _happens_before(
    f: ModuleFacts, scope: Scope, pos: tuple[int, int], pred: Callable[[CallSite], bool], depth: int = 0
) -> Optional[bool]:
    """Does a call matching `pred` run before `pos` in `scope`: earlier in the same function (directly or
    in a function it calls), or before the call into this function in some caller? Source order, a few
    levels. None when it cannot be told (a helper whose callers live in another file)."""
    if depth > 5:
        return None
    for cs in scope.calls:
        if cs.pos >= pos:
            continue
        if pred(cs) or (cs.local and _function_contains(f, cs.attr, pred, 0, {scope.name})):
            return True
        if not cs.local and f.project is not None and find_call_in(f, cs, pred) is not None:
            return True
    if is_entry(f, scope):
        return False  # the module's top level and spawn targets are where a process starts
    callers = callers_of(f, scope)
    if not callers:
        return None
    answers = [_happens_before(g, c.scope, c.pos, pred, depth + 1) for g, c in callers]
    if True in answers:
        return True
    return False if all(a is False for a in answers) else None


def _rank_zero_only(f: ModuleFacts, scope: Scope, depth: int = 0) -> bool:
    """Every path into `scope` passes a rank-0 check (or we cannot see who calls it: stay silent)."""
    if scope.guarded:
        return True
    if is_entry(f, scope):
        return False  # module code and spawn targets / callbacks run on every rank
    if depth > 5:
        return True
    return all(c.guarded or _rank_zero_only(g, c.scope, depth + 1) for g, c in callers_of(f, scope))


def _runs_at_import(f: ModuleFacts, scope: Scope, depth: int = 0) -> bool:
    """Code in `scope` runs when the module is imported (no `__main__` guard on the way)."""
    if scope.is_module:
        return True
    if depth > 5:
        return False
    return any(
        not c.main_guard and _runs_at_import(f, c.scope, depth + 1)
        for c in f.callers.get(scope.name, ())
        if c.scope is not scope
    )


def _is_mp(cs: CallSite) -> bool:
    return cs.qual.startswith(_MP_MODULES)


def _is_process(f: ModuleFacts, cs: CallSite, *, pools: bool) -> bool:
    if cs.attr not in (("Process", "Pool") if pools else ("Process",)):
        return False
    if _is_mp(cs):
        return True
    head = (cs.raw or "").split(".", 1)[0]
    return head in f.contexts


# --- rules ------------------------------------------------------------------------------------------


@rule(
    "DDP001",
    "fork-start-cuda",
    "processes are forked in a script that uses CUDA: a forked child cannot use CUDA",
    'use the spawn start method: mp.set_start_method("spawn") or mp.get_context("spawn"), or torchrun',
    "CUDA cannot be re-initialised in a forked child; the child fails on its first CUDA call.",
)
def check_fork_start_cuda(f: ModuleFacts) -> Iterator[Hit]:
    cuda = uses_cuda(f)
    other_method = False
    for cs in f.calls_named("set_start_method", "get_context"):
        if not _is_mp(cs):
            continue
        method = const_value(cs.arg(0, "method"))
        if method == "fork":
            if cuda:
                yield cs.node, f'{cs.attr}("fork") in a script that uses CUDA: a forked child cannot use CUDA'
        elif cs.attr == "set_start_method" and isinstance(method, str):
            other_method = True
    if other_method:
        return
    for scope in f.scopes:
        touched = False
        for cs in scope.calls:
            if not touched:
                touched = is_cuda_touch(cs)
            elif _is_process(f, cs, pools=True):
                head = (cs.raw or "").split(".", 1)[0]
                if f.contexts.get(head, "fork") != "fork":
                    continue
                yield (
                    cs.node,
                    (
                        f"{cs.attr}() started with the default fork start method after CUDA was initialised "
                        "in this function"
                    ),
                )


# Global-rank taint (DDP002): which names hold the global rank, per function, in source order.


def _env_key(f: ModuleFacts, node: ast.AST) -> Optional[str]:
    """os.environ["RANK"], os.environ.get("RANK"), os.getenv("RANK") -> "RANK"."""
    if isinstance(node, ast.Subscript):
        if f.resolve(node.value) == "os.environ":
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return key.value
        return None
    if isinstance(node, ast.Call) and node.args:
        callee = f.resolve(node.func)
        if callee in ("os.environ.get", "os.getenv", "os.environ.__getitem__"):
            key = node.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return key.value
    return None


def _is_composite_rank(value: ast.AST) -> bool:
    """`node_rank * gpus_per_node + gpu`: the global rank built from the spawn index on a multi-node run."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return False
    return any(
        isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult) for side in (value.left, value.right)
    )


class _GlobalRankTaint:
    def __init__(self, f: ModuleFacts) -> None:
        self.f = f
        self.self_attrs: set[str] = set()  # "self.global_rank" keys tainted in any method
        self.hits: list[tuple[ast.AST, str]] = []
        # (function name, positional index) -> the rank expression a caller passes there.
        self.param_taint: dict[tuple[str, int], str] = {}

    def tainted(self, node: Optional[ast.AST], env: set[str]) -> Optional[str]:
        """The rank expression's name when `node` holds the global rank, else None."""
        if node is None:
            return None
        t = type(node)
        if t is ast.Name or t is ast.Attribute:
            key = dotted(node)
            if key and (key in env or key in self.self_attrs):
                return key
            return None
        if t is ast.Subscript:
            # os.environ["RANK"], and any mapping keyed "RANK" (env_dict = {k: os.environ[k] ...}).
            key = node.slice  # type: ignore[attr-defined]
            if isinstance(key, ast.Constant) and key.value in _GLOBAL_RANK_ENV:
                return f"{dotted(node.value) or '...'}[{key.value!r}]"  # type: ignore[attr-defined]
            return None
        if t is ast.Call:
            ident = final_identifier(node)
            if ident in ("int", "str") and len(node.args) == 1:  # type: ignore[attr-defined]
                return self.tainted(node.args[0], env)  # type: ignore[attr-defined]
            if ident in ("get_rank", "get_global_rank"):
                return f"{ident}()"
            return "RANK" if _env_key(self.f, node) in _GLOBAL_RANK_ENV else None
        if t is ast.IfExp:
            return self.tainted(node.body, env) or self.tainted(node.orelse, env)  # type: ignore[attr-defined]
        if t is ast.BoolOp:
            for v in node.values:  # type: ignore[attr-defined]
                name = self.tainted(v, env)
                if name:
                    return name
        return None

    def assign(
        self, targets: list[ast.expr], value: Optional[ast.expr], env: set[str], record_self: bool
    ) -> None:
        for target in targets:
            if isinstance(target, (ast.Tuple, ast.List)):
                values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [None] * len(target.elts)
                if len(values) == len(target.elts):
                    self.assign(list(target.elts), None, env, record_self)
                    for t, v in zip(target.elts, values):
                        self.assign([t], v, env, record_self)
                continue
            key = dotted(target)
            if not key:
                continue
            name = self.tainted(value, env)
            if not name and value is not None and _is_composite_rank(value):
                ident = key.rsplit(".", 1)[-1]
                if is_rank_identifier(ident) and "local" not in ident.lower():
                    name = key
            if name:
                env.add(key)
                if record_self and key.startswith("self."):
                    self.self_attrs.add(key)
            else:
                env.discard(key)

    def check_call(self, node: ast.Call, env: set[str]) -> None:
        f = self.f
        callee = f.resolve(node.func)
        attr = final_identifier(node)
        culprit: Optional[str] = None
        if isinstance(node.func, ast.Name) and attr in f.functions:
            # demo_basic(rank) with the global rank: the callee's parameter holds it too.
            for index, arg in enumerate(node.args):
                name = self.tainted(arg, env)
                if name:
                    self.param_taint.setdefault((attr, index), name)
        if callee.endswith("cuda.set_device") or callee == "torch.accelerator.set_device_index":
            culprit = self.tainted(node.args[0] if node.args else None, env)
        elif attr in ("to", "cuda") and isinstance(node.func, ast.Attribute):
            culprit = self.tainted(node.args[0] if node.args else None, env)
        elif callee == "torch.device" and node.args:
            first = node.args[0]
            if _cuda_string(first) and len(node.args) > 1:
                culprit = self.tainted(node.args[1], env)
            else:
                culprit = self.tainted(first, env)
        for kw in node.keywords:
            if culprit:
                break
            if kw.arg == "device_ids" and isinstance(kw.value, (ast.List, ast.Tuple)):
                for elt in kw.value.elts:
                    culprit = culprit or self.tainted(elt, env)
            elif kw.arg in ("device", "output_device", "device_id", "map_location"):
                culprit = self.tainted(kw.value, env)
        if culprit:
            self.hits.append((node, culprit))

    def check_string(self, node: ast.AST, env: set[str]) -> None:
        """Only the value right after "cuda:" picks the device: f"cuda:{x} (rank {rank})" is about x."""
        index: Optional[ast.AST] = None
        if isinstance(node, ast.JoinedStr):
            for before, after in zip(node.values, node.values[1:]):
                if (
                    isinstance(before, ast.Constant)
                    and str(before.value).endswith("cuda:")
                    and isinstance(after, ast.FormattedValue)
                ):
                    index = after.value
                    break
        elif isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant):
            if str(node.left.value).startswith("cuda:%"):
                right = node.right
                index = right.elts[0] if isinstance(right, ast.Tuple) and right.elts else right
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            template = node.func.value
            if isinstance(template, ast.Constant) and str(template.value).startswith("cuda:{") and node.args:
                index = node.args[0]
        culprit = self.tainted(index, env)
        if culprit:
            self.hits.append((node, culprit))

    def assignments(
        self, body: list[ast.stmt], out: list[tuple[tuple[int, int], list[ast.expr], Optional[ast.expr]]]
    ) -> None:
        """The scope's assignments in source order, each keyed by where it takes effect (its end)."""
        for stmt in body:
            t = type(stmt)
            if t is ast.Assign:
                out.append(((stmt.end_lineno, stmt.end_col_offset), stmt.targets, stmt.value))  # type: ignore[attr-defined]
            elif t is ast.AnnAssign:
                if stmt.value is not None:  # type: ignore[attr-defined]
                    out.append(((stmt.end_lineno, stmt.end_col_offset), [stmt.target], stmt.value))  # type: ignore[attr-defined]
            elif t in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
                continue
            elif t is ast.For or t is ast.AsyncFor:
                it = stmt.iter  # type: ignore[attr-defined]
                out.append(((it.end_lineno, it.end_col_offset), [stmt.target], None))  # type: ignore[attr-defined]
                self.assignments(stmt.body, out)  # type: ignore[attr-defined]
                self.assignments(stmt.orelse, out)  # type: ignore[attr-defined]
            else:
                for field in ("body", "orelse", "finalbody"):
                    block = getattr(stmt, field, None)
                    if block:
                        self.assignments(block, out)
                for h in getattr(stmt, "handlers", ()):
                    self.assignments(h.body, out)
                for case in getattr(stmt, "cases", ()):
                    self.assignments(case.body, out)

    def scope_pass(
        self, scope: Scope, env: set[str], record_self: bool, sinks: list[tuple[tuple[int, int], ast.AST]]
    ) -> set[str]:
        """Apply the scope's assignments in source order, checking each sink against the names tainted so
        far (flow-insensitive inside branches: simple, in source order)."""
        events: list[tuple[tuple[int, int], list[ast.expr], Optional[ast.expr]]] = []
        self.assignments(scope.node.body, events)  # type: ignore[attr-defined]
        i = 0
        for end, targets, value in events:
            while i < len(sinks) and sinks[i][0] < end:
                self.check_sink(sinks[i][1], env)
                i += 1
            self.assign(targets, value, env, record_self)
        for _, node in sinks[i:]:
            self.check_sink(node, env)
        return env

    def check_sink(self, node: ast.AST, env: set[str]) -> None:
        if isinstance(node, ast.Call):
            self.check_call(node, env)
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "format" and _cuda_prefix(func.value):
                self.check_string(node, env)
        else:
            self.check_string(node, env)

    def sinks(self) -> dict[int, list[tuple[tuple[int, int], ast.AST]]]:
        """Per scope (by id), the calls and "cuda:..." strings that can pick a device, in source order."""
        out: dict[int, list[tuple[tuple[int, int], ast.AST]]] = {}
        for scope in self.f.scopes:
            found = [
                (cs.pos, cs.node)
                for cs in scope.calls
                if _maybe_device_sink(cs) or (cs.local and type(cs.node.func) is ast.Name)
            ]
            if found:
                out[id(scope)] = found
        for node, scope in self.f.cuda_strings:
            out.setdefault(id(scope), []).append(((node.lineno, node.col_offset), node))  # type: ignore[attr-defined]
        for found in out.values():
            found.sort(key=lambda item: item[0])
        return out

    def run(self) -> list[tuple[ast.AST, str]]:
        f = self.f
        sinks = self.sinks()
        if not sinks:
            return []
        module_env = self.scope_pass(f.module, set(), False, sinks.get(id(f.module), []))
        functions = [s for s in f.scopes if not s.is_module]
        # Pass 1 learns which self.<attr> hold the global rank in any method; pass 2 reports.
        module_hits = list(self.hits)
        if "self" in f.names:
            for scope in functions:
                self.scope_pass(scope, self._initial(module_env, scope), True, [])
        self.hits = module_hits
        for scope in functions:
            found = sinks.get(id(scope))
            if found:
                self.scope_pass(scope, self._initial(module_env, scope), False, found)
        # A function handed the global rank by a caller in this file: one more pass with that parameter
        # tainted (one level: enough for `demo_basic(rank)` called from main()).
        for scope in functions:
            args = scope.node.args.args  # type: ignore[attr-defined]
            extra = {
                args[i].arg: culprit
                for (name, i), culprit in self.param_taint.items()
                if name == scope.name and i < len(args)
            }
            found = sinks.get(id(scope))
            if extra and found:
                self.scope_pass(scope, self._initial(module_env, scope) | set(extra), False, found)
        return self.hits

    @staticmethod
    def _initial(module_env: set[str], scope: Scope) -> set[str]:
        return {k for k in module_env if "." not in k and k not in scope.params}


_DEVICE_KWARGS = frozenset({"device_ids", "device", "output_device", "device_id", "map_location"})


def _maybe_device_sink(cs: CallSite) -> bool:
    if cs.attr in ("to", "cuda", "set_device", "set_device_index", "device"):
        return True
    return any(kw.arg in _DEVICE_KWARGS for kw in cs.node.keywords)


# Text that any global-rank source needs: get_rank(), a RANK-like environment key, `rank = a * b + c`.
_RANK_SOURCE_RE = re.compile(
    rb"get_(?:global_)?rank|['\"](?:RANK|SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK|PMIX_RANK)['\"]"
    rb"|rank\s*=[^=\n][^\n]*\*"
)


def _cuda_prefix(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda:")


def is_test_file(path: str) -> bool:
    """A unit-test module by its name: test_x.py or x_test.py (pytest's and unittest's conventions)."""
    name = re.split(r"[\\/]", path)[-1]
    return name.startswith("test_") or name.endswith("_test.py")


@rule(
    "DDP002",
    "device-from-global-rank",
    "GPU chosen from the global rank: on a multi-node run it is past the node's GPU count",
    'pick the GPU with the local rank: local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)',
    "Ranks are numbered across nodes; GPU ordinals restart at 0 on every node.",
)
def check_device_from_global_rank(f: ModuleFacts) -> Iterator[Hit]:
    if not _RANK_SOURCE_RE.search(f.source):
        return  # no global rank is read or computed anywhere in the file
    if is_test_file(f.path):
        return  # unit tests of distributed code run on one node, where the global rank is the local one
    seen: set[int] = set()
    for node, culprit in _GlobalRankTaint(f).run():
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield (
            node,
            (
                f"GPU chosen from the global rank `{culprit}`: on a multi-node run it is past the node's GPU count "
                "(invalid device ordinal) or puts two ranks on one GPU"
            ),
        )


def _mentions_nccl(node: Optional[ast.AST], f: Optional[ModuleFacts] = None) -> Optional[bool]:
    """True / False when the backend expression is readable, None when it is not. `args.dist_backend`
    is read through its argparse default in the same file."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and "nccl" in node.value.lower()
    if f is not None and isinstance(node, ast.Attribute):
        default = f.argparse_default(node)
        return _mentions_nccl(default) if isinstance(default, ast.Constant) else None
    if isinstance(node, ast.IfExp):
        branches = [_mentions_nccl(node.body, f), _mentions_nccl(node.orelse, f)]
        if True in branches:
            return True
        return False if branches == [False, False] else None
    return None


def _is_collective_call(cs: CallSite) -> bool:
    return cs.qual.startswith("torch.distributed.") and cs.attr in COLLECTIVE_NAMES


# Every rank must make these calls, in the same order (point-to-point send/recv are not among them).
COLLECTIVE_NAMES = frozenset(
    {
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "broadcast_object_list",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
    }
)


def _gpu_work(cs: CallSite) -> bool:
    if cs.attr == "barrier" and cs.kwarg("device_ids") is not None:
        return False  # barrier(device_ids=[i]) names its GPU: the documented way around the guess
    return is_cuda_touch(cs) or cs.kwarg("device_ids") is not None or _is_collective_call(cs)


def nccl_init_order(f: ModuleFacts) -> list[tuple[CallSite, str, str]]:
    """Each NCCL init_process_group without a device set before it: (call, "bug" | "order", message).
    "bug": GPU work (or a collective) runs before set_device, or set_device never follows; "order":
    set_device follows with nothing on the GPU in between (the opinionated DDP021)."""
    if "nccl_init_order" in f.memo:
        return f.memo["nccl_init_order"]  # type: ignore[return-value]
    out: list[tuple[CallSite, str, str]] = []
    for cs in _init_calls(f):
        if cs.kwarg("device_id") is not None or cs.has_star_kwargs():
            continue
        backend = cs.arg(0, "backend")
        if backend is None:
            if not uses_cuda(f):
                continue
        elif not _mentions_nccl(backend, f):
            continue
        before = _happens_before(f, cs.scope, cs.pos, _is_set_device)
        if before:
            continue
        set_at: Optional[CallSite] = None
        work_at: Optional[CallSite] = None
        for later in cs.scope.calls:
            if later.pos <= cs.pos:
                continue
            if _is_set_device(later) or find_call_in(f, later, _is_set_device) is not None:
                set_at = later
                break
            if work_at is None and (
                _gpu_work(later) or find_call_in(f, later, _is_collective_call) is not None
            ):
                work_at = later
        if set_at is not None and work_at is None:
            out.append(
                (
                    cs,
                    "order",
                    f"NCCL process group created before torch.cuda.set_device() (line {set_at.node.lineno}): "
                    "nothing runs on the GPU in between, but this rank may start on GPU 0 if CUDA work "
                    "moves before set_device",
                )
            )
        elif set_at is not None and work_at is not None:
            out.append(
                (
                    cs,
                    "bug",
                    f"NCCL process group created before torch.cuda.set_device() (line {set_at.node.lineno}), "
                    f"with GPU work or a collective in between (line {work_at.node.lineno}): that work runs "
                    "on GPU 0 on every rank",
                )
            )
        elif work_at is not None or (before is False and not is_entry(f, cs.scope)):
            # (A process entry point that does nothing on the GPU after init has nothing to misplace.)
            where = f" (GPU work at line {work_at.node.lineno})" if work_at is not None else ""
            out.append(
                (
                    cs,
                    "bug",
                    "NCCL process group created and no torch.cuda.set_device() before or after it in this "
                    f"process{where}: ranks may all start on GPU 0",
                )
            )
    f.memo["nccl_init_order"] = out
    return out


@rule(
    "DDP003",
    "nccl-before-set-device",
    "NCCL process group created before torch.cuda.set_device(), with GPU work in between: it runs on GPU 0",
    "call torch.cuda.set_device(local_rank) before init_process_group, or pass device_id=torch.device('cuda', local_rank)",
    "Without a current device, NCCL and CUDA contexts of every rank land on GPU 0.",
)
def check_nccl_before_set_device(f: ModuleFacts) -> Iterator[Hit]:
    for cs, kind, message in nccl_init_order(f):
        if kind == "bug":
            yield cs.node, message


@rule(
    "DDP021",
    "set-device-after-init",
    "NCCL process group created before torch.cuda.set_device(), with nothing on the GPU in between",
    "move torch.cuda.set_device(local_rank) above init_process_group, or pass device_id=",
    "Harmless as written; fragile: CUDA work added between the two lines lands on GPU 0 on every rank.",
    default=False,
)
def check_set_device_after_init(f: ModuleFacts) -> Iterator[Hit]:
    for cs, kind, message in nccl_init_order(f):
        if kind == "order":
            yield cs.node, message


_TCP_PORT_RE = re.compile(r":(\d+)/?$")


def _literal_port(node: Optional[ast.AST]) -> Optional[int]:
    """A port written as a literal: "12355", 12355, str(12355), f"12355"."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            return None
        if isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit()):
            port = int(v)
            return port or None
        return None
    if isinstance(node, ast.Call) and final_identifier(node) == "str" and len(node.args) == 1:
        return _literal_port(node.args[0])
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return _literal_port(ast.Constant("".join(str(v.value) for v in node.values)))  # type: ignore[attr-defined]
    return None


def _url_port(node: Optional[ast.AST]) -> Optional[int]:
    """tcp://10.0.0.1:23456 or f"tcp://{addr}:23456" -> 23456."""
    text = None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr) and node.values:
        last = node.values[-1]
        if isinstance(last, ast.Constant) and isinstance(last.value, str):
            text = last.value
    if text is None or (isinstance(node, ast.Constant) and not text.startswith("tcp://")):
        return None
    if isinstance(node, ast.JoinedStr):
        first = node.values[0]
        if not (isinstance(first, ast.Constant) and str(first.value).startswith("tcp://")):
            return None
    m = _TCP_PORT_RE.search(text)
    return int(m.group(1)) if m and int(m.group(1)) else None


def _port_variable(f: ModuleFacts, value: ast.AST) -> Optional[tuple[str, int, int]]:
    """`port` in `os.environ["MASTER_PORT"] = str(port)` when every assignment of `port` is a literal."""
    if isinstance(value, ast.Call) and final_identifier(value) == "str" and len(value.args) == 1:
        value = value.args[0]
    key = dotted(value)
    assigned = f.assigns.get(key or "", [])
    if not assigned:
        return None
    ports = [_literal_port(v) for v, _ in assigned]
    if all(ports):
        return key, ports[0], assigned[0][1].lineno  # type: ignore[return-value]
    return None


@rule(
    "DDP004",
    "hard-coded-port",
    "rendezvous port hard-coded: two jobs on one node clash on it",
    "read the port from the launcher (MASTER_PORT set by torchrun/Slurm) or pick a free one; never a literal",
    "A second job on the same node, or a zombie of the last one, already holds the port.",
)
def check_hard_coded_port(f: ModuleFacts) -> Iterator[Hit]:
    for base, key, value, stmt in f.env_assigns:
        if key == "MASTER_PORT" and f.resolve_dotted(base) == "os.environ":
            if id(stmt) in f.env_defaults:
                continue  # under `if "MASTER_PORT" not in os.environ:`: a default, like setdefault
            port = _literal_port(value)
            if port:
                yield stmt, f"MASTER_PORT hard-coded to {port}: two jobs on one node clash on it"
                continue
            held = _port_variable(f, value)
            if held:
                name, port, line = held
                yield (
                    stmt,
                    f"MASTER_PORT set from `{name}`, hard-coded to {port} (line {line}): two jobs on one node "
                    "clash on it",
                )
    for cs in f.calls_named("update"):
        if cs.qual != "os.environ.update":
            continue
        values = [kw.value for kw in cs.node.keywords if kw.arg == "MASTER_PORT"]
        for a in cs.node.args:
            if isinstance(a, ast.Dict):
                values += [
                    v
                    for k, v in zip(a.keys, a.values)
                    if isinstance(k, ast.Constant) and k.value == "MASTER_PORT"
                ]
        for v in values:
            port = _literal_port(v)
            if port:
                yield cs.node, f"MASTER_PORT hard-coded to {port}: two jobs on one node clash on it"
    for cs in _init_calls(f):
        method = cs.arg(1, "init_method")
        port = _url_port(method)
        if port:
            yield cs.node, f"init_method hard-codes port {port}: two jobs on one node clash on it"
            continue
        key = dotted(method) if method is not None else None
        for value, stmt in f.assigns.get(key or "", ()):
            port = _url_port(value)
            if port:
                yield (
                    stmt,
                    f"`{key}` hard-codes port {port} and is passed to init_method (line {cs.node.lineno}): "
                    "two jobs on one node clash on it",
                )
    for cs in f.calls_named("TCPStore"):
        port = _literal_port(cs.arg(1, "port"))
        if port:
            yield cs.node, f"TCPStore port hard-coded to {port}: two jobs on one node clash on it"


@rule(
    "DDP005",
    "sampler-without-set-epoch",
    "DistributedSampler shuffles but set_epoch() is never called: every epoch sees the same order",
    "call sampler.set_epoch(epoch) (or loader.sampler.set_epoch(epoch)) at the start of every epoch",
    "The sampler seeds its shuffle with seed + epoch, and epoch stays 0 unless set.",
)
def check_sampler_set_epoch(f: ModuleFacts) -> Iterator[Hit]:
    samplers = [
        cs for cs in f.calls_named("DistributedSampler") if const_value(cs.arg(3, "shuffle")) in (None, True)
    ]
    if not samplers:
        return
    for cs in f.calls_named("set_epoch"):
        arg = cs.arg(0, "epoch")
        if arg is not None and not isinstance(arg, ast.Constant):
            return  # set per epoch somewhere (through any attribute path)
    if f.project is not None and f.project.any_call(("set_epoch",)):  # type: ignore[attr-defined]
        return  # called in another file of the project (a trainer module)
    # Names holding a sampler, or a DataLoader built on one: handed to code in another file (a trainer,
    # `from utils import train`), set_epoch may happen there, out of sight.
    held: set[str] = set()
    for cs in samplers:
        held.update(n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(cs.node), ()))
    for cs in f.calls_named("DataLoader"):
        sampler = cs.arg(3, "sampler")
        if sampler is not None and (isinstance(sampler, ast.Call) or final_identifier(sampler) in held):
            held.update(n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(cs.node), ()))
    escaping = [cs for cs in f.calls if held and _escapes(f, cs, held)]
    if f.project is not None and escaping:
        # Linted with its project: handed to functions we can read, and no set_epoch anywhere in it.
        if all(callees_of(f, cs) for cs in escaping):
            escaping = []
    if escaping:
        return
    for cs in samplers:
        yield cs.node


# Calls that take a sampler or loader without calling set_epoch on it behind our back.
_LOADER_CONSUMERS = frozenset(
    {
        "DataLoader",
        "DistributedSampler",
        "BatchSampler",
        "print",
        "len",
        "iter",
        "next",
        "enumerate",
        "zip",
        "tqdm",
        "list",
        "isinstance",
        "getattr",
        "hasattr",
        "range",
        "info",
        "debug",
        "warning",
        "log",
        "format",
    }
)


def _escapes(f: ModuleFacts, cs: CallSite, held: set[str]) -> bool:
    """`cs` passes one of the `held` names to a function this file does not define."""
    if cs.attr in _LOADER_CONSUMERS or cs.attr in f.functions or cs.attr in f.classes:
        return False
    values = list(cs.node.args) + [kw.value for kw in cs.node.keywords]
    return any(isinstance(v, (ast.Name, ast.Attribute)) and final_identifier(v) in held for v in values)


@rule(
    "DDP006",
    "sampler-with-shuffle",
    "DataLoader gets both a sampler and shuffle=True: ValueError at construction",
    "drop shuffle=True (the sampler shuffles; DistributedSampler(shuffle=True) is the default)",
    "DataLoader refuses the combination; the sampler decides the order.",
)
def check_sampler_with_shuffle(f: ModuleFacts) -> Iterator[Hit]:
    for cs in f.calls_named("DataLoader"):
        if not _is_const(cs.arg(2, "shuffle"), True):
            continue
        for index, name in ((3, "sampler"), (4, "batch_sampler")):
            value = cs.arg(index, name)
            if value is not None and not _is_const(value, None):
                yield cs.node, f"DataLoader gets both {name}= and shuffle=True: ValueError at construction"
                break


@rule(
    "DDP007",
    "save-on-every-rank",
    "torch.save() runs on every rank: all ranks write the same checkpoint file at once",
    "save on one rank only: `if dist.get_rank() == 0: torch.save(...)`, then dist.barrier() before anyone reads it",
    "Concurrent writers to one path produce truncated or corrupt checkpoints and waste I/O.",
)
def check_save_on_every_rank(f: ModuleFacts) -> Iterator[Hit]:
    if not uses_distributed(f):
        return
    for cs in f.calls:
        if cs.qual != "torch.save":
            continue
        path = cs.arg(1, "f")
        if path is not None and (per_rank_path(f, path) or in_memory(f, path)):
            continue  # one file per rank, on purpose; or a BytesIO buffer
        local = local_rank_guarded(f, cs)
        if local is not None:
            yield (
                cs.node,
                f"torch.save() runs where local rank is 0 (line {local}) in a multi-node script: the local "
                "rank 0 of every node writes the same file",
            )
            continue
        if cs.guarded or _rank_zero_only(f, cs.scope):
            continue
        yield cs.node


def in_memory(f: ModuleFacts, target: ast.AST) -> bool:
    """`buf = io.BytesIO(); torch.save(obj, buf)`: no file is written."""
    if isinstance(target, ast.Call):
        return final_identifier(target) in ("BytesIO", "StringIO")
    return any(
        isinstance(v, ast.Call) and final_identifier(v) in ("BytesIO", "StringIO")
        for v, _ in f.assigns.get(dotted(target) or "", ())
    )


def per_rank_path(f: ModuleFacts, path: ast.AST, depth: int = 0) -> bool:
    """The path depends on the rank: directly (`f"ckpt{rank}.pt"`) or through a variable assigned from
    one (`name = base + str(rank)`; `os.path.join(out, name)`; `with open(shard) as fh`). A variable is
    read at its last assignment above the use (`fh` is reused by several `with` blocks)."""
    if mentions_rank(path):
        return True
    if depth > 2:
        return False
    line = getattr(path, "lineno", 0)
    for n in ast.walk(path):
        if isinstance(n, (ast.Name, ast.Attribute)):
            value = value_before(f, dotted(n) or "", line)
            if value is not None and per_rank_path(f, value, depth + 1):
                return True
    return False


def value_before(f: ModuleFacts, key: str, line: int) -> Optional[ast.expr]:
    """The value last assigned to `key` on a line above `line` (else its first assignment anywhere)."""
    assigned = f.assigns.get(key, ())
    if not assigned:
        return None
    above = [(stmt.lineno, value) for value, stmt in assigned if stmt.lineno <= line]
    return max(above, key=lambda item: item[0])[1] if above else assigned[0][0]


# The script knows it runs across nodes: it names the global rank or the node rank apart from the local
# one. (get_rank() alone is not enough: single-node scripts call it too.)
_MULTI_NODE_RE = re.compile(rb"global_rank|node_rank|nnodes|num_nodes|['\"]RANK['\"]")


def _local_only(test: ast.AST) -> bool:
    ranks = [i for i in _names_in(test) if is_rank_identifier(i)]
    return bool(ranks) and all("local" in i.lower() for i in ranks)


def local_rank_guarded(f: ModuleFacts, cs: CallSite, depth: int = 0) -> Optional[int]:
    """The line of the `local_rank == 0` check that alone guards `cs` in a multi-node script, else None."""
    if not _MULTI_NODE_RE.search(f.source):
        return None
    guard = cs.guarded
    if isinstance(guard, ast.AST) and not isinstance(guard, (ast.Name, ast.Attribute, ast.Call)):
        return guard.lineno if _local_only(guard) else None  # type: ignore[attr-defined]
    if guard or is_entry(f, cs.scope) or depth > 3:
        return None
    callers = callers_of(f, cs.scope)
    lines = [local_rank_guarded(g, c, depth + 1) for g, c in callers]
    if lines and all(line is not None for line in lines):
        return lines[0]
    return None


@rule(
    "DDP008",
    "load-without-map-location",
    "torch.load() without map_location in DDP code: tensors saved from a GPU load back onto that GPU on every rank",
    'pass map_location="cpu" (or map_location=f"cuda:{local_rank}")',
    "Tensors saved from cuda:0 load back onto cuda:0 on every rank: extra memory on GPU 0, then OOM.",
    default=False,
)
def check_load_map_location(f: ModuleFacts) -> Iterator[Hit]:
    if not uses_distributed(f):
        return
    for cs in f.calls:
        if cs.qual == "torch.load" and cs.arg(1, "map_location") is None and not cs.has_star_kwargs():
            # `if args.gpu is None: torch.load(p) else: torch.load(p, map_location=loc)`: the bare load is
            # the one-process-per-node branch; the per-GPU branch maps.
            if any(o.qual == "torch.load" and o.kwarg("map_location") is not None for o in cs.scope.calls):
                continue
            path = cs.arg(0, "f")
            if path is not None and per_rank_path(f, path):
                continue  # each rank reads the file it saved from its own GPU
            yield cs.node


@rule(
    "DDP009",
    "init-without-timeout",
    "init_process_group() without timeout=: a lost rank becomes a 10-30 minute hang",
    "pass timeout=datetime.timedelta(minutes=...) sized to your slowest step (checkpointing, evaluation)",
    "The default collective timeout is 10 minutes (NCCL) to 30 minutes; a fault then looks like a hang.",
    default=False,
)
def check_init_timeout(f: ModuleFacts) -> Iterator[Hit]:
    for cs in _init_calls(f):
        if cs.arg(2, "timeout") is None and not cs.has_star_kwargs():
            yield cs.node


@rule(
    "DDP010",
    "no-destroy-process-group",
    "init_process_group() without destroy_process_group() anywhere in the file",
    "call dist.destroy_process_group() when training ends (in a finally: block so errors clean up too)",
    "Without it NCCL resources leak and recent PyTorch warns at exit; a crashed rank can leave peers hanging.",
    default=False,
)
def check_destroy(f: ModuleFacts) -> Iterator[Hit]:
    inits = _init_calls(f)
    if inits and "destroy_process_group" not in f.attrs and "destroy_process_group" not in f.names:
        if f.project is not None and f.project.any_call(("destroy_process_group",)):  # type: ignore[attr-defined]
            return
        yield inits[0].node


@rule(
    "DDP011",
    "data-parallel",
    "nn.DataParallel: single-process, GIL-bound and not the supported multi-GPU path",
    "use DistributedDataParallel with one process per GPU (torchrun --nproc_per_node=N)",
    "DataParallel replicates the model every step from one Python process; DDP is faster and maintained.",
    default=False,
)
def check_data_parallel(f: ModuleFacts) -> Iterator[Hit]:
    for cs in f.calls:
        if cs.attr in ("DataParallel", "data_parallel") and cs.qual.startswith("torch."):
            yield cs.node


# The module as an argv element, or in a command line: not prose that merely names it.
_LAUNCH_RE = re.compile(r"^\s*torch\.distributed\.launch\s*$|-m\s+torch\.distributed\.launch\b")


@rule(
    "DDP012",
    "distributed-launch",
    "torch.distributed.launch is deprecated: use torchrun",
    "launch with `torchrun --nproc_per_node=N train.py` and read LOCAL_RANK from the environment",
    "torch.distributed.launch is deprecated and passes --local-rank, which older argparse code rejects.",
)
def check_distributed_launch(f: ModuleFacts) -> Iterator[Hit]:
    lines: set[int] = set()
    for module, stmt in f.imported_modules:
        if (
            module == "torch.distributed.launch" or module.startswith("torch.distributed.launch.")
        ) and stmt.lineno not in lines:
            lines.add(stmt.lineno)
            yield stmt
    if b"torch.distributed.launch" not in f.source:
        return
    bare_strings: set[int] = set()
    for n in ast.walk(f.tree):
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant):
            bare_strings.add(id(n.value))  # docstrings and comments-as-strings are prose, not a launch
        elif (
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and _LAUNCH_RE.search(n.value)
            and id(n) not in bare_strings
            and n.lineno not in lines
        ):
            lines.add(n.lineno)
            yield n, "runs torch.distributed.launch, which is deprecated: use torchrun"


@rule(
    "DDP013",
    "local-rank-argument",
    "--local_rank argparse option: torch.distributed.launch now passes --local-rank, and torchrun passes nothing",
    'read int(os.environ["LOCAL_RANK"]); if you must keep the flag, accept both: add_argument("--local-rank", "--local_rank")',
    "PyTorch 2.0's launcher passes --local-rank=N (hyphen); a parser that knows only --local_rank exits.",
)
def check_local_rank_argument(f: ModuleFacts) -> Iterator[Hit]:
    hits = []
    for cs in f.calls_named("add_argument"):
        opts = {a.value for a in cs.node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
        if "--local_rank" in opts and "--local-rank" not in opts:
            hits.append(cs)
    if not hits:
        return
    # `if torch.__version__ ... 1:` / `if TORCH_MAJOR == 1:` around the option: only the old launcher.
    versioned: list[tuple[int, int]] = []
    low = f.source.lower()
    for n in ast.walk(f.tree) if b"version" in low or b"major" in low else ():
        if isinstance(n, ast.If) and any(
            "version" in i.lower() or "major" in i.lower() for i in _names_in(n.test)
        ):
            versioned.append((n.body[0].lineno, n.body[-1].end_lineno or n.body[-1].lineno))
    for cs in hits:
        if not any(a <= cs.node.lineno <= b for a, b in versioned):
            yield cs.node


def _names_in(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr


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


def _none_checked(test: ast.AST, negated: bool = False) -> Optional[str]:
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
                name = _none_checked(stmt.test, negated=True)  # type: ignore[attr-defined]
                if name:
                    state[name] = _DEFINED  # `assert x is not None`
            elif t is ast.If and not stmt.orelse and ends_in_exit(stmt.body) and _none_checked(stmt.test):  # type: ignore[attr-defined]
                state[_none_checked(stmt.test)] = _DEFINED  # type: ignore[attr-defined,index]  # `if x is None: raise`
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


def _uses_ddp_wrapper(f: ModuleFacts) -> bool:
    return (
        "DistributedDataParallel" in f.names
        or "DistributedDataParallel" in f.attrs
        or any(cs.qual.endswith("DistributedDataParallel") for cs in f.calls)
    )


@rule(
    "DDP015",
    "reentrant-checkpoint",
    "reentrant activation checkpointing in a DDP model: 'Expected to mark a variable ready only once'",
    "pass use_reentrant=False to checkpoint() (gradient_checkpointing_kwargs={'use_reentrant': False}), "
    "or build DDP with static_graph=True",
    "The reentrant variant re-runs forward inside backward, so DDP's gradient hooks fire twice.",
)
def check_reentrant_checkpoint(f: ModuleFacts) -> Iterator[Hit]:
    ddp = _uses_ddp_wrapper(f)
    if not (ddp or any(True for _ in f.calls_named("init_process_group"))):
        return
    if "_set_static_graph" in f.attrs:
        return
    for cs in f.calls:
        if cs.qual.endswith("DistributedDataParallel") and _is_const(cs.kwarg("static_graph"), True):
            return
    for cs in f.calls:
        if ddp and cs.qual in _CHECKPOINT_FUNCS:
            flag = cs.kwarg("use_reentrant")
            if (flag is None and not cs.has_star_kwargs()) or _is_const(flag, True):
                shown = (
                    "use_reentrant=True"
                    if flag is not None
                    else "without use_reentrant= (reentrant by default)"
                )
                yield (
                    cs.node,
                    f"{cs.attr}() {shown} in a DDP model: 'Expected to mark a variable ready only once'",
                )
        elif cs.attr == "gradient_checkpointing_enable":
            kwargs = cs.kwarg("gradient_checkpointing_kwargs")
            if kwargs is None and cs.has_star_kwargs():
                continue
            if kwargs is None or (
                isinstance(kwargs, ast.Dict)
                and not any(
                    isinstance(k, ast.Constant) and k.value == "use_reentrant" and _is_const(v, False)
                    for k, v in zip(kwargs.keys, kwargs.values)
                )
            ):
                yield (
                    cs.node,
                    (
                        "gradient_checkpointing_enable() without use_reentrant=False under DDP: "
                        "'Expected to mark a variable ready only once'"
                    ),
                )


@rule(
    "DDP016",
    "spawn-without-main-guard",
    'processes started without an `if __name__ == "__main__":` guard: each child re-runs the launch',
    'move the spawn into `if __name__ == "__main__":` (or a main() called only from there)',
    "The spawn start method re-imports the main module in every child; unguarded, the launch runs again.",
)
def check_spawn_main_guard(f: ModuleFacts) -> Iterator[Hit]:
    for cs in f.calls:
        if cs.main_guard:
            continue
        if cs.qual in _SPAWN_FUNCS or _is_process(f, cs, pools=False):
            if _runs_at_import(f, cs.scope):
                yield (
                    cs.node,
                    (
                        f'{cs.attr}() runs at import time, without an `if __name__ == "__main__":` guard: '
                        "each spawned child re-runs it"
                    ),
                )


def all_rules() -> dict[str, Rule]:
    return dict(RULES)


# The rules about what every rank must do alike live in their own module; importing it registers them.
from ddpdoctor.lint import rank_rules  # noqa: E402,F401
