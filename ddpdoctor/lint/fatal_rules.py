"""Rules for code that cannot do what it says on any launch (classes the held-out corpus 5 found missed):
DDP036 (a rendezvous port outside 1..65535), DDP037 (a gradient-averaging loop whose test is never
true, so the ranks never synchronise) and DDP040 (a rank or world size read under a name nothing binds).
Registered through ruleset.py.

Each reads a literal fact of the code, not its context: the port is a number, the test compares the
exact type of an `nn.Parameter`, Python's own scoping says the name is unbound. So all belong to the
default tier.
"""

from __future__ import annotations

import ast
import builtins
import re
from typing import Iterator, Optional

from ddpdoctor.lint.facts import ModuleFacts, dotted, final_identifier, is_rank_identifier
from ddpdoctor.lint.helpers import COLLECTIVE_NAMES, uses_distributed
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import _init_method_ports, _literal_port

# --- DDP036: a port outside 1..65535 -----------------------------------------------------------------

_MAX_PORT = 65535


def _out_of_range(port: Optional[int]) -> bool:
    return port is not None and port > _MAX_PORT


def _env_port_values(f: ModuleFacts) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(where, value) of every MASTER_PORT the code sets: `os.environ["MASTER_PORT"] = v` (a default under
    `if "MASTER_PORT" not in os.environ` too: an out-of-range default fails the same way),
    `os.environ.setdefault("MASTER_PORT", v)` and `os.environ.update(MASTER_PORT=v)`."""
    for base, key, value, stmt in f.env_assigns:
        if key == "MASTER_PORT" and f.resolve_dotted(base) == "os.environ":
            yield stmt, value
    for cs in f.calls:
        if cs.qual == "os.environ.setdefault" and len(cs.node.args) == 2:
            k = cs.node.args[0]
            if isinstance(k, ast.Constant) and k.value == "MASTER_PORT":
                yield cs.node, cs.node.args[1]
        elif cs.qual == "os.environ.update":
            for kw in cs.node.keywords:
                if kw.arg == "MASTER_PORT":
                    yield cs.node, kw.value
            for a in cs.node.args:
                if isinstance(a, ast.Dict):
                    for k, v in zip(a.keys, a.values):
                        if isinstance(k, ast.Constant) and k.value == "MASTER_PORT":
                            yield cs.node, v


@rule(
    "DDP036",
    "port-out-of-range",
    "rendezvous port outside 1..65535: no process can listen on it, and init fails on every launch",
    "use a port in 1024..65535 (29500 is torch's default), or read MASTER_PORT from the launcher",
    "A TCP port is 16 bits. PyTorch's TCPStore rejects a larger number when init_process_group builds the "
    "store (older versions truncate it silently to another port), so every run fails, or meets on a port "
    "nobody chose.",
)
def check_port_out_of_range(f: ModuleFacts) -> Iterator[Hit]:
    for where, value in _env_port_values(f):
        port = _literal_port(value)
        if _out_of_range(port):
            yield where, f"MASTER_PORT set to {port}, above 65535: the rendezvous store cannot listen on it"
    for where, port, key, init_line in _init_method_ports(f):
        if not _out_of_range(port):
            continue
        if key is None:
            yield where, f"init_method uses port {port}, above 65535: the rendezvous cannot listen on it"
        else:
            yield (
                where,
                f"`{key}` uses port {port}, above 65535, and is passed to init_method (line "
                f"{init_line}): the rendezvous cannot listen on it",
            )
    for cs in f.calls_named("TCPStore"):
        port = _literal_port(cs.arg(1, "port"))
        if _out_of_range(port):
            yield cs.node, f"TCPStore port {port} is above 65535: the store cannot listen on it"


# --- DDP037: gradient averaging behind a type test that is never true --------------------------------


def _exact_tensor_test(f: ModuleFacts, test: ast.AST, var: str) -> bool:
    """`type(p) is torch.Tensor` / `type(p) == torch.Tensor`: False for every `nn.Parameter`, a subclass
    (unlike `isinstance(p, torch.Tensor)`, which is True)."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    if not isinstance(test.ops[0], (ast.Is, ast.Eq)):
        return False
    left, right = test.left, test.comparators[0]
    if isinstance(right, ast.Call):
        left, right = right, left
    if not (
        isinstance(left, ast.Call)
        and isinstance(left.func, ast.Name)
        and left.func.id == "type"
        and len(left.args) == 1
        and dotted(left.args[0]) == var
    ):
        return False
    return f.resolve(right) == "torch.Tensor"


def _parameter_loop_var(loop: ast.For) -> Optional[str]:
    """The parameter's name in `for p in model.parameters()` / `for name, p in m.named_parameters()`."""
    it = loop.iter
    if not isinstance(it, ast.Call):
        return None
    kind = final_identifier(it)
    if kind == "parameters" and isinstance(loop.target, ast.Name):
        return loop.target.id
    if kind == "named_parameters" and isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2:
        second = loop.target.elts[1]
        return second.id if isinstance(second, ast.Name) else None
    return None


