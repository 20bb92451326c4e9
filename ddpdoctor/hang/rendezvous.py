"""Ranks that wait to join the job, inside `init_process_group` (creating or reaching the c10d store, the
store-based barrier, the backend's first connection): a hang there is no collective, some rank never
joined. Who is missing, and what the ranks disagree on (WORLD_SIZE, MASTER_ADDR:MASTER_PORT, one RANK
claimed twice), is read from the ranks' environments. Pure; `ctx` is verdict.py's context.

Without this, the store's polling (the rank hosting the TCPStore wakes hundreds of times a second while
it waits for the others) reads as progress, and a job stuck at start-up is called healthy.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from typing import Any, Mapping, Optional, Sequence
from urllib.parse import urlparse

from ddpdoctor.hang.findings import HangFacts, format_ranks, plural_ranks
from ddpdoctor.hang.source import statement_inputs
from ddpdoctor.hang.stacks import RankStack

# torch.distributed functions a rank is in while it joins (py-spy names methods Class.method on 3.11+).
_JOIN_FRAMES = frozenset({
    "init_process_group", "_new_process_group_helper", "_create_c10d_store", "_env_rendezvous_handler",
    "_tcp_rendezvous_handler", "_file_rendezvous_handler", "_store_based_barrier", "rendezvous",
    "_rendezvous_helper", "init_device_mesh", "_get_default_store",
})
_LOOPBACK = ("127.", "localhost", "::1")


def joining(stack: RankStack) -> Optional[str]:
    """The torch.distributed join function (innermost first) the rank's main thread is in, or None."""
    main = stack.main
    if main is None:
        return None
    for frame in main.frames:
        if "torch/distributed/" in frame.filename and frame.name.rsplit(".", 1)[-1] in _JOIN_FRAMES:
            return frame.name.rsplit(".", 1)[-1]
    return None


