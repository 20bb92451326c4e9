"""Over-long lines are read in keyword windows with a bounded amount of work per line (issue #23: a 64 MB
single line dense with keywords ran at 6 MB/s, 1 GB did not finish in 120 s).

The lines below are real messages (torch's libuv TCPStore as in pytorch/pytorch#126510; NCCL's net_ib.cc
WARN as quoted in tests/fixtures/explain/lines.json) repeated into one line, as a log without newlines (a JSON blob, a
progress bar redrawn with \\r) makes them."""

from __future__ import annotations

import io

from ddpdoctor.explain import explain
from ddpdoctor.explain.kb import load_knowledge_base as load_kb
from ddpdoctor.explain.scan import MAX_LINE, MAX_WINDOWS_PER_LINE, WINDOW, scan_inputs

PORT = b"RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use "
IB = b"-worker-1:946:988 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129 "
FILLER = b"x" * 200 + b" "


def _explain(data: bytes):
    return explain(load_kb(), scan_inputs(load_kb(), [("blob.log", io.BytesIO(data))]))


def test_a_line_past_the_window_budget_is_cut_and_says_so() -> None:
    line = (PORT + FILLER) * (MAX_WINDOWS_PER_LINE * 8) + b"\n"
    assert len(line) > MAX_LINE
    result = _explain(line)
    (stats,) = result.inputs
    assert stats.long_lines == 1 and stats.windows_capped == 1
    assert result.root is not None and result.root.id == "store.port_in_use"


def test_a_line_within_the_budget_is_read_whole() -> None:
    # The IB error sits after many repeats of another message, still inside the budget: found.
    line = (PORT + FILLER) * (MAX_WINDOWS_PER_LINE // 2) + IB + b"\n"
    result = _explain(line)
    (stats,) = result.inputs
    assert stats.windows_capped == 0
    ids = {d.id for d in [result.root, *result.consequences, *result.notes] if d is not None}
    assert {"store.port_in_use", "nccl.ib_retry_exceeded"} <= ids, ids


def test_the_budget_is_per_line_not_per_file() -> None:
    # A capped line does not stop the next line from being read.
    long_line = (PORT + FILLER) * (MAX_WINDOWS_PER_LINE * 8) + b"\n"
    result = _explain(long_line + IB + b"\n")
    ids = {d.id for d in [result.root, *result.consequences, *result.notes] if d is not None}
    assert "nccl.ib_retry_exceeded" in ids, ids


def test_window_budget_covers_megabytes_of_a_line() -> None:
    # The budget is in windows around keywords: at least a few MiB of a dense line are read.
    assert MAX_WINDOWS_PER_LINE * WINDOW // 2 >= 2 << 20
