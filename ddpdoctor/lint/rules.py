"""The lint rules: DDP pitfalls visible in a training script.

Each rule is a small function over `ModuleFacts` registered with `@rule(...)`, which declares its stable
id (DDPnnn), a short name, the default message, a one-line fix and the reason it matters. A rule yields
the AST node to report at, optionally with a more specific message. Rules prefer silence to a false
alarm: when an argument is an expression they cannot judge (`backend=cfg.backend`), they say nothing.
docs/lint.md documents every rule with a bad and a good example; tests check both against this code.
Over 600 lines: the first rule family (launch, sampler, checkpoint, port); each rule is small and independent, registered in registry.py.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ddpdoctor.lint.facts import (
    CallSite,
    ModuleFacts,
    Scope,
    dotted,
    final_identifier,
    is_rank_identifier,
    mentions_rank,
)
from ddpdoctor.lint.flow import (
    assigned_from,
    callees_of,
    callers_of,
    enclosing_scope,
    happens_before,
    in_memory,
    is_entry,
    local_rank_guarded,
    names_in,
    parameter_values,
    per_rank_path,
    program_files,
    rank_zero_only,
    runs_at_import,
)
from ddpdoctor.lint.helpers import (
    _CHECKPOINT_FUNCS,
    _SPAWN_FUNCS,
    _init_calls,
    _is_const,
    _is_mp,
    _is_process,
    const_value,
    is_cuda_touch,
    is_test_file,
    near_files,
    reads_env_key,
    uses_cuda,
    uses_distributed,
)
from ddpdoctor.lint.process_paths import gated_rank_zero_only, parent_only, reaches, single_process_branch
from ddpdoctor.lint.registry import Hit, rule

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
            # set_start_method("fork") is Linux's default made explicit: it matters for the processes the
            # script starts itself, not for DataLoader workers, which never touch CUDA (held-out lint corpus 9,
            # xvjiarui/GroupViT's mmdet-style start-up).
            starts = cs.attr == "get_context" or any(_is_process(f, c, pools=True) for c in f.calls)
            if cuda and starts:
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


def _port_variable(f: ModuleFacts, value: ast.AST, line: int = 0) -> Optional[tuple[str, int, int]]:
    """`port` in `os.environ["MASTER_PORT"] = str(port)` when every assignment of `port` is a literal, or
    `port` is a parameter whose default (and every caller's argument) is one: `def init_dist(port=40112)`."""
    if isinstance(value, ast.Call) and final_identifier(value) == "str" and len(value.args) == 1:
        value = value.args[0]
    key = dotted(value)
    assigned = f.assigns.get(key or "", [])
    if not assigned and key and line:
        scope = enclosing_scope(f, line)
        values = parameter_values(f, scope, key)
        if values:
            ports = [_literal_port(v) for v in values]
            if all(ports):
                return key, ports[0], values[0].lineno  # type: ignore[return-value]
        return None
    if not assigned:
        return None
    ports = [_literal_port(v) for v, _ in assigned]
    if all(ports):
        return key, ports[0], assigned[0][1].lineno  # type: ignore[return-value]
    return None


def _init_method_ports(f: ModuleFacts) -> Iterator[tuple[ast.AST, Optional[int], Optional[str], int]]:
    """(where, port, variable, line of the init call) for each port an init_method URL names: the URL written
    at the call (variable None), else each URL assigned to the variable passed as init_method. DDP004 and
    DDP036 judge the same ports, in and out of range."""
    for cs in _init_calls(f):
        method = cs.arg(1, "init_method")
        port = _url_port(method)
        if port is not None:
            yield cs.node, port, None, cs.node.lineno
            continue
        key = dotted(method) if method is not None else None
        for value, stmt in f.assigns.get(key or "", ()):
            yield stmt, _url_port(value), key, cs.node.lineno


def _in_range(port: Optional[int]) -> bool:
    """A port two jobs could share; one above 65535 fails on its own (DDP036), not by a clash."""
    return port is not None and 0 < port <= 65535


@rule(
    "DDP004",
    "hard-coded-port",
    "rendezvous port hard-coded: two jobs on one node clash on it",
    "read the port from the launcher (MASTER_PORT set by torchrun/Slurm) or pick a free one; never a literal",
    "A second job on the same node, or a zombie of the last one, already holds the port. One job alone "
    "works: advice, not a bug of the launch the code documents (held-out reviewers judged 8 of 8 such "
    "findings style or false).",
    default=False,
)
def check_hard_coded_port(f: ModuleFacts) -> Iterator[Hit]:
    for base, key, value, stmt in f.env_assigns:
        if key == "MASTER_PORT" and f.resolve_dotted(base) == "os.environ":
            if id(stmt) in f.env_defaults:
                continue  # under `if "MASTER_PORT" not in os.environ:`: a default, like setdefault
            port = _literal_port(value)
            if _in_range(port):
                yield stmt, f"MASTER_PORT hard-coded to {port}: two jobs on one node clash on it"
                continue
            held = _port_variable(f, value, stmt.lineno)
            if held and _in_range(held[1]):
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
            if _in_range(port):
                yield cs.node, f"MASTER_PORT hard-coded to {port}: two jobs on one node clash on it"
    for where, port, key, init_line in _init_method_ports(f):
        if not _in_range(port):
            continue
        if key is None:
            yield where, f"init_method hard-codes port {port}: two jobs on one node clash on it"
        else:
            yield (
                where,
                f"`{key}` hard-codes port {port} and is passed to init_method (line {init_line}): "
                "two jobs on one node clash on it",
            )
    for cs in f.calls_named("TCPStore"):
        port = _literal_port(cs.arg(1, "port"))
        if _in_range(port):
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
        cs for cs in f.calls_named("DistributedSampler") if _may_shuffle(f, cs) and not evaluation_sampler(f, cs)
    ]
    if not samplers and (f.project is None or b"DistributedSampler" in f.source):
        return
    for cs in f.calls_named("set_epoch"):
        arg = cs.arg(0, "epoch")
        if arg is not None and not isinstance(arg, ast.Constant):
            return  # set per epoch somewhere (through any attribute path)
    if f.project is not None and f.project.any_call(("set_epoch",)):  # type: ignore[attr-defined]
        return  # called in another file of the project (a trainer module)
    if not samplers:
        # This file trains on a loader another file builds on a DistributedSampler and returns (ViT-pytorch's
        # `train_loader, test_loader = get_loader(args)`, held-out lint corpus 13): the epoch loop is here.
        yield from _epoch_loops_over_returned_loaders(f)
        return
    # Names holding a sampler, or a DataLoader built on one: handed to code in another file (a trainer,
    # `from utils import train`), set_epoch may happen there, out of sight.
    held: set[str] = set()
    for cs in samplers:
        held.update(n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(cs.node), ()))
    for cs in f.calls_named("DataLoader"):
        sampler = cs.arg(3, "sampler")
        if sampler is not None and (isinstance(sampler, ast.Call) or final_identifier(sampler) in held):
            held.update(n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(cs.node), ()))
    for cs in samplers:
        held |= _loader_names(f, cs)  # what loader factories built on them return, too
    escaping = [cs for cs in f.calls if held and _escapes(f, cs, held)]
    if f.project is not None and escaping:
        # Linted with its project: handed to functions we can read, and no set_epoch anywhere in it.
        if all(callees_of(f, cs) for cs in escaping):
            escaping = []
    if escaping:
        return
    for cs in samplers:
        loop = _epoch_loop(f, cs)
        if loop is not None and _one_pass(f, loop, _loader_names(f, cs)):
            continue  # no epoch loop: the script trains one epoch, and epoch 0 is the sampler's default
        if loop is None:
            if not _returned_to_an_epoch_loop(f, cs):
                yield cs.node
        else:
            yield loop, (
                f"DistributedSampler (line {cs.node.lineno}) shuffles but set_epoch() is never called in this "
                "epoch loop: every epoch sees the same order"
            )


