"""Held-out set 4 is spent and now tunes the knowledge base: the logs explain missed or named generically when
it was graded (tests/fixtures/explain/spent-set4, copied unchanged; sources in the fixtures README) are a
second check on whole real logs; the first is tests/fixtures/explain/lines.json, line by line from the
source formats (Lightning's start line, CUDA's error 46 string, torch elastic's heartbeat warning, NCCL's P2P
format, CPython's faulthandler format)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from test_explain_spent_set3 import explain_file

from ddpdoctor.explain import explain, load_knowledge_base, scan_inputs

FIXTURES = Path(__file__).parent / "fixtures" / "explain"
SPENT = FIXTURES / "spent-set4"
KB = load_knowledge_base()
LINES: dict[str, list[str]] = {}
for _item in json.loads((FIXTURES / "lines.json").read_text())["lines"]:
    LINES.setdefault(_item["signature"], []).append(_item["line"])

# log -> (root cause id or None, lead id or None, exit code)
EXPECTED = {
    "lightning-8707-slurm-no-srun": (None, "launch.ranks_missing", 0),
    "lightning-10098-slurm-nodes-mismatch": ("launch.duplicate_rank", None, 1),
    "lightning-4389-srun-no-ntasks": ("launch.duplicate_rank", None, 1),
    "lightning-19425-p2p-broken": (None, "nccl.p2p_suspect", 1),
    "vllm-3071-version-bug": (None, "watchdog.unconfirmed", 1),
    "pytorch-23363-docker-network": (None, "nccl.system_error", 1),
    "pytorch-67742-rdzv-host-killed": ("rdzv.connection_lost", None, 1),
    "machin-25-exclusive-process-mode": ("device.busy_unavailable", None, 1),
    "nanogpt-116-exclusive-mode-set-device": ("device.busy_unavailable", None, 1),
    "returnn-1482-param-sync-oom": (None, None, 1),
}


def _report(text: str) -> dict:
    return explain(KB, scan_inputs(KB, [("input.log", io.BytesIO(text.encode()))])).to_dict()


def _explain(name: str) -> dict:
    return explain_file(SPENT / f"{name}.log")


def test_every_spent_log_has_an_expectation() -> None:
    assert sorted(p.stem for p in SPENT.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_spent_log_is_explained(name: str) -> None:
    report = _explain(name)
    root, lead, code = EXPECTED[name]
    assert (report["root_cause"] or {}).get("id") == root
    assert (report["lead"] or {}).get("id") == lead
    assert report["exit_code"] == code


# ---------------------------------------------------------------- from the source formats
def _start_lines(ranks: list[int], world: int) -> str:
    fmt = LINES["context.lightning_rank"][0]  # Lightning's format, rank 0 of 4
    return "".join(
        fmt.replace("GLOBAL_RANK: 0", f"GLOBAL_RANK: {r}").replace("MEMBER: 1/4", f"MEMBER: {r + 1}/{world}") + "\n"
        for r in ranks
    )


def test_same_rank_twice_is_a_launcher_misconfiguration() -> None:
    report = _report(_start_lines([0, 1, 0, 1], 4))
    root = report["root_cause"]
    assert root["id"] == "launch.duplicate_rank" and root["data"]["duplicate_ranks"] == [0, 1]
    assert "ntasks-per-node" in root["cause"] and report["exit_code"] == 1


def test_every_rank_once_or_a_restarted_full_set_is_not_flagged() -> None:
    # Followed by training output: an ordinary run (a log that ends on these lines is a hang sign, see
    # tests/test_explain_tuning5.py).
    for ranks in ([0, 1, 2, 3], [0, 1, 2, 3, 0, 1, 2, 3]):
        report = _report(_start_lines(ranks, 4) + "Epoch 0: 100%|##########| 10/10 [00:01<00:00, 9.1it/s]\n")
        assert report["root_cause"] is None and report["lead"] is None and report["exit_code"] == 0


def test_some_ranks_only_is_a_lead_not_a_failure() -> None:
    # Another node may log elsewhere: a lead (exit 0), never a root cause.
    report = _report(_start_lines([0, 1], 4))
    assert report["root_cause"] is None and report["lead"]["id"] == "launch.ranks_missing"
    assert report["exit_code"] == 0


@pytest.mark.parametrize("line", LINES["device.busy_unavailable"])
def test_busy_or_unavailable_beats_the_generic_exception(line: str) -> None:
    report = _report(line + "\n")
    assert report["root_cause"]["id"] == "device.busy_unavailable"
    assert "set_device" in report["root_cause"]["fix"]
    assert "python.exception" not in {c["id"] for c in report["consequences"]}


def test_p2p_setup_then_silence_is_a_p2p_lead() -> None:
    report = _report("".join(line + "\n" for line in LINES["context.nccl_p2p"]))
    assert report["lead"]["id"] == "nccl.p2p_suspect" and "NCCL_P2P_DISABLE=1" in report["lead"]["fix"]
    assert report["lead"]["data"]["p2p_transports"] == ["CUMEM", "IPC"]


def test_p2p_with_init_complete_and_no_timeout_is_healthy() -> None:
    init = (FIXTURES / "real-h100").glob("*.log")
    complete = next(line for p in init for line in p.read_text().splitlines() if "Init COMPLETE" in line)
    text = "".join(line + "\n" for line in LINES["context.nccl_p2p"]) + complete + "\n"
    report = _report(text + "step 1 loss 2.3\n" * 6)
    assert report["lead"] is None and report["exit_code"] == 0
    # Ending right there is a hang sign, but P2P is not singled out once init completed (a lead, exit 0).
    report = _report(text)
    assert report["lead"]["id"] == "nccl.init_hang" and report["exit_code"] == 0


def test_p2p_then_watchdog_timeout_leads_with_p2p() -> None:
    text = "".join(line + "\n" for line in LINES["context.nccl_p2p"]) + LINES["watchdog.timeout"][0] + "\n"
    report = _report(text)
    assert report["root_cause"] is None and report["lead"]["id"] == "nccl.p2p_suspect"


def test_only_a_timeout_says_the_cause_is_not_in_the_log() -> None:
    report = _report(LINES["watchdog.timeout"][0] + "\n")
    lead = report["lead"]
    assert lead["title"].startswith("Cause not in this log")
    assert "Collect:" in lead["reasoning"] and report["no_cause_found"]["fetch_next"]


@pytest.mark.parametrize("line", LINES["failure.unrecognised"][-4:])
def test_faulthandler_dump_and_unknown_nccl_error_are_failures(line: str) -> None:
    report = _report(line + "\n")
    assert report["exit_code"] == 1, line


def test_rendezvous_heartbeat_lost_is_the_root_not_the_sigterm() -> None:
    text = LINES["rdzv.connection_lost"][0] + "\n" + LINES["launch.sigterm_siblings"][0] + "\n"
    report = _report(text)
    assert report["root_cause"]["id"] == "rdzv.connection_lost"
    assert "launch.sigterm_siblings" in {c["id"] for c in report["consequences"]}


def _many_p2p_lines(n: int) -> str:
    """NCCL's P2P channel lines as a communicator of n channel/peer pairs prints them (digits varied), each a
    real quoted line of lines.json with its channel and peer numbers changed."""
    base = LINES["context.nccl_p2p"]
    out = []
    for i in range(n):
        line = base[i % len(base)]
        out.append(line.replace("Channel 00", f"Channel {i % 32:02d}").replace("Channel 01", f"Channel {i % 32:02d}"))
    return "".join(line + "\n" for line in out)


def test_p2p_lines_past_their_quota_still_tell_a_log_that_ends_on_them() -> None:
    # context.nccl_p2p leaves the prefilter after 64 lines of an input (a line printed hundreds of times per
    # communicator init cost a Python step each); the input's last two lines are still looked at.
    report = _report(_many_p2p_lines(300))
    assert report["lead"]["id"] == "nccl.p2p_suspect", report["lead"]
    # The same lines followed by training output: an ordinary NCCL_DEBUG=INFO run, no lead.
    report = _report(_many_p2p_lines(300) + "step 1 loss 2.3\n" * 6)
    assert report["lead"] is None or report["lead"]["id"] != "nccl.p2p_suspect", report["lead"]


def test_the_prefilter_skips_nccl_info_chatter_but_not_nccl_messages() -> None:
    from ddpdoctor.explain.kb import PREFILTER_GUARDS, trie_regex

    prefilter = re.compile(trie_regex([b"NCCL", b"NCCL WARN", b"Error"], PREFILTER_GUARDS))
    assert prefilter.search(b"gpu-node-17:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC") is None
    assert prefilter.search(b"node1:5:5 [0] NCCL WARN Call to connect returned").group() == b"NCCL WARN"
    assert prefilter.search(b"[rank0]: NCCL communicator was aborted on rank 0").group() == b"NCCL"
    assert prefilter.search(b"node1:5:5 [0] NCCL INFO Error: x").group() == b"Error"
