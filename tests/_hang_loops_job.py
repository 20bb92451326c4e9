"""A 2-rank gloo job whose ranks part at a loop, run under torchrun by tests/test_hang_loops.py (never
imported). argv[1] is the scenario:

- `early_break`: rank 1 leaves its training loop through a `break` on a rank-local condition and waits in
  the checkpoint's barrier; rank 0 stays in the loop and waits in the gradient all_reduce;
- `uneven_ddp`: a hand-rolled strided shard of 5 samples in batches of 2 gives rank 0 two batches and
  rank 1 one; rank 0 blocks in DistributedDataParallel's forward of its extra batch (the bucket rebuild's
  broadcast), rank 1 has finished the epoch and waits in all_gather_object.

- `eval_ddp`: rank 0 alone evaluates through the DDP wrapper (BatchNorm buffers, broadcast_buffers=True,
  grad enabled) after each epoch: its forward blocks in DDP's buffer broadcast while rank 1 waits in the
  next step's backward all-reduce (a forward/backward mismatch, no iteration count differs);
- `except_barrier`: rank 1 raises on a bad batch and its exception handler calls barrier(); rank 0 waits
  in the DDP backward all-reduce;
- `rank_only`: a checkpoint function returns early on rank 1 and calls all_gather_object on rank 0 only,
  rank 1 goes on to barrier();
- `p2p_skip`: a 2-stage send/recv pipeline (branches of an if on the rank) where rank 1 `continue`s past
  its send of one gradient: both ranks wait in recv.
- `thread_collective`: rank 0 runs all_gather_object in a background checkpoint thread and joins it;
  rank 1 goes on to barrier(): rank 0's collective is in a non-main thread.
- `root_mismatch`: each rank broadcasts from the rank it believes has the best score, computed from its
  own score only: rank 0 broadcasts with src=0, rank 1 with src=1, both wait in the same broadcast.
- `tag_mismatch`: a 2-stage send/recv pipeline where stage 1 reports its loss with the gradient tag while
  stage 0 receives it with the loss tag: rank 0 waits in recv, rank 1 in send.
- `param_loop`: gradients averaged in `for p in model.parameters(): all_reduce`, then a validation exchange
  where rank 0 expects one more batch than rank 1 sends: rank 1 goes on to the next epoch's averaging
  while rank 0 waits in recv (no rank runs "one more iteration" of the parameter loop);
- `ring_recv`: a ring exchange where every rank receives from its left neighbour before sending to its
  right one (recv-then-send on every rank): nobody sends;
- `group_alone`: rank 0 creates its evaluation group lazily, on first use, inside `if rank == 0:`; rank 1
  goes on to the next step's all_reduce (new_group is a collective over every process);
- `halo_exchange`: a neighbour exchange written send-then-recv on every rank; with 2 ranks each one's
  neighbour is the other, so both wait in send (a gloo send waits for the matching receive);
- `mutual_send`: both ranks send 64 MB over a side TCP socket before reading the peer's (sendall on both
  ends with full socket buffers): both block in sendall, outside any collective.
- `subgroup_skip` (3 ranks): ranks 1-2 form an expert group (`new_group(experts)`); each all-reduces its
  load on that group only when it got tokens, and rank 2 never does: rank 1 waits in the group's all_reduce,
  ranks 0 and 2 in the global gradient all_reduce (held-out hang set 6, j04's class, written again here).
- `store_poll`: every rank adds itself to a per-phase counter in the c10d store, then polls it every 50 ms
  until it equals the world size; the counter is reused for the next phase, so it passes the world size and
  the equality never holds again (held-out hang set 7, j03's class, written again here).
- `shared_service`: rank 0 serves shard assignments from a single-threaded HTTPServer thread whose handler
  fetches the manifest from that same server; every rank's main thread waits for its reply (held-out hang
  set 6, j16's class, written again here).

- `label_keys`: per-class statistics keyed by the labels each rank saw in its own shard; rank 1 saw one more
  label, so it all-reduces one more key while rank 0 has gone on to the barrier (held-out hang set 10, j03's
  class, written again here).
- `wall_deadline`: a time-boxed loop (`while time.monotonic() < deadline:`) whose deadline each rank computes
  from its own start; rank 1 finished loading 1.5 s later, so rank 0 leaves first and waits in the
  checkpoint's barrier while rank 1 waits in the next all_reduce (held-out hang set 9, j04's class, written
  again here).
- `cached_collective`: an all_reduce inside an `@functools.cache` function; rank 0's shard size repeats, so
  its second call hits the cache and skips the all_reduce rank 1 waits in (held-out hang set 11, j02's class,
  written again here).

Each rank touches $HANG_READY_DIR/ready_<rank> just before the point where it hangs.
"""