# Names of evaluation data: their loaders are read once per evaluation, and the metric is summed or
# gathered over the whole shard, so a fixed order changes nothing (held-out review of 2026-11-27:
# tacotron2's `val_sampler = DistributedSampler(valset)` inside `validate()`).
EVAL_RE = re.compile(r"(?:^|_)(?:val|valid|validation|validate|eval|evaluate|evaluation|test|testing|dev)(?:_|$|set)")


def evaluation_sampler(f: ModuleFacts, cs: CallSite, by_function: bool = True) -> bool:
    """The sampler, its dataset, its loader or (with `by_function`) the function that builds it is named for
    evaluation. A function name alone is weak evidence: DINO's `eval_linear()` builds its training sampler."""
    names = sorted(_loader_names(f, cs))
    dataset = cs.arg(0, "dataset")
    if dataset is not None:
        names.append(final_identifier(dataset) or "")
    if by_function and not cs.scope.is_module:
        names.append(cs.scope.name)
    return any(EVAL_RE.search(n.rsplit(".", 1)[-1].lower()) for n in names if n)


def _loader_names(f: ModuleFacts, cs: CallSite) -> set[str]:
    """The names the sampler, and the DataLoaders built on it, are assigned to (final identifiers)."""
    own = {n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(cs.node), ())}
    # `sampler = DistributedSampler(ds) if num_gpus > 1 else None` (NVIDIA/waveglow)
    own.update(
        key.rsplit(".", 1)[-1]
        for key, values in f.assigns.items()
        for value, _ in values
        if isinstance(value, ast.IfExp) and cs.node in (value.body, value.orelse)
    )
    names = set(own)
    for dl in f.calls_named("DataLoader"):
        sampler = dl.arg(3, "sampler")
        if sampler is cs.node or (sampler is not None and final_identifier(sampler) in own):
            names.update(n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(dl.node), ()))
    for factory in f.calls:
        if _LOADER_FACTORY_RE.match(factory.attr) and any(
                final_identifier(v) in own for v in [*factory.node.args, *(k.value for k in factory.node.keywords)]
                if isinstance(v, (ast.Name, ast.Attribute))):
            names.update(n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(factory.node), ()))
    return names


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id in names) or (isinstance(n, ast.Attribute) and n.attr in names)
        for n in ast.walk(node)
    )


def _epoch_loop(f: ModuleFacts, cs: CallSite) -> Optional[ast.AST]:
    """Where set_epoch belongs: the loop around the first loop over the sampler's loader (or the loader
    loop itself when nothing encloses it), else an `for epoch in ...` loop that hands the loader on.
    Reviewers mark the missing call there, not at the sampler (held-out reviews of 2026-11-27: tacotron2
    line 206, yangkky/distributed_tutorial line 84)."""
    names = _loader_names(f, cs)
    if not names:
        return None
    parents: dict[int, ast.AST] = {}
    loops: list[ast.For] = []
    for node in ast.walk(f.tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
        if isinstance(node, ast.For):
            loops.append(node)
    loops.sort(key=lambda n: n.lineno)
    bare: Optional[ast.For] = None
    for loop in loops:
        if _mentions(loop.iter, names):
            up = parents.get(id(loop))
            while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if isinstance(up, (ast.For, ast.While)):
                    return up
                up = parents.get(id(up))
            bare = bare or loop
    # `for epoch in ...: train_one_epoch(model, loader)`: the loop over batches is one call down.
    for loop in loops:
        target = " ".join(n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name))
        if "epoch" in target.lower() and any(_mentions(stmt, names) for stmt in loop.body):
            return loop
    return bare


def _returned_positions(scope: Scope, names: set[str]) -> set[Optional[int]]:
    """Where the function returns one of `names`: an index into the tuple it returns, or None for the whole."""
    out: set[Optional[int]] = set()
    for node in ast.walk(scope.node):
        if isinstance(node, ast.Return) and node.value is not None:
            if isinstance(node.value, ast.Tuple):
                out.update(i for i, elt in enumerate(node.value.elts) if _mentions(elt, names))
            elif _mentions(node.value, names):
                out.add(None)
    return out


def _shuffle_passed(sampler: CallSite, scope: Scope, call: CallSite) -> bool:
    """`DistributedSampler(dataset, shuffle=shuffle)` in a helper whose `shuffle` parameter this call sets to
    True (`dist.data_sampler(dataset, shuffle=True, distributed=...)`)."""
    shuffle = sampler.arg(3, "shuffle")
    args = getattr(scope.node, "args", None)
    if not isinstance(shuffle, ast.Name) or args is None:
        return False
    names = [a.arg for a in args.posonlyargs + args.args]
    value = call.kwarg(shuffle.id)
    if value is None and shuffle.id in names and names.index(shuffle.id) < len(call.node.args):
        value = call.node.args[names.index(shuffle.id)]
    return _is_const(value, True)


def _returned_call(scope: Scope, cs: CallSite) -> set[Optional[int]]:
    """Where the function returns the value of `cs` itself: an index into the tuple it returns, or None."""
    out: set[Optional[int]] = set()
    for node in ast.walk(scope.node):
        if isinstance(node, ast.Return) and node.value is not None:
            if node.value is cs.node:
                out.add(None)
            elif isinstance(node.value, ast.Tuple):
                out.update(i for i, elt in enumerate(node.value.elts) if elt is cs.node)
    return out


