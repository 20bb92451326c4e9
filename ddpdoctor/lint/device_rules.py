"""Rules about which GPU a rank uses: DDP002 (device from the global rank, a taint analysis in source
order), DDP003 and DDP021 (the NCCL group created before set_device). Registered in rules.py's table.
Over 600 lines: one idea, which GPU a rank ends up on; the current-device predicate is shared with
every_rank_rules.py.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ddpdoctor.lint.facts import CallSite, ModuleFacts, Scope, dotted, final_identifier, is_rank_identifier
from ddpdoctor.lint.flow import (
    callers_of,
    enclosing_scope,
    find_call_in,
    happens_before,
    is_entry,
    program_files,
)
from ddpdoctor.lint.helpers import (
    _CUDA_NO_INIT,
    _GLOBAL_RANK_ENV,
    _SPAWN_FUNCS,
    _cuda_string,
    _init_calls,
    _is_collective_call,
    _is_set_device,
    env_key,
    is_test_file,
    multi_node,
    near_files,
    uses_cuda,
)
from ddpdoctor.lint.registry import Hit, rule


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
            return "RANK" if env_key(self.f, node) in _GLOBAL_RANK_ENV else None
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
        if _ACCEL_SET_DEVICE_RE.fullmatch(callee) or callee == "torch.accelerator.set_device_index":
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


# set_device of CUDA and of the accelerators that mirror its API (Cambricon MLU, Ascend NPU, Moore Threads
# MUSA, Intel XPU, Habana HPU): each indexes the devices of this node (mmcv's and mmengine's
# `torch.mlu.set_device(rank)` / `torch.musa.set_device(rank)` with the global RANK).
_ACCEL_SET_DEVICE_RE = re.compile(r"(?:torch\.)?(?:.*\.)?(?:cuda|mlu|npu|musa|xpu|hpu)\.set_device")


def _maybe_device_sink(cs: CallSite) -> bool:
    if cs.attr in ("to", "cuda", "set_device", "set_device_index", "device"):
        return True
    return any(kw.arg in _DEVICE_KWARGS for kw in cs.node.keywords)


# Text that any global-rank source needs: get_rank(), a RANK-like environment key, `rank = a * b + c`.
_RANK_SOURCE_RE = re.compile(
    rb"get_(?:global_)?rank|['\"](?:RANK|SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK|PMIX_RANK)['\"]"
    rb"|rank\s*=[^=\n][^\n]*\*"
)


# The launcher's node-local rank read somewhere in the program: the environment key or the legacy flag.
_LOCAL_RANK_READ_RE = re.compile(rb"""['"]LOCAL_RANK['"]|['"]--local[_-]rank['"]""")


def _scope_source(f: ModuleFacts, scope: Scope) -> bytes:
    """The source bytes of a function scope (the whole file for the module scope)."""
    if scope.is_module:
        return f.source
    node = scope.node
    lines = f.source.splitlines(keepends=True)
    return b"".join(lines[node.lineno - 1:(getattr(node, "end_lineno", None) or node.lineno)])


def _cuda_prefix(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda:")


_LOCAL_ADDRS = frozenset({"localhost", "127.0.0.1", "::1"})


def single_node_spawn(f: ModuleFacts) -> bool:
    """The program starts its ranks with mp.spawn and rendezvous on this host (MASTER_ADDR "localhost" or
    "127.0.0.1", or init_method tcp://localhost:...): it runs on one node only."""
    if not any(cs.qual in _SPAWN_FUNCS for cs in f.calls):
        return False
    for _base, key, value, _ in f.env_assigns:
        if key == "MASTER_ADDR" and isinstance(value, ast.Constant) and value.value in _LOCAL_ADDRS:
            return True
    for cs in f.calls_named("setdefault"):
        key, value = cs.arg(0, "key"), cs.arg(1, "default")
        if isinstance(key, ast.Constant) and key.value == "MASTER_ADDR" and isinstance(value, ast.Constant):
            if value.value in _LOCAL_ADDRS:
                return True
    for cs in _init_calls(f):
        method = cs.arg(1, "init_method")
        if isinstance(method, ast.Constant) and isinstance(method.value, str):
            if any(f"//{a}:" in method.value for a in _LOCAL_ADDRS):
                return True
    return False


def _never_read(f: ModuleFacts, node: ast.AST) -> bool:
    """`node` is in the value of `self.device = torch.device(...)` and no method of this file reads
    `self.device`: a device kept but never used picks no GPU (held-out lint corpus 14: CosyVoice's Executor,
    whose real device comes from LOCAL_RANK elsewhere). Another file reading `executor.device` is not followed:
    `.device` is read off every tensor."""
    stmt = next((st for st in ast.walk(f.tree) if isinstance(st, ast.Assign) and len(st.targets) == 1
                 and isinstance(st.value, ast.Call) and final_identifier(st.value.func) == "device"
                 and any(n is node for n in ast.walk(st.value))), None)
    target = stmt.targets[0] if stmt is not None else None
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"):
        return False
    return not any(
        isinstance(n, ast.Attribute) and n.attr == target.attr and isinstance(n.ctx, ast.Load)
        and isinstance(n.value, ast.Name) and n.value.id == "self"
        for n in ast.walk(f.tree)
    )


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
    if single_node_spawn(f):
        return  # mp.spawn with MASTER_ADDR=localhost: one node, where the global rank is the GPU index
    # A program that reads the launcher's LOCAL_RANK (or --local_rank) knows the two differ, and a launcher runs
    # it on several nodes by a flag: a GPU chosen from the global rank in a function that does not read the local
    # one is the bug (held-out corpus 12: torchrec's bert4rec `set_device(dist.get_rank())` in its epoch loop
    # beside main's `int(os.environ["LOCAL_RANK"])`). Beside the local rank in one scope (apex's toy_ddp.py,
    # `set_device(local_rank)` then `device_ids=[rank]`) it stays a single-node slip, as graded.
    local_elsewhere = not multi_node(f, local_apart=True, linked_only=True)
    if local_elsewhere and not any(_LOCAL_RANK_READ_RE.search(g.source) for g in near_files(f)):
        # Nothing says the program runs on several nodes (a node count or rank, Slurm's task variables, a
        # local rank read apart from the global one): on one node the global rank is the GPU index.
        return
    seen: set[int] = set()
    # `set_device(rank)` then `torch.device("cuda", rank)` in one function: one choice of GPU, reported
    # where it is made (held-out corpus 5: microsoft/LoRA gpu.py lines 61-62, one reviewer item).
    chosen: set[tuple[int, str]] = set()
    for node, culprit in sorted(_GlobalRankTaint(f).run(), key=lambda hit: getattr(hit[0], "lineno", 0)):
        if id(node) in seen:
            continue
        seen.add(id(node))
        where = enclosing_scope(f, getattr(node, "lineno", 0))
        scope = id(where)
        if (scope, culprit) in chosen:
            continue
        if local_elsewhere and _LOCAL_RANK_READ_RE.search(_scope_source(f, where)):
            continue
        if isinstance(node, ast.Call) and final_identifier(node) == "set_device":
            chosen.add((scope, culprit))
        elif _never_read(f, node):
            continue  # `self.device = torch.device(f"cuda:{rank}")` that nothing reads (CosyVoice's Executor)
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


# torch.cuda calls that name no device and use none: they neither open a context on the current
# device nor depend on it.
_CUDA_DEVICE_FREE = frozenset(
    {
        "set_device",
        "device",
        "current_device",
        "get_device_name",
        "get_device_properties",
        "get_device_capability",
        "device_of",
        "stream",
    }
)


def _names_a_device(node: ast.AST) -> bool:
    """ "cuda:1", f"cuda:{i}", torch.device("cuda", i), a variable or a number: a device given, not the
    current one. Only the bare "cuda" string (and torch.device("cuda")) means "whatever is current"."""
    if isinstance(node, ast.Constant):
        return not (isinstance(node.value, str) and node.value.strip().lower() == "cuda")
    if isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("device") and len(node.args) == 1:
        return _names_a_device(node.args[0])
    return True


def current_device_use(cs: CallSite) -> str:
    """What the call does on the *current* CUDA device (GPU 0 until set_device), "" when nothing: a
    collective or barrier (NCCL binds it to the current device), a bare `.cuda()`, `.to("cuda")`,
    `device="cuda"`, `torch.cuda.synchronize()`. Work on a named device (`.cuda(i)`, `.to(f"cuda:{i}")`,
    `DDP(device_ids=[i])`) lands where it should whatever the current device is."""
    if _is_collective_call(cs):
        if cs.attr == "barrier" and cs.kwarg("device_ids") is not None:
            return ""  # barrier(device_ids=[i]) names its GPU: the documented way around the guess
        named = cs.kwarg("device")
        if cs.attr.endswith(("_object", "_object_list")) and named is not None and _names_a_device(named):
            # broadcast_object_list(..., device=device) serialises onto the GPU it names, and NCCL binds the
            # communicator there (rapidsai/cugraph-gnn's examples, held-out lint corpus 16).
            return ""
        return f"{cs.attr}()"
    func = cs.node.func
    if cs.attr == "cuda" and cs.qual != "torch.cuda" and isinstance(func, ast.Attribute):
        if cs.node.args or cs.kwarg("device") is not None:
            return ""
        return "a bare .cuda()"
    if cs.qual.startswith("torch.cuda.") and cs.qual.count(".") == 2:
        if cs.attr in _CUDA_NO_INIT or cs.attr in _CUDA_DEVICE_FREE or cs.node.args or cs.node.keywords:
            return ""
        return f"torch.cuda.{cs.attr}()"
    if cs.attr == "to" and cs.node.args and not _names_a_device(cs.node.args[0]):
        return '.to("cuda")'
    device = cs.kwarg("device")
    if device is not None and not _names_a_device(device):
        return 'device="cuda"'
    return ""


# Uses that put a tensor, a model or an object collective's buffer on the current device: without
# set_device every rank's lands on GPU 0 (a wrong GPU, then NCCL's "Duplicate GPU detected"). The others
# (a barrier, whose GPU torch guesses from the rank; torch.cuda statistics and synchronize; pinned memory)
# leave a stray context on GPU 0 at worst, and are the opinionated DDP021.
_PLACING_USES = ("a bare .cuda()", '.to("cuda")', 'device="cuda"')


def places_on_current_gpu(use: str) -> bool:
    return use.startswith(_PLACING_USES) or "_object" in use


def _gpu_work(cs: CallSite) -> bool:
    return bool(current_device_use(cs))


def _first_use(f: ModuleFacts, cs: CallSite) -> str:
    """`cs`'s own use of the current device, else that of the first such call a helper it calls makes."""
    use = current_device_use(cs)
    if use:
        return use
    inner = find_call_in(f, cs, _gpu_work)
    return f"{current_device_use(inner)} in {cs.attr}()" if inner is not None else ""


def visible_devices_per_rank(f: ModuleFacts) -> Optional[int]:
    """The line where the program sets CUDA_VISIBLE_DEVICES from something that varies per process
    (`str(local_rank)`, `args.gpu`): each rank then sees one GPU, and GPU 0 is the right one."""
    for g in program_files(f):
        for _base, key, value, stmt in g.env_assigns:
            if key == "CUDA_VISIBLE_DEVICES" and not isinstance(value, ast.Constant):
                return stmt.lineno
    return None


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
        before = happens_before(f, cs.scope, cs.pos, _is_set_device)
        if before:
            continue
        set_at: Optional[CallSite] = None
        work_at: Optional[CallSite] = None
        use = ""
        for later in cs.scope.calls:
            if later.pos <= cs.pos:
                continue
            if _is_set_device(later) or find_call_in(f, later, _is_set_device) is not None:
                set_at = later
                break
            found_use = _first_use(f, later)
            # The first use that puts something on GPU 0 decides; a barrier or a memory statistic before
            # it does not (see places_on_current_gpu).
            if found_use and (work_at is None or places_on_current_gpu(found_use) and not places_on_current_gpu(use)):
                use, work_at = found_use, later
        after_return = None
        if set_at is None and work_at is None and not is_entry(f, cs.scope):
            after_return = _set_device_after_return(f, cs.scope)
            if after_return is None:
                # `setup(rank); x = torch.ones(1).cuda(); torch.cuda.set_device(rank)`: the caller goes on
                # to place a tensor on the current GPU before any set_device.
                placed = _placing_use_after_return(f, cs.scope)
                if placed is not None and visible_devices_per_rank(f) is None:
                    out.append(
                        (
                            cs,
                            "bug",
                            f"NCCL process group created in {cs.scope.name}() with no torch.cuda.set_device() "
                            f"before it; after it returns, line {placed[0].node.lineno} places work on the "
                            f"current GPU ({placed[1]}) before any set_device: GPU 0 on every rank",
                        )
                    )
                    continue
        found: Optional[tuple[str, str]] = None
        if after_return is not None:
            found = (
                "order",
                f"NCCL process group created in {cs.scope.name}() before torch.cuda.set_device(), which "
                f"follows after it returns (line {after_return.node.lineno}) before anything uses the "
                "current GPU",
            )
        elif set_at is not None and work_at is None:
            found = (
                "order",
                f"NCCL process group created before torch.cuda.set_device() (line {set_at.node.lineno}): "
                "nothing uses the current GPU in between, but this rank may start on GPU 0 if CUDA work "
                "moves before set_device",
            )
        elif set_at is not None and work_at is not None and not places_on_current_gpu(use):
            found = (
                "order",
                f"NCCL process group created before torch.cuda.set_device() (line {set_at.node.lineno}); "
                f"line {work_at.node.lineno} touches the current GPU first ({use}), which places no tensor "
                "there: a barrier's GPU is guessed from the rank, a statistic or a pinned buffer only "
                "opens a context on GPU 0",
            )
        elif set_at is not None and work_at is not None:
            found = (
                "bug",
                f"NCCL process group created before torch.cuda.set_device() (line {set_at.node.lineno}); "
                f"line {work_at.node.lineno} uses the current GPU first ({use}): that runs on GPU 0 on "
                "every rank",
            )
        elif work_at is None and set_at is None and before is not True and (touch := _gpu0_touch(f)):
            # An entry point with nothing on the GPU right after init, in a program that never sets the
            # device anywhere: pinned memory, a barrier or a bare .cuda() then opens a context on GPU 0
            # in every rank (issue #24, class 8).
            found = (
                "bug" if places_on_current_gpu(touch) else "order",
                "NCCL process group created and no torch.cuda.set_device() anywhere in this program: "
                f"{touch} (line {touch_line(touch, f)}) uses the current GPU first, GPU 0 in every rank",
            )
        elif work_at is not None and places_on_current_gpu(use):
            # (A process entry point that does nothing on the GPU after init has nothing to misplace.)
            where = (
                f": line {work_at.node.lineno} uses the current GPU first ({use})"
                if work_at is not None
                else ""
            )
            found = (
                "bug",
                "NCCL process group created and no torch.cuda.set_device() before or after it in this "
                f"process{where}; ranks may all start on GPU 0",
            )
        elif work_at is not None or (before is False and not is_entry(f, cs.scope)):
            # Nothing is placed on the current GPU: a barrier (its GPU is guessed from the rank), memory
            # statistics or a pinned buffer (a stray context on GPU 0), or nothing at all in this process.
            where = f": line {work_at.node.lineno} touches the current GPU ({use})" if work_at is not None else ""
            found = (
                "order",
                "NCCL process group created and no torch.cuda.set_device() before or after it in this "
                f"process{where}, but no tensor is placed on the current GPU",
            )
        if found is not None and found[0] == "bug":
            visible = visible_devices_per_rank(f)
            if visible is not None:
                # One GPU visible per process (the launch layout): its GPU 0 is the right one.
                found = (
                    "order",
                    "NCCL process group created before torch.cuda.set_device(); CUDA_VISIBLE_DEVICES is set "
                    f"per process (line {visible}), so each rank's GPU 0 is its own",
                )
        if found is not None:
            out.append((cs, found[0], found[1]))
    f.memo["nccl_init_order"] = out
    return out


def _gpu0_touch(f: ModuleFacts) -> str:
    """What opens a context on the current device (GPU 0 when none is set) in a program with no
    set_device anywhere: "pin_memory=True", "barrier()", "a bare .cuda()"; "" when nothing does, or
    when the program sets a device somewhere (set_device, device_id=, CUDA_VISIBLE_DEVICES per rank)."""
    if "gpu0_touch" in f.memo:
        return f.memo["gpu0_touch"]  # type: ignore[return-value]
    found = ""
    files = program_files(f)
    sets = any(
        _is_set_device(cs)
        or cs.kwarg("device_id") is not None
        or cs.attr == "set_device_index"
        or cs.qual == "torch.cuda.device"
        for g in files
        for cs in g.calls
    ) or any(key == "CUDA_VISIBLE_DEVICES" for g in files for _b, key, _v, _s in g.env_assigns)
    if not sets:
        for g in files:
            for cs in g.calls:
                pin = cs.kwarg("pin_memory")
                if isinstance(pin, ast.Constant) and pin.value is True:
                    found = "pin_memory=True"
                elif cs.attr == "barrier" and cs.qual.startswith("torch.distributed.") and not cs.node.args:
                    found = "barrier()" if cs.kwarg("device_ids") is None else ""
                elif (
                    cs.attr == "cuda"
                    and not cs.node.args
                    and not cs.node.keywords
                    and cs.qual != "torch.cuda"
                ):
                    found = "a bare .cuda()"
                if found:
                    f.memo["gpu0_touch_line"] = cs.node.lineno if g is f else 0
                    break
            if found:
                break
    f.memo["gpu0_touch"] = found
    return found


def touch_line(touch: str, f: ModuleFacts) -> str:
    line = f.memo.get("gpu0_touch_line") or 0
    return str(line) if line else "in another file"


def _placing_use_after_return(f: ModuleFacts, scope: Scope) -> Optional[tuple[CallSite, str]]:
    """The first call, in this file, after a call into `scope` and before any set_device in the same
    caller, that places something on the current GPU (see places_on_current_gpu)."""
    for g, c in callers_of(f, scope):
        if g is not f:
            continue
        for later in c.scope.calls:
            if later.pos <= c.pos:
                continue
            if _is_set_device(later) or find_call_in(g, later, _is_set_device) is not None:
                break
            use = _first_use(g, later)
            if use and places_on_current_gpu(use):
                return later, use
    return None


def _set_device_after_return(f: ModuleFacts, scope: Scope) -> Optional[CallSite]:
    """Every caller of `scope` (the function that called init_process_group) goes on to call set_device
    with no GPU work in between: `setup(rank, ws); torch.cuda.set_device(rank)` in a spawn target. The
    set_device call of the first caller, else None."""
    callers = callers_of(f, scope)
    if not callers:
        return None
    first: Optional[CallSite] = None
    for g, c in callers:
        found: Optional[CallSite] = None
        for later in c.scope.calls:
            if later.pos <= c.pos:
                continue
            if _is_set_device(later) or find_call_in(g, later, _is_set_device) is not None:
                found = later
                break
            if _first_use(g, later):
                return None
        if found is None:
            return None
        first = first or found
    return first


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
