"""A gloo job that hangs in one of the patterns users meet, run under torchrun by
tests/test_hang_patterns.py (never imported). argv[1] is the scenario; the culprit is the last rank:

- `ddp_unused`: DistributedDataParallel (find_unused_parameters=False); on the last rank a branch skips
  a layer, so it never launches the gradient all-reduce of that bucket and goes on to a barrier, while
  the others wait for that all-reduce inside loss.backward();
- `dataloader`: the last rank's DataLoader worker blocks forever in __getitem__;
- `prefetch`: every rank feeds its steps from a `prefetch` thread; the last rank's thread dies;
- `zero`: ZeroRedundancyOptimizer; the last rank sleeps before its third optimizer.step(), the others
  wait in step()'s parameter broadcast;
- `lock`: the last rank takes a (non-reentrant) lock twice: log_metrics() under the lock calls flush(),
  which takes it again;
- `object_vs_plain`: the last rank calls broadcast_object_list, the others a plain broadcast (held-out
  hang set 12, j01): their broadcast pairs with the first of its two and they go on to an all_reduce;
- `fork_thread`: the last rank starts a codec with a worker thread, then forks a multiprocessing child that
  uses the codec: the child waits for a reply only the worker thread gives, and fork() did not copy that thread
  (held-out hang set 12, j06); the rank waits in join();
- `sched_heartbeat`: the last rank drains a sched.scheduler with run() at a checkpoint, but its heartbeat
  event schedules itself again, so run() never returns (held-out hang set 12, j07);
- `two_listeners`: the last rank's logging set-up runs twice, so two QueueListeners read one queue; stopping
  the second puts one sentinel, which the first (waiting longer) takes, and stop() joins forever (held-out hang
  set 12, j10);
- `reseeded_port`: the last rank picks a metrics port with a generator re-seeded on every try, so each retry
  draws the port that is already taken (held-out hang set 12, j12);
- `eventfd_merged`: the last rank counts finished shards on an eventfd made without EFD_SEMAPHORE and reads
  once per shard: the first read takes all three (held-out hang set 12, j02);
- `join_under_lock`: the last rank joins its writer thread inside `with lock:`, and the writer's last flush
  takes that lock (held-out hang set 13, j12);
- `sigmask_pause`: the last rank blocks SIGALRM with pthread_sigmask, then waits in signal.pause() for it
  (held-out hang set 13, j05);
- `generator_target`: the last rank waits for an Event set by a thread whose target holds a `yield`
  (held-out hang set 13, j08);
- `join_unshadowed`: the last rank runs out of inputs inside `Join`, the others wait in an all_gather of
  their own (held-out hang set 13, j13);
- `seeded_probe` (2 ranks): every rank seeds torch's generator with its rank and runs a probe all_gather on
  steps where its draw is under 0.3; at step 4 only rank 1 draws it (held-out hang set 13, j07);
- `stream_end` (2 ranks): the loop is `zip(stream, range(steps))` with `steps` the smallest shard; zip pulls
  the last rank's stream past its end, which runs the all_gather after the generator's loop (held-out hang
  set 13, j04);
- `pool_callback`: the last rank encodes documents with a ThreadPool whose apply_async callback calls
  `pool.apply` for long ones: the callback runs on the pool's result-handler thread and waits for itself
  (held-out hang set 13, j02);
- `checkpoint_recompute` (2 ranks): a block whose forward all_gathers batch statistics is wrapped in
  torch.utils.checkpoint on the last rank only (its batches are long); in backward the recompute issues an
  extra all_gather while the other rank waits in DDP's gradient all-reduce (held-out hang set 13, j10);
- `imported_setter`: like `generator_target`, but the Event's setter lives in the job's own module
  tests/_hang_mirror.py, which no live stack passes through (held-out hang set 13, j08);
- `left_loop`: the last rank leaves the training loop early (`break` on a condition of its own) and
  idles after it, while the others wait in the loop's all_reduce.

Each rank touches $HANG_READY_DIR/ready_<rank> just before the point where it hangs.
"""