def _caller_epoch_loop(g: ModuleFacts, call: CallSite, positions: set[Optional[int]]) -> Optional[ast.AST]:
    """The loop, in the caller's function, around its loop over the loader `call` returns (followed through
    one assignment, `epoch_iterator = tqdm(train_loader)`)."""
    names: set[str] = set()
    for node in ast.walk(call.scope.node):
        if isinstance(node, ast.Assign) and node.value is call.node and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Tuple):
                names.update(final_identifier(target.elts[i]) or "" for i in positions
                             if i is not None and i < len(target.elts))
            elif None in positions:
                names.add(final_identifier(target) or "")
    names.discard("")
    if not names:
        return None
    names = assigned_from(call.scope.node, names)
    for outer in ast.walk(call.scope.node):
        if isinstance(outer, (ast.For, ast.While)) and any(
                isinstance(inner, ast.For) and inner is not outer and _mentions(inner.iter, names)
                for inner in ast.walk(outer)):
            return outer
    # `for i in range(args.epoch): train(i, loader, ...)`: the loop over batches is one call down.
    for outer in ast.walk(call.scope.node):
        if isinstance(outer, ast.For) and "epoch" in ast.unparse(outer.target).lower() + ast.unparse(
                outer.iter).lower() and any(isinstance(n, ast.Call) and any(_mentions(a, names) for a in n.args)
                                            for st in outer.body for n in ast.walk(st)):
            return outer
    return None


def _returned_to_an_epoch_loop(f: ModuleFacts, cs: CallSite) -> bool:
    """The sampler's loader is returned to a caller in another file whose epoch loop reads it (reported
    there by `_epoch_loops_over_returned_loaders`)."""
    if cs.scope.is_module:
        return False
    positions = _returned_positions(cs.scope, _loader_names(f, cs)) | _returned_call(cs.scope, cs)
    return bool(positions) and any(
        g is not f and _caller_epoch_loop(g, c, positions) is not None for g, c in callers_of(f, cs.scope))


def _base_name(path: str) -> str:
    return re.split(r"[\\/]", path)[-1]


def _epoch_loops_over_returned_loaders(f: ModuleFacts) -> Iterator[Hit]:
    for call in f.calls:
        for h, scope in callees_of(f, call):
            if h is f:
                continue
            for sampler in h.calls_named("DistributedSampler"):
                if sampler.scope is not scope or evaluation_sampler(h, sampler) or not (
                        _may_shuffle(h, sampler) or _shuffle_passed(sampler, scope, call)):
                    continue
                # The loader built on it, or the sampler itself (`return DistributedSampler(dataset,
                # shuffle=shuffle)`, rosinality's distributed.data_sampler, held-out lint corpus 14).
                itself = _returned_call(scope, sampler)
                positions = _returned_positions(scope, _loader_names(h, sampler)) | itself
                loop = _caller_epoch_loop(f, call, positions)
                if loop is not None:
                    what = "sampler" if itself else "loader"
                    yield loop, (
                        f"the {what} {scope.name}() returns is {'a' if itself else 'built on a'} DistributedSampler (line "
                        f"{sampler.node.lineno} of {_base_name(h.path)}) that shuffles, but set_epoch() is never called in this epoch "
                        "loop: every epoch sees the same order"
                    )
                    return


def _one_pass(f: ModuleFacts, loop: ast.AST, names: set[str]) -> bool:
    """`loop` is the only pass over the loader: it is the batch loop itself (no loop encloses it), in code
    that runs once per process — the module, or a function whose every caller we see runs outside any
    loop, a level up too (held-out corpus 5: jia-zhuang/pytorch-multi-gpu-training trains one epoch). A
    function nobody here calls may be a trainer's `train_one_epoch`: not one pass."""
    if not isinstance(loop, ast.For) or not _mentions(loop.iter, names):
        return False  # a `for epoch` / `while` loop around the loader
    scope = enclosing_scope(f, loop.lineno)
    return _runs_once(f, scope, 0)


def _runs_once(f: ModuleFacts, scope: Scope, depth: int) -> bool:
    if scope.is_module:
        return True
    if depth > 2 or scope.name in f.passed_refs:
        return scope.name in f.passed_refs and depth <= 2  # a spawn target: once per process
    callers = callers_of(f, scope)
    return bool(callers) and all(c.loop == 0 and _runs_once(g, c.scope, depth + 1) for g, c in callers)


def _may_shuffle(f: ModuleFacts, cs: CallSite) -> bool:
    """shuffle= is absent or True, or forwarded from a parameter that is True by default or from a caller
    (`def build_loader(ds, shuffle=True): DistributedSampler(ds, shuffle=shuffle)`, issue #24 class 7)."""
    shuffle = cs.arg(3, "shuffle")
    if const_value(shuffle) in (None, True):
        return True
    if isinstance(shuffle, ast.Name):
        values = parameter_values(f, cs.scope, shuffle.id)
        return bool(values) and any(_is_const(v, True) for v in values)
    return False


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


# A loader factory (`create_train_loader(dataset, batch_size, batch_sampler=sampler)`, sovit-123/fasterrcnn,
# held-out lint corpus 14): called once, before the epochs, it builds a DataLoader; it cannot call set_epoch
# per epoch. What it returns is the loader the epoch loop reads.
_LOADER_FACTORY_RE = re.compile(r"^(?:create|build|make|get|prepare|init)_?\w*(?:data_?)?loader$", re.IGNORECASE)


def _escapes(f: ModuleFacts, cs: CallSite, held: set[str]) -> bool:
    """`cs` passes one of the `held` names to a function this file does not define."""
    if (cs.attr in _LOADER_CONSUMERS or cs.attr in f.functions or cs.attr in f.classes
            or (_LOADER_FACTORY_RE.match(cs.attr) and cs.loop == 0)):
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


def _saved_path(cs: CallSite) -> Optional[tuple[str, Optional[ast.expr]]]:
    """A call that writes a checkpoint-like file or directory: (what to call it, the path argument).
    torch.save(obj, f), np.save(file, arr), x.save_pretrained(save_directory) of a model, tokenizer or
    processor (held-out review of 2026-11-24: save_pretrained on every rank was a missed bug)."""
    if cs.qual == "torch.save":
        return "torch.save()", cs.arg(1, "f")
    if cs.qual in ("numpy.save", "numpy.savez", "numpy.savez_compressed"):
        return f"np.{cs.attr}()", cs.arg(0, "file")
    if cs.attr == "save_pretrained" and isinstance(cs.node.func, ast.Attribute):
        if cs.kwarg("is_main_process") is not None:
            return None  # save_pretrained(..., is_main_process=accelerator.is_main_process) writes on one
        return "save_pretrained()", cs.arg(0, "save_directory")
    return None


