"""A gloo job whose last rank hangs in a wait that is no collective, run under torchrun by
tests/test_hang_waits.py (never imported). argv[1] is the scenario; every other rank waits in
all_reduce for the last one:

- `lock_order`: the main thread holds LOCK_A and wants LOCK_B; a `saver` thread holds LOCK_B and wants
  LOCK_A (a lock-order deadlock between two threads of one rank);
- `self_lock`: a Lock taken with acquire() on one path is never released; the next `with` waits on it
  (nothing else in the process holds or releases it);
- `generator_lock`: a generator yields inside `with self._lock:`; suspended there, it keeps the lock, and the
  next `with self._lock:` (a reset) waits for it;
- `queue_join`: a `consumer` thread takes every item but never calls task_done(); Queue.join() waits;
- `queue_get`: the `producer` thread died; the main thread waits in Queue.get();
- `exit_joins_child`: the rank raises; at exit, multiprocessing's exit handler joins its non-daemon log-sink
  child, which waits for a sentinel that never comes;
- `signal_wait`: the rank waits in signal.sigwait for a SIGUSR1 nobody sends it;
- `child_banner`: the rank reads a banner line from a helper process that printed it into its block buffer
  (stdout is a pipe) and then went on working without flushing;
- `child_stderr_full`: the rank reads its child's stdout to the end while the child is blocked writing
  its stderr, a second pipe nobody reads (full at 64 KiB);
- `alarm_zero`: the rank paces itself with signal.alarm(int(0.5)) == alarm(0) and waits in signal.pause();
- `join_before_set`: leaving a ThreadPoolExecutor's `with` joins a worker that waits for an Event set after it;
- `put_holding_lock`: the rank puts into a full queue while holding the lock its `quality-agg` consumer
  thread takes before each get();
- `swapped_queue`: a reset re-creates the prefetch queue while the `prefetch` thread keeps filling the old
  (full) one; the main thread waits in get() on the new, empty one;
- `mp_queue_get`: a multiprocessing.Process producer put two items and exited; the main thread waits in
  multiprocessing.Queue.get();
- `poll`: the main thread polls for a file nobody writes, sleeping 0.2 s between tries;
- `event`: the main thread waits on a threading.Event nothing sets;
- `select_buffered`: a helper service writes its banner and its ready line at once; the rank reads the banner
  with readline() (which buffers both) and then waits in select() on the pipe for the ready line (held-out hang
  set 10, j10's class, written again here);
- `import_join`: the rank imports _hang_import_kit, whose top-level code joins a thread that imports
  _hang_import_kit (held-out hang set 10, j07's class);
- `side_store`: the rank serves a side TCPStore for the whole world with wait_for_workers, behind a test that
  lets only it open the store (held-out hang set 10, j01's class);
- `mp_lock_killed`: a builder process is killed over its time budget while it holds a multiprocessing Lock; the
  rank then waits to take that lock (held-out hang set 10, j09's class);
- `target_called`: `threading.Thread(target=heartbeat_loop(stop, path))` runs the heartbeat loop in the main
  thread itself (held-out hang set 10, j06's class, written again here);
- `barrier`: the main thread waits on a threading.Barrier(2) no other thread reaches;
- `proc_join`: the main thread joins a multiprocessing.Process child that sleeps;
- `popen_wait`: the main thread waits in subprocess.run(["sleep", "3600"]);
- `writer`: rank 0 alone runs a `tb-writer` thread by design; the last rank sleeps before all_reduce;
- `flock`: the last rank takes an fcntl.flock on a file, then opens it again and waits for the lock;
- `pipe_read`: the last rank reads from a pipe whose write end nobody writes to;
- `fifo_open`: the last rank opens a FIFO for reading that no process opens for writing;
- `store_get`: the last rank waits in the c10d store's get() for a key no rank sets;
- `accept`: the last rank listens on a TCP port and waits in accept() for a client that never comes;
- `pool_lost`: a multiprocessing.Pool worker dies (os._exit) in the middle of a task; pool.map waits;
- `sleep_ms`: the last rank's rate limiter passes a delay in milliseconds to time.sleep (seconds).
- `frozen_predicate`: the last rank waits in Condition.wait_for whose predicate compares a local copy of the
  buffer's length taken before the wait; the filler thread notifies on every item, the copy never changes
  (held-out hang set 12, j04's class, written again here);
- `lost_wakeup`: the last rank's loader thread notifies a Condition before the main thread waits on it
  (no predicate is re-checked): the notify is lost;
- `pipe_held`: the last rank runs check_output of a shell that leaves `sleep` in the background holding its
  output pipe: the shell exits, EOF never comes;
- `regex_spin`: the last rank matches a regular expression with nested repetition against a near miss
  (exponential backtracking): one call that never returns, on CPU;
- `worker_stuck`: the last rank's DataLoader collate_fn loops forever on one batch (its trimming makes no
  progress): the rank waits for the batch, one worker is in the collate_fn, the other idles.
- `pool_busy`: the last rank's one-worker ThreadPoolExecutor runs a heartbeat loop; the checkpoint task
  submitted after it never starts, and the main thread waits in Future.result();
- `future_blocked`: the last rank's pool runs its shard fetch, which waits on an Event nobody sets; the main
  thread waits in Future.result();
- `lock_file`: the last rank creates a lock file with O_EXCL, raises before removing it (the removal is not
  in a `finally:`), and then polls to create it again: its own stale lock;
- `float_loop`: the last rank spins in `while acc != target: acc += 0.1` (0.1 * 3 != 0.3 in floats);
- `length_header`: the last rank sends a request to its scoring service with a big-endian length header the
  service reads little-endian; both wait to read (held-out hang set 10, j11);
- `doubling_overflow`: the last rank doubles an int16 bucket edge until it wraps to 0 (held-out hang set 10, j12);
- `stuck_loop`: the last rank spins in a `while i < len(items)` whose `continue` skips the increment;
- `popen_pipe_full`: the last rank wait()s on a child started with stdout=PIPE that writes 1 MB: the pipe
  fills, the child blocks writing, the parent never reads;
- `join_before_get`: the last rank joins a multiprocessing.Process that put 1 MB on a Queue before it
  get()s it: the child cannot exit until the item is read;
- `circular`: the last rank polls for a file rank 0 writes only after the barrier rank 0 waits in.
- `world_too_big`: every rank passes init_process_group a world size from its own settings, one more than the
  launch started: the job never forms (held-out hang set 7, j14's class);
- `loop_self_wait`: the last rank's metrics loop runs in a thread; a coroutine on it calls the synchronous
  flush(), which waits in run_coroutine_threadsafe(..., loop).result() on that same loop; the main thread's
  own flush() waits behind it;
- `clocks_mixed`: the last rank's upload throttle computes its next slot from time.time() and its delay against
  time.monotonic(): a sleep of about the Unix time;
- `kept_alive`: the last rank starts a non-daemon heartbeat thread, then raises: its main thread ends, the
  interpreter waits for the heartbeat in threading._shutdown and the process stays alive;
- `queue_put`: the last rank's writer thread takes one item from a bounded Queue(maxsize=2) and dies; the
  main thread's fourth put() waits for room forever;
- `manager_lock`: the last rank takes a multiprocessing Manager's Lock and, through a helper, takes it again:
  the proxy call waits in the manager process;
- `asyncio_unsafe`: the last rank awaits a future that a reader thread completes with `loop.call_soon`
  (not call_soon_threadsafe): the loop is never woken and sleeps in select();
- `self_request`: the last rank serves its settings over HTTP from a single-threaded HTTPServer thread whose
  handler fetches a part of them from the same server; the main thread's request never gets an answer.

Each rank touches $HANG_READY_DIR/ready_<rank> just before the point where it hangs.
"""

