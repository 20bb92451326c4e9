"""Classes of the second held-out lint review of 2026-11-27 (docs/lint.md, "Measured on code nobody here had
read, second corpus", now spent and used for tuning): one test per class, on a snippet written for
ddpdoctor in the shape a public repository uses (the shape's origin beside each). No third-party code is
copied; identifiers and bodies are ours. Each negative has its positive twin, so the test fails when the
rule is silent for the wrong reason.
"""

from __future__ import annotations

import textwrap

from ddpdoctor.lint import RULES, default_rules, lint_source


def codes(src: str) -> list[tuple[int, str]]:
    return [(d.line, d.code) for d in lint_source(textwrap.dedent(src), "train.py", default_rules())]


def lines_of(src: str, code: str) -> list[int]:
    """The lines `code` reports; an opinionated rule (DDP004 since the held-out gradings) is run beside
    the default tier when asked about."""
    rules = [r for r in RULES.values() if r.default or r.id == code]
    return [d.line for d in lint_source(textwrap.dedent(src), "train.py", rules) if d.code == code]


# --- 1. a port set only when MASTER_PORT is unset or empty is a default ------------------------------

# facebookresearch/dlrm extend_distributed.py: `if not os.environ.get("MASTER_PORT", None):
# os.environ["MASTER_PORT"] = "29500"` in an MPI init helper.
PORT_DEFAULT = """
import os
import torch.distributed as dist

def init_distributed(rank, size):
    {test}
        os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group("gloo", rank=rank, world_size=size)
"""


def test_port_default_any_spelling_of_unset() -> None:
    for test in (
        'if not os.environ.get("MASTER_PORT", None):',
        'if os.getenv("MASTER_PORT") is None:',
        'if os.environ.get("MASTER_PORT", "") == "":',
        'if "MASTER_PORT" not in os.environ.keys():',
    ):
        assert lines_of(PORT_DEFAULT.format(test=test), "DDP004") == [], test
    # The twin: a test of another variable does not make the port a default.
    assert lines_of(PORT_DEFAULT.format(test='if not os.environ.get("RANK", None):'), "DDP004") == [7]
    present = PORT_DEFAULT.format(test='if os.environ.get("MASTER_PORT"):\n        pass\n    else:')
    assert lines_of(present, "DDP004") == []


# --- 2 and 3. set_epoch: evaluation samplers are exempt; the finding sits at the epoch loop ----------

# NVIDIA/tacotron2 train.py: the training sampler is built in prepare_dataloaders() and the loader is
# iterated in train()'s epoch loop with no set_epoch (reviewer's line: the epoch loop); validate()
# builds `val_sampler = DistributedSampler(valset)` and sums the all-reduced loss.
TACOTRON_SHAPE = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

def prepare_dataloaders(trainset):
    train_sampler = DistributedSampler(trainset)
    train_loader = DataLoader(trainset, sampler=train_sampler, batch_size=8)
    return train_loader

def validate(model, valset):
    with torch.no_grad():
        val_sampler = DistributedSampler(valset)
        val_loader = DataLoader(valset, sampler=val_sampler, batch_size=8)
        total = 0.0
        for batch in val_loader:
            total += model(batch).item()
    return total

def train(model, trainset, valset, optimizer, epochs):
    dist.init_process_group("nccl")
    train_loader = prepare_dataloaders(trainset)
    for epoch in range(epochs):
        for batch in train_loader:
            model(batch).backward()
            optimizer.step()
        validate(model, valset)
"""


def test_set_epoch_reported_at_epoch_loop_not_for_validation() -> None:
    hits = [d for d in lint_source(textwrap.dedent(TACOTRON_SHAPE), "train.py", default_rules()) if d.code == "DDP005"]
    assert [d.line for d in hits] == [23]  # `for epoch in range(epochs):`, not the val sampler at 13
    assert "line 7" in hits[0].message  # names the training sampler
    # The twin: the same evaluation sampler under a training name is reported.
    renamed = TACOTRON_SHAPE.replace("val_sampler", "aux_sampler").replace("val_loader", "aux_loader")
    renamed = renamed.replace("def validate(", "def run_aux(").replace("validate(model", "run_aux(model")
    renamed = renamed.replace("valset", "auxset")
    assert len(lines_of(renamed, "DDP005")) == 2


# --- 4a. MASTER_ADDR forced to loopback when unset, in mpirun code that spans nodes -------------------

# facebookresearch/dlrm extend_distributed.py: reads OMPI/PMI ranks and the node-local size, warns
# "Looks like distributed multinode run", then `os.environ["MASTER_ADDR"] = "127.0.0.1"`.
ADDR_DEFAULT = """
import os
import torch.distributed as dist

def init_distributed():
    rank = int(os.environ.get("{rank_var}", 0))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    local_size = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1))
    if not os.environ.get("MASTER_ADDR", None):
        if local_size != size:
            print("multinode run without MASTER_ADDR")
        os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group("gloo", rank=rank, world_size=size)
"""


def test_loopback_addr_default_under_mpirun() -> None:
    assert lines_of(ADDR_DEFAULT.format(rank_var="OMPI_COMM_WORLD_RANK"), "DDP032") == [12]
    # The twin: under torchrun (RANK), which always sets MASTER_ADDR, the default never fires.
    assert lines_of(ADDR_DEFAULT.format(rank_var="RANK"), "DDP032") == []


# --- 4b. a sampler seed drawn at random when the config has none ---------------------------------------

# cszn/KAIR main_train_psnr.py: `seed = opt['train']['manual_seed']; if seed is None: seed =
# random.randint(1, 10000)`, then `DistributedSampler(train_set, ..., seed=seed)` on every rank.
SEED_FALLBACK = """
import random
import torch.distributed as dist
from torch.utils.data import DistributedSampler

def main(opt, train_set):
    dist.init_process_group("nccl")
    seed = opt["train"]["manual_seed"]
    if seed is None:
        seed = random.randint(1, 10000)
    {share}
    sampler = DistributedSampler(train_set, shuffle=True, seed=seed)
    for epoch in range(10):
        sampler.set_epoch(epoch)
"""


def test_sampler_seed_random_fallback() -> None:
    assert lines_of(SEED_FALLBACK.format(share="pass"), "DDP028") == [12]
    # The twin: the drawn seed is broadcast from rank 0 before the sampler.
    shared = SEED_FALLBACK.format(share="seed = dist.broadcast_object_list([seed], src=0) or seed")
    assert lines_of(shared, "DDP028") == []


# --- 4c. a free port probed by every Slurm task -----------------------------------------------------

# open-mmlab/mmcv mmcv/runner/dist_utils.py `_init_dist_slurm`: `if _is_free_port(29500): MASTER_PORT =
# '29500' else: str(_find_free_port())`, run in every srun task.
FREE_PORT = """
import os
import socket
import torch.distributed as dist

def _find_free_port():
    sock = socket.socket()
    sock.bind(("", 0))
    return sock.getsockname()[1]

def init_dist({where}):
    {rank}
    if "MASTER_PORT" in os.environ:
        pass
    else:
        os.environ["MASTER_PORT"] = str(_find_free_port())
    dist.init_process_group("nccl")
"""


def test_free_port_per_slurm_task() -> None:
    assert lines_of(FREE_PORT.format(where="", rank='rank = int(os.environ["SLURM_PROCID"])'), "DDP034") == [16]
    # The twin: the same probe in a torchrun program (RANK) runs once per job in the launch script's
    # parent or is overridden by the launcher: not flagged.
    assert lines_of(FREE_PORT.format(where="", rank='rank = int(os.environ["RANK"])'), "DDP034") == []