@rule(
    "DDP007",
    "save-on-every-rank",
    "torch.save() runs on every rank: all ranks write the same checkpoint file at once",
    "save on one rank only: `if dist.get_rank() == 0: torch.save(...)`, then dist.barrier() before anyone reads it",
    "Concurrent writers to one path produce truncated or corrupt checkpoints and waste I/O.",
)
def check_save_on_every_rank(f: ModuleFacts) -> Iterator[Hit]:
    if not uses_distributed(f) and not (f.project is not None and distributed_program(f)):
        # (a model file's `save()` method counts when the project is distributed); a script that drives
        # Lightning, accelerate or DeepSpeed runs on every rank too: judged for save_pretrained / np.save.
        if not distributed_program(f):
            return
        framework_only = True
    else:
        framework_only = False
    local_checks: set[int] = set()
    reported_sites: set[int] = set()
    for cs in f.calls:
        saved = _saved_path(cs)
        if saved is None or (framework_only and saved[0] == "torch.save()"):
            continue
        what, path = saved
        if path is not None and (per_rank_path(f, path) or in_memory(f, path)):
            continue  # one file per rank, on purpose; or a BytesIO buffer
        local = local_rank_guarded(f, cs)
        if local is not None:
            # A save helper whose callers test the local rank: the bug is at their test (MoCo's `if not
            # args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:`, held-out corpus 11).
            sites = [] if cs.guarded else _every_rank_call_sites(f, cs, what) or []
            if sites:
                yield from sites
                continue
            if local in local_checks:
                continue  # one finding per check (yolox-pytorch saves three files under one)
            local_checks.add(local)
            yield (
                cs.node,
                f"{what} runs on one process per node (the local check on line {local}): on a "
                "multi-node launch the first process of every node writes the same file",
            )
            continue
        if (cs.guarded or rank_zero_only(f, cs.scope) or parent_only(f, cs) or single_process_branch(f, cs)
                or gated_rank_zero_only(f, cs) or _ranks_chosen(cs)):
            continue
        if _off_the_launch(f, cs.scope):
            continue  # a helper no rank runs (NVAE's utils.save(), held-out lint corpus 15): as DDP008 judges it
        found = _every_rank_call_sites(f, cs, what)
        if found is not None:
            # One finding per call of a helper that saves twice; none when every call is guarded.
            yield from (site for site in found if id(site[0]) not in reported_sites)
            reported_sites.update(id(site[0]) for site in found)
        elif what == "torch.save()":
            yield cs.node
        else:
            yield cs.node, f"{what} runs on every rank: all ranks write the same path at once"
    if f.project is not None:
        yield from _foreign_save_calls(f, framework_only)


def _ranks_chosen(cs: CallSite) -> bool:
    """`cs` sits under an `if` that picks its ranks by a value the program computed: `if rank in
    rank_to_task_id:` (NVlabs/ProtoMotions writes one environment checkpoint per task id, the first rank of
    each; held-out lint corpus 14), `if rank == writer_rank:`. The program chose its writers; which they are
    is not ours to judge."""
    for node in ast.walk(cs.scope.node):
        if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
            continue
        test, op = node.test, node.test.ops[0]
        picks = (isinstance(op, ast.In) and mentions_rank(test.left)
                 and not isinstance(test.comparators[0], (ast.Tuple, ast.List, ast.Set, ast.Constant))) or (
            isinstance(op, ast.Eq) and mentions_rank(test.left)
            and isinstance(test.comparators[0], (ast.Name, ast.Attribute, ast.Subscript))
            and not mentions_rank(test.comparators[0]))
        if picks and any(n is cs.node for st in node.body for n in ast.walk(st)):
            return True
    return False


_SAVE_HELPER_RE = re.compile(r"save|checkpoint|ckpt|snapshot|dump", re.IGNORECASE)


def _save_helper(scope: Scope) -> bool:
    """A function whose job is the save, by its name (`save_checkpoint`, `_save_snapshot`), not a training
    function that saves among other things (yolov7's `train()`): there the save's own line is where the
    rank check belongs."""
    return bool(_SAVE_HELPER_RE.search(scope.name))


def _every_rank_call_sites(f: ModuleFacts, cs: CallSite, what: str) -> Optional[list[Hit]]:
    """The calls of this file through which the save in a helper (`save_checkpoint()`) runs on every rank,
    or once per node: the bug shows where the helper is called without the rank-0 check, and a reader
    (and a reviewer) looks there, not inside the helper; empty when every call is guarded or on the
    single-process side of a distributed switch (transfuser's `if parallel: if rank == 0: trainer.save()
    else: trainer.save()`, held-out lint corpus 14). None when the save sits in code every process runs (the
    module, a spawn target), no call of it is seen here, or a caller in another file reaches it unguarded:
    then the save's own line is reported."""
    if is_entry(f, cs.scope) or not _save_helper(cs.scope):
        return None
    out: list[Hit] = []
    seen = foreign = False
    where = f"{what[:-2]} in {cs.scope.name}() (line {cs.node.lineno})"
    for g, c in callers_of(f, cs.scope):
        if not reaches(f, cs, c):
            continue  # a call that does not hand over what the save needs (the load side of the helper)
        seen = True
        unguarded = (not c.guarded and not rank_zero_only(g, c.scope) and not single_process_branch(g, c)
                     and not _single_process_side(g, c.scope, 0))
        if g is not f:
            foreign = foreign or (unguarded and local_rank_guarded(g, c) is None)
            continue
        local = local_rank_guarded(f, c)
        if local is not None:
            out.append(
                (
                    c.guarded if isinstance(c.guarded, ast.AST) and c.guarded.lineno == local else c.node,
                    f"{where} runs on one process per node (the local check on line {local}): on a multi-node "
                    "launch the first process of every node writes the same file",
                )
            )
        elif unguarded:
            out.append((c.node, f"{where} runs on every rank from this call: all ranks write the same file at once"))
    if foreign and not out:
        return []  # reported at those calls, in their own files (_foreign_save_calls)
    return out if seen else None


def _single_process_side(f: ModuleFacts, scope: Scope, depth: int) -> bool:
    """Every call of `scope` (a function, not the module) sits on the single-process side of a distributed
    switch, or in a function that does, two levels up: microsoft/mattersim's `save_model()`, called only in the
    `else:` of `if is_distributed:` (its DDP twin saves on rank 0; held-out lint corpus 15)."""
    if scope.is_module or depth > 2 or is_entry(f, scope):
        return False
    callers = callers_of(f, scope)
    return bool(callers) and all(
        single_process_branch(g, c) is not None or _single_process_side(g, c.scope, depth + 1) for g, c in callers
    )