import asyncio
import concurrent.futures
import fcntl
import json
import multiprocessing
import os
import queue
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch
import torch.distributed as dist
from _hang_http import reply_json

LOCK_A = threading.Lock()
LOCK_B = threading.Lock()
STATE_LOCK = threading.Lock()


def ready(rank: int) -> None:
    open(os.path.join(os.environ["HANG_READY_DIR"], f"ready_{rank}"), "w").close()


def saver(both: threading.Barrier) -> None:
    with LOCK_B:
        both.wait()
        with LOCK_A:  # HANG-LINE saver
            pass


def lock_order(rank: int) -> None:
    both = threading.Barrier(2)
    threading.Thread(target=saver, args=(both,), name="saver", daemon=True).start()
    with LOCK_A:
        both.wait()
        ready(rank)
        with LOCK_B:  # HANG-LINE lock-order
            pass


def save_state(early: bool) -> None:
    STATE_LOCK.acquire()
    if early:
        return  # leaves STATE_LOCK held
    STATE_LOCK.release()


def self_lock(rank: int) -> None:
    save_state(early=True)
    ready(rank)
    with STATE_LOCK:  # HANG-LINE self-lock
        pass


class ShardStream:
    """Batches of the rank's shards, read under the stream's lock (a reset may come from another thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.shards = [[1, 2, 3], [4, 5]]
        self.pos = 0

    def batches(self):  # type: ignore[no-untyped-def]
        for shard in self.shards:
            with self._lock:
                for batch in shard:
                    batch = batch * 2  # the batch as the model wants it
                    yield batch  # suspended here, the with block (and the lock) stays open

    def reset(self) -> None:
        with self._lock:  # HANG-LINE generator-lock
            self.pos = 0


def generator_lock(rank: int) -> None:
    stream = ShardStream()
    batches = stream.batches()
    next(batches)
    ready(rank)
    stream.reset()


def log_sink(records: multiprocessing.Queue) -> None:
    while records.get() is not None:  # until the sentinel
        pass


def exit_joins_child(rank: int) -> None:
    records: multiprocessing.Queue = multiprocessing.Queue()
    sink = multiprocessing.Process(target=log_sink, args=(records,), name="log-sink")  # not a daemon
    sink.start()
    records.put({"step": 2})
    ready(rank)
    raise KeyError("label_smoothing")  # HANG-LINE raise; the sentinel is never sent


def wait_for_go(rank: int) -> None:
    # The evaluator process is told to signal "its parent" when done; the parent of this rank is the
    # launcher, so the signal goes there.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    ready(rank)
    signal.sigwait({signal.SIGUSR1})  # HANG-LINE sigwait


CHILD = "import time; print('READY'); time.sleep(3600)"  # warms a cache before serving: READY stays buffered


def child_banner(rank: int) -> None:
    # A helper process prints READY (into its block buffer: stdout is a pipe), then goes on working.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a plain environment: buffered
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    ready(rank)
    banner = proc.stdout.readline()  # HANG-LINE child-readline
    print(banner)


SERVICE = "import sys, time; sys.stdout.write('sampler v1\\nready\\n'); sys.stdout.flush(); time.sleep(600)"


class ServiceClient:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVICE], stdout=subprocess.PIPE)
        self.banner = self.proc.stdout.readline()

    def wait_ready(self) -> bytes:
        select.select([self.proc.stdout], [], [])  # HANG-LINE select-buffered
        return self.proc.stdout.readline()


def select_buffered(rank: int) -> None:
    client = ServiceClient()
    time.sleep(0.5)  # both lines are in the pipe, then in the reader's buffer
    ready(rank)
    client.wait_ready()


def export_shards(rank: int) -> None:
    sealed = threading.Event()  # set once the manifest is written

    def upload() -> None:
        sealed.wait()  # HANG-LINE sealed-wait

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # HANG-LINE pool-exit
        pool.submit(upload)
        ready(rank)
    sealed.set()


class Pacer:
    """Paces requests with SIGALRM; after warm-up the interval halves to 0.5 s."""

    def __init__(self) -> None:
        self.slots = 0
        self.interval = 1.0
        signal.signal(signal.SIGALRM, self.on_alarm)

    def on_alarm(self, signum, frame) -> None:
        self.slots += 1

    def wait_slot(self) -> None:
        signal.alarm(int(self.interval))
        signal.pause()  # HANG-LINE alarm-pause


def alarm_zero(rank: int) -> None:
    pacer = Pacer()
    pacer.interval /= 2
    ready(rank)
    pacer.wait_slot()


# A validator that reports its warnings on stderr (far more than a pipe holds) and its summary on stdout.
VALIDATOR = "import sys; sys.stderr.write('warning: short row\\n' * 20000); print('rows ok')"


def child_stderr_full(rank: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", VALIDATOR], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    ready(rank)
    summary = proc.stdout.read()  # HANG-LINE child-stdout
    print(summary, proc.stderr.read())


AGG_LOCK = threading.Lock()


def aggregate(items: queue.Queue) -> None:
    while True:
        with AGG_LOCK:  # HANG-LINE agg-lock
            items.get()


def put_holding_lock(rank: int) -> None:
    items: queue.Queue = queue.Queue(maxsize=1)
    with AGG_LOCK:
        threading.Thread(target=aggregate, args=(items,), name="quality-agg", daemon=True).start()
        time.sleep(0.5)
        ready(rank)
        for i in range(3):
            items.put(i)  # HANG-LINE put-holding


def fill(items: queue.Queue) -> None:
    n = 0
    while True:
        n += 1
        items.put(torch.full((2,), float(n)))


class Prefetcher:
    """Batches loaded ahead by a `prefetch` thread into a bounded queue."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue(maxsize=2)
        threading.Thread(target=fill, args=(self.q,), name="prefetch", daemon=True).start()

    def reset(self) -> None:
        self.q = queue.Queue(maxsize=2)  # a fresh queue for the new epoch; the thread keeps the old one

    def next(self) -> torch.Tensor:
        return self.q.get()  # HANG-LINE swapped-get


