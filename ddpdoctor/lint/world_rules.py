"""Rules about the size of the world and what every rank holds (issue #24, class 11): the world size
read from the wrong count (Slurm tasks without the GPUs per task, the local GPU count on several nodes),
an object only rank 0 creates used on every rank, a CPU tensor handed to an NCCL collective, a
DistributedSampler seeded differently on each rank; and the rendezvous address and port each task decides
on its own (DDP032, DDP034). Over 600 lines: one family of small independent rules sharing the launcher
patterns at the end. Registered in rules.py's table (imported at its end).

Like the other rules they speak only where the code says it plainly, and prefer silence otherwise.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Iterable, Iterator, Optional

from ddpdoctor.lint.facts import (
    NONZERO,
    ZERO,
    CallSite,
    ModuleFacts,
    classify_guard,
    dotted,
    ends_in_exit,
    final_identifier,
    mentions_rank,
)
from ddpdoctor.lint.flow import callers_of, enclosing_scope, parameter_values, rank_zero_only, value_before
from ddpdoctor.lint.helpers import (
    _SPAWN_FUNCS,
    COLLECTIVE_NAMES,
    _init_calls,
    env_key,
    multi_node,
    near_files,
    reads_env_key,
    uses_distributed,
)
from ddpdoctor.lint.process_paths import single_process_branch
from ddpdoctor.lint.registry import Hit, rule

# --- DDP024: the world size from Slurm's task or node count ------------------------------------------

_SLURM_NODES = frozenset({"SLURM_NNODES", "SLURM_JOB_NUM_NODES"})
_SLURM_TASKS = frozenset({"SLURM_NTASKS", "SLURM_NPROCS"})
_WORLD_TARGET_RE = re.compile(r"world_size|world|num_replicas|nprocs", re.I)


def _env_keys(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _multiplied(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) for n in ast.walk(node))


def _world_assigns(f: ModuleFacts) -> Iterator[tuple[str, ast.expr, ast.stmt]]:
    for key, values in f.assigns.items():
        if _WORLD_TARGET_RE.search(key.rsplit(".", 1)[-1]):
            for value, stmt in values:
                yield key, value, stmt
    for _base, key, value, stmt in f.env_assigns:
        if key == "WORLD_SIZE":
            yield "os.environ['WORLD_SIZE']", value, stmt


@rule(
    "DDP024",
    "world-size-from-slurm-tasks",
    "world size taken from Slurm's node or task count, without the processes each task starts",
    "world_size = int(os.environ['SLURM_NNODES']) * gpus_per_node (or SLURM_NTASKS when srun starts one task "
    "per GPU, with no mp.spawn)",
    "When each Slurm task (one per node) spawns a process per GPU, the job has tasks x GPUs ranks; "
    "init_process_group(world_size=tasks) then waits for ranks that never come, or rejects rank >= world_size.",
)
def check_world_size_from_slurm(f: ModuleFacts) -> Iterator[Hit]:
    if b"SLURM_" not in f.source:
        return
    spawns = any(cs.qual in _SPAWN_FUNCS for cs in f.calls)
    for key, value, stmt in _world_assigns(f):
        keys = _env_keys(value)
        if _multiplied(value):
            continue
        if keys & _SLURM_NODES:
            which = sorted(keys & _SLURM_NODES)[0]
        elif keys & _SLURM_TASKS and spawns:
            which = sorted(keys & _SLURM_TASKS)[0]
        else:
            continue
        # Reported where the wrong count reaches init_process_group(world_size=...), the line that hangs
        # or raises, when this file passes it there; else at the assignment.
        used = [
            ws
            for init in _init_calls(f)
            if (ws := init.kwarg("world_size")) is not None and dotted(ws) == key and ws.lineno > stmt.lineno
        ]
        yield (
            used[0] if used else stmt,
            f"`{key}` is Slurm's {which} alone (line {stmt.lineno}), but each task starts a process per GPU: "
            "the world size misses the GPUs per task and init_process_group waits for ranks that never come",
        )


# --- DDP025: the world size from the local GPU count on several nodes --------------------------------

_MULTI_NODE_RE = re.compile(rb"node_rank|nnodes|num_nodes|n_nodes|NODE_RANK|SLURM_NODEID|SLURM_PROCID|nodes")


def _device_count(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("cuda.device_count")


def _is_local_count(f: ModuleFacts, node: Optional[ast.AST], line: int) -> bool:
    if node is None or _multiplied(node):
        return False
    if _device_count(node):
        return True
    key = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
    if key:
        value = value_before(f, key, line)
        return value is not None and not _multiplied(value) and _device_count(value)
    return False


@rule(
    "DDP025",
    "world-size-from-device-count",
    "world size set to torch.cuda.device_count() in a multi-node program: it counts this node's GPUs only",
    "world_size = num_nodes * torch.cuda.device_count() (or read WORLD_SIZE from the launcher)",
    "device_count() is the GPUs of one node; on two nodes the group expects half the ranks, so the second "
    "node's ranks are rejected (rank >= world_size) or the rendezvous never completes.",
)
def check_world_size_from_device_count(f: ModuleFacts) -> Iterator[Hit]:
    if not _MULTI_NODE_RE.search(f.source):
        return
    for cs in _init_calls(f):
        ws = cs.arg(3, "world_size")
        if _is_local_count(f, ws, cs.node.lineno) and not _loopback_rendezvous(f, cs):
            yield (
                cs.node,
                "init_process_group(world_size=...) is torch.cuda.device_count(), this node's GPUs, in a "
                "program run on several nodes: the other nodes' ranks do not fit",
            )


_LOOPBACK_RE = re.compile(r"^(?:tcp://)?(?:127\.\d+\.\d+\.\d+|localhost|::1|\[::1\])(?::|$)")


def _loopback_rendezvous(f: ModuleFacts, cs: CallSite) -> bool:
    """The ranks meet at a loopback address (`init_method="tcp://127.0.0.1:12347"`, `os.environ["MASTER_ADDR"]
    = "localhost"`): only processes of one node can, so the node's GPU count is the world (DGL's and PyG's
    multi-GPU examples, held-out lint corpus 11, whose graphs' `num_nodes` read as a node count)."""
    method = cs.arg(1, "init_method")
    if isinstance(method, ast.Constant) and isinstance(method.value, str):
        return bool(_LOOPBACK_RE.match(method.value))
    return any(
        key == "MASTER_ADDR" and isinstance(value, ast.Constant) and isinstance(value.value, str)
        and bool(_LOOPBACK_RE.match(value.value))
        for _base, key, value, _stmt in f.env_assigns
    )


