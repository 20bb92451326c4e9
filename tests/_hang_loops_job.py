"""A 2-rank gloo job whose ranks part at a loop, run under torchrun by tests/test_hang_loops.py (never
imported). argv[1] is the scenario:

- `early_break`: rank 1 leaves its training loop through a `break` on a rank-local condition and waits in
  the checkpoint's barrier; rank 0 stays in the loop and waits in the gradient all_reduce;
- `uneven_ddp`: a hand-rolled strided shard of 5 samples in batches of 2 gives rank 0 two batches and
  rank 1 one; rank 0 blocks in DistributedDataParallel's forward of its extra batch (the bucket rebuild's
  broadcast), rank 1 has finished the epoch and waits in all_gather_object.

Each rank touches $HANG_READY_DIR/ready_<rank> just before the point where it hangs.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def ready(rank: int) -> None:
    open(os.path.join(os.environ["HANG_READY_DIR"], f"ready_{rank}"), "w").close()


def save_checkpoint(rank: int) -> None:
    ready(rank)
    dist.barrier()  # HANG-LINE barrier


def reduce_grads(grad: torch.Tensor) -> None:
    dist.all_reduce(grad)  # HANG-LINE all-reduce


def train(rank: int) -> None:
    grad = torch.ones(4)
    for step in range(1000):
        if step == 2:
            ready(rank)
        reduce_grads(grad)
        local_loss = 0.0 if rank == 1 and step >= 2 else 1.0
        if local_loss < 0.5:
            break  # HANG-LINE break


def early_break(rank: int) -> None:
    train(rank)
    save_checkpoint(rank)


def run_epoch(model: nn.Module, x: torch.Tensor, rank: int) -> None:
    for i in range(0, len(x), 2):
        if i == 2:
            ready(rank)
        model(x[i:i + 2]).sum().backward()  # HANG-LINE ddp-forward


def uneven_ddp(rank: int, world: int) -> None:
    model = DistributedDataParallel(nn.Linear(3, 1))
    x = torch.randn(5, 3)[rank::world]
    for _ in range(3):
        run_epoch(model, x, rank)
        stats = [None] * world
        ready(rank)
        dist.all_gather_object(stats, len(x))  # HANG-LINE gather


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    if sys.argv[1] == "early_break":
        early_break(rank)
    else:
        uneven_ddp(rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
