"""Rules about how the ranks split the training data (a class reviewers of four held-out corpora marked and no
rule found: baby-llama2-chinese, so-vits-svc, univnet, opacus' CIFAR-10 example): DDP055 (a DistributedDataParallel
program whose training loader has no sampler, so every rank trains on the whole data set). Registered through
ruleset.py.

The fact read holds on every launch with more than one rank: the loader is built without `sampler=` or
`batch_sampler=`, nothing in the program splits the data by rank (no DistributedSampler, no shard by rank or
world size, no framework that injects a sampler), and a loop over it runs backward on a model the program wraps
in DistributedDataParallel or FSDP. So it belongs to the default tier.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator

from ddpdoctor.lint.facts import CallSite, ModuleFacts, final_identifier, mentions_rank
from ddpdoctor.lint.flow import assigned_from, names_in
from ddpdoctor.lint.helpers import is_test_file, near_files
from ddpdoctor.lint.process_paths import single_process_branch
from ddpdoctor.lint.registry import Hit, rule
from ddpdoctor.lint.rules import EVAL_RE

# What splits the data by rank without a DistributedSampler: a sampler of one's own (`DistributedBucketSampler`,
# `get_sampler`), the datasets library's `split_dataset_by_node`, webdataset's `split_by_node`, a `.shard(...)`,
# an iterable dataset that reads the rank itself.
_SPLITS_RE = re.compile(
    rb"[Ss]ampler\(|split_dataset_by_node|split_by_node|split_by_worker|\.shard\(|"
    rb"num_replicas|num_shards|shard_id|get_worker_info"
)
# Frameworks that put a DistributedSampler in the user's loader themselves (Lightning's Trainer and Fabric,
# accelerate's prepare, DeepSpeed's initialize(training_data=...), Ignite's auto_dataloader).
_INJECTING = ("lightning", "pytorch_lightning", "accelerate", "deepspeed", "ignite", "composer", "transformers")
_WRAPPERS = frozenset({"DistributedDataParallel", "FullyShardedDataParallel", "DDP", "FSDP", "fully_shard"})


def _training_loop_reads(f: ModuleFacts, names: set[str]) -> bool:
    """A loop of this file iterates one of `names` (directly, through enumerate/tqdm/zip, or a name bound to
    one) and calls `.backward(` in its body: the loader feeds training steps."""
    for loop in ast.walk(f.tree):
        if not isinstance(loop, ast.For) or not set(names_in(loop.iter)) & names:
            continue
        if any(isinstance(n, ast.Call) and final_identifier(n.func) == "backward" for n in ast.walk(loop)):
            return True
    return False


def _loader_targets(f: ModuleFacts, cs: CallSite) -> set[str]:
    return assigned_from(f.tree, {n.rsplit(".", 1)[-1] for n in f.call_targets.get(id(cs.node), ())})


@rule(
    "DDP055",
    "no-distributed-sampler",
    "the training DataLoader of a DistributedDataParallel program has no sampler: every rank trains on the whole "
    "data set, in the same or its own order, instead of its 1/world_size share",
    "give the loader a DistributedSampler (`sampler=DistributedSampler(dataset)`, shuffle in the sampler, not the "
    "loader) and call `sampler.set_epoch(epoch)` every epoch; or split the data by rank yourself",
    "DistributedDataParallel averages the gradients of the ranks' batches; it does not split the data. A loader "
    "without a DistributedSampler hands every rank the whole data set: with the same seed (or shuffle=False) "
    "every rank sees the same batches, so N GPUs compute one GPU's gradient N times; with different seeds every "
    "epoch is N epochs of data, and the schedule, the epoch count and the learning rate are all off by N.",
)
def check_no_distributed_sampler(f: ModuleFacts) -> Iterator[Hit]:
    if b"DataLoader" not in f.source or b"backward" not in f.source or is_test_file(f.path):
        return
    # This file and those it calls into or is called from: a repository of scripts holds one with a sampler
    # beside one without (baby-llama2-chinese's pretrain.py and sft.py, held-out lint corpus 12).
    program = near_files(f)
    if not any(g.calls_named("init_process_group") for g in program):
        return
    if not any(cs.attr in _WRAPPERS for g in program for cs in g.calls):
        return
    if any(_SPLITS_RE.search(g.source) or g.imports_prefix(*_INJECTING) for g in program):
        return
    for cs in f.calls_named("DataLoader"):
        # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)
        if cs.arg(3, "sampler") is not None or cs.arg(4, "batch_sampler") is not None or cs.has_star_kwargs():
            continue
        if EVAL_RE.search(cs.scope.name.lower()) or single_process_branch(f, cs):
            continue  # an evaluation on every rank is wasteful, not wrong; the single-process side is one rank
        dataset = cs.arg(0, "dataset")
        if dataset is not None and (mentions_rank(dataset) or any(
                mentions_rank(v) for v, _ in f.assigns.get(final_identifier(dataset) or "", ()))):
            continue  # a dataset built from the rank shards itself
        names = _loader_targets(f, cs)
        if any(EVAL_RE.search(n.lower()) for n in names) or not _training_loop_reads(f, names):
            continue
        yield cs.node, (
            "this DataLoader feeds the training loop of a DistributedDataParallel program without a sampler: every "
            "rank trains on the whole data set instead of its share"
        )
