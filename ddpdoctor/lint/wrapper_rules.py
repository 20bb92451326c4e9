"""Rules about the DistributedDataParallel wrapper itself (classes the held-out corpus 8 found missed):
DDP045 (a method of the user's model called on the wrapper, which does not forward it), DDP046 (a model
wrapped with device_ids while it is still on the CPU) and DDP054 (the training forward run through `.module`,
around the wrapper: held-out corpus 13). Registered through ruleset.py.

Both read what the wrapper is, from torch's own code: DistributedDataParallel defines no __getattr__ of its own
(unlike FSDP, which forwards unknown attributes to the wrapped module), so `ddp_model.generate()` raises
AttributeError; and its constructor checks that a module given device_ids sits on one GPU.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ddpdoctor.lint.facts import CallSite, ModuleFacts, Scope, dotted, final_identifier
from ddpdoctor.lint.registry import Hit, rule

# The public attributes of torch.nn.parallel.DistributedDataParallel and torch.nn.Module (torch 2.13: dir() of
# both classes) and the instance attributes DDP's __init__ sets: what a call on the wrapper can reach.
_WRAPPER_ATTRS = frozenset(
    {
        "add_module", "apply", "bfloat16", "broadcast_buffers", "buffers", "call_super_init", "children",
        "compile", "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "gather",
        "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "join", "join_device",
        "join_hook", "join_process_group", "load_state_dict", "modules", "mtia", "named_buffers",
        "named_children", "named_modules", "named_parameters", "no_sync", "parameters", "register_backward_hook",
        "register_buffer", "register_comm_hook", "register_forward_hook", "register_forward_pre_hook",
        "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
        "register_load_state_dict_pre_hook", "register_module", "register_parameter",
        "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_", "scatter",
        "set_extra_state", "set_submodule", "share_memory", "state_dict", "to", "to_empty", "to_kwargs", "train",
        "type", "will_sync_module_buffers", "xpu", "zero_grad",
        # instance attributes and the usual ways through the wrapper
        "module", "training", "device_ids", "output_device", "process_group", "reducer", "logger",
        "__call__", "_get_ddp_logging_data", "_set_static_graph", "_register_fused_optim",
    }
)  # fmt: skip


def _is_ddp(cs: CallSite) -> bool:
    """torch's own DistributedDataParallel (not a framework's subclass such as mmengine's
    MMDistributedDataParallel, which adds train_step and friends)."""
    return cs.qual.startswith("torch.") and cs.qual.rsplit(".", 1)[-1] == "DistributedDataParallel"


def _bound_in_other_branch(f: ModuleFacts, name: str, wrap: CallSite) -> bool:
    """`name` is also bound in another branch of an `if` around the wrapping (`if deepspeed: model, opt, _, _ =
    deepspeed.initialize(...) else: model = DDP(model)`): which object a later call sees depends on that test."""
    stmt_line = wrap.node.lineno
    for node in ast.walk(wrap.scope.node):
        if not isinstance(node, ast.If):
            continue
        sides = [node.body, node.orelse]
        holds = [any(getattr(n, "lineno", -1) == stmt_line and n is wrap.node for st in side for n in ast.walk(st))
                 for side in sides]
        if not any(holds):
            continue
        other = sides[1] if holds[0] else sides[0]
        for st in other:
            for n in ast.walk(st):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(
                    n, (ast.AnnAssign, ast.AugAssign)) else []
                for t in targets:
                    names = t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]
                    if any(dotted(x) == name for x in names):
                        return True
    return False


def _other_arm(wrap: CallSite, cs: CallSite) -> bool:
    """The wrapping and the call sit in different arms of one `if` (`if mode == "train": model = DDP(model)
    ... elif mode == "dev": model.dev(...)`, News-Recommendation, held-out lint corpus 13): the call never sees
    the wrapper."""
    for node in ast.walk(wrap.scope.node):
        if not isinstance(node, ast.If):
            continue
        arms = [{id(n) for st in side for n in ast.walk(st)} for side in (node.body, node.orelse)]
        if (id(wrap.node) in arms[0] and id(cs.node) in arms[1]) or (id(wrap.node) in arms[1] and id(cs.node) in arms[0]):
            return True
    return False


def _wrapped(f: ModuleFacts) -> list[tuple[str, CallSite]]:
    """(name, the DDP call) for each `name = DistributedDataParallel(...)` of this file."""
    out = []
    for cs in f.calls:
        if not _is_ddp(cs):
            continue
        for name in f.call_targets.get(id(cs.node), ()):
            out.append((name, cs))
    return out


def _assigned_between(f: ModuleFacts, name: str, start: int, end: int) -> bool:
    """`name` is bound again between the two lines (`model = model.module`): the later call is not on the wrapper."""
    return any(start < stmt.lineno < end for _, stmt in f.assigns.get(name, ()))


def _same_body(f: ModuleFacts, wrap: CallSite, cs: CallSite) -> bool:
    """The call runs where the wrapper is the value of its name: the same function after the wrapping, or, for an
    attribute of `self`, another method of the same class."""
    if cs.scope is wrap.scope:
        return cs.pos > wrap.pos
    if cs.raw is None or not cs.raw.startswith("self."):
        return False
    mine = _class_of(f, cs.scope)
    return mine is not None and mine is _class_of(f, wrap.scope)


def _class_of(f: ModuleFacts, scope: Scope) -> Optional[ast.ClassDef]:
    """The class whose body defines this function (methods only), from one walk of the file."""
    if "method_classes" not in f.memo:
        f.memo["method_classes"] = {
            id(item): node for node in ast.walk(f.tree) if isinstance(node, ast.ClassDef) for item in node.body
        }
    return f.memo["method_classes"].get(id(scope.node))  # type: ignore[union-attr,no-any-return]


@rule(
    "DDP045",
    "wrapper-custom-method",
    "a method of your model called on the DistributedDataParallel wrapper: DDP does not forward it "
    "(AttributeError: 'DistributedDataParallel' object has no attribute ...)",
    "call it on the wrapped model: ddp_model.module.method(...) (keep a reference: raw = model before wrapping)",
    "DistributedDataParallel is an nn.Module around yours with no __getattr__ of its own: only nn.Module's and "
    "DDP's attributes exist on it; your model's own methods and attributes are on ddp_model.module.",
)
def check_wrapper_custom_method(f: ModuleFacts) -> Iterator[Hit]:
    if b"DistributedDataParallel" not in f.source and b"DDP" not in f.source:
        return
    wrapped = _wrapped(f)
    if not wrapped:
        return
    for name, wrap in wrapped:
        if _bound_in_other_branch(f, name, wrap):
            continue
        if name.startswith("self.") and any(
            stmt.lineno != wrap.node.lineno for _, stmt in f.assigns.get(name, ())
        ):
            continue  # self.model is bound elsewhere too (unwrapped in one branch): which value a method sees is unknown
        for cs in f.calls:
            raw = cs.raw or ""
            if not raw.startswith(name + ".") or raw.count(".") != name.count(".") + 1:
                continue
            method = cs.attr
            # (a leading underscore: nn.Module's private methods, _register_state_dict_hook and the like)
            if method in _WRAPPER_ATTRS or method.startswith("_") or not _same_body(f, wrap, cs):
                continue
            if cs.scope is wrap.scope and (_assigned_between(f, name, wrap.node.lineno, cs.node.lineno)
                                           or _other_arm(wrap, cs)):
                continue
            yield (
                cs.node,
                f"{raw}() is called on the DistributedDataParallel wrapper ({name} = DistributedDataParallel(...) "
                f"at line {wrap.node.lineno}): DDP has no attribute {method!r}; call {name}.module.{method}()",
            )


def _moved(f: ModuleFacts, name: str, scope: Scope, before: tuple[int, int]) -> bool:
    """Something before the wrapping may have put `name` on a device: `.to(...)`/`.cuda(...)` on it, or it was
    handed to another call (a helper may move it), or built with a device."""
    for cs in scope.calls:
        if cs.pos >= before:
            continue
        raw = cs.raw or ""
        if raw.startswith(name + ".") and cs.attr in ("to", "cuda", "to_empty", "xpu", "npu"):
            return True
        if any(dotted(a) == name for a in [*cs.node.args, *(k.value for k in cs.node.keywords)]):
            return True
    return False


def _made_on_cpu(f: ModuleFacts, name: str, wrap: CallSite) -> Optional[int]:
    """The line where `name` was built by a plain constructor call in the wrapping's own function (not moved
    in the same expression: `Net().to(rank)`, and not given a device), else None."""
    if b"set_default_device" in f.source or b"with torch.device(" in f.source:
        return None  # built under a default device
    mine = {id(n) for n in ast.walk(wrap.scope.node)}
    above = [(stmt.lineno, value) for value, stmt in f.assigns.get(name, ())
             if stmt.lineno < wrap.node.lineno and id(stmt) in mine]
    if not above:
        return None
    line, value = max(above, key=lambda item: item[0])
    if not isinstance(value, ast.Call) or any(k.arg in ("device", "device_map") for k in value.keywords):
        return None
    if any("device" in final_identifier(a).lower() or "gpu" in final_identifier(a).lower() for a in value.args):
        # `IDLoss(base_dir, device)`: a constructor handed the device places itself (yangxy/GPEN, corpus 9)
        return None
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
           and n.func.attr in ("to", "cuda", "to_empty", "from_pretrained", "xpu") for n in ast.walk(value)):
        return None  # `Net().cuda()`, `torch.compile(Net().to(rank))`
    return line


@rule(
    "DDP046",
    "ddp-module-on-cpu",
    "model wrapped in DistributedDataParallel with device_ids while still on the CPU: the constructor raises "
    "(device_ids ... only work with single-device GPU modules)",
    "move the model to its GPU before wrapping: model = model.to(local_rank); "
    "DDP(model, device_ids=[local_rank])",
    "DDP's constructor checks that a module given device_ids has all its parameters on that one GPU; a model "
    "built on the CPU and never moved fails at start-up (or, with device_ids left out, trains on the CPU).",
)
def check_ddp_module_on_cpu(f: ModuleFacts) -> Iterator[Hit]:
    if b"device_ids" not in f.source:
        return
    for cs in f.calls:
        if not _is_ddp(cs) or not cs.node.args:
            continue
        ids = cs.kwarg("device_ids")
        if ids is None or (isinstance(ids, ast.Constant) and ids.value is None):
            continue
        name = dotted(cs.node.args[0])
        if not name or name.startswith("self."):
            continue
        made = _made_on_cpu(f, name, cs)
        if made is None or _moved(f, name, cs.scope, cs.pos):
            continue
        yield (
            cs.node,
            f"{name} (built at line {made}) is wrapped with device_ids but was never moved to a GPU: call "
            f"{name}.to(device) before DistributedDataParallel",
        )


# --- DDP052: DDP without device_ids on the branch that never sets the device ------------------------------


def _sets_device(body: list[ast.stmt]) -> bool:
    """The statements pick this process's GPU: torch.cuda.set_device(...), or DDP(..., device_ids=[...])."""
    for node in (n for st in body for n in ast.walk(st)):
        if isinstance(node, ast.Call):
            name = final_identifier(node.func)
            if name == "set_device" or (name == "DistributedDataParallel"
                                        and any(k.arg == "device_ids" for k in node.keywords)):
                return True
    return False


