"""NCCL RAS: a loopback server replays real NCCL 2.28.9 replies byte for byte (and synthetic variants built
from NCCL's documented format); the client and parser must read them, and time-outs and a closed port
must become clear findings."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.hang.probe_io import parse_addr, query_ras
from ddpdoctor.hang.ras import RasReplyError, parse_ras, parse_ras_text, split_reply
from ddpdoctor.hang.verdict import HangFacts, judge_hang

FIX = Path(__file__).parent / "fixtures" / "nccl_ras"


class RasServer:
    """Speaks NCCL's side of the RAS protocol on 127.0.0.1: one handshake line per command, then the
    report and a close (src/ras/client_support.cc). `lines` are the server's lines in order."""

    def __init__(self, reply: bytes, stall_s: float = 0.0, old_nccl: bool = False) -> None:
        head, rest = reply.split(b"\n", 1)
        self.handshake = [head + b"\n"]
        while rest.startswith(b"OK\n"):
            self.handshake.append(b"OK\n")
            rest = rest[3:]
        self.body = rest
        self.stall_s = stall_s
        self.old_nccl = old_nccl
        self.received: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            reader = conn.makefile("rb")
            replies = list(self.handshake)
            for raw in reader:
                line = raw.decode().strip()
                self.received.append(line)
                upper = line.upper()
                if upper.startswith("SET FORMAT") and self.old_nccl:
                    conn.sendall(f"ERROR: Unknown command {line}\n".encode())
                elif upper in ("STATUS", "VERBOSE STATUS"):
                    time.sleep(self.stall_s)
                    conn.sendall(self.body)
                    break
                else:
                    conn.sendall(replies.pop(0) if replies else b"OK\n")
        self.sock.close()


def test_replays_real_json_reply_byte_for_byte():
    real = (FIX / "json-status-2.28.9.txt").read_bytes()
    server = RasServer(real)
    reply = query_ras(server.addr, timeout_s=5)
    assert reply.error == ""
    assert reply.data == real
    assert server.received == ["CLIENT PROTOCOL 2", "TIMEOUT 4", "SET FORMAT json", "VERBOSE STATUS"]
    protocol, body = split_reply(reply.data)
    status = parse_ras(body)
    assert protocol == "2" and status.fmt == "json" and status.nccl_version == "2.28.9"
    assert len(status.comms) == 1 and status.missing == [] and status.behind == []


@pytest.mark.parametrize("name", ["status-2.28.9.txt", "verbose-status-2.28.9.txt"])
def test_replays_real_text_reply_byte_for_byte(name):
    real = (FIX / name).read_bytes()
    server = RasServer(real)
    reply = query_ras(server.addr, timeout_s=5, json_format=False)
    assert reply.data == real
    _, body = split_reply(reply.data)
    status = parse_ras(body)
    assert status.fmt == "text" and status.nccl_version == "2.28.9"
    assert status.group_rows == [
        {"group": 0, "comms": 1, "ranks_per_comm": 1, "status": "RUNNING", "errors": "OK"}
    ]
    assert not status.missing and not status.behind and not status.mismatch


def test_old_nccl_without_json_falls_back_to_text():
    real = (FIX / "status-2.28.9.txt").read_bytes()
    server = RasServer(real, old_nccl=True)
    reply = query_ras(server.addr, timeout_s=5)
    assert reply.error == ""
    status = parse_ras(split_reply(reply.data)[1])
    assert status.fmt == "text" and status.nccl_version == "2.28.9"


def test_synthetic_missing_rank_text():
    status = parse_ras_text((FIX / "synthetic-incomplete.txt").read_text())
    assert [r.rank for r in status.missing] == [21]
    assert status.missing_processes[0].pid == 3487984
    assert status.timeouts == 2


def test_synthetic_mismatch_text_names_ranks_behind():
    status = parse_ras_text((FIX / "synthetic-mismatch.txt").read_text())
    assert status.mismatch
    assert [r.rank for r in status.behind] == [5]
    behind = status.behind[0]
    assert behind.pid == 483077 and behind.host == "172.16.64.210" and behind.count == 6649
    assert status.ahead_count["#0-0 (27a079b828ff1a75)"] == 6650


def test_synthetic_missing_rank_json_gives_verdict(tmp_path):
    server = RasServer((FIX / "synthetic-json-missing.txt").read_bytes())
    reply = query_ras(server.addr, timeout_s=5)
    status = parse_ras(split_reply(reply.data)[1])
    assert [(r.rank, r.pid) for r in status.missing] == [(1, 1524345)]
    report = judge_hang(HangFacts(host="h", ras=status, ras_addr=server.addr))
    assert report.verdict["kind"] == "missing" and report.verdict["culprit_ranks"] == [1]
    assert "pid 1524345" in report.verdict["summary"]


def test_synthetic_json_counts_behind():
    status = parse_ras((FIX / "synthetic-json-behind.txt").read_text().split("OK\n", 2)[-1])
    assert [(r.rank, r.count, r.op) for r in status.behind] == [(2, 41, "AllReduce")]
    assert status.mismatch