def swapped_queue(rank: int) -> None:
    loader = Prefetcher()
    loader.next()
    loader.reset()
    time.sleep(0.5)
    ready(rank)
    loader.next()


def consume(items: queue.Queue) -> None:
    while True:
        items.get()  # no task_done()


def queue_join(rank: int) -> None:
    items: queue.Queue = queue.Queue()
    threading.Thread(target=consume, args=(items,), name="consumer", daemon=True).start()
    for i in range(4):
        items.put(i)
    ready(rank)
    items.join()  # HANG-LINE queue-join


class Metrics:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="metrics-loop", daemon=True).start()

    async def drain(self) -> int:
        return 1

    def flush(self) -> int:
        return asyncio.run_coroutine_threadsafe(self.drain(), self.loop).result()  # HANG-LINE loop-flush

    async def tick(self) -> None:
        self.flush()  # a coroutine on the loop calling the synchronous flush


def loop_self_wait(rank: int) -> None:
    metrics = Metrics()
    asyncio.run_coroutine_threadsafe(metrics.tick(), metrics.loop)
    time.sleep(0.5)
    ready(rank)
    metrics.flush()


class Throttle:
    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.next_slot = time.time() + every_s  # wall clock

    def wait(self) -> None:
        delay = self.next_slot - time.monotonic()  # monotonic clock: counts from boot
        time.sleep(delay)  # HANG-LINE clocks-mixed


