"""A gloo rank started without a launcher (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the test), run
by tests/test_hang_joining.py (never imported): it touches $HANG_READY_DIR/ready_<rank> and joins the
job; with a rank missing or given another MASTER_PORT (or another INIT_FILE, or a store prefix taken from its
own clock with RUN_TAG_FROM_CLOCK), it waits in init_process_group."""

import os
from datetime import datetime, timedelta

import torch.distributed as dist

rank = int(os.environ["RANK"])
open(os.path.join(os.environ["HANG_READY_DIR"], f"ready_{rank}"), "w").close()
# INIT_FILE: rendezvous through a file store (file://) instead of MASTER_ADDR/MASTER_PORT
init = {"init_method": f"file://{os.environ['INIT_FILE']}", "rank": rank,
        "world_size": int(os.environ["WORLD_SIZE"])} if os.environ.get("INIT_FILE") else {}
# INIT_PORT_OFFSET: a tcp:// init_method whose port this rank computes with an offset of its own
if os.environ.get("INIT_PORT_OFFSET"):
    port = int(os.environ["MASTER_PORT"]) + int(os.environ["INIT_PORT_OFFSET"])
    init = {"init_method": f"tcp://127.0.0.1:{port}", "rank": rank, "world_size": int(os.environ["WORLD_SIZE"])}


def open_run(rank: int, world: int) -> None:
    """Rendezvous under a prefix named after this run: each rank reads its own clock."""
    tag = datetime.now().strftime("%Y%m%d-%H%M%S-%f")  # HANG-LINE tag
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0,
                         timeout=timedelta(seconds=300))
    store = dist.PrefixStore(f"runs/{tag}", base)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,  # HANG-LINE prefixed
                            timeout=timedelta(seconds=300))


if os.environ.get("RUN_TAG_FROM_CLOCK"):
    open_run(rank, int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300), **init)  # HANG-LINE init
dist.barrier()