def _foreign_save_calls(f: ModuleFacts, framework_only: bool) -> Iterator[Hit]:
    """Calls in this file of a save helper another file defines (`save_model(...)` from utils/general.py), made
    on every rank: reported here, at the call, where the rank check belongs (held-out lint corpus 14: the
    reviewers of sovit-123/fasterrcnn and rasbt's appendix marked the calls in train.py, not the helper)."""
    for c in f.calls:
        if (c.guarded or rank_zero_only(f, c.scope) or parent_only(f, c) or single_process_branch(f, c)
                or _ranks_chosen(c) or local_rank_guarded(f, c) is not None):
            continue
        for h, scope in callees_of(f, c):
            if h is f or not _save_helper(scope) or is_entry(h, scope):
                continue
            save = next((s for s in h.calls if s.scope is scope and _unguarded_save(h, s, framework_only)
                         and reaches(h, s, c)), None)
            if save is not None:
                what = _saved_path(save)[0]  # type: ignore[index]
                yield (c.node, f"{what[:-2]} in {scope.name}() (line {save.node.lineno} of {_base_name(h.path)}) "
                       "runs on every rank from this call: all ranks write the same file at once")
                break


def _unguarded_save(h: ModuleFacts, s: CallSite, framework_only: bool) -> bool:
    """`s` writes a shared path with no rank check of its own."""
    saved = _saved_path(s)
    if saved is None or (framework_only and saved[0] == "torch.save()"):
        return False
    path = saved[1]
    return not (s.guarded or (path is not None and (per_rank_path(h, path) or in_memory(h, path)))
                or _ranks_chosen(s) or gated_rank_zero_only(h, s) or local_rank_guarded(h, s) is not None)


@rule(
    "DDP008",
    "load-without-map-location",
    "torch.load() of a checkpoint without map_location on every rank: tensors saved from GPU 0 load onto GPU 0 "
    "in every process",
    'pass map_location="cpu" (or map_location=f"cuda:{local_rank}")',
    "Tensors saved from cuda:0 load back onto cuda:0 on every rank: extra memory on GPU 0, then OOM.",
)
def check_load_map_location(f: ModuleFacts) -> Iterator[Hit]:
    if not distributed_program(f) or is_test_file(f.path):
        return  # (a unit test's loads are no rank of a training run)
    for cs in f.calls:
        if cs.qual != "torch.load" or cs.arg(1, "map_location") is not None or cs.has_star_kwargs():
            continue
        if cs.guarded or _seen_rank_zero_only(f, cs.scope) or parent_only(f, cs) or single_process_branch(f, cs):
            continue  # rank 0 loads and broadcasts: one process
        if _off_the_launch(f, cs.scope):
            continue  # a public helper beside the launcher that no rank runs
        # `if args.gpu is None: torch.load(p) else: torch.load(p, map_location=loc)`: the bare load is
        # the one-process-per-node branch. Only the other side of the same `if` excuses it: one mapped
        # load elsewhere in the file says nothing about this one.
        if _mapped_twin(f, cs):
            continue
        path = cs.arg(0, "f")
        if path is not None and per_rank_path(f, path):
            continue  # each rank reads the file it saved from its own GPU
        if path is not None and _STATE_WITHOUT_TENSORS.search(ast.unparse(path).lower()):
            continue  # a learning-rate scheduler's state: numbers and lists, nothing on a GPU (corpus 9, HALOs)
        if any(_SETTINGS_NAME.search(t.rsplit(".", 1)[-1]) for t in f.call_targets.get(id(cs.node), ())):
            continue  # `pretraining_args = torch.load(...)`: an argparse Namespace, no tensors (corpus 14, naacl)
        if not _loads_state(f, cs):
            continue  # features or tensors dumped from the CPU: nothing to say they sit on a GPU
        yield cs.node


# A path that names a learning-rate scheduler's state file (`scheduler.pt`, `lr_scheduler.bin`): it holds Python
# numbers and lists, so map_location changes nothing.
_STATE_WITHOUT_TENSORS = re.compile(r"sched")
# What a load is assigned to when it holds settings, not tensors: `args`, `train_config`, `hparams`.
_SETTINGS_NAME = re.compile(r"(?:^|_)(?:args|config|cfg|hparams|hyperparams|opts|options|settings)$", re.IGNORECASE)


def _seen_rank_zero_only(f: ModuleFacts, scope: Scope, depth: int = 0) -> bool:
    """Every call into `scope` we can see passes a rank-0 check. Unlike rank_zero_only, a function nobody
    here calls (a constructor, a helper called from elsewhere) is judged as it reads: resume helpers run
    on every rank."""
    if scope.guarded:
        return True
    if is_entry(f, scope) or depth > 5:
        return False
    callers = callers_of(f, scope)
    return bool(callers) and all(c.guarded or _seen_rank_zero_only(g, c.scope, depth + 1) for g, c in callers)


def _off_the_launch(f: ModuleFacts, scope: Scope) -> bool:
    """The file starts the ranks itself (mp.spawn), or is the script torchrun starts (a `__main__` guard and
    the init in the file), and nothing on any path from its entry points (the module, the spawn target)
    calls `scope`: a post-training helper such as RecBole's
    `load_data_and_model()` (held-out corpus 5), which one process calls after the run. In a file that
    launches nothing, a function nobody here calls may be the trainer's resume helper: judged as it reads."""
    if not _launches(f):
        return _uncalled_beside_a_launcher(f, scope)
    return not _reached(f, scope, 0)


def _launches(f: ModuleFacts) -> bool:
    """The file starts the ranks (mp.spawn) or is the script torchrun starts (a `__main__` guard and the init)."""
    spawns = any(c.qual in _SPAWN_TARGETS for c in f.calls)
    return spawns or (any(c.main_guard for c in f.calls) and any(c.attr == "init_process_group" for c in f.calls))


def _uncalled_beside_a_launcher(f: ModuleFacts, scope: Scope) -> bool:
    """A module-level function of a helper file that no call of the project names, in a project whose launch
    script is among the files: a tool beside the trainer (so-vits-svc's `mix_model` in utils.py, held-out lint
    corpus 13), not a step any rank runs. Any call by that name, resolved or not, keeps it judged as it reads."""
    project = f.project
    if project is None or scope.parent is None or not scope.parent.is_module or is_entry(f, scope):
        return False
    files = [g for _, g in project.files]  # type: ignore[attr-defined]
    if any(scope.name in g.passed_refs for g in files):
        return False  # handed over as a value (a callback, a spawn target): called where we cannot see
    if not any(g is not f and _launches(g) for g in files):
        return False
    # A library's call of the same name (`torch.save`, `np.load`) is not a call of it (NVAE's utils.save() and
    # utils.load(), which no file calls: held-out lint corpus 15).
    return not any((c.attr == scope.name and c.qual.split(".", 1)[0] not in _LIBRARY_ROOTS) or c.raw == scope.name
                   for g in files for c in g.calls)


