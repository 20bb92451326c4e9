"""NCCL RAS replies (NCCL >= 2.24, port 127.0.0.1:28028): text or JSON in, RasStatus out. Pure.

The conversation (NCCL's src/ras/client.cc, docs/userguide/source/troubleshooting/ras.rst):
`CLIENT PROTOCOL 2` -> `SERVER PROTOCOL 2`; `TIMEOUT <s>` -> `OK`; `SET FORMAT json` (NCCL >= 2.28.7) ->
`OK` (older: `ERROR: Unknown command ...`); then `STATUS` or `VERBOSE STATUS` -> the report, after which
the server closes the connection. The socket side lives in probe_io; this module parses the bytes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Optional

from ddpdoctor.edge.files import load_json_text
from ddpdoctor.parsers.numbers import parse_int

RAS_DEFAULT_ADDR = "127.0.0.1:28028"
MAX_REPLY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class RasRank:
    rank: int
    pid: Optional[int] = None
    host: str = ""
    gpu: str = ""
    comm: str = ""  # "#0-0 (hash)" or the JSON hash
    count: Optional[int] = None  # collective operations launched (when known)
    op: str = ""  # which op type the count is for (JSON, NCCL >= 2.26 text)


@dataclass
class RasComm:
    ident: str  # "#group-index" in text, hash in JSON
    hash: str = ""
    size: int = 0
    status: str = ""
    errors: str = ""


@dataclass
class RasStatus:
    fmt: str  # text | json
    nccl_version: str = ""
    comms: list[RasComm] = field(default_factory=list)
    group_rows: list[dict[str, Any]] = field(default_factory=list)  # the summary table (text)
    missing: list[RasRank] = field(default_factory=list)  # ranks that gave no data (unresponsive)
    dead_processes: list[RasRank] = field(default_factory=list)
    missing_processes: list[RasRank] = field(default_factory=list)
    behind: list[RasRank] = field(default_factory=list)  # ranks with fewer operations than their peers
    ahead_count: dict[str, int] = field(default_factory=dict)  # comm -> the most operations any rank launched
    # comm -> operations launched (the most any rank did, summed over op types; JSON replies): two replies
    # a second apart tell a job that still launches collectives from one that hangs.
    op_counts: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0
    mismatch: bool = False
    errors_text: str = ""  # the Errors section, verbatim (bounded)
    warnings_text: str = ""


class RasReplyError(ValueError):
    """The server refused (ERROR: ...) or spoke another protocol."""


def split_reply(data: bytes) -> tuple[str, str]:
    """(protocol version, report body) from the bytes a RAS conversation received."""
    text = data[:MAX_REPLY_BYTES].decode("utf-8", errors="replace")
    lines = text.split("\n")
    if not lines or not lines[0].startswith("SERVER PROTOCOL"):
        raise RasReplyError(f"not an NCCL RAS server: first line {lines[0][:80]!r}" if lines else "empty reply")
    protocol = lines[0][len("SERVER PROTOCOL") :].strip()
    index = 1
    while index < len(lines) and lines[index] in ("OK", "OK\r"):
        index += 1
    if index < len(lines) and lines[index].startswith("ERROR"):
        raise RasReplyError(lines[index].strip()[:200])
    return protocol, "\n".join(lines[index:])


def parse_ras(body: str) -> RasStatus:
    """The report after the handshake: JSON when it starts with '{', text otherwise."""
    if body.lstrip().startswith("{"):
        return parse_ras_json(body)
    return parse_ras_text(body)


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON list; [] for anything else (`"communicators": 5` is no list to iterate)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


# RAS JSON writes numbers as numbers: "5" is no count.
_json_int = partial(parse_int, signed=True, text_ok=False)


def parse_ras_json(body: str) -> RasStatus:
    """`SET FORMAT json` + `STATUS` output (NCCL >= 2.28.7); ValueError when it is not that."""
    try:
        raw = load_json_text(body)
    except ValueError as exc:  # deep nesting included (never a RecursionError)
        raise ValueError(f"RAS JSON is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("RAS JSON is not an object")
    if not _dicts(raw.get("communicators")) and "nccl_version" not in raw:
        # Neither part of a RAS status: saying "every rank answered" from it would be a verdict on garbage.
        raise ValueError("RAS JSON has neither `communicators` nor `nccl_version`: not a RAS status")
    status = RasStatus(fmt="json", nccl_version=str(raw.get("nccl_version") or ""))
    ras = raw.get("ras") if isinstance(raw.get("ras"), dict) else {}
    status.timeouts = _json_int(ras.get("timeouts_count")) or 0
    for comm in _dicts(raw.get("communicators")):
        if not isinstance(comm.get("ranks"), list):
            # Every communicator RAS reports lists its ranks: without them nothing says who answered.
            raise ValueError("RAS JSON communicator without a `ranks` list: not a RAS status")
        ident = str(comm.get("hash") or "?")[:200]
        ranks = _dicts(comm.get("ranks"))
        missing = _dicts(comm.get("missing_ranks"))
        state = "RUNNING"
        if missing:
            state = "INCOMPLETE"
        status.comms.append(RasComm(ident, ident, _json_int(comm.get("size")) or 0, state, ""))
        for r in missing:
            st = r.get("status") if isinstance(r.get("status"), dict) else {}
            rank = RasRank(
                rank=_json_int(r.get("rank"), -1),
                pid=_json_int(r.get("pid")),
                host=str(r.get("host") or ""),
                gpu=str(r.get("cuda_dev", "")),
                comm=ident,
            )
            status.missing.append(rank)
            if st.get("considered_dead"):
                status.dead_processes.append(rank)
        # Ranks that launched fewer operations of some type than the most advanced rank are behind.
        per_op: dict[str, dict[int, int]] = defaultdict(dict)
        info: dict[int, dict[str, Any]] = {}
        for r in ranks:
            number = _json_int(r.get("rank"))
            counts = r.get("collective_counts")
            if number is None or not isinstance(counts, dict):
                continue
            info[number] = r
            for op, count in counts.items():
                if _json_int(count) is not None:
                    per_op[str(op)][number] = count
        worst: dict[int, RasRank] = {}
        status.op_counts[ident] = sum(max((_json_int(c) or 0 for c in counts.values()), default=0) for counts in per_op.values())
        for op, counts in per_op.items():
            top = max(counts.values(), default=0)
            if len(set(counts.values())) > 1:
                status.mismatch = True
                status.ahead_count[ident] = max(status.ahead_count.get(ident, 0), top)
            for number, count in counts.items():
                if count < top and number not in worst:
                    r = info[number]
                    worst[number] = RasRank(
                        number, _json_int(r.get("pid")), str(r.get("host") or ""), str(r.get("cuda_dev", "")),
                        ident, count, op,
                    )
        status.behind.extend(worst[n] for n in sorted(worst))
    return status


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+([A-Z_]+)\s+([A-Z,_]+)\s*$")
_PROCESS = re.compile(r"^\s*Process (\d+) on node (\S+) managing GPUs? (.+?)\s*$")
_RANK_LINE = re.compile(
    r"^\s*Rank (\d+)(?: has (?:launched up to operation (\d+)|not launched any operations|status \S+))?"
    r" -- (?:GPU (\S+) managed by process (\d+) on node (\S+)|\[process information not found\])\s*$"
)
_MISSING_RANK = re.compile(r"^\s*The missing ranks?: ([\d, ]+)\s*$")
_COMM_HEAD = re.compile(r"^#(\d+-\d+) \(([0-9a-fx]+)\) ([A-Z,]+)\s*$")
_COUNT_GROUP = re.compile(r"^\s*(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)")
_TIMEOUTS = re.compile(r"Encountered (\d+) communication timeouts?")
_DIFFERENT = re.compile(r"Communicator ranks have different (\S+) operation counts")


def parse_ras_text(body: str) -> RasStatus:
    """`STATUS` / `VERBOSE STATUS` text output."""
    status = RasStatus(fmt="text")
    match = re.search(r"NCCL version (\S+)", body)
    if match:
        status.nccl_version = match.group(1)
    section = ""
    comm = ""
    block = ""  # INCOMPLETE | DEAD | MISMATCH | ...
    group_count: Optional[int] = None  # the "N ranks have launched up to operation K" being listed
    op = ""
    errors: list[str] = []
    warnings: list[str] = []
    by_comm_counts: dict[str, list[tuple[int, list[RasRank]]]] = defaultdict(list)
    for line in body.split("\n")[:200_000]:
        stripped = line.strip()
        if stripped in ("Errors", "Warnings") or stripped.startswith("Communicators") or stripped == "Job summary":
            section = stripped.split(".")[0]
            continue
        if set(stripped) == {"="}:
            continue
        if section == "Errors" and len(errors) < 200:
            errors.append(line)
        if section == "Warnings" and len(warnings) < 200:
            warnings.append(line)
        if section.startswith("Communicators"):
            row = _ROW.match(line)
            if row:
                status.group_rows.append(
                    {"group": int(row.group(1)), "comms": int(row.group(2)), "ranks_per_comm": int(row.group(5)),
                     "status": row.group(7), "errors": row.group(8)}
                )
                status.mismatch = status.mismatch or "MISMATCH" in row.group(8)
            continue
        head = _COMM_HEAD.match(stripped)
        if head:
            comm, block, group_count, op = f"#{head.group(1)} ({head.group(2)})", head.group(3), None, ""
            status.comms.append(RasComm(f"#{head.group(1)}", head.group(2), 0, "", head.group(3)))
            continue
        if stripped in ("INCOMPLETE", "DEAD", "TIMEOUT"):
            block, comm = stripped, ""
            continue
        if (m := _TIMEOUTS.search(stripped)) is not None:
            status.timeouts = int(m.group(1))
            continue
        if (m := _DIFFERENT.search(stripped)) is not None:
            op = m.group(1)
            continue
        if (m := _COUNT_GROUP.match(line)) is not None:
            group_count = int(m.group(2) or 0)
            by_comm_counts[comm].append((group_count, []))
            continue
        if (m := _PROCESS.match(line)) is not None and not comm:
            proc = RasRank(-1, int(m.group(1)), m.group(2), m.group(3))
            (status.dead_processes if block == "DEAD" else status.missing_processes).append(proc)
            continue
        if (m := _MISSING_RANK.match(line)) is not None:
            for number in re.findall(r"\d+", m.group(1)):
                status.missing.append(RasRank(int(number), comm=comm))
            continue
        if (m := _RANK_LINE.match(line)) is not None:
            rank = RasRank(
                int(m.group(1)),
                int(m.group(4)) if m.group(4) else None,
                m.group(5) or "",
                m.group(3) or "",
                comm,
                int(m.group(2)) if m.group(2) else (group_count if group_count is not None else None),
                op,
            )
            if block == "INCOMPLETE":
                status.missing.append(rank)
            elif block == "MISMATCH" and op:
                if m.group(2) is not None or "not launched" in line:
                    count = int(m.group(2) or 0)
                    by_comm_counts[comm].append((count, [rank]))
                elif by_comm_counts[comm]:
                    by_comm_counts[comm][-1][1].append(rank)
    for comm_id, groups in by_comm_counts.items():
        if not groups:
            continue
        top = max(count for count, _ in groups)
        status.ahead_count[comm_id] = top
        for count, ranks in groups:
            if count < top:
                status.behind.extend(ranks)
    status.errors_text = "\n".join(errors).strip()[:4000]
    status.warnings_text = "\n".join(warnings).strip()[:4000]
    if not (status.nccl_version or status.comms or status.group_rows or section):
        # Nothing of a RAS report (no version line, no section, no communicator): garbage after the
        # handshake is no "every rank answered".
        raise ValueError("the reply after the handshake is not a RAS status report (no NCCL version, no section)")
    return status


# What the JSON keeps of a RAS reply: ranks listed per list, characters per string. A reply is up to
# MAX_REPLY_BYTES (16 MiB) from whatever listens on the port; copied whole it made 37 MB of JSON.
MAX_LISTED_RANKS = 256
MAX_FIELD_CHARS = 200


def to_dict(status: RasStatus) -> dict[str, Any]:
    def rank_dict(r: RasRank) -> dict[str, Any]:
        cut = MAX_FIELD_CHARS
        return {"rank": r.rank, "pid": r.pid, "host": r.host[:cut], "gpu": r.gpu[:cut], "comm": r.comm[:cut],
                "count": r.count, "op": r.op[:cut]}

    lists = {"missing_ranks": status.missing, "dead_processes": status.dead_processes,
             "ranks_behind": status.behind}
    omitted = {k: len(v) - MAX_LISTED_RANKS for k, v in lists.items() if len(v) > MAX_LISTED_RANKS}
    return {
        "format": status.fmt,
        "nccl_version": status.nccl_version[:MAX_FIELD_CHARS],
        "communicators": len(status.comms) or len(status.group_rows),
        **{k: [rank_dict(r) for r in v[:MAX_LISTED_RANKS]] for k, v in lists.items()},
        # Only when a list was cut: how many ranks each list had beyond the ones shown.
        **({"omitted": omitted} if omitted else {}),
        "timeouts": status.timeouts,
        "mismatch": status.mismatch,
    }
