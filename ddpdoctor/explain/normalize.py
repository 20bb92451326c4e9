"""Line normalizer: strip launcher prefixes, and read rank, host, pid and timestamp off a log line.

Handles `[rank3]:` (PyTorch >= 2.3), torchrun's `[default0]:` / `[default 0]:` (--tee / log_line_prefix),
ProcessGroupNCCL's `[Rank 2]` / `[PG 1 Rank 0]` / `[PG ID 0 PG GUID 0(default_pg) Rank 6]`, NCCL's
`host:pid:tid [dev]` prefix, and the timestamp formats of python logging, glog, dmesg -T and syslog.
The prefixes other launchers put in front of every line (srun --label `0: `, OpenMPI --tag-output
`[1,0]<stderr>:`, nccl-tests' `# `, Ray's `(RayTrainWorker pid=123, ip=10.0.0.1) `, Slurm's `srun: error: `,
DeepSpeed's `[2024-05-06 10:12:31,577] [INFO] [launch.py:316:main] `) are stripped from the message start, so
patterns anchored at the message start still match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAUNCHER_PREFIX = re.compile(r"\[(rank|default) ?(\d+)\]:")
_MSG_RANK = re.compile(r"\[(?:PG [^\]\[]*?)?Rank (\d+)\]")
# NCCL: host:pid:tid [cudaDev]; container hostnames may be hex ids that start with a digit.
_NCCL_PREFIX = re.compile(
    r"(?<![\w.:\-])(?P<host>(?=[\w.\-]*[A-Za-z])[A-Za-z0-9][\w.\-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
)
# Ray's prefix on a worker's output: `(RayTrainWorker pid=123, ip=10.0.0.1) `.
RAY_WORKER_PREFIX = r"\((?:[\w.:-]{1,80} )?pid=\d{1,10}(?:, ip=[\w.:-]{1,64})?\) "
# Launcher / framework prefixes at the start of the message, stripped (a few times: they nest). Each is
# anchored and bounded, so this costs a handful of character tests per hit line.
_LEAD_PREFIX = re.compile(
    r"(?:\d{1,5}: "  # srun --label, pdsh: task or node number
    r"|\[\d{1,5},\d{1,5}\]<(?:stdout|stderr)>: ?"  # OpenMPI --tag-output
    r"|# "  # nccl-tests prints its header and results behind '# '
    rf"|{RAY_WORKER_PREFIX}"  # Ray worker output
    r"|srun: error: "  # Slurm's own messages (the node and task follow)
    r"|\[\d{4}-\d\d-\d\d[ T][\d:.,]{5,15}\] ?\[(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\] ?"
    r"(?:\[[^\]\n]{1,120}\] ?)?"  # DeepSpeed's logger: [time] [LEVEL] [file:line:func]
    r")"
)
_MAX_LEAD = 4
# A C++ stack frame (c10::Error's backtrace, glog's "Check failure stack trace") or the line that introduces
# one: the symbols name the code that raised, never the cause.
_FRAME = re.compile(r"\s*(?:frame #\d+: |@\s+0x[0-9a-f]+ |Exception raised from \S+ at |\*\*\* Check failure stack trace)")
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), start=1)}
_TS_ISO = re.compile(
    r"(?<!\d)(?P<Y>\d{4})-(?P<m>\d\d)-(?P<d>\d\d)[T _](?P<H>\d\d):(?P<M>\d\d)(?::(?P<S>\d\d)(?:[.,](?P<f>\d+))?)?"
)
# glog: E0321 02:07:08.408271257; c10 logging drops the month's zero: [E321 02:07:08.408271257 (no year)
_TS_GLOG = re.compile(
    r"(?<![\w])[IWEF](?P<m>\d{1,2})(?P<d>\d\d) (?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d)(?:\.(?P<f>\d+))?"
)
# dmesg -T / ctime: [Sun Mar 30 08:24:00 2025]; syslog: Mar 10 01:33:03 host kernel: ...
_TS_CTIME = re.compile(
    r"(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) )?(?P<b>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<d>\d{1,2}) "
    r"(?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d)(?:\.(?P<f>\d+))?"
)
# How far into a line a timestamp may start (after prefixes); a date deep inside a message is not the line's time.
_TS_WINDOW = 160


@dataclass(frozen=True)
class LineInfo:
    message: str  # the line from its last launcher prefix on (prefixes before it removed)
    rank: int | None = None  # global rank when the line says so ([rankN]: or [Rank N] without a prefix)
    local_rank: int | None = None  # torchrun's [defaultN]: is the local rank on that node
    pg_rank: int | None = None  # [Rank N] inside a ProcessGroupNCCL message (rank within its group)
    host: str | None = None
    pid: int | None = None
    ts: float | None = None  # seconds since the start of the year (the year itself is ignored)
    frame: bool = False  # a C++ stack frame line: never a cause


def parse_timestamp(text: str) -> float | None:
    """Seconds since the start of the year of the first timestamp near the start of `text`, or None.

    Years are ignored so that glog (no year), dmesg -T and ISO times of one run compare; dmesg's
    seconds-since-boot `[  687.29]` is not an absolute time and is not parsed.
    """
    head = text[:_TS_WINDOW]
    best: tuple[int, float] | None = None
    for rx in (_TS_ISO, _TS_GLOG, _TS_CTIME):
        m = rx.search(head)
        if not m or (best is not None and m.start() >= best[0]):
            continue
        g = m.groupdict()
        month = _MONTHS[g["b"]] if g.get("b") else int(g["m"])
        day, hour, minute = int(g["d"]), int(g["H"]), int(g["M"])
        if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60):
            continue
        second = int(g["S"] or 0)
        frac = float("0." + g["f"]) if g.get("f") else 0.0
        value = (((month - 1) * 31 + (day - 1)) * 24 + hour) * 3600 + minute * 60 + second + frac
        best = (m.start(), value)
    return best[1] if best else None


def normalize_line(text: str, anchor: int | None = None) -> LineInfo:
    """Split launcher prefixes off `text`; `anchor` is where the interesting part starts (a keyword match).

    When several prefixes occur (progress bars glue lines of different ranks together) the last one
    before the anchor owns the message.
    """
    if anchor is None:
        anchor = len(text)
    rank = local_rank = None
    start = 0
    for m in _LAUNCHER_PREFIX.finditer(text, 0, max(anchor, 0) + 1):
        if m.start() > anchor:
            break
        start = m.end()
        if m.group(1) == "rank":
            rank, local_rank = int(m.group(2)), None
        else:
            rank, local_rank = None, int(m.group(2))
    message = text[start:]
    for _ in range(_MAX_LEAD):
        m = _LEAD_PREFIX.match(message)
        if m is None:
            break
        message = message[m.end() :]
    pg_rank = None
    m = _MSG_RANK.search(message)
    if m:
        pg_rank = int(m.group(1))
        if rank is None and local_rank is None:
            rank = pg_rank
    host = pid = None
    m = _NCCL_PREFIX.search(message, 0, 240)
    if m:
        host, pid = m.group("host"), int(m.group("pid"))
    return LineInfo(
        message=message,
        rank=rank,
        local_rank=local_rank,
        pg_rank=pg_rank,
        host=host,
        pid=pid,
        ts=parse_timestamp(message) or parse_timestamp(text),
        frame=_FRAME.match(message) is not None,
    )


_FILE_RANK = re.compile(r"(?:^|[^a-z])rank[_\-.]?(\d+)(?!\d)", re.IGNORECASE)


def rank_from_filename(name: str) -> int | None:
    """rank3.log, train_rank_12.out, node1-rank-2.txt -> the rank; None when the name says nothing."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    m = _FILE_RANK.search(base)
    return int(m.group(1)) if m else None