def beat() -> None:
    while True:
        time.sleep(0.5)  # HANG-LINE heartbeat


def kept_alive(rank: int) -> None:
    threading.Thread(target=beat, name="heartbeat").start()  # not a daemon
    ready(rank)
    raise KeyError("missing shard")  # HANG-LINE kept-raise


def write_one(items: queue.Queue) -> None:
    items.get()
    raise RuntimeError("writer failed")  # the consumer dies after one item


def queue_put(rank: int) -> None:
    items: queue.Queue = queue.Queue(maxsize=2)
    threading.Thread(target=write_one, args=(items,), name="ckpt-writer", daemon=True).start()
    time.sleep(0.5)
    ready(rank)
    for i in range(4):
        items.put(i)  # HANG-LINE queue-put


def manager_lock(rank: int) -> None:
    manager = multiprocessing.Manager()
    shared = manager.Lock()
    shared.acquire()
    ready(rank)
    shared.acquire()  # HANG-LINE manager-lock


def produce(items: queue.Queue) -> None:
    items.put(0)
    raise RuntimeError("producer failed")  # the thread dies; only its stderr says so


def queue_get(rank: int) -> None:
    items: queue.Queue = queue.Queue()
    producer = threading.Thread(target=produce, args=(items,), name="producer", daemon=True)
    producer.start()
    producer.join()
    items.get()
    ready(rank)
    items.get()  # HANG-LINE queue-get


