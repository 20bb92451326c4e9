"""The processes at the other end of a process's pipes and TCP sockets, from /proc: a rank blocked reading a
socket or a pipe waits for whoever holds the other end, and what that process does is why the data never
comes (a helper service that itself waits to read, one that crashed, one that answers another request).

Equivalent: `ls -l /proc/PID/fd` (socket:[INODE], pipe:[INODE]), `cat /proc/PID/net/tcp /proc/PID/net/tcp6`
(the connection each socket inode is, in the process's network namespace), and `ls -l /proc/*/fd` for the
processes of the same user that hold the other end. Never raises; bounded in processes and time.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Optional

# /proc/net/tcp row: "  1: 0100007F:1F90 0100007F:A2B4 01 ... uid timeout inode ..."
_TCP_ROW = re.compile(r"^\s*\d+:\s+([0-9A-F]{8,32}):([0-9A-F]{4})\s+([0-9A-F]{8,32}):([0-9A-F]{4})\s+([0-9A-F]{2})"
                      r"(?:\s+\S+){5}\s+(\d+)", re.IGNORECASE)
_ESTABLISHED = "01"
_LINK = re.compile(r"^(socket|pipe):\[(\d{1,20})\]$")
_MAX_FDS = 4096
_MAX_PROCESSES = 4096


@dataclass(frozen=True)
class TcpConnection:
    """One row of /proc/net/tcp(6): the local and remote endpoints as the kernel prints them (hex), its state."""

    local: str
    remote: str
    state: str


@dataclass(frozen=True)
class Peer:
    """A process holding the other end of one of a process's pipes or TCP connections."""

    pid: int
    via: str  # "tcp 127.0.0.1:41234 -> 127.0.0.1:5555", "pipe"
    argv: tuple[str, ...]


def parse_proc_net_tcp(text: str) -> dict[int, TcpConnection]:
    """inode -> connection, from the text of /proc/net/tcp or tcp6 (the header line and bad rows skipped)."""
    out: dict[int, TcpConnection] = {}
    for line in text.splitlines()[1:100_000]:
        found = _TCP_ROW.match(line)
        if found is None:
            continue
        inode = int(found.group(6))
        if inode:
            out[inode] = TcpConnection(f"{found.group(1).upper()}:{found.group(2).upper()}",
                                       f"{found.group(3).upper()}:{found.group(4).upper()}", found.group(5).upper())
    return out


def endpoint_text(endpoint: str) -> str:
    """'0100007F:15B3' -> '127.0.0.1:5555' (IPv4 as the kernel stores it, little-endian words); IPv6 as hex."""
    address, _, port = endpoint.partition(":")
    try:
        number = int(port, 16)
        if len(address) == 8:
            raw = bytes.fromhex(address)[::-1]
            return f"{'.'.join(str(b) for b in raw)}:{number}"
        if len(address) == 32 and address.upper().startswith("0000000000000000FFFF0000"):
            raw = bytes.fromhex(address[24:])[::-1]
            return f"{'.'.join(str(b) for b in raw)}:{number}"
        return f"[{address.lower()}]:{number}"
    except ValueError:
        return endpoint


def fd_links(pid: int, proc: str = "/proc", standard: bool = True) -> dict[str, set[int]]:
    """'socket' / 'pipe' -> the inodes of the process's open sockets and pipes (without fds 0-2 when not
    `standard`: a rank's stdout pipe leads to its launcher's log reader, no peer it waits for); empty when
    unreadable."""
    out: dict[str, set[int]] = {"socket": set(), "pipe": set()}
    base = os.path.join(proc, str(pid), "fd")
    try:
        names = os.listdir(base)[:_MAX_FDS]
    except OSError:
        return out
    for name in names:
        if not standard and name in ("0", "1", "2"):
            continue
        try:
            found = _LINK.match(os.readlink(os.path.join(base, name)))
        except OSError:
            continue
        if found is not None:
            out[found.group(1)].add(int(found.group(2)))
    return out


def _read(path: str, limit: int = 1 << 22) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("ascii", "replace")
    except OSError:
        return ""


def _argv(pid: int, proc: str) -> tuple[str, ...]:
    raw = _read(os.path.join(proc, str(pid), "cmdline"), 8192)
    return tuple(part for part in raw.split("\0") if part)[:16]


def _uid(pid: int, proc: str) -> Optional[int]:
    try:
        return os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError:
        return None


def other_ends(pid: int, skip: set[int], proc: str = "/proc", budget_s: float = 1.0, limit: int = 4) -> list[Peer]:
    """The processes of `pid`'s own user, other than `pid` and those in `skip` (the job's ranks and agent),
    holding the other end of its established TCP connections (the row whose local and remote endpoints are this
    one's, swapped, in the same network namespace) or of its pipes: at most `limit`, children of `pid` first."""
    mine = fd_links(pid, proc, standard=False)
    if not mine["socket"] and not mine["pipe"]:
        return []
    table: dict[int, TcpConnection] = {}
    for name in ("tcp", "tcp6"):
        table.update(parse_proc_net_tcp(_read(os.path.join(proc, str(pid), "net", name))))
    by_ends = {(c.local, c.remote): inode for inode, c in table.items() if c.state == _ESTABLISHED}
    wanted: dict[int, str] = {}
    for inode in mine["socket"]:
        conn = table.get(inode)
        if conn is None or conn.state != _ESTABLISHED:
            continue
        other = by_ends.get((conn.remote, conn.local))
        if other is not None and other not in mine["socket"]:
            wanted[other] = f"tcp {endpoint_text(conn.local)} -> {endpoint_text(conn.remote)}"
    pipes = set(mine["pipe"])
    if not wanted and not pipes:
        return []
    owner = _uid(pid, proc)
    try:
        pids = sorted((int(p) for p in os.listdir(proc) if p.isdigit()), key=lambda p: (p < pid, p))
    except OSError:
        return []
    deadline = time.monotonic() + budget_s
    found: dict[int, str] = {}
    for other_pid in pids[:_MAX_PROCESSES]:
        if time.monotonic() > deadline or len(found) >= limit * 4:
            break
        if other_pid == pid or other_pid in skip or _uid(other_pid, proc) != owner:
            continue
        theirs = fd_links(other_pid, proc)
        via = next((wanted[i] for i in theirs["socket"] if i in wanted), None)
        if via is None and pipes & theirs["pipe"]:
            via = "pipe"
        if via is not None:
            found[other_pid] = via
    parents = {p: _parent(p, proc) for p in found}
    ordered = sorted(found, key=lambda p: (parents.get(p) != pid, not found[p].startswith("tcp"), p))
    return [Peer(p, found[p], _argv(p, proc)) for p in ordered[:limit]]


def _parent(pid: int, proc: str) -> Optional[int]:
    text = _read(os.path.join(proc, str(pid), "stat"), 4096)
    fields = text.rsplit(")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
