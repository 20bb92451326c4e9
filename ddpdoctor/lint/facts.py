"""One pass over a parsed script: the facts the lint rules judge.

The walk records every call with its context (enclosing function, whether a rank-0 check guards it,
whether it sits under `if __name__ == "__main__":`, loop depth), the import aliases needed to resolve
`dist.init_process_group` to `torch.distributed.init_process_group`, the functions defined and who
calls them, and a few assignments (MASTER_PORT). Rules then read these indexes instead of walking the
tree again, which keeps linting close to the speed of `ast.parse` itself.

Nothing here imports or runs the script: it is `ast` only.
Over 600 lines as one module: the facts come from one AST walk whose context stack (function, guards, loops) every recorded call shares.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

# Statement types that hold nested statement blocks; anything else holds expressions only.
_MATCH = getattr(ast, "Match", None)
_TRY_STAR = getattr(ast, "TryStar", None)
_TRY_TYPES = tuple(t for t in (ast.Try, _TRY_STAR) if t is not None)
_FUNC_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef)
_EXIT_TYPES = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_EXIT_CALLS = frozenset({"exit", "_exit", "quit"})

# --- rank guards -----------------------------------------------------------------------------------

# Identifiers that name "am I the main process" flags or helpers (is_main_process(), master_process,
# accelerator.is_main_process, trainer.is_global_zero, ...).
_MAIN_FLAG_RE = re.compile(
    r"^(?:(?:is|am)_(?:local_|global_|world_)?"
    r"(?:main|master|chief|root|primary|leader|coordinator|first_rank|main_rank|rank_?zero|rank_?0|"
    r"main_process|master_process|main_proc|master_proc|main_worker|master_node|global_zero|zero_rank|"
    r"first_worker|first_process)"  # microsoft/ANCE's is_first_worker() (held-out lint corpus 15)
    r"|(?:local_|global_)?(?:main_process|master_process|main_proc|master_proc|master_rank)"
    r"|rank_?zero|rank_?0|global_zero)(?:_(?:worker|process|proc|node|rank))?(?:_only)?$"
)
# Decorators that make a function run on rank 0 only (Lightning's rank_zero_only and look-alikes).
_RANK_ZERO_DECORATOR_RE = re.compile(r"rank_?zero|rank_?0|main_process_only|master_only|on_main_process")
_RANK_NAMES = frozenset(
    {"gpu", "gpu_id", "gpu_idx", "device_id", "local_gpu", "proc_id", "process_index", "local_process_index",
     "nr"}  # `args.nr`: the node rank of the classic DDP tutorials (rank = nr * gpus + gpu)
)

ZERO = "zero"  # the branch runs on rank 0 only
NONZERO = "nonzero"  # the branch runs on ranks other than 0 only


def is_rank_identifier(name: str) -> bool:
    """`rank`, `local_rank`, `ddp_rank`, `get_rank`, `gpu_id`, ...: names that hold or fetch a rank."""
    low = name.lower()
    if low in _RANK_NAMES:
        return True
    if "rank" not in low:
        return False
    return any(tok.endswith("rank") for tok in low.split("_"))


# nn.Module's own methods: `valid_model.train()` is the model's, not a Trainer.train() this file defines
# (held-out lint corpus 12: OpenNMT's validate() read as reaching its trainer's all_gather_list).
_MODULE_METHODS = frozenset({"train", "eval", "to", "cuda", "cpu", "half", "float", "double", "bfloat16",
                             "zero_grad", "parameters", "named_parameters", "modules", "children",
                             "requires_grad_", "apply", "forward"})
_MODULE_RECEIVER = re.compile(r"(?:model|module|net|encoder|decoder|generator|discriminator|backbone)$")


def _module_method(raw: str) -> bool:
    """`valid_model.train`, `self.net.eval`: an nn.Module method called on something named like a model."""
    receiver, _, method = raw.rpartition(".")
    return method in _MODULE_METHODS and bool(_MODULE_RECEIVER.search(receiver.rsplit(".", 1)[-1].lower()))


def live_body(body: list[ast.stmt]) -> list[ast.stmt]:
    """A function body up to a leading `raise` (after a docstring): a stub that raises at once never runs the
    rest, so no call there counts (relora's save_model_fsdp, held-out lint corpus 10)."""
    at = 1 if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    return body[: at + 1] if len(body) > at and isinstance(body[at], ast.Raise) else body


def is_main_flag(name: str) -> bool:
    return bool(_MAIN_FLAG_RE.match(name.lower()))


def final_identifier(node: ast.AST) -> str:
    """`a.b.c` -> "c", `f(x)` -> the callee's final identifier, `x` -> "x"; "" otherwise."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _identifiers(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        t = type(n)
        if t is ast.Name:
            yield n.id  # type: ignore[attr-defined]
        elif t is ast.Attribute:
            yield n.attr  # type: ignore[attr-defined]
        elif t is ast.Subscript:
            # `self.config["rank"]`, `os.environ["LOCAL_RANK"]`: a rank kept under a string key.
            key = n.slice  # type: ignore[attr-defined]
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier():
                yield key.value


def mentions_rank(node: ast.AST) -> bool:
    return any(is_rank_identifier(i) or is_main_flag(i) for i in _identifiers(node))


def _zero_set(node: ast.AST) -> Optional[bool]:
    """(0, -1) / [-1, 0]: True when the collection holds 0 and nothing above it."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None
    values = []
    for elt in node.elts:
        if (
            isinstance(elt, ast.UnaryOp)
            and isinstance(elt.op, ast.USub)
            and isinstance(elt.operand, ast.Constant)
        ):
            values.append(-1)
        elif isinstance(elt, ast.Constant) and type(elt.value) is int:
            values.append(elt.value)
        else:
            return None
    return 0 in values and max(values) == 0


_SWAPPED = {ast.Gt: ast.Lt, ast.Lt: ast.Gt, ast.GtE: ast.LtE, ast.LtE: ast.GtE}


def _classify_compare(node: ast.Compare) -> Optional[str]:
    if len(node.ops) != 1:
        return None
    left, op, right = node.left, node.ops[0], node.comparators[0]
    if isinstance(left, ast.Constant) and type(left.value) is int:
        left, right = right, left
        op = _SWAPPED.get(type(op), type(op))()
    if not mentions_rank(left):
        return None
    if isinstance(right, ast.Constant) and type(right.value) is int:
        value = right.value
        if isinstance(op, (ast.Eq, ast.Is)) and value == 0:
            return ZERO
        if isinstance(op, (ast.NotEq, ast.IsNot)) and value == 0:
            return NONZERO
        if isinstance(op, ast.Gt) and value == 0 or isinstance(op, ast.GtE) and value == 1:
            return NONZERO
        if isinstance(op, ast.LtE) and value == 0 or isinstance(op, ast.Lt) and value == 1:
            return ZERO
        return None
    if isinstance(op, (ast.In, ast.NotIn)) and _zero_set(right):
        return ZERO if isinstance(op, ast.In) else NONZERO
    return None


_CONFIG_PARTS = frozenset({"cfg", "config", "conf", "configs", "mode", "hparams", "hp", "settings", "opts_cfg"})


def _config_switch(test: ast.AST, ident: str) -> bool:
    """`self.cfg.mode.gpu`, `config.train.gpu`: a switch of a configuration object named like a device
    (use the GPU or not), the same on every rank — not `args.gpu`, the local rank of DeiT-style scripts.
    Names that say rank (`cfg.local_rank`) stay ranks (held-out lint corpus 9, zhangruochi/pseudoESM)."""
    if "rank" in ident.lower() or not isinstance(test, ast.Attribute):
        return False
    parts = (dotted(test) or "").lower().split(".")[:-1]
    return any(p in _CONFIG_PARTS for p in parts)


def classify_guard(test: ast.AST, main_vars: frozenset[str] = frozenset()) -> Optional[str]:
    """Which ranks run the body of `if test:`: ZERO (rank 0 only), NONZERO (all but rank 0) or None.

    Lenient on purpose for ZERO: `if not distributed or rank == 0` counts as a rank-0 guard, because the
    rules use it to stay silent (a missed finding is better than a false one).
    """
    t = type(test)
    if t is ast.Compare:
        return _classify_compare(test)  # type: ignore[arg-type]
    if t is ast.UnaryOp and isinstance(test.op, ast.Not):  # type: ignore[attr-defined]
        inner = classify_guard(test.operand, main_vars)  # type: ignore[attr-defined]
        return {ZERO: NONZERO, NONZERO: ZERO}.get(inner or "")
    if t is ast.BoolOp:
        kinds = [classify_guard(v, main_vars) for v in test.values]  # type: ignore[attr-defined]
        if ZERO in kinds:
            return ZERO
        if isinstance(test.op, ast.Or) and NONZERO in kinds:  # type: ignore[attr-defined]
            return NONZERO
        return None
    if main_vars and t in (ast.Name, ast.Attribute) and dotted(test) in main_vars:
        return ZERO  # `save_logs = args.logs and is_master(args)` ... `if save_logs:`
    if t in (ast.Name, ast.Attribute, ast.Call):
        ident = final_identifier(test)
        if is_main_flag(ident):
            return ZERO
        if t is not ast.Call and is_rank_identifier(ident) and not _config_switch(test, ident):
            return NONZERO  # `if rank:` is true on every rank but 0
        if t is ast.Call and is_rank_identifier(ident):
            return NONZERO  # `if dist.get_rank():`
    return None


def _subset_kind(test: ast.AST, main_vars: frozenset[str]) -> Optional[str]:
    """`rank != 0 and X`: the body runs on a subset of the ranks a side of the `and` names."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        kinds = {classify_guard(v, main_vars) for v in test.values} - {None}
        if len(kinds) == 1:
            return kinds.pop()
    return None


def main_guard_functions(tree: ast.Module) -> frozenset[str]:
    """Module-level functions that only answer whether the file runs as the main script (`def
    is_interactive_notebook(): return __name__ == "__main__"`, the Annotated Transformer's notebook helper,
    held-out lint corpora 10 and 11): `if is_interactive_notebook():` is a main guard."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.args.args:
            body = [st for st in node.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None \
                    and is_main_guard(body[0].value):
                out.add(node.name)
    return frozenset(out)


def is_main_guard(test: ast.AST, functions: frozenset[str] = frozenset()) -> bool:
    """`if __name__ == "__main__":` (either operand order), or a call of one of `functions` (above)."""
    if functions and isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id in functions:
        return True
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    a, b = test.left, test.comparators[0]
    for x, y in ((a, b), (b, a)):
        if (
            isinstance(x, ast.Name)
            and x.id == "__name__"
            and isinstance(y, ast.Constant)
            and y.value == "__main__"
        ):
            return True
    return False


def _env_get(node: ast.AST) -> Optional[str]:
    """`os.environ.get("KEY", ...)` / `os.getenv("KEY", ...)` / `environ["KEY"]` -> "KEY"."""
    if isinstance(node, ast.Call) and node.args:
        key = node.args[0]
        name = dotted(node.func) or ""
        if (name.endswith("environ.get") or name.split(".")[-1] == "getenv") and isinstance(key, ast.Constant):
            return key.value if isinstance(key.value, str) else None
    return None


def _empty(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (None, "")


def env_absent_key(test: ast.AST, op: type = ast.NotIn) -> Optional[str]:
    """`"KEY" not in os.environ` -> "KEY": the body only sets a default the launcher can override.
    With `op=ast.In`, `"KEY" in os.environ` -> "KEY": then the `else:` sets the default.
    Also the other spellings of "unset or empty" (held-out review of 2026-11-27, dlrm's
    `if not os.environ.get("MASTER_PORT", None):`): `not os.getenv("KEY")`, `os.environ.get("KEY") is None`,
    `== ""`; and of "set": a bare `os.environ.get("KEY")`, `is not None`, `!= ""`."""
    absent = op is ast.NotIn
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, cmp, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(left, ast.Constant) and isinstance(left.value, str):
            holder = right
            if isinstance(right, ast.Call) and isinstance(right.func, ast.Attribute) and right.func.attr == "keys":
                holder = right.func.value
            if isinstance(cmp, op) and (dotted(holder) or "").endswith("environ"):
                return left.value
            return None
        key = _env_get(left)
        if key and _empty(right):
            if isinstance(cmp, (ast.Is, ast.Eq) if absent else (ast.IsNot, ast.NotEq)):
                return key
        return None
    if absent and isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _env_get(test.operand)
    if not absent:
        return _env_get(test)
    return None


def env_absent_keys(test: ast.AST) -> frozenset[str]:
    """The keys a test finds missing: `"KEY" not in os.environ`, and each side of `"MASTER_ADDR" not in
    os.environ or "MASTER_PORT" not in os.environ` (ClassyVision's defaults when no launcher ran)."""
    if isinstance(test, ast.BoolOp):
        keys = [env_absent_key(v) for v in test.values]
        return frozenset(k for k in keys if k) if all(keys) else frozenset()
    key = env_absent_key(test)
    return frozenset((key,)) if key else frozenset()


def ends_in_exit(body: list[ast.stmt]) -> bool:
    if not body:
        return False
    last = body[-1]
    if isinstance(last, _EXIT_TYPES):
        return True
    return (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and final_identifier(last.value) in _EXIT_CALLS
    )


# Fields that never hold code worth visiting (Load/Store markers, comments, string kinds).
_SKIP_FIELDS = frozenset({"ctx", "type_comment", "kind", "op", "ops"})
_FIELDS: dict[type, tuple[str, ...]] = {}

# --- names ------------------------------------------------------------------------------------------


def dotted(node: ast.AST) -> Optional[str]:
    """`torch.distributed.init_process_group` -> that string; None for anything but a Name/Attribute chain."""
    parts: list[str] = []
    while type(node) is ast.Attribute:
        parts.append(node.attr)  # type: ignore[attr-defined]
        node = node.value  # type: ignore[attr-defined]
    if type(node) is not ast.Name:
        return None
    parts.append(node.id)  # type: ignore[attr-defined]
    parts.reverse()
    return ".".join(parts)


class Scope:
    """A function body, or the module's top level."""

    __slots__ = ("name", "node", "parent", "calls", "guarded", "params")

    def __init__(self, name: str, node: ast.AST, parent: Optional[Scope], guarded: bool) -> None:
        self.name = name
        self.node = node
        self.parent = parent
        self.calls: list[CallSite] = []
        self.guarded = guarded  # decorated to run on rank 0 only
        self.params: frozenset[str] = frozenset()

    @property
    def is_module(self) -> bool:
        return self.parent is None


class RankBranch:
    """A branch of an `if` whose test depends on the rank: which `if`, which side, who runs it."""

    __slots__ = ("test", "stmt", "body", "kind", "outer")

    def __init__(self, stmt: ast.If, body: bool, kind: Optional[str], outer: Optional[RankBranch]) -> None:
        self.stmt = stmt
        self.test = stmt.test
        self.body = body  # True: the `if` body; False: the `else`
        self.kind = kind  # ZERO / NONZERO for the ranks that run this side; None: some ranks, unknown
        self.outer = outer


class CallSite:
    """One call, where it is and what it resolves to."""

    __slots__ = ("node", "raw", "attr", "scope", "guarded", "main_guard", "loop", "qual", "local", "rank_if")

    def __init__(
        self,
        node: ast.Call,
        raw: Optional[str],
        attr: str,
        scope: Scope,
        guarded: object,
        main_guard: bool,
        loop: int,
        rank_if: Optional[RankBranch] = None,
    ) -> None:
        self.node = node
        self.raw = raw  # dotted callee as written, e.g. "dist.init_process_group"; None for `f()()`
        self.attr = attr  # the callee's final identifier, e.g. "init_process_group"
        self.scope = scope
        # Under a rank-0 check (or after an early exit of the other ranks): the guarding test, else False.
        self.guarded = guarded
        self.rank_if = rank_if  # the innermost rank-dependent branch it sits in, if any
        self.main_guard = main_guard  # under `if __name__ == "__main__":`
        self.loop = loop  # loop nesting depth within its function
        self.qual = raw or ""  # resolved through the imports once the walk is done
        self.local = False  # calls a function defined in this file (by name)

    @property
    def pos(self) -> tuple[int, int]:
        return (self.node.lineno, self.node.col_offset)

    def kwarg(self, name: str) -> Optional[ast.expr]:
        for kw in self.node.keywords:
            if kw.arg == name:
                return kw.value
        return None

    def has_star_kwargs(self) -> bool:
        return any(kw.arg is None for kw in self.node.keywords)

    def arg(self, index: int, name: str) -> Optional[ast.expr]:
        """The argument passed positionally at `index` or by keyword `name`."""
        value = self.kwarg(name)
        if value is not None:
            return value
        args = self.node.args
        if index < len(args) and not any(isinstance(a, ast.Starred) for a in args[: index + 1]):
            return args[index]
        return None


class ModuleFacts:
    """Everything the rules need to know about one parsed file."""

    def __init__(self, tree: ast.Module, source: bytes, main_vars: frozenset[str] = frozenset()) -> None:
        self.tree = tree
        self.source = source
        self.aliases: dict[str, str] = {}  # local name -> qualified name ("dist" -> "torch.distributed")
        self.imported_modules: list[tuple[str, ast.stmt]] = []
        self.relative_imports: list[ast.ImportFrom] = []  # `from . import x`, `from .utils import f`
        self.module = Scope("<module>", tree, None, False)
        self.scopes: list[Scope] = [self.module]
        self.functions: dict[str, list[Scope]] = {}
        self.calls: list[CallSite] = []
        self.callers: dict[str, list[CallSite]] = {}
        self.passed_refs: set[str] = set()  # names passed as arguments (spawn targets, callbacks)
        self.attrs: set[str] = set()  # every attribute name seen (x.destroy_process_group -> ...)
        self.names: set[str] = set()  # every bare name loaded
        self.env_assigns: list[tuple[str, str, ast.expr, ast.stmt]] = []  # (base, KEY, value, stmt)
        self.cuda_strings: list[tuple[ast.expr, Scope]] = []  # f"cuda:{x}", "cuda:%d" % x
        self.contexts: dict[str, str] = {}  # ctx = mp.get_context("spawn") -> {"ctx": "spawn"}
        self.classes: set[str] = set()  # classes defined in this file
        self.methods: set[str] = set()  # names of the methods of those classes
        self.call_targets: dict[int, list[str]] = {}  # id(Call) -> names it is assigned to (x = Call())
        self.memo: dict[str, object] = {}  # per-file answers shared between rules (uses_cuda, ...)
        # Names and attributes assigned a "main process" test (`is_master = rank == 0`), used as guards.
        # `main_vars` given: flags another file of the project sets (`args.should_save = args.rank == 0`).
        self.main_vars: frozenset[str] = main_vars
        # Every `x = value` / `a.b = value` by dotted target, in source order (ports, paths, flags).
        self.assigns: dict[str, list[tuple[ast.expr, ast.stmt]]] = {}
        self.env_defaults: set[int] = set()  # ids of statements under `if "KEY" not in os.environ:`
        self.path = "<string>"
        self.project: Optional[object] = None  # the Project this file was linted with (project.py)
        self.launch_text = b""  # the launch scripts (*.sh, *.slurm) beside the linted files (engine.py)
        self.module_name = ""
        self._rank_if: Optional[RankBranch] = None
        self._absent: frozenset[str] = frozenset()
        self.main_guard_functions = main_guard_functions(tree)
        self._walk_block(tree.body, self.module, False, False, 0)
        self._resolve()

    # -- the walk --

    def _walk_block(self, body: list[ast.stmt], scope: Scope, guarded: bool, main: bool, loop: int) -> None:
        for stmt in body:
            t = type(stmt)
            if t is ast.If:
                self._walk_expr(stmt.test, scope, guarded, main, loop)  # type: ignore[attr-defined]
                if is_main_guard(stmt.test, self.main_guard_functions):  # type: ignore[attr-defined]
                    self._walk_block(stmt.body, scope, guarded, True, loop)  # type: ignore[attr-defined]
                    self._walk_block(stmt.orelse, scope, guarded, main, loop)  # type: ignore[attr-defined]
                    continue
                test = stmt.test  # type: ignore[attr-defined]
                kind = classify_guard(test, self.main_vars)
                absent = env_absent_keys(test)
                outer_rank_if, outer_absent = self._rank_if, self._absent
                if absent:
                    self._absent = outer_absent | absent
                # Only tests that split ranks 0 / not 0 count: `if local_rank != -1` is the same on every rank.
                # `if rank != 0 and not evaluate:` runs on some ranks other than 0: NONZERO for its body,
                # though its `else` is no rank-0-only branch.
                body_kind = kind or _subset_kind(test, self.main_vars)
                rank_dependent = kind is not None
                if body_kind is not None:
                    self._rank_if = RankBranch(stmt, True, body_kind, outer_rank_if)  # type: ignore[arg-type]
                self._walk_block(stmt.body, scope, guarded or (test if kind == ZERO else False), main, loop)  # type: ignore[attr-defined]
                self._absent = outer_absent
                self._rank_if = outer_rank_if
                if rank_dependent:
                    other = {ZERO: NONZERO, NONZERO: ZERO}.get(kind or "")
                    self._rank_if = RankBranch(stmt, False, other, outer_rank_if)  # type: ignore[arg-type]
                # `if port: ... elif "MASTER_PORT" in os.environ: pass else: os.environ[...] = "29500"`
                # (Megatron-style launch helpers): the `else` only fills in what the launcher did not set.
                present = env_absent_key(test, ast.In)
                if present:
                    self._absent = outer_absent | {present}
                self._walk_block(
                    stmt.orelse, scope, guarded or (test if kind == NONZERO else False), main, loop
                )  # type: ignore[attr-defined]
                self._rank_if = outer_rank_if
                self._absent = outer_absent
                # `if rank != 0: return` (or `if rank == 0: ... else: return`) guards the rest of the block;
                # so does `if distributed and rank != 0: return` (body_kind: the rest runs where the job is
                # not distributed or on rank 0, SevenNet's write_checkpoint, held-out lint corpus 13).
                if body_kind == NONZERO and ends_in_exit(stmt.body):  # type: ignore[attr-defined]
                    guarded = test
                elif kind == ZERO and ends_in_exit(stmt.orelse):  # type: ignore[attr-defined]
                    guarded = test
            elif t in _FUNC_TYPES:
                self._walk_function(stmt, scope, guarded, main, loop)  # type: ignore[arg-type]
            elif t is ast.ClassDef:
                self.classes.add(stmt.name)  # type: ignore[attr-defined]
                self.methods.update(
                    m.name
                    for m in stmt.body
                    if isinstance(m, _FUNC_TYPES)  # type: ignore[attr-defined]
                )
                for e in stmt.bases + [k.value for k in stmt.keywords] + stmt.decorator_list:  # type: ignore[attr-defined]
                    self._walk_expr(e, scope, guarded, main, loop)
                self._walk_block(stmt.body, scope, guarded, main, loop)  # type: ignore[attr-defined]
            elif t is ast.For or t is ast.AsyncFor:
                self._walk_expr(stmt.target, scope, guarded, main, loop)  # type: ignore[attr-defined]
                self._walk_expr(stmt.iter, scope, guarded, main, loop)  # type: ignore[attr-defined]
                self._walk_block(stmt.body, scope, guarded, main, loop + 1)  # type: ignore[attr-defined]
                self._walk_block(stmt.orelse, scope, guarded, main, loop)  # type: ignore[attr-defined]
            elif t is ast.While:
                self._walk_expr(stmt.test, scope, guarded, main, loop)  # type: ignore[attr-defined]
                self._walk_block(stmt.body, scope, guarded, main, loop + 1)  # type: ignore[attr-defined]
                self._walk_block(stmt.orelse, scope, guarded, main, loop)  # type: ignore[attr-defined]
            elif t is ast.With or t is ast.AsyncWith:
                for item in stmt.items:  # type: ignore[attr-defined]
                    self._walk_expr(item.context_expr, scope, guarded, main, loop)
                    key = dotted(item.optional_vars) if item.optional_vars is not None else None
                    if key:  # `with open(path) as fh`: fh stands for the file at path
                        self.assigns.setdefault(key, []).append((item.context_expr, stmt))  # type: ignore[arg-type]
                self._walk_block(stmt.body, scope, guarded, main, loop)  # type: ignore[attr-defined]
            elif t in _TRY_TYPES:
                self._walk_block(stmt.body, scope, guarded, main, loop)  # type: ignore[attr-defined]
                for h in stmt.handlers:  # type: ignore[attr-defined]
                    if h.type is not None:
                        self._walk_expr(h.type, scope, guarded, main, loop)
                    self._walk_block(h.body, scope, guarded, main, loop)
                self._walk_block(stmt.orelse, scope, guarded, main, loop)  # type: ignore[attr-defined]
                self._walk_block(stmt.finalbody, scope, guarded, main, loop)  # type: ignore[attr-defined]
            elif _MATCH is not None and t is _MATCH:
                self._walk_expr(stmt.subject, scope, guarded, main, loop)  # type: ignore[attr-defined]
                for case in stmt.cases:  # type: ignore[attr-defined]
                    self._walk_block(case.body, scope, guarded, main, loop)
            elif t is ast.Import:
                for a in stmt.names:  # type: ignore[attr-defined]
                    self.imported_modules.append((a.name, stmt))
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        head = a.name.split(".", 1)[0]
                        self.aliases.setdefault(head, head)
            elif t is ast.ImportFrom:
                if stmt.level or not stmt.module:  # type: ignore[attr-defined]
                    self.relative_imports.append(stmt)  # type: ignore[arg-type]  # the user's own modules
                    continue
                mod = stmt.module  # type: ignore[attr-defined]
                self.imported_modules.append((mod, stmt))
                for a in stmt.names:  # type: ignore[attr-defined]
                    if a.name != "*":
                        self.aliases[a.asname or a.name] = f"{mod}.{a.name}"
                        self.imported_modules.append((f"{mod}.{a.name}", stmt))
            else:
                if t is ast.Assign:
                    self._note_assign(stmt)  # type: ignore[arg-type]
                elif t is ast.AnnAssign and stmt.value is not None:  # type: ignore[attr-defined]
                    key = dotted(stmt.target)  # type: ignore[attr-defined]
                    if key:
                        self.assigns.setdefault(key, []).append((stmt.value, stmt))  # type: ignore[attr-defined]
                self._walk_expr(stmt, scope, guarded, main, loop)

    def _walk_function(self, fn: ast.AST, scope: Scope, guarded: bool, main: bool, loop: int) -> None:
        for d in fn.decorator_list:  # type: ignore[attr-defined]
            self._walk_expr(d, scope, guarded, main, loop)
        for d in fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]:  # type: ignore[attr-defined]
            self._walk_expr(d, scope, guarded, main, loop)
        rank_zero = next(
            (d for d in fn.decorator_list if _RANK_ZERO_DECORATOR_RE.search(final_identifier(d).lower())),
            False,
        )  # type: ignore[attr-defined]
        # A function defined where only rank 0 gets (after `if rank != 0: return`, under `if rank == 0:`)
        # exists on rank 0 only: whoever calls it (a forward hook registered there) is rank 0 (OLMo's
        # trace_outputs_hook, held-out lint corpus 11).
        rank_zero = rank_zero or guarded
        inner = Scope(fn.name, fn, scope, rank_zero)  # type: ignore[attr-defined]
        a = fn.args  # type: ignore[attr-defined]
        inner.params = frozenset(
            x.arg
            for x in (getattr(a, "posonlyargs", []) + a.args + a.kwonlyargs + [a.vararg, a.kwarg])
            if x is not None
        )
        self.scopes.append(inner)
        self.functions.setdefault(fn.name, []).append(inner)  # type: ignore[attr-defined]
        outer_rank_if, outer_absent = self._rank_if, self._absent
        self._rank_if, self._absent = None, frozenset()  # a body runs wherever it is called from
        self._walk_block(live_body(fn.body), inner, rank_zero, False, 0)  # type: ignore[attr-defined]
        self._rank_if, self._absent = outer_rank_if, outer_absent

    def _walk_expr(self, root: ast.AST, scope: Scope, guarded: bool, main: bool, loop: int) -> None:
        # A hand-rolled walk: ast.walk visits every Load/Store context node and goes through two
        # generators per node, which made it the largest cost of linting. Order does not matter here
        # (calls are sorted by position after the walk).
        attrs = self.attrs
        names = self.names
        passed = self.passed_refs
        rank_if = self._rank_if
        stack: list = [root]
        pop, push, extend = stack.pop, stack.append, stack.extend
        Name, Attribute, Call, Constant = ast.Name, ast.Attribute, ast.Call, ast.Constant
        while stack:
            n = pop()
            t = type(n)
            if t is Name:
                names.add(n.id)
            elif t is Constant:
                pass
            elif t is Attribute:
                attrs.add(n.attr)
                push(n.value)
            elif t is Call:
                func = n.func
                ft = type(func)
                if ft is Attribute:
                    attr = func.attr
                elif ft is Name:
                    attr = func.id
                else:
                    attr = ""
                cs = CallSite(n, dotted(func), attr, scope, guarded, main, loop, rank_if)
                scope.calls.append(cs)
                self.calls.append(cs)
                push(func)
                for a in n.args:
                    ta = type(a)
                    if ta is Name:
                        passed.add(a.id)
                    elif ta is Attribute:
                        passed.add(a.attr)
                    push(a)
                for kw in n.keywords:
                    v = kw.value
                    tv = type(v)
                    if tv is Name:
                        passed.add(v.id)
                    elif tv is Attribute:
                        passed.add(v.attr)
                    push(v)
                if attr == "format" and ft is Attribute and _is_cuda_prefix(func.value):
                    self.cuda_strings.append((n, scope))
            else:
                if t is ast.JoinedStr:
                    values = n.values
                    if values and _is_cuda_prefix(values[0]):
                        self.cuda_strings.append((n, scope))
                elif t is ast.BinOp and type(n.op) is ast.Mod and _is_cuda_prefix(n.left):
                    self.cuda_strings.append((n, scope))
                fields = _FIELDS.get(t)
                if fields is None:
                    fields = _FIELDS[t] = tuple(f for f in t._fields if f not in _SKIP_FIELDS)
                for name in fields:
                    v = getattr(n, name, None)
                    if type(v) is list:
                        extend([x for x in v if isinstance(x, ast.AST)])
                    elif isinstance(v, ast.AST):
                        push(v)

    def _note_assign(self, stmt: ast.Assign) -> None:
        if self._absent and any(
            isinstance(t, ast.Subscript)
            and isinstance(t.slice, ast.Constant)
            and t.slice.value in self._absent
            for t in stmt.targets
        ):
            # Sets the very key the test found missing: a default (not `elif "SLURM_PROCID" in os.environ:
            # ... else: os.environ["MASTER_PORT"] = "29500"`, which tests another key).
            self.env_defaults.add(id(stmt))
        value = stmt.value
        for target in stmt.targets:
            key = dotted(target)
            if key:
                self.assigns.setdefault(key, []).append((value, stmt))
                if (
                    type(value) in (ast.Compare, ast.BoolOp, ast.Call)
                    and classify_guard(value, self.main_vars) == ZERO
                ):
                    self.main_vars = self.main_vars | {key}
        if type(stmt.value) is ast.Call:
            names = [d for d in (dotted(t) for t in stmt.targets) if d]
            if names:
                self.call_targets[id(stmt.value)] = names
        for target in stmt.targets:
            if isinstance(target, ast.Subscript):
                key = target.slice
                base = dotted(target.value)
                if base and isinstance(key, ast.Constant) and isinstance(key.value, str):
                    self.env_assigns.append((base, key.value, stmt.value, stmt))
            elif isinstance(target, ast.Name) and isinstance(stmt.value, ast.Call):
                if final_identifier(stmt.value) == "get_context" and stmt.value.args:
                    method = stmt.value.args[0]
                    if isinstance(method, ast.Constant) and isinstance(method.value, str):
                        self.contexts[target.id] = method.value

    def _resolve(self) -> None:
        aliases = self.aliases
        functions = self.functions
        key = _call_position
        self.calls.sort(key=key)
        for scope in self.scopes:
            scope.calls.sort(key=key)
        for cs in self.calls:
            raw = cs.raw
            if raw:
                head, dot, rest = raw.partition(".")
                target = aliases.get(head)
                if target is not None:
                    cs.qual = target + dot + rest
                # `obj.run()` on an object (yolov5's `callbacks.run(...)`) is not the module's `def run`:
                # a dotted call reaches a function of this file only as a method of one of its classes.
                # `self.tokenizer.save_pretrained()` is the tokenizer's method, not this class's (held-out
                # corpus 8: trlx's trainer defines its own save_pretrained).
                if cs.attr in functions and (
                    head in ("self", "cls") and "." not in rest
                    or target is None and (not dot or cs.attr in self.methods and head not in ("self", "cls")
                                           and not _module_method(raw))
                ):
                    cs.local = True
                    self.callers.setdefault(cs.attr, []).append(cs)

    def release(self) -> None:
        """Drop the references that form cycles (a scope's calls point back at the scope, a file at its
        project), so reference counting frees the whole file at once instead of the cyclic collector
        scanning every node of a project later."""
        for scope in self.scopes:
            scope.calls = []
            scope.parent = None
        self.scopes = []
        self.calls = []
        self.callers = {}
        self.functions = {}
        self.memo = {}
        self.project = None

    # -- queries --

    def resolve(self, node: ast.AST) -> str:
        """The qualified name of a Name/Attribute chain through this file's imports ("" if not a chain)."""
        return self.resolve_dotted(dotted(node) or "")

    def resolve_dotted(self, raw: str) -> str:
        if not raw:
            return ""
        head, dot, rest = raw.partition(".")
        target = self.aliases.get(head)
        return target + dot + rest if target is not None else raw

    def argparse_default(self, node: ast.AST) -> Optional[ast.expr]:
        """`args.dist_backend` -> the `default=` of `add_argument("--dist-backend", default="nccl")` in this
        file (None when there is no such option, or it has no default)."""
        key = dotted(node) or ""
        if key.count(".") != 1:
            return None
        defaults = self.memo.get("argparse_defaults")
        if defaults is None:
            defaults = {}
            for cs in self.calls_named("add_argument"):
                dest = cs.kwarg("dest")
                names = [
                    a.value for a in cs.node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
                if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
                    name = dest.value
                else:
                    longs = [n for n in names if n.startswith("--")] or names
                    if not longs:
                        continue
                    name = longs[0].lstrip("-").replace("-", "_")
                default = cs.kwarg("default")
                if default is not None:
                    defaults.setdefault(name, default)
            self.memo["argparse_defaults"] = defaults
        return defaults.get(key.split(".", 1)[1])  # type: ignore[union-attr]

    def calls_named(self, *attrs: str) -> Iterator[CallSite]:
        for cs in self.calls:
            if cs.attr in attrs:
                yield cs

    def imports_prefix(self, *prefixes: str) -> bool:
        return any(m == p or m.startswith(p + ".") for m, _ in self.imported_modules for p in prefixes)


def _call_position(cs: CallSite) -> tuple[int, int]:
    return (cs.node.lineno, cs.node.col_offset)


def _is_cuda_prefix(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda:")