def put_two(items) -> None:
    items.put(1)
    items.put(2)


def mp_queue_get(rank: int) -> None:
    items = multiprocessing.Queue()
    child = multiprocessing.Process(target=put_two, args=(items,))
    child.start()
    items.get()
    items.get()
    child.join()
    ready(rank)
    items.get()  # HANG-LINE mp-queue-get


def poll(rank: int) -> None:
    flag = os.path.join(os.environ["HANG_READY_DIR"], "never-written")
    ready(rank)
    while not os.path.exists(flag):  # HANG-LINE poll-loop
        time.sleep(0.2)  # HANG-LINE poll-sleep


def sleep_forever() -> None:
    time.sleep(3600)  # HANG-LINE child-sleep


def flock(rank: int) -> None:
    path = os.path.join(os.environ["HANG_READY_DIR"], "lockfile")
    held = open(path, "w")
    fcntl.flock(held, fcntl.LOCK_EX)
    again = open(path, "w")  # another open file description: its flock waits for the first
    ready(rank)
    fcntl.flock(again, fcntl.LOCK_EX)  # HANG-LINE flock


def pipe_read(rank: int) -> None:
    readable, writable = os.pipe()
    ready(rank)
    os.read(readable, 1)  # HANG-LINE pipe-read


def fifo_open(rank: int) -> None:
    path = os.path.join(os.environ["HANG_READY_DIR"], "fifo")
    os.mkfifo(path)
    ready(rank)
    open(path).read()  # HANG-LINE fifo-open


def store_get(rank: int) -> None:
    store = dist.distributed_c10d._get_default_store()
    ready(rank)
    store.get("never-set")  # HANG-LINE store-get


def rate_limit(rank: int, delay_ms: int) -> None:
    ready(rank)
    time.sleep(delay_ms)  # HANG-LINE sleep-ms


def crash_on(n: int) -> int:
    if n == 1:
        os._exit(1)  # a worker dying mid-task, as a segfault in native code would
    return n


def accept(rank: int) -> None:
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    ready(rank)
    server.accept()  # HANG-LINE accept


def pool_lost(rank: int) -> None:
    pool = multiprocessing.get_context("fork").Pool(2)
    ready(rank)
    pool.map(crash_on, range(4))  # HANG-LINE pool-map


LONG_WORDS = re.compile(r"(\w+\s?)*$")  # nested repetition: exponential backtracking on a near miss


def regex_spin(rank: int) -> None:
    ready(rank)
    LONG_WORDS.match("a" * 40 + "!")  # HANG-LINE regex


def trim_to_budget(batch: list) -> list:
    budget = 8
    while sum(len(x) for x in batch) > budget:
        batch[-1] = batch[-1][: max(len(batch[-1]), 1)]  # HANG-LINE collate-loop
    return batch


def worker_stuck(rank: int) -> None:
    from torch.utils.data import DataLoader

    samples = [[1] * 3, [1] * 3, [1] * 12, [1] * 3]
    loader = DataLoader(samples, batch_size=2, num_workers=2, collate_fn=trim_to_budget)
    ready(rank)
    for _ in loader:  # HANG-LINE loader
        pass


