"""Who joined: identities, heartbeats and readiness of every rank, through torch's TCPStore.

Each rank first publishes its identity, then beats a heartbeat while its local checks run, then marks
itself ready. Rank 0 watches those keys with its own clock, so it can name a rank that never joined
(missing) or that joined and then went silent (lost), within a bound, instead of hanging in a
collective that waits for it forever.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

from ddpdoctor.cluster.launch import LaunchInfo
from ddpdoctor.cluster.report import NodeIdentity
from ddpdoctor.edge.files import load_json_text

HEARTBEAT_INTERVAL_S = 1.0
# A rank whose heartbeat has not changed for this long is lost (its process died or its network went).
LOST_AFTER_S = 10.0
# After joining, a rank has its --timeout plus this to finish its checks before rank 0 gives up on it.
READY_SLACK_S = 10.0
POLL_INTERVAL_S = 0.25

# Rank states while rank 0 waits.
PENDING = "pending"
READY = "ready"
NEVER_JOINED = "missing"
SILENT = "lost"


def open_store(info: LaunchInfo, timeout_s: float) -> Any:
    """A store shared by every rank, under a prefix of its own.

    Under torchrun the agent of node 0 already hosts a TCPStore at MASTER_ADDR:MASTER_PORT (every
    worker is a client, as torch's own env:// rendezvous does); otherwise rank 0 hosts it. Unlike
    torch's rendezvous, rank 0 does not wait for every worker to connect here: waiting is done key by
    key below, so a missing rank can be named.
    """
    from torch.distributed import PrefixStore, TCPStore

    timeout = timedelta(seconds=max(timeout_s, 1.0))
    is_master = info.rank == 0 and not info.use_agent_store
    kwargs: dict[str, Any] = {"multi_tenant": True} if is_master else {}
    store = TCPStore(
        info.master_addr,
        info.master_port,
        None,
        is_master,
        timeout,
        wait_for_workers=False,
        **kwargs,
    )
    return PrefixStore(info.store_prefix + "/cluster", store)


class Channel:
    """The store behind a lock: the heartbeat thread and the main thread share one connection."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self.store.set(key, value)

    def has(self, key: str) -> bool:
        with self._lock:
            return bool(self.store.check([key]))

    def get_if_present(self, key: str) -> Optional[str]:
        with self._lock:
            if not self.store.check([key]):
                return None
            return bytes(self.store.get(key)).decode("utf-8", errors="replace")

    def wait_for(
        self, key: str, deadline: float, should_stop: Callable[[], bool] = lambda: False
    ) -> Optional[str]:
        """Poll for a key until the deadline (monotonic); None if it never came."""
        while True:
            value = self.get_if_present(key)
            if value is not None:
                return value
            if time.monotonic() >= deadline or should_stop():
                return None
            time.sleep(POLL_INTERVAL_S)

    def set_json(self, key: str, value: Any) -> None:
        self.set(key, json.dumps(value, default=str))

    def get_json(self, key: str) -> Any:
        """The JSON value another rank put under `key`; None when absent or unreadable (garbage, or
        nested deep enough to raise RecursionError): the caller reports that rank as sending no data."""
        text = self.get_if_present(key)
        if text is None:
            return None
        try:
            return load_json_text(text)
        except ValueError:
            return None


def identity_key(rank: int) -> str:
    return f"identity/{rank}"


def beat_key(rank: int) -> str:
    return f"beat/{rank}"


def ready_key(rank: int) -> str:
    return f"ready/{rank}"


def payload_key(rank: int) -> str:
    return f"payload/{rank}"


PLAN_KEY = "plan"


class Heartbeat:
    """Increments beat/<rank> every interval in a daemon thread until stopped."""

    def __init__(self, channel: Channel, rank: int, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.channel = channel
        self.rank = rank
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ddpdoctor-heartbeat-{rank}", daemon=True)

    def _run(self) -> None:
        count = 0
        while not self._stop.is_set():
            count += 1
            try:
                self.channel.set(beat_key(self.rank), str(count))
            except Exception:  # noqa: BLE001 - rank 0 gone; the main thread finds out and says so
                return
            self._stop.wait(self.interval_s)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 1.0)


@dataclass
class RankWatch:
    """What rank 0 has seen of one rank, on rank 0's own monotonic clock."""

    rank: int
    identity: Optional[NodeIdentity] = None
    joined_at: Optional[float] = None
    beat: Optional[str] = None
    beat_changed_at: Optional[float] = None
    ready: bool = False
    state: str = PENDING
    detail: str = ""


def classify_rank(
    watch: RankWatch,
    now: float,
    join_deadline: float,
    check_timeout_s: float,
    lost_after_s: float = LOST_AFTER_S,
    ready_slack_s: float = READY_SLACK_S,
) -> tuple[str, str]:
    """(state, why) of one rank: ready, pending, missing (never joined) or lost (went silent)."""
    if watch.ready:
        return READY, ""
    if watch.joined_at is None:
        if now >= join_deadline:
            return NEVER_JOINED, "no identity published before the join timeout"
        return PENDING, ""
    last = watch.beat_changed_at if watch.beat_changed_at is not None else watch.joined_at
    if now - last >= lost_after_s:
        return SILENT, f"no heartbeat for {now - last:.0f}s (process died or network lost)"
    if now - watch.joined_at >= check_timeout_s + ready_slack_s:
        return SILENT, f"still not done {now - watch.joined_at:.0f}s after joining (stuck)"
    return PENDING, ""


@dataclass
class WaitOutcome:
    watches: dict[int, RankWatch] = field(default_factory=dict)

    def ranks_in(self, state: str) -> list[int]:
        return sorted(r for r, w in self.watches.items() if w.state == state)

    @property
    def complete(self) -> bool:
        return all(w.state == READY for w in self.watches.values())


def wait_for_ranks(
    channel: Channel,
    world_size: int,
    own: NodeIdentity,
    join_deadline: float,
    check_timeout_s: float,
    lost_after_s: float = LOST_AFTER_S,
) -> WaitOutcome:
    """Rank 0: poll until every other rank is ready, missing or lost; bounded by the deadlines."""
    watches = {r: RankWatch(rank=r) for r in range(world_size)}
    watches[0] = RankWatch(rank=0, identity=own, joined_at=time.monotonic(), ready=True, state=READY)
    while True:
        now = time.monotonic()
        for watch in watches.values():
            if watch.state != PENDING:
                continue
            if watch.identity is None:
                raw = channel.get_json(identity_key(watch.rank))
                if isinstance(raw, dict):
                    watch.identity = NodeIdentity.from_dict(raw)
                    watch.joined_at = now
            if watch.identity is not None:
                beat = channel.get_if_present(beat_key(watch.rank))
                if beat is not None and beat != watch.beat:
                    watch.beat, watch.beat_changed_at = beat, now
                watch.ready = channel.has(ready_key(watch.rank))
            watch.state, watch.detail = classify_rank(
                watch, time.monotonic(), join_deadline, check_timeout_s, lost_after_s
            )
        if all(w.state != PENDING for w in watches.values()):
            return WaitOutcome(watches)
        time.sleep(POLL_INTERVAL_S)


def short_host(name: str) -> str:
    return name.split(".", 1)[0].lower()


def name_absent(
    missing_ranks: Sequence[int],
    joined: Mapping[int, NodeIdentity],
    expected_hosts: Sequence[str],
    world_size: int,
    host_source: str,
) -> tuple[dict[int, tuple[str, str]], list[tuple[str, str]]]:
    """Labels for ranks that never joined, and for expected hosts no rank came from.

    With one task per host (world size == number of hosts, Slurm's block order), rank r runs on
    expected_hosts[r], so a missing rank is named by its host. Otherwise the missing ranks are named by
    number and every expected host without a joined rank is listed by name.
    Returns ({rank: (label, detail)}, [(label, detail) for hosts not otherwise named]).
    """
    seen = {short_host(i.hostname) for i in joined.values()}
    if joined and not seen & {short_host(h) for h in expected_hosts}:
        # No joined rank's host name is in the list: the list names nodes some other way (Slurm node
        # names need not be host names), so names cannot be compared; ranks are named by number only.
        expected_hosts = ()
    one_per_host = bool(expected_hosts) and len(expected_hosts) == world_size
    named_hosts: set[str] = set()
    ranks: dict[int, tuple[str, str]] = {}
    for rank in missing_ranks:
        if one_per_host and short_host(expected_hosts[rank]) not in seen:
            host = expected_hosts[rank]
            named_hosts.add(short_host(host))
            ranks[rank] = (f"node {rank} ({host})", f"rank {rank}, expected on {host} per {host_source}")
        else:
            ranks[rank] = (f"rank {rank}", "never published its identity")
    hosts: list[tuple[str, str]] = []
    for host in expected_hosts:
        key = short_host(host)
        if key not in seen and key not in named_hosts:
            named_hosts.add(key)
            hosts.append((f"host {host}", f"listed in {host_source} but no rank from it joined"))
    return ranks, hosts