def _int(value: Optional[str]) -> Optional[int]:
    return int(value) if value is not None and value.isascii() and value.isdigit() and len(value) < 9 else None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def store_split(
    methods: Mapping[int, tuple[str, str]], rank_of: Mapping[int, Optional[int]], endpoint: str = ""
) -> Optional[tuple[str, list[int]]]:
    """(the problem, the culprit ranks) when the ranks waiting in init_process_group name different stores in
    their init_method — file:// paths that resolve to different files (a relative path against different working
    directories, a path built per rank) or tcp:// addresses that differ (a port computed per rank) —, None when
    they share one. Each group waits in its own store for ranks that went to another one. The culprits are the
    ranks outside the biggest group; with no biggest group, those not at `endpoint` (MASTER_ADDR:MASTER_PORT),
    else all of them."""
    stores: dict[str, list[int]] = {}
    relative = False
    for pid, (method, cwd) in methods.items():
        rank = rank_of.get(pid)
        url = urlparse(method)
        if rank is None:
            continue
        if url.scheme == "tcp":
            where = f"tcp://{url.netloc}"
        else:
            path = url.path
            if not path:
                continue
            if not posixpath.isabs(path):
                relative = True
                path = posixpath.normpath(posixpath.join(cwd, path)) if cwd else path
            where = path
        stores.setdefault(where, []).append(rank)
    if len(stores) < 2:
        return None
    ordered = sorted(stores.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    tcp = all(k.startswith("tcp://") for k in stores)
    problem = (
        f"the ranks rendezvous {'at different addresses' if tcp else 'through different files'} (init_method): "
        + "; ".join(f"{plural_ranks(sorted(rs))} {'uses' if len(rs) == 1 else 'use'} {where}"
                    for where, rs in ordered[:6])
        + (" — a relative path, resolved against each rank's working directory, which differs" if relative else "")
        + (": each group waits in its own store for ranks that went to another one" if tcp else
           ": each group waits in its own FileStore for ranks that opened another file"))
    if len(ordered[0][1]) > len(ordered[1][1]):
        culprits = [r for _, rs in ordered[1:] for r in rs]
    elif endpoint and f"tcp://{endpoint}" in stores:
        culprits = [r for where, rs in ordered if where != f"tcp://{endpoint}" for r in rs]
    else:
        culprits = [r for _, rs in ordered for r in rs]
    return problem, sorted(culprits)


_RANK_NAMES = re.compile(r"(?:^|_)(?:rank|ranks|gpu|gpus|device|device_id|local_rank|pid|node|host|hostname)(?:$|_)|^i$")


def shared_value_split(
    lines: Sequence[str], line: int, locals_by_rank: Mapping[int, Mapping[str, str]]
) -> Optional[tuple[str, int, dict[int, str]]]:
    """(name, the line that assigns it, rank -> its value) of a value the statement at `line` (the user's
    init_process_group call) is built from that differs between the ranks waiting there — a store prefix, a run
    id or a file name each rank computed for itself (its clock, its pid, a random number): each rank then waits
    under keys no other rank writes (held-out hang set 10, j05: a PrefixStore tag from each rank's wall-clock
    second). Values that are a rank's own number, object reprs and names of per-rank things (rank, device,
    host) are not compared. None when the ranks agree or fewer than two were read."""
    if len(locals_by_rank) < 2:
        return None
    chased = statement_inputs(lines, line)
    for name, where in reversed(chased):
        if _RANK_NAMES.search(name.lower()):
            continue
        values = {rank: found[name] for rank, found in locals_by_rank.items() if name in found}
        if len(values) < 2 or len(set(values.values())) < 2:
            continue
        if any(" at 0x" in v or v.startswith("<") or v == str(rank) for rank, v in values.items()):
            continue
        return name, where, values
    return None


def verdict_joining(ctx: Any) -> Optional[dict[str, Any]]:
    """Every rank on this node waits inside init_process_group in every snapshot: the job never formed.
    None when any rank is elsewhere (a rank still loading data before its init is start-up, and moves)."""
    facts: HangFacts = ctx.facts
    job = facts.job
    live = [s for s in facts.stacks if s.main is not None]
    if job is None or not live or any(joining(s) is None for s in live):
        return None
    if any(s.main is not None and joining(s) is None for sample in facts.samples for s in sample.stacks):
        return None
    workers = [w for w in job.workers if not w.env_error]
    ranks = [w.rank for w in workers if w.rank is not None]
    worlds = Counter(_int(w.env.get("WORLD_SIZE")) for w in workers if w.env.get("WORLD_SIZE"))
    endpoints: dict[str, list[int]] = {}
    for w in workers:
        if w.rank is not None and (w.env.get("MASTER_ADDR") or w.env.get("MASTER_PORT")):
            endpoints.setdefault(f"{w.env.get('MASTER_ADDR', '?')}:{w.env.get('MASTER_PORT', '?')}", []).append(w.rank)
    problems: list[str] = []
    culprits: list[int] = []
    twice = sorted(r for r, n in Counter(ranks).items() if n > 1)
    if twice:
        pids = [w.pid for w in workers if w.rank in twice]
        problems.append(
            f"RANK {format_ranks(twice)} is claimed by {len(pids)} processes (pid {', '.join(map(str, pids[:6]))}): each "
            "process needs its own RANK from 0 to WORLD_SIZE-1, so the rank numbers no process took are never filled")
    if len(worlds) > 1:
        parts = [f"{plural_ranks(sorted(w.rank for w in workers if w.rank is not None and _int(w.env.get('WORLD_SIZE')) == size))}"
                 f" say {size}" for size, _ in worlds.most_common()]
        problems.append(f"the ranks disagree on WORLD_SIZE ({'; '.join(parts)})")
        common = worlds.most_common(1)[0][0]
        culprits += [w.rank for w in workers if w.rank is not None and _int(w.env.get("WORLD_SIZE")) != common]
    if len(endpoints) > 1:
        ordered = sorted(endpoints.items(), key=lambda kv: -len(kv[1]))
        problems.append(
            "the ranks disagree on MASTER_ADDR:MASTER_PORT ("
            + "; ".join(f"{plural_ranks(sorted(rs))} use {ep}" for ep, rs in ordered)
            + "): they wait in different stores, each for ranks that went to the other")
        culprits += [r for _, rs in ordered[1:] for r in rs]
    world = worlds.most_common(1)[0][0] if worlds else job.world_size
    missing = sorted(set(range(world)) - set(ranks)) if world and world <= 1 << 16 else []
    endpoint = next(iter(endpoints), "")
    local_only = endpoint.startswith(_LOOPBACK)
    local_world = _int(next((w.env.get("LOCAL_WORLD_SIZE") for w in workers if w.env.get("LOCAL_WORLD_SIZE")), None))
    astray = [(r, pid, ep, size) for r, pid, ep, size in facts.strays if r in missing]
    if astray:
        problems.append("; ".join(
            f"rank {r} runs on this node (pid {pid}) but with MASTER_ADDR:MASTER_PORT {ep} and WORLD_SIZE {size}, "
            f"while this job uses {endpoint or '?'} and WORLD_SIZE {world}: it waits in another store"
            for r, pid, ep, size in astray[:4]))
        culprits += [r for r, _, _, _ in astray]
        missing = [r for r in missing if r not in {a[0] for a in astray}]
    split = store_split(facts.init_methods, {w.pid: w.rank for w in workers}, endpoint) if not problems else None
    if split is not None:
        problems.append(split[0])
        culprits += split[1]
        missing = []
    asked = _int(facts.init_locals.get("world_size"))
    if asked is not None and world and asked != world and asked > 0 and not problems:
        # The script passes its own world size (a config default) while the launcher started another number of
        # processes: the store waits for ranks no launcher will start (held-out hang set 7, j14).
        extra = list(range(world, asked))[:64]
        problems.append(
            f"the script calls init_process_group with world_size={asked} (read from its init_process_group frame; "
            f"at {ctx.where_line(live[0])}), but the launch started {world} process(es) (WORLD_SIZE={world}): "
            + (f"it waits for {plural_ranks(extra)}, which nothing will start" if extra else
               "ranks numbered from the launch do not fit that world")
            + "; the world size comes from the script's own setting, not from the launcher")
        missing = []
        culprits += sorted(ranks)
    shared = None
    frame = live[0].user_frame()
    lines = ctx.facts.sources.get(frame.filename) if frame is not None else None
    if lines and not problems and not missing:
        rank_of = {w.pid: w.rank for w in workers if w.rank is not None}
        shared = shared_value_split(lines, frame.line, {rank_of[pid]: found for pid, found in
                                                        facts.joining_locals.items() if pid in rank_of})
    if shared is not None:
        name, assigned, values = shared
        groups: dict[str, list[int]] = {}
        for rank, value in sorted(values.items()):
            groups.setdefault(value, []).append(rank)
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
        origin = (f" ({frame.filename}:{assigned} `{lines[assigned - 1].strip()[:100]}`)" if assigned else "")
        problems.append(
            f"the ranks build what they rendezvous through from `{name}`{origin}, and it differs between them: "
            + "; ".join(f"{plural_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {value[:80]}" for value, rs in
                        ordered[:4])
            + " (py-spy --locals of the frame calling init_process_group): a value every rank must share (a store "
              "prefix, a run id, a file name) is computed by each rank for itself, so each waits under keys no "
              "other rank writes")
        culprits += ([r for _, rs in ordered[1:] for r in rs] if len(ordered[0][1]) > len(ordered[1][1])
                     else sorted(values))
    if missing and not problems:
        names = plural_ranks(missing[:64]) + (f" and {len(missing) - 64} more" if len(missing) > 64 else "")
        if local_only or (local_world is not None and world is not None and local_world >= world):
            problems.append(
                f"{names} of the {world} {'is' if len(missing) == 1 else 'are'} not running: never started or exited "
                f"before joining" + (f", and with MASTER_ADDR {endpoint.split(':')[0]} no other node can run "
                                     f"{'it' if len(missing) == 1 else 'them'}" if local_only else ""))
        else:
            problems.append(
                f"{names} of the {world} run on no process here and have not joined from their nodes (not started "
                f"there, another MASTER_ADDR/MASTER_PORT or WORLD_SIZE there, or a firewall between them and "
                f"{endpoint or 'MASTER_ADDR:MASTER_PORT'})")
        if 0 in missing and endpoint:
            problems.append(f"rank 0, which hosts the store at {endpoint}, is among them: the others retry "
                            "connecting to it")
        culprits += missing
    if not problems:
        problems.append(f"all {len(ranks)} rank(s) of a {world or '?'}-rank job are here and still wait: the store or "
                        "the backend's first connection does not complete (a firewall, the wrong network interface "
                        "in GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME, a MASTER_ADDR that resolves to another host)")
    started = min((facts.rank_start[w.pid] for w in workers if w.pid in facts.rank_start), default=None)
    waited = (f" for {_minutes(facts.taken_at - started)} since the ranks started"
              if started is not None and facts.taken_at > started else "")
    where = ctx.where_line(live[0])
    summary = (
        f"the job never formed: {plural_ranks(sorted(ranks)) if ranks else 'every rank'} "
        f"{'waits' if len(live) == 1 else 'wait'} in init_process_group ({joining(live[0])}) at {where}{waited} -> "
        + "; ".join(problems)
    )
    fix = ((
        "Give every rank the same init_method, computed from nothing a rank holds alone (a per-rank port, cwd or "
        "restart counter): one absolute path for file:// (`file:///shared/dir/rdzv`, on a file system every node "
        "sees, deleted before a new run), one address for tcp://; or use env:// with MASTER_ADDR/MASTER_PORT. "
    ) if split is not None else "") + ((
        "Compute what names the rendezvous (a store prefix, a run id, a file name) once and give it to every "
        "rank: from the launcher (`TORCHELASTIC_RUN_ID`, an argument or environment variable set before the "
        "ranks start), never from each rank's clock, pid or random numbers. "
    ) if shared is not None else "") + (
        "Start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE and a distinct RANK from 0 to "
        "WORLD_SIZE-1 (torchrun and srun set them for you); make sure each node can reach MASTER_ADDR:MASTER_PORT "
        "(`nc -zv ADDR PORT`); pass `timeout=` to init_process_group so a rank that never joins is an error."
    )
    present = sorted(set(culprits) & set(ranks))
    records = ctx.records(present) + [
        {"rank": r, "pid": None, "host": None, "where": "not running on this node", "file": None, "line": None,
         "chain": []} for r in sorted(set(culprits) - set(ranks))[:64]]
    if not culprits:
        records = ctx.records(sorted(ranks))
    return {
        "kind": "joining", "summary": summary, "culprit_ranks": sorted(set(culprits)) or sorted(ranks),
        "other_ranks": sorted(set(ranks) - set(culprits)) if culprits else [], "culprits": records,
        "collective": None, "tie": not culprits and len(ranks) > 1, "fix": fix, "source": "stacks",
    }



def _option(argv: tuple[str, ...], *names: str) -> str:
    """The value of a torchrun option in `--name V` or `--name=V` form (`-` and `_` spellings alike)."""
    wanted = {n.replace("_", "-") for n in names}
    for index, arg in enumerate(argv[:200]):
        key, _, value = arg.partition("=")
        if key.replace("_", "-") in wanted:
            if value:
                return value[:200]
            return argv[index + 1][:200] if index + 1 < len(argv) else ""
    return ""


def verdict_agent_waiting(facts: HangFacts) -> Optional[dict[str, Any]]:
    """--pid names a torchrun agent with no worker process: it has not started its ranks because the
    rendezvous has not completed (the other nodes' agents have not joined), or it is between restarts."""
    job = facts.job
    if job is None or not job.agent_pid or job.workers:
        return None
    argv = job.agent_cmdline
    nnodes = _option(argv, "--nnodes") or "1"
    endpoint = _option(argv, "--rdzv-endpoint") or ":".join(
        v for v in (_option(argv, "--master-addr"), _option(argv, "--master-port")) if v)
    backend = _option(argv, "--rdzv-backend") or ("static" if not endpoint or "--master-addr" in " ".join(argv) else "")
    run_id = _option(argv, "--rdzv-id")
    started = facts.agent_start
    stack = facts.agent_stack
    inside = ""
    if stack is not None and stack.main is not None:
        torch_frames = [f for f in stack.main.frames if "torch/distributed/" in f.filename]
        # The rendezvous operation it is in, rather than the back-off sleep below it.
        frame = next((f for f in torch_frames if "endezvous" in f.name), torch_frames[0] if torch_frames else None)
        if frame is not None:
            inside = f" (its stack: {frame.name}() in {'/'.join(frame.filename.rsplit('/', 2)[-2:])}:{frame.line})"
    waited = (f" for {_minutes(facts.taken_at - started)}" if started is not None and facts.taken_at > started else "")
    settings = ", ".join(f"{k} {v}" for k, v in (("--nnodes", nnodes), ("--rdzv-backend", backend),
                                                  ("--rdzv-endpoint", endpoint), ("--rdzv-id", run_id)) if v)
    summary = (
        f"the torchrun agent pid {job.agent_pid} has started no rank{waited}: it waits in the rendezvous{inside} "
        f"for the agents of the other node(s) ({settings}) -> the nodes that have not joined are the cause: their "
        "torchrun was not started, or was given another --rdzv-id, --rdzv-endpoint or --nnodes, or cannot reach "
        f"{endpoint or 'the endpoint'}"
    )
    fix = (
        "Start torchrun on every node with the same --nnodes, --rdzv-backend, --rdzv-endpoint and --rdzv-id "
        f"(`nc -zv {endpoint.replace(':', ' ') if endpoint else 'HOST PORT'}` from each node tests the endpoint); "
        "the rendezvous gives up after its join timeout (`--rdzv-conf join_timeout=SECONDS`, 600 by default)."
    )
    return {
        "kind": "joining", "summary": summary, "culprit_ranks": [], "other_ranks": [], "culprits": [],
        "collective": None, "tie": False, "fix": fix, "source": "stacks" if inside else None,
    }