class WarmBuffer:
    def __init__(self, warm: int) -> None:
        self.warm = warm
        self._buf: list[int] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._fill, name="filler", daemon=True).start()

    def _fill(self) -> None:
        for item in range(10_000):
            with self._cond:
                self._buf.append(item)
                self._cond.notify_all()
            time.sleep(0.05)

    def wait_until_warm(self) -> None:
        with self._cond:
            have = len(self._buf)
            self._cond.wait_for(lambda: have >= self.warm)  # HANG-LINE frozen-predicate


def frozen_predicate(rank: int) -> None:
    buffer = WarmBuffer(warm=8)
    ready(rank)
    buffer.wait_until_warm()


def lost_wakeup(rank: int) -> None:
    cond = threading.Condition()
    state = {}

    def load() -> None:
        with cond:
            state["batch"] = 1
            cond.notify()  # before anyone waits: lost

    loader = threading.Thread(target=load, name="loader")
    loader.start()
    loader.join()
    ready(rank)
    with cond:
        cond.wait()  # HANG-LINE lost-wakeup


def pipe_held(rank: int) -> None:
    ready(rank)
    # The shell exits at once; the `sleep` it left in the background holds the output pipe.
    subprocess.check_output(["/bin/sh", "-c", "sleep 3600 & echo started"])  # HANG-LINE pipe-held


def heartbeat() -> None:
    while True:
        time.sleep(0.1)


def pool_busy(rank: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-io")
    pool.submit(heartbeat)
    saved = pool.submit(len, b"state")
    ready(rank)
    saved.result()  # HANG-LINE pool-busy


def fetch_shard(arrived: threading.Event) -> bytes:
    arrived.wait()  # HANG-LINE fetch-wait
    return b""


def future_blocked(rank: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fetch")
    shard = pool.submit(fetch_shard, threading.Event())
    ready(rank)
    shard.result()  # HANG-LINE future-blocked


def popen_pipe_full(rank: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write('x' * (1 << 20))"],
                            stdout=subprocess.PIPE)
    ready(rank)
    proc.wait()  # HANG-LINE popen-pipe-full


def put_big(items) -> None:
    items.put(b"x" * (1 << 20))


def join_before_get(rank: int) -> None:
    items = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=put_big, args=(items,))
    child.start()
    ready(rank)
    child.join()  # HANG-LINE join-before-get
    items.get()


def take_lock(path: str) -> None:
    while True:  # HANG-LINE lock-loop
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return
        except FileExistsError:
            time.sleep(0.2)  # HANG-LINE lock-sleep


def lock_file(rank: int) -> None:
    path = os.path.join(os.environ["HANG_READY_DIR"], "cache.lock")
    try:
        take_lock(path)
        raise OSError("cache refresh failed")
        os.remove(path)  # the lock's removal, skipped by the exception
    except OSError:
        pass
    ready(rank)
    take_lock(path)


def float_loop(rank: int) -> None:
    acc, target = 0.0, 0.3
    ready(rank)
    while acc != target:  # HANG-LINE float-loop
        acc += 0.1


def stuck_loop(rank: int) -> None:
    items = [1, None, 2]
    i = 0
    ready(rank)
    while i < len(items):  # HANG-LINE stuck-loop
        if items[i] is None:
            continue
        i += 1


def length_header(rank: int) -> None:
    server_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hang_frame_server.py")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = subprocess.Popen([sys.executable, server_script, str(port)], stdout=subprocess.PIPE)
    service.stdout.readline()  # "ready"
    conn = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"texts": ["a b c", "d e"]}).encode()
    conn.sendall(struct.pack("!I", len(body)) + body)
    ready(rank)
    head = conn.recv(4)  # HANG-LINE client-recv
    conn.recv(struct.unpack("!I", head)[0])