def _bare_cuda_before(body: list[ast.stmt], line: int) -> bool:
    """A `.cuda()` with no device (the current device, GPU 0 unless someone set it) earlier in the branch."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cuda"
        and not n.args and not n.keywords and n.lineno < line
        for st in body for n in ast.walk(st)
    )


@rule(
    "DDP052",
    "ddp-default-device",
    "the model is wrapped in DistributedDataParallel without device_ids after a bare .cuda() on the branch that "
    "never sets the device (its other branch does): every process of the node that takes it uses GPU 0",
    "set the device on this branch too (`torch.cuda.set_device(local_rank)`; `model.cuda(local_rank)`; "
    "`DistributedDataParallel(model, device_ids=[local_rank])`), or refuse the branch when several processes "
    "share a node",
    "The ImageNet example's lineage keeps a branch for one process per node that drives every GPU (DDP's "
    "single-process multi-device mode, removed from PyTorch since): launched one process per GPU (torchrun, "
    "srun) without the flag that selects the other branch, every process lands there, calls model.cuda() on "
    "the current device, GPU 0, and wraps it without device_ids: all ranks of the node train on GPU 0 (out of "
    "memory, NCCL's 'Duplicate GPU detected'), the other GPUs idle.",
)
def check_ddp_default_device(f: ModuleFacts) -> Iterator[Hit]:
    if b"DistributedDataParallel" not in f.source or b".cuda()" not in f.source:
        return
    for node in ast.walk(f.tree):
        if not isinstance(node, ast.If) or not node.orelse:
            continue
        for side, other in ((node.body, node.orelse), (node.orelse, node.body)):
            if _sets_device(side) or not _sets_device(other):
                continue
            for st in side:
                for call in (n for n in ast.walk(st) if isinstance(n, ast.Call)):
                    if (final_identifier(call.func) == "DistributedDataParallel" and len(call.args) < 2
                            and not any(k.arg in ("device_ids", None) for k in call.keywords)
                            and _bare_cuda_before(side, call.lineno)):
                        yield (
                            call,
                            f"DistributedDataParallel without device_ids after a bare .cuda() on this branch of "
                            f"the `if` on line {node.lineno}, whose other branch sets the device: the processes "
                            "that take it all use GPU 0",
                        )


# --- DDP054: the training forward through `.module`, around the wrapper ---------------------------------

# Methods of the wrapped model that do not run a forward pass (saving, inspecting, moving, configuring).
_NOT_FORWARD = _WRAPPER_ATTRS - {"__call__", "forward"} | {"generate", "sample", "encode_text"}


def _reaches_backward(loop: ast.AST, names: set[str]) -> Optional[ast.Call]:
    """The `.backward()` of the loop (or `scaler.scale(x).backward()`) whose loss is computed from `names`,
    followed through the loop's assignments (`results = model.module.train_step(b); loss = results["loss"]`)."""
    tracked = set(names)
    body = sorted((n for n in ast.walk(loop) if isinstance(n, ast.Assign)), key=lambda n: n.lineno)
    for _ in range(3):
        for node in body:
            if any(isinstance(n, ast.Name) and n.id in tracked for n in ast.walk(node.value)):
                tracked |= {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    for node in ast.walk(loop):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
            if any(isinstance(n, ast.Name) and n.id in tracked for n in ast.walk(node.func.value)):
                return node
    return None


_WRAPPER_NAME_RE = re.compile(r"model|ddp|net|engine", re.IGNORECASE)
_NO_GRAD = frozenset({"no_grad", "inference_mode"})


def _through_module(call: ast.Call) -> bool:
    """`model.module(batch)` or `model.module.method(batch)` with a method that runs a forward pass, on a
    receiver named like a (wrapped) model — not `self.module(x)` inside a module of one's own."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "module":
        receiver, ok = func.value, True
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and func.value.attr == "module":
        receiver, ok = func.value.value, func.attr not in _NOT_FORWARD and not func.attr.startswith("_")
    else:
        return False
    return ok and bool(_WRAPPER_NAME_RE.search(final_identifier(receiver) or ""))


@rule(
    "DDP054",
    "module-forward-bypasses-ddp",
    "the training forward runs through `.module`, around the DistributedDataParallel wrapper: DDP never "
    "prepares the backward, so the gradients are not all-reduced and every rank trains its own model",
    "call the wrapper itself (`loss = ddp_model(batch)`), with the training step in the model's forward(); "
    "for a method other than forward, route it through forward (`def forward(self, batch, mode='loss')`) — "
    "use `.module` only to save, load or evaluate",
    "DistributedDataParallel synchronises gradients from its own forward(): there it marks the parameters that "
    "will receive gradients, and the autograd hooks then all-reduce them during backward. A loss computed by "
    "`ddp_model.module.train_step(batch)` or `ddp_model.module(batch)` skips that forward; backward runs, each "
    "rank steps with its own gradients, and the replicas drift apart without an error (with "
    "find_unused_parameters=True the next forward through the wrapper may raise instead).",
)
def check_module_forward_bypasses_ddp(f: ModuleFacts) -> Iterator[Hit]:
    if b".module" not in f.source or b"backward" not in f.source or (
            b"DistributedDataParallel" not in f.source and b"DDP" not in f.source):
        return
    # A call in a nested loop is judged once, from the outermost loop around it: that loop's body holds every
    # assignment and backward an inner loop's does.
    judged: set[int] = set()
    # Calls under `with torch.no_grad():` (an evaluation loop beside the training one, agiresearch/OpenP5,
    # held-out lint corpus 14) build no graph: nothing of theirs is backpropagated.
    for block in ast.walk(f.tree):
        if isinstance(block, (ast.With, ast.AsyncWith)) and any(
                final_identifier(item.context_expr) in _NO_GRAD for item in block.items):
            judged.update(id(c) for c in ast.walk(block) if isinstance(c, ast.Call))
    for loop in ast.walk(f.tree):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        for node in ast.walk(loop):
            if not isinstance(node, ast.Assign):
                continue
            call = next((c for c in ast.walk(node.value) if isinstance(c, ast.Call) and _through_module(c)), None)
            if call is None or id(call) in judged:
                continue
            judged.add(id(call))
            names = {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
            backward = _reaches_backward(loop, names) if names else None
            if backward is None:
                continue
            yield (
                call,
                f"`{ast.unparse(call.func)}(...)` computes the loss backpropagated on line {backward.lineno} "
                "around the DistributedDataParallel wrapper: its gradients are never all-reduced",
            )
