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
import symtable
from typing import Iterator, Optional

from ddpdoctor.lint.facts import ModuleFacts, dotted, final_identifier, is_rank_identifier
from ddpdoctor.lint.helpers import COLLECTIVE_NAMES, _init_calls, uses_distributed
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import _literal_port, _url_port

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
    for cs in _init_calls(f):
        method = cs.arg(1, "init_method")
        port = _url_port(method)
        if _out_of_range(port):
            yield cs.node, f"init_method uses port {port}, above 65535: the rendezvous cannot listen on it"
            continue
        key = dotted(method) if method is not None else None
        for value, stmt in f.assigns.get(key or "", ()):
            port = _url_port(value)
            if _out_of_range(port):
                yield (
                    stmt,
                    f"`{key}` uses port {port}, above 65535, and is passed to init_method (line "
                    f"{cs.node.lineno}): the rendezvous cannot listen on it",
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
    if b"type(" not in f.source:
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
_BUILTINS = frozenset(dir(builtins))
_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)
_DYNAMIC_NAMES_RE = re.compile(rb"import\s+\*|\bglobals\(\)|\bexec\(|\b__builtins__\b|\bbuiltins\.")


def _distributed_name(name: str) -> bool:
    return is_rank_identifier(name) or bool(_WORLD_NAME_RE.search(name))


def _module_binds(top: symtable.SymbolTable, name: str, source: bytes) -> bool:
    """The module binds `name`: assigned, imported, a def or class, or set through `global name`."""
    if re.search(rb"\bglobal\b[^\n]*\b" + re.escape(name.encode()) + rb"\b", source):
        return True
    try:
        sym = top.lookup(name)
    except KeyError:
        return False
    return sym.is_assigned() or sym.is_imported() or sym.is_namespace()


def _tables(table: symtable.SymbolTable) -> Iterator[symtable.SymbolTable]:
    for child in table.get_children():
        yield child
        yield from _tables(child)


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
    if not uses_distributed(f) or _DYNAMIC_NAMES_RE.search(f.source):
        return  # names could come from `import *`, globals() or exec: not decidable here
    try:
        top = symtable.symtable(f.source.decode("utf-8", "replace"), f.path, "exec")
    except (SyntaxError, ValueError):
        return
    # (get_type() is a str in 3.11, a StrEnum from 3.13: equal to "function" in both)
    functions = {(t.get_lineno(), t.get_name()): t for t in _tables(top) if t.get_type() == "function"}
    parents = {id(c): p for p in ast.walk(f.tree) for c in ast.iter_child_nodes(p)}
    reported: set[str] = set()
    for node in ast.walk(f.tree):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
            continue
        name = node.id
        if name in reported or name in _BUILTINS or not _distributed_name(name):
            continue
        up = parents.get(id(node))
        while up is not None and not isinstance(up, _SCOPES):
            up = parents.get(id(up))
        scope = up
        if scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # a lambda, a class body or a comprehension: their scoping rules, left alone
        if scope is None:
            bound = _module_binds(top, name, f.source)
        else:
            lineno = scope.decorator_list[0].lineno if scope.decorator_list else scope.lineno  # type: ignore[attr-defined]
            table = functions.get((lineno, scope.name)) or functions.get((scope.lineno, scope.name))  # type: ignore[attr-defined]
            if table is None:
                continue
            try:
                sym = table.lookup(name)
            except KeyError:
                continue
            if (
                sym.is_parameter()
                or sym.is_local()
                or sym.is_free()
                or sym.is_imported()
                or sym.is_assigned()
            ):
                continue
            bound = _module_binds(top, name, f.source)
        if not bound:
            reported.add(name)
            yield node, f"`{name}` is read here but nothing binds it: NameError on every rank that gets here"
