"""A torch.multiprocessing.spawn job (no torchrun: RANK is set in code, not in the environment) whose
last rank sleeps before an all_reduce the others wait in. Run by tests/test_hang_live.py; argv[1] is a
directory where each rank touches `ready_<rank>` when it reaches the point where it hangs."""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def rank_main(rank: int, ready_dir: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120))
    grad = torch.ones(4)
    dist.all_reduce(grad)
    open(os.path.join(ready_dir, f"ready_{rank}"), "w").close()
    if rank == WORLD - 1:
        time.sleep(3600)  # HANG-LINE spawn
    dist.all_reduce(grad)


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD)