# --- DDP026: an object created on rank 0 only, used on every rank ------------------------------------


class _RankZeroNames:
    """Per function: names bound only inside a rank-0 branch, then read outside any rank check."""

    def __init__(self, f: ModuleFacts) -> None:
        self.f = f
        self.hits: list[tuple[ast.AST, str]] = []

    def scan(self, body: list[ast.stmt], params: Iterable[str] = ()) -> None:
        zero_only: dict[str, int] = {}  # name -> line of its rank-0 assignment
        everywhere: set[str] = set(params)  # every rank has the function's parameters
        self._bind(body, False, zero_only, everywhere)
        for name in everywhere:
            zero_only.pop(name, None)
        if zero_only:
            self._uses(body, False, zero_only, set())

    def _targets(self, stmt: ast.stmt) -> list[str]:
        out: list[str] = []
        targets: list[ast.AST] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = [stmt.target]
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return [(a.asname or a.name).split(".")[0] for a in stmt.names]
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [stmt.name]
        # `opt.hyp = ...` / `d[k] = ...` bind nothing: `opt` is whatever it was before (yolov7's train()
        # parameter, set on rank 0 only as an attribute), so only plain names and their unpacking count.
        while targets:
            t = targets.pop()
            if isinstance(t, ast.Name):
                out.append(t.id)
            elif isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
        return out

    def _bind(
        self, body: list[ast.stmt], zero: bool, zero_only: dict[str, int], everywhere: set[str]
    ) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.Global, ast.Nonlocal)):
                everywhere.update(stmt.names)  # bound elsewhere too
            for name in self._targets(stmt):
                if zero:
                    zero_only.setdefault(name, stmt.lineno)
                else:
                    everywhere.add(name)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(stmt, ast.If):
                kind = classify_guard(stmt.test, self.f.main_vars)
                self._bind(stmt.body, zero or kind == ZERO, zero_only, everywhere)
                self._bind(stmt.orelse, zero or kind == NONZERO, zero_only, everywhere)
                continue
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if isinstance(block, list):
                    self._bind(block, zero, zero_only, everywhere)
            for h in getattr(stmt, "handlers", ()) or ():
                if h.name:
                    everywhere.add(h.name)
                self._bind(h.body, zero, zero_only, everywhere)
            for case in getattr(stmt, "cases", ()) or ():
                self._bind(case.body, zero, zero_only, everywhere)

    def _uses(self, body: list[ast.stmt], zero: bool, zero_only: dict[str, int], checked: set[str]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(stmt, ast.If):
                # `if writer is not None:` / `if writer:`: the code checks for the object itself.
                tested = {n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)}
                if not zero:
                    self._report(stmt.test, zero_only, checked)
                # Inside any other `if`, the use may well be on a path only rank 0 takes (open_clip's
                # evaluation loop reads rank 0's iterator unless FSDP evaluation is on): only uses every
                # rank reaches unconditionally are judged.
                self._uses(stmt.body, True, zero_only, checked | tested)
                self._uses(stmt.orelse, True, zero_only, checked | tested)
                continue
            if not zero:
                for expr in _own_exprs(stmt):
                    self._report(expr, zero_only, checked)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if isinstance(block, list):
                    self._uses(block, zero, zero_only, checked)
            for h in getattr(stmt, "handlers", ()) or ():
                self._uses(h.body, zero, zero_only, checked)
            for case in getattr(stmt, "cases", ()) or ():
                self._uses(case.body, zero, zero_only, checked)

    def _report(self, expr: ast.AST, zero_only: dict[str, int], checked: set[str]) -> None:
        nodes = list(ast.walk(expr))
        # Names a comprehension or `:=` in this very expression binds are not the rank-0 object.
        bound = {
            x.id
            for n in nodes
            if isinstance(n, (ast.comprehension, ast.NamedExpr))
            for x in ast.walk(n.target)
            if isinstance(x, ast.Name)
        }
        for n in nodes:
            if isinstance(n, ast.Name) and n.id in bound:
                continue
            if (
                isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)
                and n.id in zero_only
                and n.id not in checked
                and n.lineno > zero_only[n.id]
            ):
                self.hits.append(
                    (
                        n,
                        f"`{n.id}` is created only on rank 0 (line {zero_only[n.id]}) and used here on every "
                        "rank: NameError on the others",
                    )
                )
                zero_only.pop(n.id)  # one finding per name


