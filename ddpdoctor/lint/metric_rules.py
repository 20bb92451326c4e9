"""Rules about what the ranks report together (a class every held-out corpus had reviewers mark and no rule
found: four evaluation metrics of corpus 10): DDP049 (an evaluation metric summed over one rank's shard of
the data and used as the whole set's). Registered through ruleset.py.

The fact read holds on every launch with more than one rank: the evaluation data is split by a
DistributedSampler (or accelerate's prepare), the evaluation loop adds up counts or losses, and nothing
between the loop and their use (in the function, a helper it calls, or its caller) reduces them across
ranks. So it belongs to the default tier.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from ddpdoctor.lint.facts import CallSite, ModuleFacts, Scope, dotted, final_identifier
from ddpdoctor.lint.flow import names_in
from ddpdoctor.lint.helpers import COLLECTIVE_NAMES, is_test_file, near_files
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import EVAL_RE, distributed_program, evaluation_sampler

# Calls that combine the ranks' values (torch.distributed, accelerate, torchvision's MetricLogger, hand-made
# `reduce_tensor`/`gather_results`/`collect_results` helpers) or that torchmetrics syncs in (`compute()`).
_REDUCING = re.compile(r"reduce|gather|all_|sync_|_sync|between_processes|collect_|_collect|merge_|compute$|world_size|concat_all")
# The loop of an evaluation reads a loader (or an iterator or batches of one).
_LOADER = re.compile(r"loader|(?:^|_)dl(?:$|_)|data|batch|iter")
# Frameworks that reduce logged metrics themselves (`self.log(..., sync_dist=True)`, Keras-style fit loops).
# (Lightning's Fabric is not among them: `fabric.all_reduce` is the user's to call, and litgpt's validate() does
# not — held-out lint corpus 11.)
_SELF_REDUCING = ("keras", "ignite", "composer")
# transformers reduces what its Trainer logs; a file that takes only models or tokenizers from it runs its own
# loop (zyds/transformers-code's DDP tutorial, held-out lint corpus 13).
_TRAINER_RE = re.compile(r"^transformers(?:\.[\w.]*)?\.\w*Trainer$|^transformers\.trainer")


def _reduces(scope_node: ast.AST) -> bool:
    for node in ast.walk(scope_node):
        if _reducing_call(node):
            return True
        elif isinstance(node, ast.Name) and "world_size" in node.id.lower():
            return True
        elif isinstance(node, ast.Attribute) and "world_size" in node.attr.lower():
            return True
    return False


def _sharded_evaluation(f: ModuleFacts) -> Optional[int]:
    """Line of what splits the evaluation data across ranks, in this file or one linked with it: a
    DistributedSampler named for evaluation, or accelerate's prepare() of an evaluation loader."""
    files = near_files(f)
    for g in files:
        for cs in g.calls_named("DistributedSampler"):
            if evaluation_sampler(g, cs, by_function=False):
                return cs.node.lineno if g is f else 0
        for cs in g.calls_named("prepare", "setup_dataloaders"):
            for a in cs.node.args:
                name = (final_identifier(a) or "").lower()
                if EVAL_RE.search(name) and _LOADER.search(name):
                    return cs.node.lineno if g is f else 0
    return None


_PROGRESS = re.compile(r"(?:^|_)p?bar$|progress|tqdm", re.IGNORECASE)


def _iterated_names(fn: ast.AST, loop: ast.For) -> set[str]:
    """The names a loop reads its items from, followed once through the function's own assignments: `pbar =
    tqdm(self.val_dl)` then `for x in pbar` reads `val_dl` (KimRass/DDPM's validate(), held-out lint corpus
    13)."""
    names = set(names_in(loop.iter))
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and node.lineno < loop.lineno and any(
                isinstance(t, ast.Name) and t.id in names for t in node.targets):
            names |= set(names_in(node.value))
    return names


