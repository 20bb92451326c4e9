"""A gloo job that hangs on purpose, run under torchrun by tests/test_hang_live.py (never imported).

argv[1] is the scenario: `sleep` (the last rank sleeps before a collective), `mismatch` (rank 1 issues a
broadcast where the others issue an all_reduce), `skip` (only rank 0 issues a collective), `idle` (every
rank sleeps after its collectives), `late` (the last rank sleeps before its first collective: on NCCL, rank 0
waits inside the communicator's creation, which NCCL does lazily at the first collective; the last rank never
touches a GPU, so two ranks can run on one). HANG_BACKEND=nccl runs on cuda:LOCAL_RANK (the GPU test). A thread dumps
this rank's Flight Recorder buffer to $HANG_FR_PREFIX<rank> (pickle) and .json $HANG_FR_AFTER seconds
after the rank reached the point where it hangs (however slow the machine), the way
TORCH_FR_DUMP_TEMP_FILE names them, so the test reads real dumps of a real hang.
"""

import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

HANGING = threading.Event()  # set just before the call this rank hangs in


def dump_later(rank: int) -> None:
    import torch._C._distributed_c10d as c10d

    # An NCCL group records into a Flight Recorder of its own (CUDA events), dumped by _dump_nccl_trace;
    # _dump_fr_trace dumps the other backends' one — on the GPU nodes of 2026-11-27/28 it gave NCCL jobs
    # empty dumps (no entries, no pg_config) although their collectives had run.
    nccl = os.environ.get("HANG_BACKEND") == "nccl" and hasattr(c10d, "_dump_nccl_trace")
    _dump_fr_trace = c10d._dump_nccl_trace if nccl else c10d._dump_fr_trace
    _dump_fr_trace_json = c10d._dump_nccl_trace_json if nccl else c10d._dump_fr_trace_json
    HANGING.wait()
    time.sleep(float(os.environ.get("HANG_FR_AFTER", "1")))
    prefix = os.environ["HANG_FR_PREFIX"]
    with open(f"{prefix}{rank}.tmp", "wb") as out:
        out.write(_dump_fr_trace())
    os.replace(f"{prefix}{rank}.tmp", f"{prefix}{rank}")
    with open(f"{prefix}{rank}.json.tmp", "wb") as out:
        out.write(_dump_fr_trace_json())
    os.replace(f"{prefix}{rank}.json.tmp", f"{prefix}{rank}.json")


def main() -> None:
    scenario = sys.argv[1]
    backend = os.environ.get("HANG_BACKEND", "gloo")
    device = "cpu"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    late = scenario == "late" and local_rank == int(os.environ.get("LOCAL_WORLD_SIZE", "1")) - 1
    if backend == "nccl" and not late:
        device = f"cuda:{0 if scenario == 'late' else local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=int(os.environ.get("HANG_PG_TIMEOUT", "120"))))
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("HANG_FR_PREFIX"):
        threading.Thread(target=dump_later, args=(rank,), daemon=True).start()
    grad = torch.ones(16, device=device)
    if scenario == "late":
        HANGING.set()
        if late:
            time.sleep(3600)  # HANG-LINE late
        dist.all_reduce(grad)
    for _ in range(3):
        dist.all_reduce(grad)
    if scenario == "sleep":
        HANGING.set()
        if rank == world - 1:
            time.sleep(3600)  # HANG-LINE sleep
        dist.all_reduce(grad)
    elif scenario == "mismatch":
        HANGING.set()
        if rank == 1:
            dist.broadcast(grad, src=0)  # HANG-LINE mismatch
        else:
            dist.all_reduce(grad)
    elif scenario == "skip":
        HANGING.set()
        if rank == 0:
            dist.all_reduce(torch.zeros(1, device=device))  # HANG-LINE skip
        dist.barrier()
    if backend == "nccl":
        torch.cuda.synchronize()
    HANGING.set()
    time.sleep(3600)


if __name__ == "__main__":
    main()