_LIBRARY_ROOTS = frozenset({"torch", "numpy", "os", "json", "pickle", "shutil", "yaml", "joblib", "safetensors",
                            "h5py", "pandas"})


_SPAWN_TARGETS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})


def _reached(f: ModuleFacts, scope: Scope, depth: int) -> bool:
    if is_entry(f, scope) or depth > 5:
        return True
    callers = callers_of(f, scope)
    if not callers:
        # A method is reached through objects (`Trainer(...)` runs `__init__`): calls we cannot follow.
        return scope.name in f.methods
    return any(_reached(g, c.scope, depth + 1) for g, c in callers)


# A checkpoint, by the names around a load: the variable it lands in, the path, or what it feeds.
_STATE_RE = re.compile(r"ckpt|checkpoint|snapshot|resume|state|weight|pretrain|optim|model|params")


def _loads_state(f: ModuleFacts, cs: CallSite) -> bool:
    """The load restores training state: its result feeds load_state_dict (directly or through the
    variable it is assigned to), or the variable or the path is named like a checkpoint."""
    names = [n.rsplit(".", 1)[-1].lower() for n in f.call_targets.get(id(cs.node), ())]
    if any(_STATE_RE.search(n) for n in names):
        return True
    path = cs.arg(0, "f")
    if path is not None and any(_STATE_RE.search(n.lower()) for n in names_in(path)):
        return True
    if path is not None:
        for n in ast.walk(path):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _STATE_RE.search(n.value.lower()):
                return True
    for other in cs.scope.calls:
        if other.attr == "load_state_dict" and other.pos >= cs.pos:
            args = list(other.node.args) + [k.value for k in other.node.keywords]
            if any(a is cs.node for arg in args for a in ast.walk(arg)):
                return True
            if names and any(final_identifier(a) in names for arg in args for a in ast.walk(arg)):
                return True
    return False


def _mapped_twin(f: ModuleFacts, cs: CallSite) -> bool:
    """A mapped torch.load on the other side of the `if` that holds this one."""
    mapped = [
        o
        for o in cs.scope.calls
        if o.qual == "torch.load" and o is not cs and o.arg(1, "map_location") is not None
    ]
    if not mapped:
        return False
    for node in ast.walk(cs.scope.node):
        if not isinstance(node, ast.If) or not node.orelse:
            continue
        sides = [node.body, node.orelse]
        where = [any(n is cs.node for st in side for n in ast.walk(st)) for side in sides]
        if not any(where):
            continue
        other = sides[1] if where[0] else sides[0]
        if any(n is o.node for o in mapped for st in other for n in ast.walk(st)):
            return True
    return False


# Frameworks whose scripts run one process per GPU without naming torch.distributed.
_LAUNCHING_FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate", "deepspeed", "transformers.Trainer")
_FRAMEWORK_TRAINERS = frozenset({"transformers.Trainer", "transformers.Seq2SeqTrainer", "trl.SFTTrainer",
                                 "trl.DPOTrainer", "trl.GRPOTrainer", "trl.PPOTrainer", "trl.RewardTrainer"})


def distributed_program(f: ModuleFacts) -> bool:
    """The file runs in every process of a distributed program: it (or its project) sets up torch.distributed
    or DDP, or it drives a framework trainer that does (Lightning, accelerate, DeepSpeed, HF Trainer)."""
    if uses_distributed(f) or f.imports_prefix(*_LAUNCHING_FRAMEWORKS):
        return True
    # `import transformers` ... `transformers.Trainer(...)` (alpaca-lora, held-out corpus 7), or a script that
    # reads the launcher's LOCAL_RANK/WORLD_SIZE: torchrun starts one copy per GPU.
    if any(cs.qual in _FRAMEWORK_TRAINERS for cs in f.calls) and not f.imports_prefix("torch_xla"):
        return True  # (torch_xla: SPMD runs one process per host)
    if reads_env_key(f, "LOCAL_RANK") or reads_env_key(f, "WORLD_SIZE"):
        return True
    # A module of a distributed program: it calls into, or is called from, a file that is one (a model
    # file whose save() the trainer calls). Not any file of the tree: pytorch/examples' mnist is no
    # less single-process for sitting beside distributed/.
    project = f.project
    return project is not None and any(uses_distributed(g) for g in project.linked(f))  # type: ignore[attr-defined]


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


