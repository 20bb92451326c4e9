"""Port holders with real sockets and real processes; the ephemeral range from /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from ddpdoctor.edge.ports import find_port_holder, pick_free_port, read_ephemeral_range

LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)


def test_own_listening_socket_names_this_pid() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        holder = find_port_holder(port)
        assert holder is not None
        assert holder.pid == os.getpid()
        assert str(os.getpid()) in holder.describe()
        assert "python" in (holder.name + holder.cmdline).lower()


def test_bound_not_listening_socket_is_found() -> None:
    # A socket that is bound but not listening blocks the port too. Linux does not list it in
    # /proc/net/tcp, so the owner is unknown: the bind probe still reports the port as taken.
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        holder = find_port_holder(s.getsockname()[1])
        assert holder is not None
        assert holder.pid in (None, os.getpid())


def test_other_process_is_named_with_its_command_line() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        holder = find_port_holder(port)
        assert holder is not None and holder.pid == proc.pid
        assert "time.sleep(60)" in holder.cmdline
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_free_port_has_no_holder() -> None:
    port = pick_free_port()
    assert find_port_holder(port) is None
    with socket.socket() as s:  # and it is really bindable
        s.bind(("127.0.0.1", port))


def test_ephemeral_range_from_proc_and_bad_files(tmp_path: Path) -> None:
    live = read_ephemeral_range()
    if Path("/proc/sys/net/ipv4/ip_local_port_range").exists():
        assert live is not None and 0 < live[0] <= live[1] <= 65535
    good = tmp_path / "range"
    good.write_text("32768\t60999\n")
    assert read_ephemeral_range(str(good)) == (32768, 60999)
    bad = tmp_path / "bad"
    bad.write_text("garbage\n")
    assert read_ephemeral_range(str(bad)) is None
    assert read_ephemeral_range(str(tmp_path / "missing")) is None