import os
import queue
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def ready(rank: int) -> None:
    open(os.path.join(os.environ["HANG_READY_DIR"], f"ready_{rank}"), "w").close()


class Stuck(torch.utils.data.Dataset):
    def __init__(self, culprit: bool) -> None:
        self.culprit = culprit

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.culprit and index >= 4:
            threading.Event().wait()  # HANG-LINE worker
        return torch.ones(4)


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, skip_b: bool) -> torch.Tensor:
        x = self.a(x)
        return x if skip_b else self.b(x)


LOCK = threading.Lock()


def flush() -> None:
    with LOCK:  # HANG-LINE lock
        pass


def log_metrics() -> None:
    with LOCK:
        flush()


class Codec:
    """Encodes on a worker thread of its own: encode() hands the item over and waits for the reply."""

    def __init__(self) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.done = threading.Event()
        self._worker = threading.Thread(target=self._serve, name="codec-worker", daemon=True)
        self._worker.start()

    def _serve(self) -> None:
        while True:
            self.requests.get()
            self.done.set()

    def encode(self, item: int) -> None:
        self.requests.put(item)
        self.done.wait()  # HANG-LINE codec-wait


class Beats:
    """Heartbeats and deferred uploads on one sched.scheduler, driven from the training loop."""

    def __init__(self) -> None:
        import sched

        self.queue = sched.scheduler(time.monotonic, time.sleep)
        self.queue.enter(0, 5, self.beat)
        self.sent = 0

    def beat(self) -> None:
        self.sent += 1
        self.queue.enter(0.5, 5, self.beat)

    def flush(self) -> None:
        self.queue.run()  # HANG-LINE sched-run


def bind_metrics_port(run_seed: int):
    import random
    import socket

    backoff = 0.0
    while True:
        time.sleep(backoff)  # HANG-LINE reseeded-sleep
        port = random.Random(run_seed).randrange(40000, 40100)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", port))
            return sock
        except OSError:
            sock.close()
            backoff = 0.2


def wait_for_shards(count: int) -> None:
    finished = os.eventfd(0)

    def write_shards() -> None:
        for _ in range(count):
            os.eventfd_write(finished, 1)

    writer = threading.Thread(target=write_shards, name="shard-writer")
    writer.start()
    writer.join()
    for _ in range(count):
        os.eventfd_read(finished)  # HANG-LINE eventfd-read


class SampleLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.writer = threading.Thread(target=self.run, name="sample-writer", daemon=True)
        self.writer.start()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            pass
        with self.lock:  # HANG-LINE writer-flush
            pass

    def rotate(self) -> None:
        with self.lock:
            self.stop.set()
            self.writer.join()  # HANG-LINE join-under-lock


def wait_for_alarm() -> None:
    import signal

    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    signal.pause()  # HANG-LINE sigmask-pause


class Synced:
    def __init__(self) -> None:
        self.synced = threading.Event()
        threading.Thread(target=self.sync, name="syncer", daemon=True).start()

    def sync(self):
        for _ in range(3):
            yield
        self.synced.set()

    def wait(self) -> None:
        self.synced.wait()  # HANG-LINE generator-wait


def bind_twice() -> None:
    first = bind_metrics_port(1234)  # the exporter of an earlier run in this process
    bind_metrics_port(1234)
    first.close()


RECORDS: queue.Queue = queue.Queue()


def setup_logging():
    import logging
    import logging.handlers

    listener = logging.handlers.QueueListener(RECORDS, logging.NullHandler())
    listener.start()
    return listener


def export_shard(codec: Codec) -> None:
    codec.encode(1)


def shard_stream(count: int, world: int):
    """The rank's shard, one batch at a time; at the end every rank says how many batches it had."""
    for _ in range(count):
        yield torch.ones(4)
    seen = torch.tensor([float(count)])
    counts = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(counts, seen)  # HANG-LINE stream-gather