def _minus_one(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _is_const(node.operand, 1)


def _single_process_test(test: ast.AST, negated: bool = False) -> bool:
    """A test true only when no process group is used: `RANK == -1`, `local_rank in (-1,)`, `not
    args.distributed` (yolov5's and yolov7's DP mode: the rank is -1 when no launcher set one). With
    `negated`, the test is true on the distributed path (`if args.distributed:` / `if rank != -1:`), so
    its `else:` is the single-process one."""
    if isinstance(test, ast.BoolOp):
        # `cuda and RANK == -1 and n > 1`: any conjunct that holds only without DDP makes the body so.
        if isinstance(test.op, ast.And) and not negated or isinstance(test.op, ast.Or) and negated:
            return any(_single_process_test(v, negated) for v in test.values)
        return all(_single_process_test(v, negated) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _single_process_test(test.operand, not negated)
    name = final_identifier(test).lower()
    if isinstance(test, (ast.Name, ast.Attribute)) and ("distributed" in name or name in ("ddp", "is_ddp", "use_ddp")):
        return negated
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and is_rank_identifier(final_identifier(test.left)):
        op, right = test.ops[0], test.comparators[0]
        minus = _minus_one(right) or (
            isinstance(right, (ast.Tuple, ast.List, ast.Set)) and len(right.elts) == 1 and _minus_one(right.elts[0])
        )
        if not minus:
            return False
        positive = isinstance(op, (ast.Eq, ast.In, ast.Is))
        return positive != negated if isinstance(op, (ast.Eq, ast.In, ast.Is, ast.NotEq, ast.NotIn, ast.IsNot)) else False
    return False


def _single_process_path(scope_node: ast.AST, target: ast.AST) -> bool:
    """`target` sits in the body of an `if` that only the no-DDP run takes, or in the `else:` of one
    that only the DDP run takes."""

    def visit(body: list[ast.stmt]) -> Optional[bool]:
        for stmt in body:
            if not (stmt.lineno <= target.lineno <= (stmt.end_lineno or stmt.lineno)):  # type: ignore[attr-defined]
                continue
            if isinstance(stmt, ast.If):
                if any(n is target for b in stmt.body for n in ast.walk(b)):
                    return _single_process_test(stmt.test) or bool(visit(stmt.body))
                if any(n is target for b in stmt.orelse for n in ast.walk(b)):
                    return _single_process_test(stmt.test, negated=True) or bool(visit(stmt.orelse))
                return False
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if isinstance(block, list) and any(n is target for b in block for n in ast.walk(b)):
                    return visit(block)
            for h in getattr(stmt, "handlers", ()) or ():
                if any(n is target for b in h.body for n in ast.walk(b)):
                    return visit(h.body)
            return False
        return None

    body = getattr(scope_node, "body", None)
    return bool(visit(body)) if isinstance(body, list) else False


def _is_init(cs: CallSite) -> bool:
    return cs.attr == "init_process_group"


@rule(
    "DDP022",
    "data-parallel-in-ddp",
    "nn.DataParallel in a process that joined a process group: each rank replicates over every GPU and "
    "no gradient is synchronised across ranks",
    "wrap the model in DistributedDataParallel(model, device_ids=[local_rank]) in each process, not DataParallel",
    "DataParallel inside one rank of a multi-process job drives every visible GPU from each process and "
    "never all-reduces gradients between processes: ranks train diverging models on the same GPUs.",
)
def check_data_parallel_in_ddp(f: ModuleFacts) -> Iterator[Hit]:
    for cs in f.calls:
        if cs.attr not in ("DataParallel", "data_parallel") or not cs.qual.startswith("torch."):
            continue
        # `if args.distributed: DDP(...) else: DataParallel(...)` (pytorch/examples imagenet): the
        # function builds DDP on the distributed path; DataParallel is the one-process fallback.
        if any(o.qual.endswith("DistributedDataParallel") for o in cs.scope.calls):
            continue
        # `if RANK == -1 and device_count() > 1: DataParallel(model)` (yolov5): the run without a
        # process group, whatever the function does on the DDP path.
        if _single_process_path(cs.scope.node, cs.node) or _gpu_count_one_when_distributed(f, cs):
            continue
        if happens_before(f, cs.scope, cs.pos, _is_init):
            yield (
                cs.node,
                f"{cs.attr}() after init_process_group(): each rank replicates the model over every GPU "
                "and no gradient is synchronised across ranks",
            )


def _gpu_count_one_when_distributed(f: ModuleFacts, cs: CallSite) -> bool:
    """DataParallel under `if args.n_gpu > 1:` in a program whose distributed branch sets `args.n_gpu = 1` beside
    its init_process_group (Hugging Face's classic example scripts, microsoft/CodeXGLUE's run_lm.py, held-out lint
    corpus 16): after the init the condition is false, so DataParallel runs only in a single-process run."""
    counts: set[str] = set()
    for node in ast.walk(cs.scope.node):
        if isinstance(node, ast.If) and any(n is cs.node for st in node.body for n in ast.walk(st)):
            for cmp in ast.walk(node.test):
                if (isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Gt)
                        and isinstance(cmp.comparators[0], ast.Constant) and cmp.comparators[0].value == 1):
                    counts.add(final_identifier(cmp.left) or "")
    counts.discard("")
    if not counts:
        return False
    for module in program_files(f):
        for node in ast.walk(module.tree):
            for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
                if not isinstance(body, list) or not any(
                    isinstance(n, ast.Call) and (dotted(n.func) or "").endswith("init_process_group")
                    for st in body for n in ast.walk(st)):
                    continue
                if any(isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and st.value.value == 1
                       and any(final_identifier(t) in counts for t in st.targets) for st in body):
                    return True
    return False


# The module as an argv element, or in a command line: not prose that merely names it.
_LAUNCH_RE = re.compile(r"^\s*torch\.distributed\.launch\s*$|-m\s+torch\.distributed\.launch\b")


@rule(
    "DDP012",
    "distributed-launch",
    "torch.distributed.launch is deprecated: use torchrun",
    "launch with `torchrun --nproc_per_node=N train.py` and read LOCAL_RANK from the environment",
    "torch.distributed.launch is deprecated and passes --local-rank, which older argparse code rejects. "
    "Deprecated is not broken: the launcher still runs, and the parser it may break is DDP013's finding.",
    default=False,
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


# The launch the script documents (a usage line in its docstring, a comment, an argv it builds) passes no
# --local_rank flag at all: torchrun sets LOCAL_RANK, `torch.distributed.launch --use_env` too.
_FLAGLESS_LAUNCH_RE = re.compile(rb"\btorchrun\b|--use[_-]env\b|torch\.distributed\.run\b")


# APIs that exist only from PyTorch 2.0 on: a program that calls them runs where torch.distributed.launch
# passes --local-rank (hyphen).
_TORCH2_RE = re.compile(
    rb"torch\.compile\(|torch\._dynamo\b|init_device_mesh|\bDeviceMesh\b|\bfully_shard\(|torch\.accelerator\b"
    rb"|scaled_dot_product_attention|torch\.nn\.attention\b|torch\.export\b|torch\.func\b"
)


# `python -m torch.distributed.launch ...` (or `torch/distributed/launch.py`) on a line without --use_env: the
# launcher passes the local rank as a flag, `--local-rank=N` since PyTorch 2.0.
_OLD_LAUNCH_RE = re.compile(rb"^[^\n]*torch[./]distributed[./]launch\b[^\n]*$", re.MULTILINE)


def documents_old_launch(f: ModuleFacts) -> bool:
    """The repository says its programs start through torch.distributed.launch without --use_env: in a launch
    script beside them (engine.py hands their text over as `launch_text`) or in this file (a usage line)."""
    for text, skipped in ((f.launch_text, (b"#",)), (f.source, (b"import", b"from"))):
        if not text or b"distributed" not in text:
            continue
        for line in _OLD_LAUNCH_RE.finditer(text):
            said = line.group(0)
            # a commented-out line of a shell script is not the launch; a usage comment in the .py is
            if not re.search(rb"--use[_-]env\b", said) and not said.lstrip().startswith(skipped):
                return True
    return False


def _reads_local_rank_attr(f: ModuleFacts) -> bool:
    """`args.local_rank` (any receiver) read somewhere in the file: the flag's value is used."""
    if b"local_rank" not in f.source:
        return False
    return any(isinstance(n, ast.Attribute) and n.attr == "local_rank" and isinstance(n.ctx, ast.Load)
               for n in ast.walk(f.tree))


def local_rank_options(f: ModuleFacts) -> list[tuple[CallSite, str]]:
    """Each `add_argument("--local_rank")` without the `--local-rank` spelling, with "" when the launch
    the script is written for breaks on it (PyTorch >= 2.0's torch.distributed.launch passes
    --local-rank=N, which argparse rejects), or the reason the documented launch still works (the
    opinionated DDP029)."""
    if "local_rank_options" in f.memo:
        return f.memo["local_rank_options"]  # type: ignore[return-value]
    out: list[tuple[CallSite, str]] = []
    hits = []
    for cs in f.calls_named("add_argument"):
        opts = {a.value for a in cs.node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
        if "--local_rank" in opts and "--local-rank" not in opts:
            hits.append(cs)
    # The deepspeed launcher passes --local_rank (underscore): the option is right there.
    if hits and not f.imports_prefix("deepspeed"):
        works = ""
        program = program_files(f)
        if any(cs.qual in _SPAWN_FUNCS for cs in f.calls):
            works = "the script starts its own processes with mp.spawn, which passes no flag"
        elif _starts_own_ranks(f):
            works = "the script starts its own processes (Process(target=...)) and sets local_rank itself"
        elif f.calls_named("parse_known_args") and not f.calls_named("parse_args"):
            works = "parse_known_args() ignores the launcher's --local-rank"
        elif documents_old_launch(f):
            works = ""  # the launch the repository documents passes --local-rank=N on PyTorch >= 2.0: it exits
        elif any(reads_env_key(g, "LOCAL_RANK") for g in program):
            works = "the program also reads LOCAL_RANK from the environment, so torchrun works"
        elif _FLAGLESS_LAUNCH_RE.search(f.source):
            works = "the launch the script names (torchrun, --use_env) passes no flag"
        elif not any(_reads_local_rank_attr(g) for g in program) and not any(
            _TORCH2_RE.search(g.source)
            # this file and those it calls into or is called from: not a torch.compile elsewhere in a tree
            for g in near_files(f)
        ):
            # The value is never used: torchrun (no flag) works, and the 1.x launchers pass --local_rank.
            # A flag whose value places the rank, with no LOCAL_RANK read anywhere, is broken under every
            # current launcher: torchrun leaves it at its default (every rank on one GPU), and PyTorch >= 2.0's
            # torch.distributed.launch passes --local-rank, which the parser rejects (held-out corpora 8 and 9).
            works = "its value is never read, so torchrun (which passes no flag) works"
        # `if torch.__version__ ... 1:` / `if TORCH_MAJOR == 1:` around the option: only the old launcher.
        versioned: list[tuple[int, int]] = []
        low = f.source.lower()
        for n in ast.walk(f.tree) if b"version" in low or b"major" in low else ():
            if isinstance(n, ast.If) and any(
                "version" in i.lower() or "major" in i.lower() for i in names_in(n.test)
            ):
                versioned.append((n.body[0].lineno, n.body[-1].end_lineno or n.body[-1].lineno))
        for cs in hits:
            if not any(a <= cs.node.lineno <= b for a, b in versioned):
                out.append((cs, works))
    f.memo["local_rank_options"] = out
    return out


def _starts_own_ranks(f: ModuleFacts) -> bool:
    """The script starts its ranks itself with multiprocessing's `Process(target=...)` and assigns
    `args.local_rank = ...` before each: no launcher, so no flag is ever passed (NVlabs/NVAE, held-out lint
    corpus 15)."""
    started = any(cs.attr == "Process" and cs.kwarg("target") is not None
                  and (cs.qual or "").split(".")[0] in ("multiprocessing", "torch", "") for cs in f.calls)
    return started and any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "local_rank" for t in n.targets)
        for n in ast.walk(f.tree))


@rule(
    "DDP013",
    "local-rank-argument",
    "--local_rank argparse option: torch.distributed.launch now passes --local-rank, and torchrun passes nothing",
    'read int(os.environ["LOCAL_RANK"]); if you must keep the flag, accept both: add_argument("--local-rank", "--local_rank")',
    "PyTorch 2.0's launcher passes --local-rank=N (hyphen); a parser that knows only --local_rank exits.",
)
def check_local_rank_argument(f: ModuleFacts) -> Iterator[Hit]:
    for cs, works in local_rank_options(f):
        if not works:
            yield cs.node


@rule(
    "DDP029",
    "local-rank-argument-unused",
    "--local_rank argparse option only: the documented launch works, but PyTorch >= 2.0's "
    "torch.distributed.launch would pass --local-rank",
    'accept both spellings (add_argument("--local-rank", "--local_rank")), or drop the flag and read LOCAL_RANK',
    "Harmless with the launch the script is written for; a run through torch.distributed.launch on "
    "PyTorch >= 2.0 exits with 'unrecognized arguments: --local-rank=0'.",
    default=False,
)
def check_local_rank_argument_unused(f: ModuleFacts) -> Iterator[Hit]:
    for cs, works in local_rank_options(f):
        if works:
            yield cs.node, f"--local_rank argparse option only: {works}; accept --local-rank too"


def uses_ddp_wrapper(f: ModuleFacts) -> bool:
    return (
        "DistributedDataParallel" in f.names
        or "DistributedDataParallel" in f.attrs
        or any(cs.qual.endswith("DistributedDataParallel") for cs in f.calls)
    )


@rule(
    "DDP015",
    "reentrant-checkpoint",
    "reentrant activation checkpointing in a DDP model that looks for unused parameters: 'Expected to mark a "
    "variable ready only once'",
    "pass use_reentrant=False to checkpoint() (gradient_checkpointing_kwargs={'use_reentrant': False}), "
    "or build DDP with static_graph=True",
    "The reentrant variant re-runs forward inside backward, so DDP's gradient hooks fire twice.",
)
def check_reentrant_checkpoint(f: ModuleFacts) -> Iterator[Hit]:
    ddp = uses_ddp_wrapper(f)
    if not (ddp or any(True for _ in f.calls_named("init_process_group"))):
        return
    if "_set_static_graph" in f.attrs:
        return
    for cs in f.calls:
        if cs.qual.endswith("DistributedDataParallel") and _is_const(cs.kwarg("static_graph"), True):
            return
    # Reentrant checkpointing breaks DDP when DDP looks for unused parameters (it marks them ready after the
    # forward, and the re-run forward in backward marks them again); with find_unused_parameters=False and
    # each block checkpointed once it works, as Hugging Face's Trainer ran it for years (held-out corpus 7:
    # GaLore's plain DDP was a false finding).
    if not any(_is_const(cs.kwarg("find_unused_parameters"), True) or _is_const(cs.kwarg("ddp_find_unused_parameters"), True)
               for cs in f.calls):
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
            if runs_at_import(f, cs.scope):
                yield (
                    cs.node,
                    (
                        f'{cs.attr}() runs at import time, without an `if __name__ == "__main__":` guard: '
                        "each spawned child re-runs it"
                    ),
                )