_NESTED_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _own_exprs(stmt: ast.stmt) -> Iterator[ast.AST]:
    for field, value in ast.iter_fields(stmt):
        if field in ("body", "orelse", "finalbody", "handlers", "cases", "decorator_list"):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, ast.AST) and not isinstance(item, (ast.Lambda,)):
                yield item


@rule(
    "DDP026",
    "rank-zero-object-used-everywhere",
    "a name bound only on rank 0 is used on every rank: NameError on the other ranks",
    "create it on every rank (`writer = None` first, then `if writer is not None:`), or move the use under "
    "the same rank-0 check",
    "Only rank 0 runs the branch that binds the name; the other ranks reach the use with the name unbound "
    "and die with NameError (or UnboundLocalError), which the survivors see as a hang in the next collective.",
)
def check_rank_zero_object(f: ModuleFacts) -> Iterator[Hit]:
    if not uses_distributed(f) and f.project is None:
        return
    if not f.main_vars and b"rank" not in f.source and b"main" not in f.source and b"master" not in f.source:
        return
    checker = _RankZeroNames(f)
    for scope in f.scopes:
        # Only functions with a call under a rank-0 check (an object is created by a call): the others
        # cannot bind a name on rank 0 alone that matters here, and the walk below is not free.
        if not any(cs.guarded or (cs.rank_if is not None and cs.rank_if.kind == ZERO) for cs in scope.calls):
            continue
        if not scope.is_module and callers_of(f, scope) and rank_zero_only(f, scope):
            # Every call of it is itself under a rank-0 check (Latte's create_tensorboard(), called in train.py's
            # `if rank == 0:` only; held-out lint corpus 16): no other rank runs it to reach the use.
            continue
        body = getattr(scope.node, "body", None)
        if isinstance(body, list):
            args = getattr(scope.node, "args", None)
            params = (
                [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a]
                if isinstance(args, ast.arguments)
                else []
            )
            checker.scan(body, params)
    yield from checker.hits
    if b"self." in f.source:
        for cls in ast.walk(f.tree):
            if isinstance(cls, ast.ClassDef):
                yield from _rank_zero_attributes(f, cls)


