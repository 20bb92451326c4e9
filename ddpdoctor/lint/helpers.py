"""Predicates the lint rules share: what counts as a distributed program, a CUDA touch, a collective,
an init call, a spawn; env keys and constants."""

from __future__ import annotations

import ast
import re
from typing import Optional

from ddpdoctor.lint.facts import (
    CallSite,
    ModuleFacts,
    dotted,
    final_identifier,
)

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


def const_value(node: Optional[ast.AST]) -> object:
    """The value of a literal, or the sentinel `_UNKNOWN` for anything else (None means "no argument")."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    return _UNKNOWN


_UNKNOWN = object()


def reads_env_key(f: ModuleFacts, key: str) -> bool:
    """The file reads `key` from the environment: os.environ["KEY"], os.environ.get("KEY"), os.getenv("KEY")."""
    memo = ("reads_env", key)
    if memo not in f.memo:
        found = False
        if key.encode() in f.source:
            for n in ast.walk(f.tree):
                if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load):
                    k = n.slice
                    if (
                        isinstance(k, ast.Constant)
                        and k.value == key
                        and (dotted(n.value) or "").endswith("environ")
                    ):
                        found = True
                        break
                elif isinstance(n, ast.Call) and n.args and final_identifier(n) in ("get", "getenv"):
                    k = n.args[0]
                    if isinstance(k, ast.Constant) and k.value == key:
                        found = True
                        break
        f.memo[memo] = found
    return bool(f.memo[memo])


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


def _is_mp(cs: CallSite) -> bool:
    return cs.qual.startswith(_MP_MODULES)


def _is_process(f: ModuleFacts, cs: CallSite, *, pools: bool) -> bool:
    if cs.attr not in (("Process", "Pool") if pools else ("Process",)):
        return False
    if _is_mp(cs):
        return True
    head = (cs.raw or "").split(".", 1)[0]
    return head in f.contexts


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


# What says the code runs on several nodes: Slurm's per-task variables, a node count or a node rank.
_MULTI_NODE_RE = re.compile(
    rb"SLURM_(?:PROCID|NTASKS|NPROCS|NNODES|NODEID|JOB_NUM_NODES)|\bn_?nodes\b|num_nodes|node_rank|NODE_RANK"
    rb"|GROUP_RANK|--nodes\b"
)
# A local rank or local world size read apart from the global one: the program is written for a launch
# where the two differ, i.e. several nodes.
_LOCAL_APART_RE = re.compile(
    rb"LOCAL_WORLD_SIZE|local_world_size|SLURM_LOCALID|OMPI_COMM_WORLD_LOCAL_RANK|MPI_LOCALRANKID|global_rank"
)


def near_files(f: ModuleFacts) -> list[ModuleFacts]:
    """This file and those it calls into or is called from (one step, Project.linked): its program, not every
    script of the tree (a repository of examples holds an mp.spawn script beside a torchrun one)."""
    return [f] if f.project is None else [f, *f.project.linked(f)]  # type: ignore[attr-defined]


def env_key(f: ModuleFacts, node: ast.AST) -> Optional[str]:
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


def multi_node(f: ModuleFacts, local_apart: bool = False, linked_only: bool = False) -> bool:
    """Some file of the project says it runs on several nodes; with `local_apart`, also one that reads the
    node-local rank or world size apart from the global ones. With `linked_only`, only this file and those
    it calls into or is called from count: in a framework's tree a Slurm helper elsewhere says nothing
    about a toy example (NVIDIA/apex contrib/examples)."""
    if f.project is None or linked_only:
        files = near_files(f)
    else:
        files = [g for _, g in f.project.files]  # type: ignore[attr-defined]
    return any(
        _MULTI_NODE_RE.search(g.source) or local_apart and _LOCAL_APART_RE.search(g.source) for g in files
    )


def is_test_file(path: str) -> bool:
    """A unit-test module by its name: test_x.py or x_test.py (pytest's and unittest's conventions)."""
    name = re.split(r"[\\/]", path)[-1]
    return name.startswith("test_") or name.endswith("_test.py")
