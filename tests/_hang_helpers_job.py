"""A 2-rank gloo job whose every rank has helper processes that inherit its RANK/LOCAL_RANK: a DataLoader
with 2 persistent fork workers and a Python subprocess started with the rank's environment. Rank 1 then
sleeps while rank 0 waits in an all_reduce. Run by tests/test_hang_helpers.py, under torchrun or started
by the test as srun would (RANK etc. in the environment); each rank touches `ready_<rank>` in
HANG_READY_DIR once its helpers run. Every helper is killed with the rank's process group."""

import os
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Ones(Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.ones(4)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    batches = iter(DataLoader(Ones(), batch_size=2, num_workers=2, persistent_workers=True))
    grad = next(batches).sum(0)
    dist.all_reduce(grad)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.path.join(os.environ["HANG_READY_DIR"], f"ready_{rank}"), "w").close()
    if rank == 1:
        time.sleep(3600)  # HANG-LINE helpers
    dist.all_reduce(grad)  # HANG-LINE waits
    sleeper.kill()


if __name__ == "__main__":
    main()