import functools
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from _hang_http import reply_json
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


def label_keys(rank: int) -> None:
    labels = [0, 1, 2] if rank == 0 else [0, 1, 2, 8]  # what each rank's shard happened to hold
    stats = {}
    for label in labels:
        s = stats.setdefault(label, torch.zeros(2))
        s[1] += 1
    ready(rank)
    for label in sorted(stats):
        dist.all_reduce(stats[label])  # HANG-LINE label-reduce
    save_checkpoint(rank)


def wall_deadline(rank: int) -> None:
    time.sleep(1.5 * rank)  # loading the shard takes longer on rank 1
    start = time.monotonic()
    deadline = start + 3.0
    grad = torch.ones(4)
    step = 0
    while time.monotonic() < deadline:
        step += 1
        if rank == 1 and time.monotonic() - start > 1.2:
            ready(rank)  # rank 0 leaves at about 1.5 s of rank 1's clock: this is rank 1's last lap
        dist.all_reduce(grad)  # HANG-LINE deadline-reduce
        time.sleep(0.05)
    save_checkpoint(rank)


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


def eval_ddp(rank: int) -> None:
    model = DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)))
    for epoch in range(3):
        for i in range(2):
            if epoch == 0 and i == 1:
                ready(rank)
            model(torch.randn(8, 3)).sum().backward()  # HANG-LINE eval-backward
        if rank == 0:
            for _ in range(2):
                model(torch.randn(8, 3))  # HANG-LINE eval-forward


class BadBatch(Exception):
    pass


def step(model: nn.Module, x: torch.Tensor, rank: int, i: int) -> None:
    if rank == 1 and i == 2:
        raise BadBatch("label out of range")
    model(x).sum().backward()  # HANG-LINE except-backward


def except_barrier(rank: int) -> None:
    model = DistributedDataParallel(nn.Linear(3, 1))
    for i in range(100):
        if i == 2:
            ready(rank)
        try:
            step(model, torch.randn(4, 3), rank, i)
        except BadBatch:
            dist.barrier()  # HANG-LINE except-barrier
            raise


def gather_stats(rank: int, world: int) -> None:
    if rank != 0:
        return
    stats = [None] * world
    dist.all_gather_object(stats, rank)  # HANG-LINE rank-only


def rank_only(rank: int, world: int) -> None:
    grad = torch.ones(4)
    for i in range(100):
        dist.all_reduce(grad)
        if i == 2:
            ready(rank)
            gather_stats(rank, world)
            dist.barrier()  # HANG-LINE rank-only-barrier


