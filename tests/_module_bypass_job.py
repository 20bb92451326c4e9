"""Two gloo ranks with different data, one step through the DDP wrapper or around it (`.module`); run by
tests/test_lint_module_bypass.py (never imported). Prints whether the ranks' gradients agree after backward."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    x = torch.full((2, 4), float(rank + 1))
    loss = (model.module(x) if mode == "module" else model(x)).sum()
    loss.backward()
    grads = [torch.zeros_like(model.module.weight.grad) for _ in range(dist.get_world_size())]
    dist.all_gather(grads, model.module.weight.grad)
    if rank == 0:
        print(f"{mode} equal={torch.equal(grads[0], grads[1])}", flush=True)
    # A wrapper whose forward never ran still holds its reducer: freed, and every rank past the last
    # collective, before the group goes (without this one run in six aborted at exit: "terminate called
    # without an active exception").
    del model, loss
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