def _self_attr(node: ast.AST) -> str:
    """"x" for `self.x`, else ""."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return ""


def _branch_walk(f: ModuleFacts, body: list[ast.stmt], side: str, tests: tuple[ast.AST, ...]):
    """(statement, which ranks run it: "all" / ZERO / NONZERO, the `if` tests around it) for a method body."""
    for st in body:
        yield st, side, tests
        if isinstance(st, ast.If):
            kind = classify_guard(st.test, f.main_vars)
            inner = tests + (st.test,)
            if kind is None:
                yield from _branch_walk(f, st.body, side, inner)
                yield from _branch_walk(f, st.orelse, side, inner)
            else:
                other = NONZERO if kind == ZERO else ZERO
                yield from _branch_walk(f, st.body, kind if side == "all" else side, inner)
                yield from _branch_walk(f, st.orelse, other if side == "all" else side, inner)
                # `if not is_primary_worker(): return` (ParlAI's save_model): the rest runs on the other side.
                if side == "all" and ends_in_exit(st.body) and not st.orelse:
                    side = other
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            yield from _branch_walk(f, st.body, side, tests)
            yield from _branch_walk(f, getattr(st, "orelse", []), side, tests)
        elif isinstance(st, ast.Try):
            for part in (st.body, st.orelse, st.finalbody, *[h.body for h in st.handlers]):
                yield from _branch_walk(f, part, side, tests)


def _rank_zero_attributes(f: ModuleFacts, cls: ast.ClassDef) -> Iterator[Hit]:
    """`self.x = ...` only inside rank-0 branches of the class's methods, then `self.x` read in a method
    every rank runs, outside any rank check and any test of `x` itself: AttributeError on the other ranks
    (held-out corpus 5: YOLOX's `self.mlflow_logger`, created under `if self.rank == 0:` in before_train(),
    used under `if self.args.logger == "mlflow":` in evaluate_and_save_model())."""
    methods = [m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    declared = {
        t.id
        for st in cls.body
        if isinstance(st, (ast.Assign, ast.AnnAssign))
        for t in (st.targets if isinstance(st, ast.Assign) else [st.target])
        if isinstance(t, ast.Name)
    }
    zero: dict[str, int] = {}
    # Class attributes and methods (a `@property` such as composer's `neptune_run`) exist on every rank.
    everywhere: set[str] = declared | {m.name for m in methods}
    for m in methods:
        for st, side, _ in _branch_walk(f, m.body, "all", ()):
            targets: list[ast.AST] = []
            if isinstance(st, ast.Assign):
                # `self.x = ...` and `self.x, self.y = ...`; not `self.x[k] = ...`, which reads self.x.
                targets = [
                    n for t in st.targets for n in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
                ]
            elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
                targets = [st.target]
            for t in targets:
                name = _self_attr(t)
                if not name:
                    continue
                if side == ZERO:
                    zero.setdefault(name, st.lineno)
                else:
                    everywhere.add(name)
    # Attributes looked up by name (`getattr(self, "x", None)`, `hasattr`) or set by setattr: handled.
    text = f.source
    for name in list(zero):
        if name in everywhere or f'"{name}"'.encode() in text or f"'{name}'".encode() in text:
            zero.pop(name)
    if not zero:
        return
    for m in methods:
        callers = f.callers.get(m.name, ())
        if callers and all(c.guarded or (c.rank_if is not None and c.rank_if.kind == ZERO) for c in callers):
            continue  # a method only rank 0 calls
        for st, side, tests in _branch_walk(f, m.body, "all", ()):
            if side != "all" or isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                continue  # (compound statements: their own lines are walked as statements)
            tested = {_self_attr(n) for t in tests for n in ast.walk(t)}
            for n in ast.walk(st):
                name = _self_attr(n)
                if name in zero and isinstance(n.ctx, ast.Load) and name not in tested:  # type: ignore[attr-defined]
                    yield (
                        n,
                        f"`self.{name}` is set only on rank 0 (line {zero[name]}) and used here on every "
                        "rank: AttributeError on the others",
                    )
                    zero.pop(name)
                    if not zero:
                        return


# --- DDP027: a CPU tensor handed to an NCCL collective -----------------------------------------------

_FACTORIES = frozenset(
    {
        "tensor",
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "as_tensor",
        "from_numpy",
        "rand",
        "randn",
        "randint",
        "Tensor",
        "FloatTensor",
        "LongTensor",
        "IntTensor",
        "DoubleTensor",
        "BoolTensor",
        "ByteTensor",
        "HalfTensor",
    }
)
# Methods that keep a tensor where it is: `torch.tensor(x).float()` is still on the CPU.
_KEEPS_DEVICE = frozenset(
    {
        "float",
        "long",
        "int",
        "double",
        "half",
        "bool",
        "view",
        "reshape",
        "unsqueeze",
        "squeeze",
        "contiguous",
        "clone",
        "detach",
        "flatten",
    }
)
_TENSOR_ARGS: dict[str, tuple[int, str]] = {
    "all_reduce": (0, "tensor"),
    "all_gather": (1, "tensor"),
    "broadcast": (0, "tensor"),
    "reduce": (0, "tensor"),
    "all_gather_into_tensor": (1, "input_tensor"),
    "reduce_scatter_tensor": (1, "input"),
}


def _nccl_program(f: ModuleFacts) -> bool:
    from ddpdoctor.lint.device_rules import _mentions_nccl

    files = [f] if f.project is None else [g for _, g in f.project.files]  # type: ignore[attr-defined]
    return any(_mentions_nccl(cs.arg(0, "backend"), g) for g in files for cs in _init_calls(g))


def _cpu_factory(node: Optional[ast.AST]) -> bool:
    """torch.tensor([...]) / torch.zeros(n) with no device= (and not moved by .cuda() / .to(...)); both
    branches of `(torch.tensor(data) if rank == 0 else torch.zeros(n))`, the usual way to broadcast from
    rank 0 (WongKinYiu/yolov7 train.py's image-weight indices)."""
    if isinstance(node, ast.IfExp):
        return _cpu_factory(node.body) and _cpu_factory(node.orelse)
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if (
        isinstance(func, ast.Attribute)
        and func.attr in _KEEPS_DEVICE
        and isinstance(func.value, (ast.Call, ast.IfExp))
    ):
        return _cpu_factory(func.value)  # torch.tensor([n]).long()
    q = dotted(node.func) or ""
    if not (q.startswith("torch.") and q.rsplit(".", 1)[-1] in _FACTORIES):
        return False
    if q.startswith("torch.cuda."):
        return False  # torch.cuda.ByteTensor(...) is a CUDA tensor (NVIDIA/apex contrib/groupbn)
    return not any(kw.arg in ("device", None) for kw in node.keywords)


def _moved_after(
    scope_calls: list[CallSite], name: str, start: tuple[int, int], end: tuple[int, int]
) -> bool:
    for c in scope_calls:
        if start < c.pos < end and c.attr in ("cuda", "to") and (c.raw or "").startswith(name + "."):
            return True
    return False


@rule(
    "DDP027",
    "cpu-tensor-nccl-collective",
    "a CPU tensor handed to a collective on an NCCL process group",
    "create it on the GPU (torch.tensor(x, device=device)) or move it (.cuda()) before the collective",
    "NCCL only moves CUDA tensors: a CPU tensor raises 'No backend type associated with device type cpu' "
    "(or, on older releases, an invalid-argument NCCL error) on every rank.",
)
def check_cpu_tensor_collective(f: ModuleFacts) -> Iterator[Hit]:
    if not any(cs.attr in _TENSOR_ARGS for cs in f.calls) or not _nccl_program(f):
        return
    for cs in f.calls:
        if cs.attr not in _TENSOR_ARGS or cs.attr not in COLLECTIVE_NAMES:
            continue
        if not cs.qual.startswith("torch.distributed."):
            continue
        if cs.kwarg("group") is not None:
            continue  # a gloo group for CPU tensors, often
        tensor = cs.arg(*_TENSOR_ARGS[cs.attr])
        if tensor is None:
            continue
        if _cpu_factory(tensor):
            yield cs.node, f"{cs.attr}() of a tensor created on the CPU, on an NCCL process group"
            continue
        key = dotted(tensor) if isinstance(tensor, ast.Name) else None
        if not key:
            continue
        assigned = (
            [
                (stmt, value)
                for value, stmt in f.assigns.get(key, ())
                if stmt.lineno <= cs.node.lineno
                and cs.scope.node.lineno <= stmt.lineno <= cs.scope.node.end_lineno  # type: ignore[attr-defined,operator]
            ]
            if not cs.scope.is_module
            else [(stmt, value) for value, stmt in f.assigns.get(key, ()) if stmt.lineno <= cs.node.lineno]
        )
        if not assigned:
            continue
        stmt, value = max(assigned, key=lambda sv: sv[0].lineno)
        if _cpu_factory(value) and not _moved_after(cs.scope.calls, key, (stmt.lineno, 0), cs.pos):
            yield (
                cs.node,
                f"{cs.attr}() of `{key}`, created on the CPU (line {stmt.lineno}), on an NCCL process group",
            )


# --- DDP028: a DistributedSampler seeded differently on each rank ------------------------------------

_RANDOM_SEED_RE = re.compile(r"^(?:randint|random|time|time_ns|getrandbits|urandom|seed)$")


def _random_fallback(f: ModuleFacts, key: str, cs: CallSite) -> int:
    """The line of `seed = random.randint(...)` above the sampler in its function, a fallback when the
    config gives no seed (held-out review of 2026-11-27: KAIR's `if seed is None: seed =
    random.randint(1, 10000)`), unless the value is broadcast before the sampler; else 0."""
    line = cs.node.lineno
    for value, stmt in f.assigns.get(key, ()):
        if stmt.lineno >= line or enclosing_scope(f, stmt.lineno) is not cs.scope:
            continue
        if any(
            isinstance(n, ast.Call) and _RANDOM_SEED_RE.match((dotted(n.func) or "").rsplit(".", 1)[-1])
            for n in ast.walk(value)
        ):
            shared = any(
                c.attr in ("broadcast", "broadcast_object_list", "bcast", "all_reduce")
                and stmt.lineno < c.node.lineno < line
                for c in cs.scope.calls
            )
            return 0 if shared else stmt.lineno
    return 0


@rule(
    "DDP028",
    "sampler-seed-per-rank",
    "DistributedSampler(seed=...) differs by rank: the ranks shuffle differently and their shards overlap",
    "pass the same seed on every rank (seed=args.seed), never seed + rank or a random one",
    "Every rank shuffles the whole dataset with the sampler's seed and takes its slice; with a different "
    "seed per rank the slices overlap and some samples are never seen in an epoch.",
)
def check_sampler_seed_per_rank(f: ModuleFacts) -> Iterator[Hit]:
    for cs in f.calls_named("DistributedSampler"):
        seed = cs.kwarg("seed")
        if seed is None:
            seed = cs.arg(4, "seed")
        if seed is None:
            continue
        why = None
        if mentions_rank(seed):
            why = "depends on the rank"
        elif any(
            isinstance(n, ast.Call) and _RANDOM_SEED_RE.match((dotted(n.func) or "").rsplit(".", 1)[-1])
            for n in ast.walk(seed)
        ):
            why = "is drawn at random in each process"
        else:
            key = dotted(seed) if isinstance(seed, (ast.Name, ast.Attribute)) else None
            value = value_before(f, key, cs.node.lineno) if key else None
            if value is not None and mentions_rank(value):
                why = f"depends on the rank (`{key}`, line {value.lineno})"
            elif key and _random_fallback(f, key, cs):
                why = (
                    f"is drawn at random in each process when the config has none (`{key}`, line "
                    f"{_random_fallback(f, key, cs)})"
                )
            elif isinstance(seed, ast.Name):
                # build_loader(ds, seed=args.seed + rank): the parameter holds what the callers pass.
                passed = parameter_values(f, cs.scope, seed.id) or []
                ranked = next((v for v in passed if mentions_rank(v)), None)
                if ranked is not None:
                    why = f"depends on the rank (`{seed.id}` is passed the rank on line {ranked.lineno})"
        if why:
            yield (
                cs.node,
                f"DistributedSampler seed {why}: the ranks' shards overlap and some samples are skipped",
            )


# --- DDP032: MASTER_ADDR fixed to one host, or to each task's own ------------------------------------

_LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1", "0.0.0.0"})
_OWN_HOST_CALLS = frozenset({"gethostname", "getfqdn", "node", "uname"})


# Launchers that start every task themselves and set no MASTER_ADDR (mpirun, srun), and what says an MPI
# job spans nodes: it reads the node-local process count apart from the world size.
_SELF_LAUNCHED_RE = re.compile(rb"SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK|MV2_COMM_WORLD_RANK")
_MPI_LOCAL_SIZE_RE = re.compile(rb"OMPI_COMM_WORLD_LOCAL_SIZE|MPI_LOCALNRANKS|MV2_COMM_WORLD_LOCAL_SIZE")


def _own_host(f: ModuleFacts, value: ast.AST) -> bool:
    """`socket.gethostname()`, `platform.node()`, `os.uname()[1]`, `os.environ["HOSTNAME"]`: the host of
    the task that runs it, different on every node."""
    for n in ast.walk(value):
        if isinstance(n, ast.Call):
            qual = f.resolve(n.func)
            if qual.split(".")[-1] in _OWN_HOST_CALLS and qual.split(".")[0] in ("socket", "platform", "os"):
                return True
        if isinstance(n, ast.Constant) and n.value == "HOSTNAME":
            return True
    return False


@rule(
    "DDP032",
    "hard-coded-master-addr",
    "MASTER_ADDR is a fixed host or each task's own hostname in code run on several nodes",
    "take MASTER_ADDR from the launcher (torchrun --rdzv-endpoint, or the first host of "
    "`scontrol show hostnames $SLURM_JOB_NODELIST` under Slurm); never a literal or the task's own name",
    "Every rank must dial the same address: rank 0's host. A literal IP is right on one cluster only, and "
    "each task's own hostname points every node at itself, so the ranks never meet and init hangs.",
)
def check_hard_coded_master_addr(f: ModuleFacts) -> Iterator[Hit]:
    if b"MASTER_ADDR" not in f.source or not (multi_node(f) or _MPI_LOCAL_SIZE_RE.search(f.source)):
        return
    self_launched = bool(_SELF_LAUNCHED_RE.search(f.source))
    for base, key, value, stmt in f.env_assigns:
        if key != "MASTER_ADDR" or f.resolve_dotted(base) != "os.environ":
            continue
        if id(stmt) in f.env_defaults:
            # A loopback default is harmless under torchrun (which always sets the key), but under mpirun
            # or srun nothing sets it, so on several nodes each node dials itself (held-out review of
            # 2026-11-27: dlrm's `if not os.environ.get("MASTER_ADDR"): ... = "127.0.0.1"`).
            if (
                self_launched
                and isinstance(value, ast.Constant)
                and isinstance(value.value, str)
                and value.value.strip().lower() in _LOCAL_HOSTS
            ):
                yield stmt, (
                    f"MASTER_ADDR defaults to {value.value!r} when unset, in code started by mpirun/srun on "
                    "several nodes (which set no MASTER_ADDR): every node dials itself and init hangs"
                )
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if value.value.strip().lower() not in _LOCAL_HOSTS:
                yield stmt, (
                    "MASTER_ADDR hard-coded to one host in code written for several nodes: on any other "
                    "machine or allocation the ranks dial a host that is not rank 0's and init hangs"
                )
        elif _own_host(f, value):
            yield stmt, (
                "MASTER_ADDR set to each task's own hostname: on several nodes every node rendezvous with "
                "itself instead of rank 0's host, and init hangs"
            )


# --- DDP033: an init_process_group failure swallowed into a one-process run --------------------------

# Handlers for these only catch an API difference (a keyword older torch lacks), not a failed rendezvous.
# Errors init_process_group does not raise (it raises RuntimeError, DistStoreError, ValueError, TimeoutError):
# a handler for these catches the code around it, e.g. fairchem's `except FileNotFoundError:  # Slurm is not
# installed` around an `scontrol` call (held-out corpus 7).
_NARROW_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "AttributeError", "TypeError", "KeyError",
                            "FileNotFoundError", "CalledProcessError"})