class PooledNorm(torch.nn.Module):
    """Normalises with statistics pooled over every rank's batch."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stats = torch.stack([x.mean(0), x.pow(2).mean(0)]).detach()
        parts = [torch.empty_like(stats) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, stats)  # HANG-LINE pooled-gather
        mean, sq = torch.stack(parts).mean(0)
        return (x - mean) / torch.sqrt((sq - mean * mean).clamp_min(0) + 1e-5) * self.weight


class Tagger(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = PooledNorm(dim)
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        long_batch = self.training and x.numel() > 256
        h = checkpoint(self.norm, x, use_reentrant=False) if long_batch else self.norm(x)  # HANG-LINE ckpt-call
        return self.fc(h)


def encode_doc(doc: str) -> list[int]:
    return [ord(c) % 40 for c in doc]


def split_ids(ids: list[int]) -> list[list[int]]:
    return [ids[i:i + 4] for i in range(0, len(ids), 4)]


def encode_shard(docs: list[str]) -> list[list[int]]:
    """Encode on a pool; long documents are split by the pool too. A ThreadPool: the same Pool machinery (its
    result-handler thread runs the callbacks) without forking a process that runs gloo's threads, whose locks a
    forked worker can inherit held (the held-out job used a fork Pool; the deadlock is the same)."""
    from multiprocessing.pool import ThreadPool

    pool = ThreadPool(2)
    encoded: list[list[int]] = []

    def collect(ids: list[int]) -> None:
        if len(ids) > 4:
            encoded.extend(pool.apply(split_ids, (ids,)))  # HANG-LINE pool-callback
        else:
            encoded.append(ids)

    pending = [pool.apply_async(encode_doc, (doc,), callback=collect) for doc in docs]
    for result in pending:
        result.wait()  # HANG-LINE pool-wait
    return encoded


def train_then(rank: int, grad: torch.Tensor, culprit: bool, hang) -> None:
    """The training loop's all_reduce every step; at step 2 the culprit calls `hang()` and the others go on."""
    for step in range(1000):
        dist.all_reduce(grad)
        if step == 2:
            ready(rank)
            if culprit:
                hang()