def _base(node: ast.AST) -> Optional[str]:
    """The name an accumulator is known by: `correct`, `self.total` -> total, `stats["n"]` -> stats."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return final_identifier(node) if isinstance(node, (ast.Name, ast.Attribute)) else None


def _accumulators(loop: ast.For) -> set[str]:
    """What the loop adds up: `x += ...`, `x = x + ...`, `meter.update(...)`, `preds.append(...)`, and a
    buffer filled at the loop's index (`losses[k] = loss`, litgpt's validate)."""
    out: set[str] = set()
    index = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    for node in ast.walk(loop):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript)
                and isinstance(node.targets[0].slice, ast.Name) and node.targets[0].slice.id in index):
            name = _base(node.targets[0])
            if name and name != "self":
                out.add(name)
            continue
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            name = _base(node.target)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.BinOp)
              and isinstance(node.value.op, ast.Add) and dotted(node.targets[0]) is not None
              and dotted(node.targets[0]) == dotted(node.value.left)):
            name = _base(node.targets[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("update", "append", "extend")):
            name = _base(node.func.value)
            if name and _PROGRESS.search(name):
                continue  # a progress bar's `update(1)` counts steps, not results
        else:
            continue
        if name and name != "self":
            out.add(name)
    return out


def _reads(stmt: ast.stmt, names: set[str]) -> Optional[str]:
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names:
            return node.id
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in names:
            return node.attr
    return None


def _after(fn: ast.AST, loop: ast.For) -> Iterator[ast.stmt]:
    """The simple statements after the loop, in source order (inside later if/with blocks too)."""
    end = loop.end_lineno or loop.lineno
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)) and node.lineno > end:
            yield node


def _helpers_reduce(f: ModuleFacts, scope: Scope, depth: int = 2) -> bool:
    """A function of this file that `scope` calls combines the ranks (`reduce_tensor(acc)` defined above)."""
    if depth == 0:
        return False
    for cs in scope.calls:
        if not cs.local:
            continue  # `model.train()` is the module's method, not this file's `def train(...)` (TinyLlama)
        for target in f.functions.get(cs.attr, ()):
            if target is not scope and (_reduces(target.node) or _helpers_reduce(f, target, depth - 1)):
                return True
    return False


def _reducing_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    attr = (final_identifier(node.func) or "").lower()
    # A barrier waits for the ranks but combines nothing (litgpt's validate() fences its loop with two).
    return (attr in COLLECTIVE_NAMES and "barrier" not in attr) or bool(_REDUCING.search(attr))


def _result_reduced(facts: ModuleFacts, cs: CallSite) -> bool:
    """The caller combines what this call returns: `reduce_tensor(validate(...))`, or `acc = validate(...)`
    then `dist.all_reduce(acc)` / `acc = gather(acc)` in the same function."""
    targets = {t.rsplit(".", 1)[-1] for t in facts.call_targets.get(id(cs.node), ())}
    for node in ast.walk(cs.scope.node):
        if not _reducing_call(node) or node is cs.node:
            continue
        for arg in ast.walk(node):
            if arg is cs.node or (isinstance(arg, (ast.Name, ast.Attribute)) and final_identifier(arg) in targets):
                return True
    return False


def _callers_reduce(f: ModuleFacts, scope: Scope) -> bool:
    """Whoever calls the evaluation reduces what it returns (`acc = validate(...); dist.all_reduce(acc)`)."""
    callers = [(f, cs) for cs in f.callers.get(scope.name, ())]
    project = f.project
    if project is not None:
        callers += project.callers(f, scope)  # type: ignore[attr-defined]
    return any(_result_reduced(g, cs) for g, cs in callers if not cs.scope.is_module)


# Classes that hold running statistics (AverageMeter, SmoothedValue, MetricLogger, a tracker): one that reduces
# across ranks makes its users' sums global. Other classes of the project that all-reduce say nothing of them.
_METER_CLASS = re.compile(r"meter|metric|average|avg|smooth|logger|tracker|counter|stat", re.IGNORECASE)


def _meters_reduce(f: ModuleFacts) -> bool:
    """A meter class of the project combines the ranks itself (an `update` or `avg` that all-reduces)."""
    files = near_files(f)
    for g in files:
        for node in ast.walk(g.tree):
            if isinstance(node, ast.ClassDef) and _METER_CLASS.search(node.name) and any(
                isinstance(m, ast.FunctionDef) and _reduces(m) for m in node.body
            ):
                return True
    return False


def _ranks_report_themselves(f: ModuleFacts) -> bool:
    """A file these rules leave alone: a unit test, code on a framework that reduces what it logs, or no
    distributed program."""
    return (is_test_file(f.path) or f.imports_prefix(*_SELF_REDUCING) or not distributed_program(f)
            or any(_TRAINER_RE.match(m) for m, _ in f.imported_modules)
            or (any(m == "transformers" for m, _ in f.imported_modules) and b"Trainer(" in f.source))


@rule(
    "DDP049",
    "unreduced-eval-metric",
    "an evaluation metric is summed over this rank's shard of the evaluation data (a DistributedSampler splits "
    "it) and used without being combined across ranks: each rank reports, and rank 0 saves or stops on, a "
    "metric of 1/world_size of the set",
    "all_reduce the sums (correct, total, loss sum) across ranks before dividing (`t = torch.tensor([correct, "
    "total], device=device); dist.all_reduce(t)`), or gather the predictions (`accelerator.gather_for_metrics`, "
    "`dist.all_gather_object`); or evaluate the whole set on rank 0 without a DistributedSampler",
    "With a DistributedSampler on the evaluation set, each rank's loop sees only its own shard (and the "
    "sampler pads the last shard with repeated samples). Counts and losses added up in that loop are that "
    "shard's: the accuracy rank 0 prints, compares with the best so far and saves a checkpoint on is not the "
    "set's, and differs from rank to rank, so ranks may disagree about early stopping.",
)
def check_unreduced_eval_metric(f: ModuleFacts) -> Iterator[Hit]:
    if b"for " not in f.source or _ranks_report_themselves(f):
        return
    functions = [s for s in f.scopes
                 if not s.is_module and isinstance(s.node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not functions:
        return
    sharded = _sharded_evaluation(f)
    if sharded is None or _meters_reduce(f):
        return
    where = f" (split across ranks on line {sharded})" if sharded else ""
    for scope in functions:
        fn = scope.node
        named_eval = bool(EVAL_RE.search(scope.name.lower()))
        loops = [(n, _iterated_names(fn, n)) for n in ast.walk(fn) if isinstance(n, ast.For)]
        # A function named for training may hold the evaluation loop too, over a loader named for it (yolox's
        # fit_one_epoch() over `gen_val`, held-out lint corpus 13).
        loops = [(loop, names) for loop, names in loops
                 if (named_eval and any(_LOADER.search(n.lower()) for n in names))
                 or any(EVAL_RE.search(n.lower()) and (_LOADER.search(n.lower()) or n.lower().startswith("gen"))
                        for n in names)]
        if not loops or _reduces(fn) or _helpers_reduce(f, scope) or _callers_reduce(f, scope):
            continue
        for loop, _ in loops:
            acc = _accumulators(loop)
            if not acc:
                continue
            use = next(((st, name) for st in sorted(_after(fn, loop), key=lambda s: s.lineno)
                        if (name := _reads(st, acc))), None)
            if use is None:
                continue
            st, name = use
            yield (
                st,
                f"`{name}` is added up over this rank's shard of the evaluation data{where} in {scope.name}() and "
                "used here without an all_reduce: the metric is one rank's, not the evaluation set's",
            )
            break



# The project already undoes the padding: predictions cut back to the set's length, duplicates dropped, or a
# sampler/helper that does not pad (HF's SequentialDistributedSampler, `nested_truncate`, an unpadded split).
_UNPADS = re.compile(
    rb"\[\s*:\s*len\(|\[\s*:\s*(?:self\.)?(?:num_samples|dataset_size|n_samples|total_samples|num_examples)\b|"
    rb"truncate|drop_duplicates|unique\(|SequentialDistributedSampler|gather_for_metrics|padding_size|pad=False|"
    rb"even_divides|"
    # DETR's CocoEvaluator keys results by image id and merges the ranks' ids with np.unique: padding collapses.
    rb"CocoEvaluator|coco_evaluator"
)


_SPLIT_RE = re.compile(r"train|mode|split|is_eval|evaluat")


def _split_dependent(f: ModuleFacts, shuffle: ast.AST, scope: object) -> bool:
    """The sampler shuffles only for the training split (`shuffle=(mode == "train")`, `shuffle = is_train and
    cfg.shuffle`): one loader factory builds the evaluation loaders too (NVIDIA/makani, MDIL-SNU/SevenNet,
    held-out lint corpus 13)."""
    texts = [ast.unparse(shuffle)]
    if isinstance(shuffle, ast.Name):
        texts += [ast.unparse(value) for value, stmt in f.assigns.get(shuffle.id, ())
                  if getattr(scope, "node", None) is not None and any(n is stmt for n in ast.walk(scope.node))]  # type: ignore[attr-defined]
    return any(_SPLIT_RE.search(t.lower()) for t in texts)


def _names_evaluation(f: ModuleFacts, cs: CallSite) -> bool:
    """The sampler, its dataset, or a DataLoader built on it in the same function is named for evaluation
    (`val_sampler`, `DistributedSampler(test_set)`, `test_loader = DataLoader(..., sampler=sampler)`); a name
    reused in another function (`sampler` for the training split there) says nothing."""
    own = {n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(cs.node), ())}
    names = set(own)
    dataset = cs.arg(0, "dataset")
    if dataset is not None:
        names.add(final_identifier(dataset) or "")
        if isinstance(dataset, ast.Call):  # `DistributedSampler(TrainDataset(self.val))`: what it wraps
            names.update(final_identifier(a) or "" for a in dataset.args[:2])
    shuffle = cs.arg(3, "shuffle")
    if isinstance(shuffle, ast.Constant) and shuffle.value is False and not cs.scope.is_module:
        names.add(cs.scope.name)  # an unshuffled sampler built by `_get_val_loader()`
    if shuffle is not None and not isinstance(shuffle, ast.Constant) and _split_dependent(f, shuffle, cs.scope):
        return True
    for dl in f.calls_named("DataLoader"):
        sampler = dl.arg(3, "sampler")
        if dl.scope is cs.scope and (sampler is cs.node or (sampler is not None and final_identifier(sampler) in own)):
            names.update(n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(dl.node), ()))
    return any(EVAL_RE.search(n.lower()) for n in names if n)


@rule(
    "DDP053",
    "eval-sampler-pads",
    "a DistributedSampler on evaluation data pads the last shards with repeated samples, and the ranks' results "
    "are combined: the metric counts those samples twice",
    "evaluate on shards that do not pad — `Subset(val_set, range(rank, len(val_set), world_size))`, or gather the "
    "predictions with their dataset indices and keep each index once (`accelerator.gather_for_metrics` does it) — "
    "and combine sums and counts, not per-rank averages",
    "DistributedSampler makes every rank's shard the same length: when the set's size does not divide by the "
    "world size, it repeats the first samples at the end (drop_last=False, the default). Training does not "
    "mind; an evaluation that gathers or all-reduces the ranks' results counts up to world_size - 1 samples "
    "twice, and the reported accuracy, MRR or loss is not the set's (and changes with the number of GPUs).",
)
def check_eval_sampler_pads(f: ModuleFacts) -> Iterator[Hit]:
    if b"DistributedSampler" not in f.source or _ranks_report_themselves(f):
        return
    files = near_files(f)
    if any(_UNPADS.search(g.source) for g in files):
        return
    combined = any(
        _reducing_call(node)
        for g in files for scope in g.scopes
        if not scope.is_module and EVAL_RE.search(scope.name.lower()) for node in ast.walk(scope.node)
    )
    if not combined:
        return  # no evaluation function combines the ranks' results: DDP049's case (or a training-only reduce)
    for cs in f.calls_named("DistributedSampler"):
        shuffle = cs.arg(3, "shuffle")
        if isinstance(shuffle, ast.Constant) and shuffle.value is True:
            continue
        drop = cs.arg(5, "drop_last")
        if drop is not None and not (isinstance(drop, ast.Constant) and drop.value is False):
            continue  # this sampler drops the tail instead of padding (a train loader's drop_last says nothing)
        if not _names_evaluation(f, cs) or _loader_never_read(f, cs):
            continue
        yield (
            cs.node,
            "DistributedSampler on evaluation data pads the last shards with repeated samples (drop_last=False), "
            "and the ranks' results are combined: the samples repeated to fill the shards are counted twice",
        )


def _loader_never_read(f: ModuleFacts, sampler: CallSite) -> bool:
    """Every DataLoader built on this sampler is assigned to a name nothing reads again (mila-docs' examples
    build `_test_dataloader`, "not used in this example": held-out lint corpus 15): no evaluation runs on it."""
    names = {t.rsplit(".", 1)[-1] for t in f.call_targets.get(id(sampler.node), ())}
    if not names:
        return False
    loaders = [dl for dl in f.calls_named("DataLoader")
               if isinstance(dl.arg(3, "sampler"), ast.Name) and dl.arg(3, "sampler").id in names]  # type: ignore[union-attr]
    targets = {t for dl in loaders for t in f.call_targets.get(id(dl.node), ())}
    if not loaders or not targets or any("." in t for t in targets):
        return False
    read = {n.id for n in ast.walk(f.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return not (targets & read)