_EXITS = frozenset({"exit", "_exit", "abort", "init_process_group"})


def _swallows(handler: ast.ExceptHandler) -> bool:
    caught = [] if handler.type is None else handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    if caught and all(dotted(c) is not None and dotted(c).split(".")[-1] in _NARROW_ERRORS for c in caught):  # type: ignore[union-attr]
        return False
    for n in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(n, ast.Raise):
            return False
        if isinstance(n, ast.Call) and (dotted(n.func) or "").split(".")[-1] in _EXITS:
            return False  # exits, or retries the init another way
    return True


def _retried_then_raised(function: ast.AST, attempt: ast.Try) -> bool:
    """`attempt` sits in a loop of `function` that retries the init (another port, a pause), and a `raise`
    after the try (later in the loop, the loop's `else:`, or after the loop) ends the run when no try succeeded:
    a failed rendezvous stops the job, only later (held-out lint corpus 16, openai/phasic-policy-gradient's
    `for i in range(attempts): ... else: raise RuntimeError("Failed to init on any port")`)."""
    end = attempt.end_lineno or attempt.lineno
    for loop in ast.walk(function):
        if not isinstance(loop, (ast.For, ast.While)) or not any(n is attempt for n in ast.walk(loop)):
            continue
        if any(isinstance(n, ast.Raise) and n.lineno > end for n in ast.walk(loop)):
            return True
        # `if not dist.is_initialized(): raise ...` after the loop.
        loop_end = loop.end_lineno or loop.lineno
        return any(
            isinstance(n, ast.If) and n.lineno > loop_end and "is_initialized" in ast.unparse(n.test)
            and any(isinstance(r, ast.Raise) for st in n.body for r in ast.walk(st))
            for n in ast.walk(function)
        )
    return False