def main() -> None:
    scenario = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit = rank == world - 1
    grad = torch.ones(4)
    if scenario == "ddp_unused":
        model = torch.nn.parallel.DistributedDataParallel(TwoLayers())
        for step in range(1000):
            if step == 2:
                ready(rank)
            skip = culprit and step >= 2
            loss = model(torch.ones(2, 8), skip_b=skip).sum()
            loss.backward()  # HANG-LINE backward
            if skip:
                dist.barrier()  # HANG-LINE unused
    elif scenario == "dataloader":
        loader = torch.utils.data.DataLoader(Stuck(culprit), batch_size=2, num_workers=1)
        for step, batch in enumerate(loader):  # HANG-LINE loader
            dist.all_reduce(batch.sum().reshape(1))
            if step == 1:
                ready(rank)
    elif scenario == "prefetch":
        batches: queue.Queue[torch.Tensor] = queue.Queue(maxsize=2)

        def prefetch() -> None:
            for step in range(1000):
                if culprit and step == 3:
                    raise RuntimeError("prefetch failed")  # the thread dies; only its stderr says so
                batches.put(torch.ones(4))

        threading.Thread(target=prefetch, name="prefetch", daemon=True).start()
        for step in range(1000):
            if step == 3:
                ready(rank)
            batch = batches.get()  # HANG-LINE prefetch
            dist.all_reduce(batch)
    elif scenario == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        model = torch.nn.Linear(8, 8)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
        for step in range(1000):
            model(torch.ones(2, 8)).sum().backward()
            if step == 2:
                ready(rank)
                if culprit:
                    time.sleep(3600)  # HANG-LINE zero-sleep
            optimizer.step()  # HANG-LINE zero-step
    elif scenario == "lock":
        train_then(rank, grad, culprit, log_metrics)
    elif scenario == "object_vs_plain":
        # The last rank sends its resume state with broadcast_object_list (two broadcasts: sizes, bytes),
        # the others receive it with one plain broadcast and go on to the training loop's all_reduce.
        start = torch.zeros(1, dtype=torch.long)
        ready(rank)
        if culprit:
            dist.broadcast_object_list([{"step": 7}], src=world - 1)  # HANG-LINE object
        else:
            dist.broadcast(start, src=world - 1)
        for _step in range(1000):
            dist.all_reduce(grad)  # HANG-LINE object-others
    elif scenario == "fork_thread":
        import multiprocessing

        for step in range(1000):
            dist.all_reduce(grad)  # HANG-LINE fork-others
            if step == 2 and culprit:
                codec = Codec()
                child = multiprocessing.get_context("fork").Process(target=export_shard, args=(codec,))
                child.start()
                ready(rank)
                child.join()  # HANG-LINE fork-join
            elif step == 2:
                ready(rank)
    elif scenario == "sched_heartbeat":
        beats = Beats()
        for step in range(1000):
            dist.all_reduce(grad)
            beats.queue.run(blocking=False)
            if step == 2:
                ready(rank)
                if culprit:
                    beats.flush()
    elif scenario == "two_listeners":
        setup_logging()
        listener = setup_logging()  # a trainer that sets logging up again
        time.sleep(0.2)
        train_then(rank, grad, culprit, lambda: listener.stop())  # HANG-LINE listener-stop
    elif scenario == "reseeded_port":
        train_then(rank, grad, culprit, bind_twice)
    elif scenario == "eventfd_merged":
        train_then(rank, grad, culprit, lambda: wait_for_shards(3))
    elif scenario == "join_under_lock":
        log = SampleLog() if culprit else None
        train_then(rank, grad, culprit, lambda: log.rotate())
    elif scenario == "sigmask_pause":
        train_then(rank, grad, culprit, wait_for_alarm)
    elif scenario == "generator_target":
        synced = Synced() if culprit else None
        train_then(rank, grad, culprit, lambda: synced.wait())
    elif scenario == "join_unshadowed":
        from torch.distributed.algorithms.join import Join

        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        batches = 3 if culprit else 1000
        seen = torch.zeros(1)
        with Join([model]):  # HANG-LINE join-enter
            for step in range(batches):
                model(torch.ones(2, 4)).sum().backward()
                seen += 1
                counts = [torch.zeros(1) for _ in range(world)]
                dist.all_gather(counts, seen)  # HANG-LINE join-gather
                if step == 1:
                    ready(rank)
    elif scenario == "checkpoint_recompute":
        model = torch.nn.parallel.DistributedDataParallel(Tagger())
        for step in range(1000):
            rows = 32 if culprit and step == 3 else 8
            loss = model(torch.randn(rows, 16, requires_grad=True)).pow(2).mean()
            if step == 3:
                ready(rank)
            loss.backward()  # HANG-LINE ckpt-backward
    elif scenario == "imported_setter":
        from _hang_mirror import Mirror

        mirror = Mirror() if culprit else None
        train_then(rank, grad, culprit, lambda: mirror.synced.wait())  # HANG-LINE mirror-wait
    elif scenario == "pool_callback":
        train_then(rank, grad, culprit, lambda: encode_shard(["abc", "a long document", "xy"]))
    elif scenario == "seeded_probe":
        torch.manual_seed(100 + rank)  # HANG-LINE probe-seed
        ready(rank)
        for _ in range(1000):
            if torch.rand(()) < 0.3:  # HANG-LINE probe-if
                parts = [torch.zeros(1) for _ in range(world)]
                dist.all_gather(parts, grad[:1].clone())  # HANG-LINE probe-gather
            dist.all_reduce(grad)  # HANG-LINE probe-reduce
    elif scenario == "stream_end":
        count = 5 if culprit else 8
        steps = torch.tensor([float(count)])
        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
        ready(rank)
        for batch, _ in zip(shard_stream(count, world), range(int(steps))):  # HANG-LINE stream-zip
            dist.all_reduce(grad.copy_(batch))
        dist.all_reduce(grad)  # HANG-LINE stream-after
    elif scenario == "left_loop":
        for step in range(1000):
            if culprit and step == 3:
                break  # HANG-LINE break
            dist.all_reduce(grad)  # HANG-LINE loop-all-reduce
            if step == 2:
                ready(rank)
        time.sleep(3600)  # HANG-LINE after-loop
    time.sleep(3600)


if __name__ == "__main__":
    main()