def doubling_overflow(rank: int) -> None:
    # Plain Python ints wrapped to 16 bits inline (two's complement, as the shard index stores them), not numpy
    # scalars, whose memory py-spy's --locals reads as garbage; no helper function, whose frame the snapshots
    # would catch instead of the loop's.
    lengths = [100, 30000]  # token counts, stored as int16 in the shard index
    top = max(lengths)
    edge = max(min(lengths), 64)
    ready(rank)
    while edge < top:  # HANG-LINE doubling
        edge = ((edge * 2 + 32768) & 0xFFFF) - 32768


def circular(rank: int, culprit: bool) -> None:
    part = os.path.join(os.environ["HANG_READY_DIR"], "part-0.pt")
    if culprit:
        ready(rank)
        while not os.path.exists(part):  # HANG-LINE circular-poll
            time.sleep(0.2)
        dist.barrier()
    else:
        ready(rank)
        dist.barrier()  # HANG-LINE circular-barrier
        torch.save(torch.ones(2), part)


async def read_settings() -> dict:
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def reader() -> None:
        time.sleep(0.5)  # the read; by now the loop sleeps in select()
        loop.call_soon(done.set_result, {"lr": 0.1})  # HANG-LINE call-soon

    threading.Thread(target=reader, name="settings-reader", daemon=True).start()
    return await done