@functools.cache
def steps_for(n_local: int) -> int:
    t = torch.tensor([n_local // 8])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)  # HANG-LINE cached-reduce
    return int(t.item())


def cached_collective(rank: int) -> None:
    # Rank 0's shard size repeats from one epoch to the next, rank 1's does not.
    sizes = [[100, 100, 100], [100, 90, 80]][rank]
    for epoch, n_local in enumerate(sizes):
        if epoch == 1:
            ready(rank)
        steps_for(n_local)
        seed = torch.tensor([epoch])
        dist.broadcast(seed, src=0)  # HANG-LINE cached-bcast


def stage0() -> None:
    for mb in range(4):
        dist.send(torch.ones(2), dst=1, tag=mb)
        grad = torch.empty(2)
        dist.recv(grad, src=1, tag=100 + mb)  # HANG-LINE p2p-grad


def stage1(step: int) -> None:
    for mb in range(4):
        act = torch.empty(2)
        dist.recv(act, src=0, tag=mb)  # HANG-LINE p2p-act
        if step == 2 and mb == 1:
            continue
        dist.send(act, dst=0, tag=100 + mb)


def p2p_skip(rank: int) -> None:
    for i in range(100):
        if i == 2:
            ready(rank)
        if rank == 0:
            stage0()
        else:
            stage1(i)


def thread_collective(rank: int, world: int) -> None:
    import threading

    def gather() -> None:
        dist.all_gather_object([None] * world, rank)  # HANG-LINE thread-gather

    for i in range(100):
        dist.all_reduce(torch.ones(2))
        if i == 2:
            ready(rank)
            if rank == 0:
                worker = threading.Thread(target=gather, name="ckpt")
                worker.start()
                worker.join()  # HANG-LINE thread-join
            dist.barrier()


def best_replica(rank: int) -> int:
    score = torch.tensor([float(rank)])  # each rank thinks it is the best: the choice is never shared
    best = rank if score.item() >= 0 else 0
    return best


def root_mismatch(rank: int) -> None:
    weights = torch.zeros(4)
    for i in range(100):
        dist.all_reduce(weights)
        if i == 2:
            ready(rank)
            dist.broadcast(weights, src=best_replica(rank))  # HANG-LINE root-broadcast


TAG_GRAD, TAG_LOSS = 1, 2


def tag_mismatch(rank: int) -> None:
    for i in range(100):
        if rank == 0:
            dist.send(torch.ones(2), dst=1, tag=TAG_GRAD)
            if i == 2:
                ready(rank)
            loss = torch.empty(1)
            dist.recv(loss, src=1, tag=TAG_LOSS)  # HANG-LINE tag-recv
        else:
            act = torch.empty(2)
            dist.recv(act, src=0, tag=TAG_GRAD)
            if i == 2:
                ready(rank)
            dist.send(act[:1], dst=0, tag=TAG_GRAD if i == 2 else TAG_LOSS)  # HANG-LINE tag-send


def param_loop(rank: int) -> None:
    model = torch.nn.Linear(2, 2)
    buf = torch.zeros(2)
    for epoch in range(3):
        for p in model.parameters():
            dist.all_reduce(p.data)  # HANG-LINE param-reduce
        batches = 3 if rank == 1 else 4
        if epoch == 0:
            ready(rank)
        for _ in range(batches):
            if rank == 1:
                dist.send(torch.ones(2), dst=0)
            else:
                dist.recv(buf, src=1)  # HANG-LINE val-recv


def ring_recv(rank: int, world: int) -> None:
    box = torch.zeros(2)
    ready(rank)
    dist.recv(box, src=(rank - 1) % world)  # HANG-LINE ring-recv
    dist.send(box, dst=(rank + 1) % world)


class Evaluator:
    def __init__(self) -> None:
        self.group = None

    def score(self, t: torch.Tensor) -> None:
        if self.group is None:
            self.group = dist.new_group([0, 1])  # HANG-LINE group-alone
        dist.all_reduce(t, group=self.group)


def group_alone(rank: int) -> None:
    evaluator = Evaluator()
    t = torch.ones(2)
    for step in range(100):
        dist.all_reduce(t)
        if step == 2:
            ready(rank)
            if rank == 0:
                evaluator.score(t)


def halo_exchange(rank: int, world: int) -> None:
    edge = torch.ones(2)
    right = (rank + 1) % world
    ready(rank)
    dist.send(edge, dst=right)  # HANG-LINE halo-send
    dist.recv(edge, src=(rank - 1) % world)


def mutual_send(rank: int) -> None:
    import socket

    box = [None]
    if rank == 0:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        box = [server.getsockname()[1]]
    dist.broadcast_object_list(box, src=0)
    if rank == 0:
        sock, _ = server.accept()
    else:
        sock = socket.create_connection(("127.0.0.1", box[0]))
    payload = b"x" * (64 << 20)
    ready(rank)
    sock.sendall(payload)  # HANG-LINE mutual-send
    sock.recv(len(payload))


def store_poll(rank: int, world: int) -> None:
    import time

    store = dist.distributed_c10d._get_default_store()
    for _phase in range(2):
        store.add("merge-phase", 1)  # the same key every phase: the count goes on past the world size
        ready(rank)
        while int(store.add("merge-phase", 0)) != world:
            time.sleep(0.05)  # HANG-LINE store-poll


def subgroup_skip(rank: int, world: int) -> None:
    experts = list(range(1, world))
    expert_group = dist.new_group(experts)
    grad = torch.ones(4)
    for _ in range(100):
        tokens = 0 if rank == world - 1 else 5
        if rank in experts and tokens > 0:
            load = torch.tensor([float(tokens)])
            ready(rank)
            dist.all_reduce(load, group=expert_group)  # HANG-LINE group-reduce
        ready(rank)
        dist.all_reduce(grad)  # HANG-LINE global-reduce


def fetch(port: int, path: str) -> dict:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as reply:  # HANG-LINE service-fetch
        return json.loads(reply.read())


def shared_service(rank: int, world: int) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Assign(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/manifest":
                body = {"shards": list(range(8))}
            else:
                manifest = fetch(self.server.server_address[1], "/manifest")  # HANG-LINE nested-fetch
                body = {"shards": manifest["shards"][int(self.path.rsplit("/", 1)[1]) :: world]}
            reply_json(self, body)

        def log_message(self, *args) -> None:
            pass

    box = [None]
    if rank == 0:
        server = HTTPServer(("127.0.0.1", 0), Assign)
        threading.Thread(target=server.serve_forever, name="assign-svc", daemon=True).start()
        box = [server.server_address[1]]
    dist.broadcast_object_list(box, src=0)
    ready(rank)
    fetch(box[0], f"/assign/{rank}")


def fence_before_send(rank: int) -> None:
    # A stats report: rank 0 receives rank 1's numbers, then both fence with a barrier; rank 1 fences first.
    ready(rank)
    stats = torch.zeros(3)
    if rank == 0:
        dist.recv(stats, src=1)  # HANG-LINE fence-recv
        dist.barrier()
    else:
        dist.barrier()  # HANG-LINE fence-barrier
        dist.send(torch.ones(3), dst=0)


def stage_local_dst(rank: int) -> None:
    # 4 ranks: 0 and 1 train data-parallel; 2 and 3 are a two-stage pipeline (group [2, 3]). Stage 1 (rank 3)
    # sends its loss back to stage 0 by the stage's index in the pipeline group (0), which torch reads as the
    # global rank 0; stage 0 (rank 2) waits for it from rank 3.
    pipe = dist.new_group([2, 3])
    ready(rank)
    if rank in (0, 1):
        dist.all_reduce(torch.ones(4))  # HANG-LINE dp-reduce
    elif rank == 2:
        loss = torch.zeros(1)
        dist.recv(loss, src=3, group=pipe)  # HANG-LINE stage-recv
    else:
        first_stage = 0  # the stage's index within the pipeline group
        dist.send(torch.ones(1), dst=first_stage)  # HANG-LINE stage-send


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    scenario = sys.argv[1]
    if scenario == "early_break":
        early_break(rank)
    elif scenario == "wall_deadline":
        wall_deadline(rank)
    elif scenario == "label_keys":
        label_keys(rank)
    elif scenario == "uneven_ddp":
        uneven_ddp(rank, world)
    elif scenario == "eval_ddp":
        eval_ddp(rank)
    elif scenario == "except_barrier":
        except_barrier(rank)
    elif scenario == "thread_collective":
        thread_collective(rank, world)
    elif scenario == "rank_only":
        rank_only(rank, world)
    elif scenario == "cached_collective":
        cached_collective(rank)
    elif scenario == "root_mismatch":
        root_mismatch(rank)
    elif scenario == "tag_mismatch":
        tag_mismatch(rank)
    elif scenario == "mutual_send":
        mutual_send(rank)
    elif scenario == "store_poll":
        store_poll(rank, world)
    elif scenario == "subgroup_skip":
        subgroup_skip(rank, world)
    elif scenario == "shared_service":
        shared_service(rank, world)
    elif scenario == "param_loop":
        param_loop(rank)
    elif scenario == "ring_recv":
        ring_recv(rank, world)
    elif scenario == "group_alone":
        group_alone(rank)
    elif scenario == "halo_exchange":
        halo_exchange(rank, world)
    elif scenario == "stage_local_dst":
        stage_local_dst(rank)
    elif scenario == "fence_before_send":
        fence_before_send(rank)
    else:
        p2p_skip(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