@rule(
    "DDP033",
    "init-failure-swallowed",
    "an init_process_group failure is caught and the run goes on without a process group",
    "let the exception propagate (or re-raise after logging): a rank that cannot join must stop the job",
    "When the rendezvous fails on some ranks (port taken, wrong address, timeout), the handler turns each "
    "into a world of one: they train alone as rank 0, write the same checkpoints, and the job looks healthy.",
)
def check_init_failure_swallowed(f: ModuleFacts) -> Iterator[Hit]:
    inits = [cs for cs in _init_calls(f) if cs.qual.startswith("torch.distributed.")]
    if not inits:
        return
    for scope in {id(cs.scope): cs.scope for cs in inits}.values():
        for n in ast.walk(scope.node):
            if not isinstance(n, ast.Try) or isinstance(n, _NESTED_DEFS):
                continue
            first, last = n.body[0].lineno, n.body[-1].end_lineno or n.body[-1].lineno
            if not any(cs.scope is scope and first <= cs.node.lineno <= last for cs in inits):
                continue
            if _retried_then_raised(scope.node, n):
                continue  # a retry loop that raises when every try failed (openai/phasic-policy-gradient)
            for h in n.handlers:
                if _swallows(h):
                    yield h, (
                        f"init_process_group() (line {first}-{last}) failing is caught here and the run "
                        "goes on: each rank that could not join trains alone as a world of one"
                    )


# --- DDP034: a free port probed by every task on its own -----------------------------------------------

_PORT_PROBE_RE = re.compile(r"free_port|unused_port|open_port|port_(?:is_)?free|port_(?:is_)?available|port_in_use")
_SHARES = frozenset({"broadcast", "broadcast_object_list", "bcast", "all_reduce"})