def fetch(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as reply:  # HANG-LINE self-request
        return json.loads(reply.read())


class Settings(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/base":
            body = {"lr": 0.1}
        else:
            body = {**fetch(self.server.server_address[1], "/base"), "step": 3}  # HANG-LINE handler
        reply_json(self, body)

    def log_message(self, *args) -> None:
        pass


def self_request(rank: int) -> None:
    server = HTTPServer(("127.0.0.1", 0), Settings)
    threading.Thread(target=server.serve_forever, name="settings-svc", daemon=True).start()
    ready(rank)
    fetch(server.server_address[1], "/run")


def open_side_store(rank: int, world: int):
    if rank != world - 1:  # the telemetry owner alone opens it
        return None
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    ready(rank)
    return dist.TCPStore("127.0.0.1", port, world,  # HANG-LINE side-store
                         is_master=True, wait_for_workers=True, timeout=timedelta(hours=1))


FORK = multiprocessing.get_context("fork")
CACHE_LOCK = FORK.Lock()


def build_cache() -> None:
    with CACHE_LOCK:
        time.sleep(600)  # a slow shard


def mp_lock_killed(rank: int) -> None:
    builder = FORK.Process(target=build_cache, daemon=True)
    builder.start()
    time.sleep(1.0)
    builder.kill()  # over budget
    builder.join()
    ready(rank)
    with CACHE_LOCK:  # HANG-LINE mp-lock
        pass


def heartbeat_loop(stop: threading.Event, path: str) -> None:
    while not stop.wait(0.2):
        with open(path, "w") as fh:
            fh.write("alive")


def target_called(rank: int) -> None:
    stop = threading.Event()
    ready(rank)
    path = os.path.join(os.environ["HANG_READY_DIR"], "heartbeat")
    beat = threading.Thread(target=heartbeat_loop(stop, path), daemon=True)  # HANG-LINE target-called
    beat.start()


def main() -> None:
    scenario = sys.argv[1]
    if scenario == "world_too_big":
        settings = {"world_size": int(os.environ["WORLD_SIZE"]) + 1}  # a config default, not the launcher's
        ready(int(os.environ["RANK"]))
        dist.init_process_group(  # HANG-LINE init-world
            "gloo", rank=int(os.environ["RANK"]), world_size=settings["world_size"], timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit = rank == world - 1
    grad = torch.ones(4)
    if scenario == "writer" and rank == 0:
        # Rank 0 alone writes the event file (TensorBoard-like): a thread that exists there by design.
        threading.Thread(target=sleep_forever, name="tb-writer", daemon=True).start()
    for step in range(1000):
        dist.all_reduce(grad)
        if step < 2:
            continue
        if scenario == "circular":
            circular(rank, culprit)
            continue
        if not culprit:
            ready(rank)
            continue
        if scenario == "lock_order":
            lock_order(rank)
        elif scenario == "target_called":
            target_called(rank)
        elif scenario == "mp_lock_killed":
            mp_lock_killed(rank)
        elif scenario == "side_store":
            open_side_store(rank, world)
        elif scenario == "import_join":
            ready(rank)
            import _hang_import_kit  # noqa: F401
        elif scenario == "select_buffered":
            select_buffered(rank)
        elif scenario == "self_lock":
            self_lock(rank)
        elif scenario == "generator_lock":
            generator_lock(rank)
        elif scenario == "swapped_queue":
            swapped_queue(rank)
        elif scenario == "exit_joins_child":
            exit_joins_child(rank)
        elif scenario == "signal_wait":
            wait_for_go(rank)
        elif scenario == "child_banner":
            child_banner(rank)
        elif scenario == "child_stderr_full":
            child_stderr_full(rank)
        elif scenario == "alarm_zero":
            alarm_zero(rank)
        elif scenario == "join_before_set":
            export_shards(rank)
        elif scenario == "put_holding_lock":
            put_holding_lock(rank)
        elif scenario == "queue_join":
            queue_join(rank)
        elif scenario == "queue_get":
            queue_get(rank)
        elif scenario == "mp_queue_get":
            mp_queue_get(rank)
        elif scenario == "poll":
            poll(rank)
        elif scenario == "event":
            ready(rank)
            threading.Event().wait()  # HANG-LINE event
        elif scenario == "barrier":
            ready(rank)
            threading.Barrier(2).wait()  # HANG-LINE barrier
        elif scenario == "proc_join":
            child = multiprocessing.Process(target=sleep_forever)
            child.start()
            ready(rank)
            child.join()  # HANG-LINE proc-join
        elif scenario == "popen_wait":
            ready(rank)
            subprocess.run(["sleep", "3600"])  # HANG-LINE popen-wait
        elif scenario == "flock":
            flock(rank)
        elif scenario == "pipe_read":
            pipe_read(rank)
        elif scenario == "fifo_open":
            fifo_open(rank)
        elif scenario == "store_get":
            store_get(rank)
        elif scenario == "accept":
            accept(rank)
        elif scenario == "pool_lost":
            pool_lost(rank)
        elif scenario == "frozen_predicate":
            frozen_predicate(rank)
        elif scenario == "lost_wakeup":
            lost_wakeup(rank)
        elif scenario == "pipe_held":
            pipe_held(rank)
        elif scenario == "regex_spin":
            regex_spin(rank)
        elif scenario == "worker_stuck":
            worker_stuck(rank)
        elif scenario == "pool_busy":
            pool_busy(rank)
        elif scenario == "popen_pipe_full":
            popen_pipe_full(rank)
        elif scenario == "join_before_get":
            join_before_get(rank)
        elif scenario == "future_blocked":
            future_blocked(rank)
        elif scenario == "lock_file":
            lock_file(rank)
        elif scenario == "float_loop":
            float_loop(rank)
        elif scenario == "stuck_loop":
            stuck_loop(rank)
        elif scenario == "length_header":
            length_header(rank)
        elif scenario == "doubling_overflow":
            doubling_overflow(rank)
        elif scenario == "loop_self_wait":
            loop_self_wait(rank)
        elif scenario == "clocks_mixed":
            ready(rank)
            Throttle(2.0).wait()
        elif scenario == "kept_alive":
            kept_alive(rank)
        elif scenario == "queue_put":
            queue_put(rank)
        elif scenario == "manager_lock":
            manager_lock(rank)
        elif scenario == "asyncio_unsafe":
            ready(rank)
            asyncio.run(read_settings())  # HANG-LINE asyncio-run
        elif scenario == "self_request":
            self_request(rank)
        elif scenario == "sleep_ms":
            rate_limit(rank, 60 * 60 * 1000)
        elif scenario == "writer":
            ready(rank)
            time.sleep(3600)  # HANG-LINE writer


if __name__ == "__main__":
    main()
