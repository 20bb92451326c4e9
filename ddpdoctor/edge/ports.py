"""Who holds a TCP port on this host (psutil), and the kernel's ephemeral port range."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

EPHEMERAL_RANGE_PATH = "/proc/sys/net/ipv4/ip_local_port_range"


@dataclass(frozen=True)
class PortHolder:
    port: int
    pid: Optional[int]  # None when the owner is not visible (another user, another network namespace)
    name: str = ""
    cmdline: str = ""
    address: str = ""

    def describe(self) -> str:
        if self.pid is None:
            # Bound-but-not-listening sockets are absent from /proc/net/tcp, as are other users' and
            # other network namespaces' sockets: the owner cannot be named, only the clash proven.
            return (
                f"port {self.port} is bound ({self.address}) by a process ddpdoctor cannot identify "
                "(a socket bound but not listening, or one of another user); find it with `ss -tanp`"
            )
        return f"port {self.port} is held by PID {self.pid} ({self.cmdline or self.name})"


def _bind_probe(port: int) -> bool:
    """True when binding the port on all addresses fails with 'address in use'."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
        except OSError as exc:
            if exc.errno == 98:  # EADDRINUSE
                return True
        finally:
            s.close()
    return False


def find_port_holder(port: int) -> Optional[PortHolder]:
    """The process listening on (or bound to) TCP `port`, or None when the port is free.

    Equivalent: ss -ltnp 'sport = :PORT'
    """
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency; degrade to the bind probe
        psutil = None
    if psutil is not None:
        try:
            conns = psutil.net_connections(kind="tcp")
        except (psutil.AccessDenied, OSError):
            conns = []
        for c in conns:
            if (
                c.laddr
                and c.laddr.port == port
                and c.status in (psutil.CONN_LISTEN, psutil.CONN_NONE, "BOUND")
            ):
                name = cmdline = ""
                if c.pid is not None:
                    try:
                        proc = psutil.Process(c.pid)
                        name = proc.name()
                        cmdline = " ".join(proc.cmdline())
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
                return PortHolder(
                    port=port, pid=c.pid, name=name, cmdline=cmdline, address=f"{c.laddr.ip}:{port}"
                )
    if _bind_probe(port):
        return PortHolder(port=port, pid=None, address=f"*:{port}")
    return None


def read_ephemeral_range(path: str = EPHEMERAL_RANGE_PATH) -> Optional[tuple[int, int]]:
    """net.ipv4.ip_local_port_range, e.g. (32768, 60999); None if unreadable."""
    try:
        lo, hi = Path(path).read_text().split()[:2]
        return int(lo), int(hi)
    except (OSError, ValueError):
        return None


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (it may be taken before use: callers retry on a clash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