@rule(
    "DDP034",
    "free-port-per-task",
    "each task picks MASTER_PORT by probing for a free port on its own host",
    "pick the port once (the launch script, or rank 0 before spawning) and pass it to every task; under "
    "Slurm derive it from SLURM_JOB_ID, never probe in each task",
    "srun and mpirun start every task themselves; a probe on each host can answer differently (rank 0's "
    "store already holds the port, or another job does on one node), so tasks dial different ports and "
    "the rendezvous hangs.",
)
def check_free_port_per_task(f: ModuleFacts) -> Iterator[Hit]:
    if b"MASTER_PORT" not in f.source or not _SELF_LAUNCHED_RE.search(f.source):
        return
    port_scopes = {
        id(enclosing_scope(f, stmt.lineno))
        for base, key, _v, stmt in f.env_assigns
        if key == "MASTER_PORT" and f.resolve_dotted(base) == "os.environ"
    }
    for scope in f.scopes:
        if id(scope) not in port_scopes:
            continue
        # The probe runs where each task reads its own launcher rank (srun/mpirun), not in a parent.
        if not _SELF_LAUNCHED_RE.search(ast.unparse(scope.node).encode()):
            continue
        if any(cs.attr in _SHARES for cs in scope.calls):
            continue
        probes = [cs for cs in scope.calls
                  if _PORT_PROBE_RE.search(cs.attr.lower()) and not single_process_branch(f, cs)]
        if probes:
            first = min(probes, key=lambda cs: cs.node.lineno)
            yield first.node, (
                f"{first.attr}() decides MASTER_PORT in every task on its own host: tasks can pick "
                "different ports and never meet"
            )


# --- DDP044: the launcher's rendezvous address replaced under torchrun -----------------------------------

# Set by the process itself: then no launcher set the rank (an agent-less or Slurm launch), and the
# script's MASTER_ADDR/MASTER_PORT is its own rendezvous.
_OWN_RANK_KEYS = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK"})
_OTHER_LAUNCHER_RE = re.compile(rb"SLURM_|OMPI_COMM_WORLD|PMI_RANK|MPI_LOCALRANKID|MV2_COMM_WORLD")


