"""A gloo rank started without a launcher (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the test, each in its own
session), run by tests/test_hang_orphan.py (never imported): after init_process_group every rank forks a log
shipper (os.fork: it inherits the rank's sockets and stderr); at its fourth step the last rank raises, and its
shipper lives on, so the other ranks wait in the all_reduce for a peer whose connections never close."""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def ship_logs() -> None:
    if os.fork() != 0:
        return
    while True:  # the child: copy log lines somewhere, forever
        time.sleep(0.5)


rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", timeout=timedelta(seconds=300))
ship_logs()
labels = [0, 1, 2, 5] if rank == world - 1 else [0, 1, 2, 3]
for step, label in enumerate(labels):
    open(os.path.join(os.environ["HANG_READY_DIR"], f"step_{rank}_{step}"), "w").close()
    if label > 3:
        raise IndexError(f"Target {label} is out of bounds.")  # HANG-LINE raise
    dist.all_reduce(torch.ones(2))  # HANG-LINE all-reduce
sys.exit(0)