@rule(
    "DDP037",
    "gradient-sync-never-runs",
    "gradients averaged only when `type(p) is torch.Tensor`, which no parameter is: the collective never "
    "runs and every rank trains its own model",
    "drop the test (every parameter is a tensor), or use `if p.grad is not None:`",
    "Model parameters are `nn.Parameter`, a subclass of Tensor: `type(p) is torch.Tensor` is False for "
    "every one of them, so the all_reduce inside never runs, no error is raised, and the ranks drift "
    "apart while each trains on its own shard.",
)
def check_gradient_sync_never_runs(f: ModuleFacts) -> Iterator[Hit]:
    if b"type(" not in f.source or b"parameters(" not in f.source:
        return
    for loop in ast.walk(f.tree):
        if not isinstance(loop, ast.For):
            continue
        var = _parameter_loop_var(loop)
        if var is None:
            continue
        for node in ast.walk(loop):
            if not isinstance(node, ast.If) or not _exact_tensor_test(f, node.test, var):
                continue
            collective = next(
                (
                    c
                    for st in node.body
                    for c in ast.walk(st)
                    if isinstance(c, ast.Call) and final_identifier(c) in COLLECTIVE_NAMES
                ),
                None,
            )
            if collective is not None:
                yield (
                    node,
                    f"`type({var}) is torch.Tensor` is never true for a parameter (nn.Parameter): the "
                    f"{final_identifier(collective)}() on line {collective.lineno} never runs and the ranks "
                    "never synchronise",
                )


# --- DDP040: a rank or world size read but never bound -----------------------------------------------------

_WORLD_NAME_RE = re.compile(r"world_?size|^world$|^nprocs$|^num_replicas$", re.IGNORECASE)
_DYNAMIC_NAMES_RE = re.compile(
    rb"import\s+\*|\bglobals\(\)|\bexec\(|\b__builtins__\b|\bbuiltins\.|\blocals\(\)"
)
_BUILTINS = frozenset(dir(builtins))
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# `case [x, *rest]` / `case {"k": v}` capture names (Python >= 3.10; the package supports 3.9).
_MATCH_CAPTURES = tuple(getattr(ast, n) for n in ("MatchAs", "MatchStar", "MatchMapping") if hasattr(ast, n))
# Scopes whose own rules (class bodies, lambdas, comprehensions) this rule does not model: left alone.
_OTHER_SCOPES = (ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _distributed_name(name: str) -> bool:
    return is_rank_identifier(name) or bool(_WORLD_NAME_RE.search(name))


def _binds(scope: ast.AST) -> set[str]:
    """The names a function (or the module) binds in its own scope, as Python's compiler decides: its
    parameters, every name stored in its body (assignments, loop / with / except targets, `:=`, imports,
    nested def and class names) and `global` / `nonlocal` declarations; nested function bodies excepted."""
    out: set[str] = set()
    if isinstance(scope, _FUNCTIONS):
        a = scope.args
        out.update(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x)
    stack: list[ast.AST] = list(getattr(scope, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            out.add(node.id)
        elif isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            out.add(node.name)
            stack.extend(node.decorator_list)
            continue  # its body is its own scope
        elif isinstance(node, ast.Lambda):
            continue
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((al.asname or al.name).split(".", 1)[0] for al in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, _MATCH_CAPTURES):
            captured = getattr(node, "name", None) or getattr(node, "rest", None)
            if captured:
                out.add(captured)
        stack.extend(ast.iter_child_nodes(node))
    return out


@rule(
    "DDP040",
    "undefined-rank-name",
    "a rank or world size read under a name nothing binds: NameError on every rank",
    "bind it first: world_size = dist.get_world_size() (rank = dist.get_rank()), or pass it in",
    "The name is neither assigned, imported, a parameter, nor a global set anywhere in its scope chain. "
    "The first rank to reach the line raises NameError; the others then wait for it in their next "
    "collective until the timeout. Often a leftover of a refactor that moved the value into a function.",
)
def check_undefined_rank_name(f: ModuleFacts) -> Iterator[Hit]:
    candidates = {n for n in f.names if n not in _BUILTINS and _distributed_name(n)}
    if not candidates or not uses_distributed(f) or _DYNAMIC_NAMES_RE.search(f.source):
        return  # (names could come from `import *`, globals() or exec: not decidable here)
    # `global x` anywhere: some function binds x at module level.
    declared: set[str] = set()
    if re.search(rb"\bglobal\s", f.source):
        declared = {n for node in ast.walk(f.tree) if isinstance(node, ast.Global) for n in node.names}
    module = _binds(f.tree) | declared
    if candidates <= module:
        return
    memo: dict[int, set[str]] = {}
    reported: set[str] = set()
    stack: list[tuple[ast.AST, tuple[ast.AST, ...]]] = [(st, ()) for st in f.tree.body]
    hits: list[tuple[int, int, ast.Name]] = []
    while stack:
        node, chain = stack.pop()
        if isinstance(node, _FUNCTIONS):
            # Decorators and defaults are evaluated where the def stands; the body is a new scope.
            for part in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults):
                if part is not None:
                    stack.append((part, chain))
            stack.extend((st, chain + (node,)) for st in node.body)
        elif isinstance(node, _OTHER_SCOPES):
            continue
        elif isinstance(node, ast.Name):
            name = node.id
            if type(node.ctx) is not ast.Load or name not in candidates or name in module:
                continue
            if any(name in memo.setdefault(id(fn), _binds(fn)) for fn in chain):
                continue
            hits.append((node.lineno, node.col_offset, node))
        else:
            stack.extend((child, chain) for child in ast.iter_child_nodes(node))
    for _, _, n in sorted(hits, key=lambda h: (h[0], h[1])):
        if n.id not in reported:
            reported.add(n.id)
            yield n, f"`{n.id}` is read here but nothing binds it: NameError on every rank that gets here"