def test_stalled_server_times_out_clearly():
    server = RasServer((FIX / "json-status-2.28.9.txt").read_bytes(), stall_s=3)
    start = time.monotonic()
    reply = query_ras(server.addr, timeout_s=1)
    assert time.monotonic() - start < 2.5
    assert reply.error_kind == "timeout" and "within 1s" in reply.error
    report = judge_hang(HangFacts(host="h", ras_error=reply.error, ras_error_kind=reply.error_kind, ras_addr=server.addr))
    ras = next(f for f in report.findings if f.id == "hang.ras")
    assert ras.severity.label == "error" and "no complete answer" in ras.summary


def test_closed_port_is_a_clear_skip():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    reply = query_ras(f"127.0.0.1:{port}", timeout_s=2)
    assert reply.error_kind == "refused"
    report = judge_hang(HangFacts(host="h", ras_error=reply.error, ras_error_kind=reply.error_kind, ras_addr=reply.addr))
    ras = next(f for f in report.findings if f.id == "hang.ras")
    assert ras.severity.label == "skip" and "no NCCL process listens" in ras.summary


def test_not_a_ras_server():
    with pytest.raises(RasReplyError):
        split_reply(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with pytest.raises(RasReplyError, match="Invalid timeout"):
        split_reply(b"SERVER PROTOCOL 2\nERROR: Invalid timeout value x\n")


@pytest.mark.parametrize("addr,expected", [("127.0.0.1:28028", ("127.0.0.1", 28028)), ("node1", ("node1", 28028)),
                                           ("[::1]:29000", ("::1", 29000))])
def test_parse_addr(addr, expected):
    assert parse_addr(addr) == expected


def test_bad_addr_is_an_error_not_a_crash():
    assert query_ras("host:notaport", timeout_s=1).error_kind == "bad_addr"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000))
def test_parsers_never_crash_on_text(text):
    # ValueError is the answer for text that is no RAS report (#26: garbage is not "every rank answered").
    for parse in (parse_ras_text, parse_ras):
        try:
            parse(text)
        except ValueError:
            pass


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2000))
def test_split_reply_never_crashes(data):
    try:
        split_reply(data)
    except RasReplyError:
        pass


@pytest.fixture
def decoy_job():
    """A local process that looks like a rank of another job (RANK, WORLD_SIZE, MASTER_* in its
    environment, a Python process): what `hang` finds on this node when it looks. Killed at the end."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
        env=dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1"),
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize("sources", [["--no-stacks", "--no-fr"], []])
def test_cli_verdict_from_ras_alone(decoy_job, sources):
    # --ras-addr without --pid reads RAS only: a job running on this node (the decoy, or whatever else
    # runs here) is never attached to, so the verdict is RAS's whatever runs beside the test.
    import json

    import jsonschema
    from typer.testing import CliRunner

    from ddpdoctor.cli import app
    from ddpdoctor.hang.probe_io import list_processes
    from ddpdoctor.hang.procs import find_jobs

    # The decoy is a job `hang` would find on its own: looking at local processes would attach to it.
    deadline = time.monotonic() + 10
    while not any(w.pid == decoy_job for j in find_jobs(list_processes()) for w in j.workers):
        assert time.monotonic() < deadline, "the decoy job never looked like a rank"
        time.sleep(0.1)
    server = RasServer((FIX / "synthetic-json-behind.txt").read_bytes())
    res = CliRunner().invoke(app, ["hang", "--ras-addr", server.addr, *sources, "--json"])
    data = json.loads(res.output)
    schema = json.loads((Path(__file__).parent.parent / "docs" / "schemas" / "hang.schema.json").read_text())
    jsonschema.validate(data, schema)
    assert data["job"] is None and data["stacks"] == []
    job = next(f for f in data["findings"] if f["id"] == "hang.job")
    assert job["severity"] == "skip" and "--ras-addr" in job["summary"] and "--pid" in job["summary"]
    assert str(decoy_job) not in res.output
    assert data["verdict"]["kind"] == "behind" and data["verdict"]["source"] == "ras"
    assert data["verdict"]["culprit_ranks"] == [2] and "pid 5002" in data["verdict"]["summary"]
    assert data["ras"]["ranks_behind"][0]["count"] == 41 and res.exit_code == 1
    assert data["verdict"]["culprits"][0]["pid"] == 5002 and data["verdict"]["culprits"][0]["host"] == "10.0.0.1"


def test_ras_addr_with_pid_still_reads_that_local_job(decoy_job):
    # Local discovery is explicit: --pid with --ras-addr reads that job's ranks and RAS.
    import json

    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = CliRunner().invoke(
        app, ["hang", "--ras-addr", f"127.0.0.1:{port}", "--pid", str(decoy_job), "--no-stacks", "--samples", "1", "--json"]
    )
    data = json.loads(res.output)
    assert [r["pid"] for r in data["job"]["ranks"]] == [decoy_job]
    assert next(f for f in data["findings"] if f["id"] == "hang.ras")["severity"] == "skip"


def test_ras_addr_and_no_ras_contradict():
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    res = CliRunner().invoke(app, ["hang", "--ras-addr", "127.0.0.1:1", "--no-ras"])
    assert res.exit_code == 2 and "contradict" in res.output