def _inside_if(tree: ast.AST, stmt: ast.stmt) -> bool:
    """`stmt` sits in the body or else-branch of an `if` (a condition decides whether it runs)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(
            s is stmt for b in (node.body, node.orelse) for s in ast.walk(ast.Module(body=b, type_ignores=[]))
        ):
            return True
    return False


@rule(
    "DDP044",
    "torchrun-rendezvous-overwritten",
    "MASTER_ADDR/MASTER_PORT overwritten in a program torchrun launches: the ranks wait for a store nobody serves",
    "do not set MASTER_ADDR/MASTER_PORT when torchrun launches the program (it exports them); for a launch "
    "without torchrun keep a default with os.environ.setdefault(...)",
    "torchrun's workers join the agent's own TCPStore at the MASTER_ADDR:MASTER_PORT it exported "
    "(TORCHELASTIC_USE_AGENT_STORE); a script that replaces them sends every rank to a port nobody listens on, "
    "and init_process_group times out (DistNetworkError). Checked with torch 2.13 under `torchrun --standalone`.",
)
def check_torchrun_rendezvous_overwritten(f: ModuleFacts) -> Iterator[Hit]:
    assigns = [(key, stmt) for base, key, _, stmt in f.env_assigns
               if key in ("MASTER_ADDR", "MASTER_PORT") and f.resolve_dotted(base) == "os.environ"
               and id(stmt) not in f.env_defaults]
    if not assigns or _OTHER_LAUNCHER_RE.search(f.source):
        return
    if f.imports_prefix("deepspeed"):
        return  # the deepspeed launcher sets LOCAL_RANK too, and its ranks host their own store
    # This file and those it calls into or is called from: a tutorial repository holds an mp.spawn script
    # beside its torchrun one.
    program = near_files(f)
    # torchrun sets LOCAL_RANK; a program that reads it and neither starts its own processes nor sets its
    # own RANK/WORLD_SIZE is one torchrun (or `torch.distributed.launch --use-env`) starts.
    if not any(reads_env_key(g, "LOCAL_RANK") for g in program):
        return
    if any(cs.qual in _SPAWN_FUNCS for g in program for cs in g.calls):
        return
    if any(key in _OWN_RANK_KEYS for g in program for _, key, _, _ in g.env_assigns):
        return
    # One finding per function: the port when it is set (the address alone may still reach the agent's store).
    seen: set[int] = set()
    for key, stmt in sorted(assigns, key=lambda a: a[0] != "MASTER_PORT"):
        scope = enclosing_scope(f, stmt.lineno)
        if _inside_if(f.tree, stmt) or id(scope) in seen:
            continue  # a branch for another launch decides it
        seen.add(id(scope))
        yield stmt, (f"{key} overwritten in a program torchrun launches (it reads LOCAL_RANK): the ranks look for "
                     "the rendezvous store there instead of torchrun's, and init_process_group times out")


# --- DDP051: the local rank handed to init_process_group as the global rank -----------------------------------


def _is_local_rank(f: ModuleFacts, value: ast.AST) -> bool:
    """The value is the local rank itself (not a global rank computed from it): `int(os.environ["LOCAL_RANK"])`,
    `args.local_rank`."""
    while isinstance(value, ast.Call) and final_identifier(value.func) == "int" and value.args:
        value = value.args[0]
    if env_key(f, value) in ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"):
        return True
    return isinstance(value, (ast.Name, ast.Attribute)) and final_identifier(value).lower() in ("local_rank",)


def _local_rank_origin(f: ModuleFacts, expr: ast.AST, scope: Any, depth: int = 0) -> Optional[ast.AST]:
    """Where the rank handed to init_process_group is the local rank: the expression, or the assignment of the
    name it is (followed through this file's assignments and the arguments callers pass for a parameter)."""
    if depth > 3 or expr is None:
        return None
    if isinstance(expr, ast.Name) and scope is not None and not scope.is_module:
        # A name bound in this function says what it holds by its value, not its name: DPR's `local_rank`
        # unpacked from `_infer_slurm_init(cfg)`, which returns SLURM_PROCID (held-out lint corpus 13).
        here = [(value, stmt) for value, stmt in f.assigns.get(expr.id, ())
                if enclosing_scope(f, stmt.lineno) is scope]
        if here:
            return next((stmt for value, stmt in here if _is_local_rank(f, value)), None)
        if any(isinstance(n, ast.Name) and n.id == expr.id and isinstance(n.ctx, ast.Store)
               for n in ast.walk(scope.node)):
            return None  # unpacked from a call's tuple, a loop or a `with`: what it holds is not its name
    if _is_local_rank(f, expr):
        return expr
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return None
    key = dotted(expr)
    for value, stmt in f.assigns.get(key or "", ()):
        # A bare name is the one assigned in this function or at module level, not a namesake in another
        # function (held-out corpus 12, tdfo: main()'s `rank = int(os.environ["LOCAL_RANK"])` for the device,
        # run_local()'s `rank` the spawn index); attributes (`args.rank`) travel between functions.
        where = enclosing_scope(f, stmt.lineno)
        if isinstance(expr, ast.Name) and scope is not None and not where.is_module and where is not scope:
            continue
        if _is_local_rank(f, value):
            return stmt
    if isinstance(expr, ast.Name) and scope is not None and not scope.is_module:
        for value in parameter_values(f, scope, expr.id) or ():
            found = _local_rank_origin(f, value, f.module, depth + 1)
            if found is not None:
                return found
    return None


def _world_is_this_node(f: ModuleFacts, world: Optional[ast.AST]) -> bool:
    """The world size given to init_process_group is this node's GPU count (`world_size=args.nprocs` after
    `args.nprocs = torch.cuda.device_count()`): a one-node program by construction, where the local index is
    the global rank (held-out corpus 12: rentainhe/pytorch-distributed-training's mp.spawn scripts)."""
    for _ in range(3):
        if world is None:
            return False
        if isinstance(world, ast.Call):
            return final_identifier(world.func) == "device_count"
        key = dotted(world) if isinstance(world, (ast.Name, ast.Attribute)) else None
        values = [v for v, _ in f.assigns.get(key or "", ())]
        if len(values) > 1 and all(isinstance(v, ast.Call) and final_identifier(v.func) == "device_count"
                                   for v in values):
            return True  # the same count read in several functions (agiresearch/OpenP5, held-out corpus 14)
        if len(values) != 1:
            return False
        world = values[0]
    return False


_NODE_WORLD = re.compile(r"LOCAL_WORLD_SIZE|local_world_size|nproc_per_node|ngpus|gpus_per_node|device_count",
                         re.IGNORECASE)


@rule(
    "DDP051",
    "local-rank-as-global-rank",
    "the local rank (LOCAL_RANK, this node's process index) is passed to init_process_group as the global "
    "rank: on more than one node several processes claim the same rank",
    "pass the global rank: rank = int(os.environ[\"RANK\"]) (torchrun sets both; use LOCAL_RANK only to pick "
    "the GPU), or let init_process_group read RANK from the environment",
    "LOCAL_RANK counts the processes of one node (0..nproc_per_node-1); RANK counts the whole job. On one "
    "node they are equal, so the script works; on two nodes both nodes' first processes register as rank 0 "
    "and the rendezvous fails (`rank 0 already registered`) or hangs, or ranks pair up wrongly.",
)
def check_local_rank_as_global_rank(f: ModuleFacts) -> Iterator[Hit]:
    if b"init_process_group" not in f.source or not (b"LOCAL_RANK" in f.source or b"local_rank" in f.source):
        return
    seen: set[int] = set()
    for cs in _init_calls(f):
        rank = cs.arg(4, "rank")
        if rank is None or _world_is_this_node(f, cs.arg(3, "world_size")):
            continue
        origin = _local_rank_origin(f, rank, cs.scope)
        if origin is None or id(origin) in seen:
            continue  # (one finding for the gloo and nccl branches of one setup)
        seen.add(id(origin))
        yield (
            origin,
            f"`{ast.unparse(rank)}` handed to init_process_group(rank=...) on line {cs.node.lineno} is the local "
            "rank: on several nodes every node's first process claims rank 0",
        )
    # The same index given to a DistributedSampler that splits the data over the whole job (held-out lint corpus
    # 13: the local rank as the shard index): every node's processes read the same shards.
    for cs in f.calls_named("DistributedSampler"):
        rank, replicas = cs.arg(2, "rank"), cs.arg(1, "num_replicas")
        if rank is None or _world_is_this_node(f, replicas) or (
                replicas is not None and _NODE_WORLD.search(ast.unparse(replicas))):
            continue  # a split over this node's processes only: the local index is the right one
        origin = _local_rank_origin(f, rank, cs.scope)
        if origin is None or id(origin) in seen:
            continue
        seen.add(id(origin))
        yield (
            cs.node,
            f"`{ast.unparse(rank)}` handed to DistributedSampler(rank=...) is the local rank: on several nodes "
            "the processes of every node read the same shards, and the other nodes' shares are never read",
        )
