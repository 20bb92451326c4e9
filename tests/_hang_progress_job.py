"""A gloo job that keeps running (or spins), run under torchrun by tests/test_hang_progress.py (never
imported). argv[1] is the scenario:

- `healthy`: every rank does a little work and an all_reduce, step after step, forever;
- `slow`: the same, but the last rank sleeps 0.5 s per step (a straggler: the job still progresses);
- `spin`: after three steps the last rank spins in a Python loop that never ends, the others wait in
  the all_reduce it never reaches;
- `io`: every fourth step rank 0 spends about 2.5 s writing a checkpoint (torch.save, then short
  writes, fsync and sleeps) while the others wait in a barrier: healthy, though one second of it looks
  hung;
- `fetch`: every rank waits about 0.3 s per step in `future.result()` for its next batch from an asyncio
  loop on a thread (held-out hang set 11, j15): the same line in every snapshot, and progress.

Each rank touches $HANG_READY_DIR/ready_<rank> once it has done three steps.
"""

import asyncio
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def spin_forever() -> int:
    count = 0
    while count >= 0:  # HANG-LINE spin
        count += 1
    return count


def write_checkpoint(path: str, weights: torch.Tensor) -> None:
    torch.save(weights, path + ".pt")
    with open(path, "wb") as out:
        for _ in range(20):
            out.write(os.urandom(256 * 1024))  # HANG-LINE io
            out.flush()
            os.fsync(out.fileno())
            time.sleep(0.1)


class Fetcher:
    """Batches from an asyncio loop on a thread, as a remote data service would give them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="fetch-loop", daemon=True).start()

    async def _one(self, step: int) -> torch.Tensor:
        await asyncio.sleep(0.3)
        return torch.full((64,), float(step))

    def get(self, step: int) -> torch.Tensor:
        return asyncio.run_coroutine_threadsafe(self._one(step), self.loop).result()  # HANG-LINE fetch


def main() -> None:
    scenario = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=int(os.environ.get("HANG_PG_TIMEOUT", "300"))))
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = torch.randn(64, 64)
    grad = torch.ones(64)
    step = 0
    fetcher = Fetcher() if scenario == "fetch" else None
    while True:
        step += 1
        if fetcher is not None:
            grad.add_(fetcher.get(step) * 0)
        for _ in range(20):
            weights = torch.tanh(weights @ weights.T / 64)  # a little compute per step
        if scenario == "slow" and rank == world - 1:
            time.sleep(0.5)  # HANG-LINE slow
        if scenario == "spin" and rank == world - 1 and step > 3:
            spin_forever()
        if scenario == "io" and step % 4 == 0:
            if rank == 0:
                write_checkpoint(os.path.join(os.environ.get("HANG_READY_DIR", "."), "ckpt"), weights)
            dist.barrier()  # HANG-LINE io-barrier
        dist.all_reduce(grad)  # HANG-LINE step
        grad.fill_(1.0)
        if step == 3 and os.environ.get("HANG_READY_DIR"):
            open(os.path.join(os.environ["HANG_READY_DIR"], f"ready_{rank}"), "w").close()
        time.sleep(0.01)


if __name__ == "__main__":
    main()
