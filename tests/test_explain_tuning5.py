"""Tuning set 5 (tests/fixtures/explain/tuning5, real logs pasted in public threads; sources and grades in that
folder's README): the classes explain missed there, checked first on lines built from the printing
programs' formats (tests/fixtures/explain/lines.json and the formats below), then on the whole tuning logs.

The classes: old c10d's `host not found: <gai_strerror>`; OpenSSH's `ssh: connect to host H port P: ...` and
DeepSpeed's ssh check; init_process_group's store-based barrier timeout (worker count vs world size); Ray's
memory-monitor kills; NCCL's nvls.cc `Cuda failure` pasted without its closing quote; torch elastic's
`signal 9 (SIGKILL)` in lower case; gloo's loopback-fallback warning explaining a later gloo failure;
Lightning's start lines for every rank ending the log (a hang at the first collective); torchrun's
failure summary as the only failure sign (the earliest block names the first failing rank); mpirun's
summary as the only failure sign (a lead naming the rank orterun names, when it does)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from test_explain_spent_set3 import explain_file

from ddpdoctor.explain import explain, load_knowledge_base, scan_inputs

FIXTURES = Path(__file__).parent / "fixtures" / "explain"
TUNING = FIXTURES / "tuning5"
KB = load_knowledge_base()
LINES: dict[str, list[str]] = {}
for _item in json.loads((FIXTURES / "lines.json").read_text())["lines"]:
    LINES.setdefault(_item["signature"], []).append(_item["line"])

# log -> (root cause id or None, lead id or None, exit code)
EXPECTED = {
    "accelerate-1519-launcher-summary-only": (None, "launch.first_failure", 1),
    "amvur-2-sigkill-flattened-summary": ("launch.sigkill", None, 1),
    "diffsynth-1001-unused-params-rank-prefix": ("ddp.unused_parameters", None, 1),
    "diffusion-planner-65-unused-params-quoted": ("ddp.unused_parameters", None, 1),
    "dope-297-bus-error-docker": ("dataloader.bus_error", None, 1),
    "dsexamples-894-pdsh-localhost-refused": ("launch.ssh_unreachable", None, 1),
    "easyr1-185-raylet-oom": ("ray.oom_kill", None, 1),
    "eva-3-deepspeed-ssh-no-route": ("launch.ssh_unreachable", None, 1),
    "horovod-2656-mpirun-summary-only": (None, "launch.mpirun_failure", 1),
    "horovod-3929-duplicate-gpu-tagged": ("nccl.duplicate_gpu", None, 1),
    "kubeflow-po-313-host-not-found-quoted": ("c10d.hostname_unresolved", None, 1),
    "kubeflow-po-333-host-not-found": ("c10d.hostname_unresolved", None, 1),
    "lightning-4612-hang-after-init-ddp": (None, "launch.init_hang", 0),
    "lmeval-1404-watchdog-slow-rank": (None, "watchdog.unconfirmed", 1),
    "marin-7018-jax-bootstrap-no-interface": ("nccl.no_socket_interface", None, 1),
    "megatron-661-duplicate-gpu-interleaved": ("nccl.duplicate_gpu", None, 1),
    "minimax01-42-vllm-shm-segment": ("nccl.shm", None, 1),
    "nccl-1235-oom-after-peer-closed": ("nccl.cuda_failure", None, 1),
    "nccl-1485-oom-proxy-setup": ("nccl.cuda_failure", None, 1),
    "nccl-tests-276-nvls-unknown-error": ("nccl.nvls_setup", None, 1),
    "pytorch-113128-ecc-tee-prefix": ("gpu.ecc", None, 1),
    "pytorch-73682-elastic-host-not-found": ("c10d.hostname_unresolved", None, 1),
    "returnn-1486-gpu-lost-pcie": ("gpu.fallen_off_bus", None, 1),
    "tczhangzhi-18-barrier-too-many-workers": ("store.barrier_timeout", None, 1),
    "trixie-9-driver-too-old-assertion": ("device.driver_too_old", None, 1),
    "vim-61-invalid-ordinal-interleaved": ("device.invalid_ordinal", None, 1),
    "vllm-1160-raylet-oom-syslog-escaped": ("ray.oom_kill", None, 1),
    "vllm-7074-gloo-loopback-fallback": ("gloo.loopback_fallback", None, 1),
    "vlmr1-289-port-in-use": ("store.port_in_use", None, 1),
}
# Consequences that must never be reported as the root cause of these logs.
NEVER_ROOT = {"nccl.socket_closed", "nccl.warn.proxy", "launch.child_failed", "launch.spawn_raised",
              "catalogue.c10d.network", "python.exception", "nccl.warn"}


def _report(text: str) -> dict:
    return explain(KB, scan_inputs(KB, [("input.log", io.BytesIO(text.encode()))])).to_dict()


# ---------------------------------------------------------------- from the source formats
@pytest.mark.parametrize(
    ("sig", "generic"),
    [
        ("c10d.hostname_unresolved", "python.exception"),
        ("launch.ssh_unreachable", "python.exception"),
        ("store.barrier_timeout", None),
        ("ray.oom_kill", None),
        ("nccl.nvls_setup", "nccl.warn"),
    ],
)
def test_format_line_is_its_own_root_cause(sig: str, generic: str | None) -> None:
    for line in LINES[sig]:
        report = _report(line + "\n")
        assert report["root_cause"]["id"] == sig, line
        assert generic not in {c["id"] for c in report["consequences"]}


def test_barrier_timeout_states_both_counts() -> None:
    root = _report(LINES["store.barrier_timeout"][0] + "\n")["root_cause"]
    assert root["data"]["world_size"] == "2" and root["data"]["joined"] == "4"
    assert "world_size=2, worker_count=4" in root["cause"] and "mp.spawn" in root["cause"]


def test_ray_kill_summary_wrapped_by_a_terminal_is_still_read() -> None:
    # rsyslog escapes ESC as #033 and a fixed-width paste breaks the line inside "tasks / actors": the
    # second half still carries Ray's format.
    line = LINES["ray.oom_kill"][0]
    head, tail = line.split("(tasks / ", 1)
    text = "#033[2m#033[33m" + head + "(tasks /\n " + tail + "\n"
    assert _report(text)["root_cause"]["id"] == "ray.oom_kill"


def test_sigkill_summary_field_in_either_case() -> None:
    for line in LINES["launch.sigkill"]:
        if "received by PID" in line:
            assert _report(line + "\n")["root_cause"]["id"] == "launch.sigkill", line


def test_gloo_loopback_fallback_alone_is_a_lead_not_a_failure() -> None:
    # Printed by every healthy single-host run whose host name maps to 127.0.1.1.
    report = _report(LINES["gloo.loopback_fallback"][0] + "\n")
    assert report["root_cause"] is None and report["lead"]["id"] == "gloo.loopback_fallback"
    assert report["exit_code"] == 0


def test_gloo_loopback_fallback_explains_the_gloo_failure_after_it() -> None:
    failure = "[rank8]:[E ProcessGroupGloo.cpp:144] Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"
    report = _report(LINES["gloo.loopback_fallback"][0] + "\n" + failure + "\n")
    assert report["root_cause"]["id"] == "gloo.loopback_fallback"
    assert "gloo.full_mesh" in {c["id"] for c in report["consequences"]}
    assert "GLOO_SOCKET_IFNAME" in report["root_cause"]["fix"] and report["exit_code"] == 1
    # The failure alone is gloo's mesh that did not connect (spent set 13, e05): GLOO_SOCKET_IFNAME first.
    alone = _report(failure + "\n")["root_cause"]
    assert alone["id"] == "gloo.full_mesh" and "GLOO_SOCKET_IFNAME" in alone["fix"]


def _start_lines(world: int) -> str:
    fmt = LINES["context.lightning_rank"][0]  # Lightning's format, rank 0 of 4
    return "".join(
        fmt.replace("GLOBAL_RANK: 0", f"GLOBAL_RANK: {r}").replace("MEMBER: 1/4", f"MEMBER: {r + 1}/{world}") + "\n"
        for r in range(world)
    )


def test_every_rank_started_and_the_log_ends_is_a_hang_lead() -> None:
    report = _report(_start_lines(2))
    assert report["root_cause"] is None and report["lead"]["id"] == "launch.init_hang"
    assert report["lead"]["data"] == {"ranks_seen": [0, 1], "world_size": 2}
    assert "NCCL_P2P_DISABLE=1" in report["lead"]["fix"] and "py-spy" in report["lead"]["fix"]
    assert report["exit_code"] == 0  # the log may just have been cut: a lead, not a failure
    # Training output after the start lines: an ordinary run.
    assert _report(_start_lines(2) + "Epoch 0:  50%|#####     | 5/10\n")["lead"] is None


# torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py): one block per
# agent, each with its own 'Root Cause (first observed failure)'.
def _summary(rank: int, local_rank: int, host: str, time: str, exitcode: int) -> str:
    return (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "train.py FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n"
        "  <NO_OTHER_FAILURES>\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        f"  time      : {time}\n"
        f"  host      : {host}\n"
        f"  rank      : {rank} (local_rank: {local_rank})\n"
        f"  exitcode  : {exitcode} (pid: 4242)\n"
        "  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "============================================================\n"
    )


def test_summary_only_leads_to_the_earliest_failing_rank() -> None:
    # The second block in the log failed first in time.
    text = _summary(0, 0, "node-a", "2024-05-06_10:12:40", 1) + _summary(4, 0, "node-b", "2024-05-06_10:11:59", 1)
    report = _report(text)
    lead = report["lead"]
    assert report["root_cause"] is None and lead["id"] == "launch.first_failure"
    assert lead["data"]["rank"] == 4 and lead["hosts"] == ["node-b"] and lead["data"]["exitcode"] == 1
    assert "earliest of 2" in lead["reasoning"]
    assert "rank 4's own output on node-b" in report["no_cause_found"]["fetch_next"][0]
    assert report["exit_code"] == 1


def test_summary_with_a_signal_is_not_a_bare_lead() -> None:
    # -9 comes with torch elastic's 'Signal 9 (SIGKILL) received by PID' line: that is the root cause.
    text = _summary(1, 1, "node-a", "2024-05-06_10:12:40", -9).replace(
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html", "Signal 9 (SIGKILL) received by PID 4242"
    )
    assert _report(text)["root_cause"]["id"] == "launch.sigkill"


def test_mpirun_summary_only_says_which_output_to_collect() -> None:
    # orterun's help-orterun.txt text.
    text = (
        "Primary job  terminated normally, but 1 process returned\n"
        "a non-zero exit code. Per user-direction, the job has been aborted.\n"
    )
    report = _report(text)
    assert report["root_cause"] is None and report["exit_code"] == 1
    assert report["lead"]["id"] == "launch.mpirun_failure" and report["lead"]["ranks"] == []
    assert "mpirun --tag-output" in report["no_cause_found"]["fetch_next"][0]
    # orterun's block naming the first process: that rank is the lead's.
    named = (
        "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
        "the job to be terminated. The first process to do so was:\n\n"
        + LINES["context.mpirun_process"][0].replace("],0]", "],3]")
        + "\n  Exit code:    1\n"
    )
    lead = _report(named)["lead"]
    assert lead["id"] == "launch.mpirun_failure" and lead["ranks"] == [3] and "rank 3" in lead["reasoning"]


# ---------------------------------------------------------------- the tuning logs
def test_every_tuning_log_has_an_expectation() -> None:
    assert sorted(p.stem for p in TUNING.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tuning_log_is_explained(name: str) -> None:
    report = explain_file(TUNING / f"{name}.log")
    root, lead, code = EXPECTED[name]
    assert (report["root_cause"] or {}).get("id") == root
    assert (report["lead"] or {}).get("id") == lead
    assert report["exit_code"] == code
    assert (report["root_cause"] or {}).get("id") not in NEVER_ROOT


def test_out_of_memory_in_nccl_beats_the_closed_socket_printed_first() -> None:
    # nccl-1235: the peer's 'Connection closed' comes first in the log; the rank that ran out of memory is
    # the cause.
    root = explain_file(TUNING / "nccl-1235-oom-after-peer-closed.log")["root_cause"]
    assert root["data"]["what"] == "out of memory" and "NCCL_BUFFSIZE" in root["fix"]


def _init_complete(ranks: list[int], nranks: int) -> str:
    fmt = LINES["context.nccl_comm_init"][0]  # NCCL's init.cc format: rank 7 of nranks 10
    return "".join(
        fmt.replace("[7]", f"[{r}]").replace("rank 7 nranks 10", f"rank {r} nranks {nranks}") + "\n" for r in ranks
    )


def test_log_ending_at_nccl_init_is_a_hang_lead() -> None:
    report = _report(_init_complete([0, 1], 2))
    lead = report["lead"]
    assert report["root_cause"] is None and lead["id"] == "nccl.init_hang"
    assert lead["data"] == {"nranks": 2, "ranks_init_complete": [0, 1]}
    assert "py-spy" in lead["fix"] and "NCCL_P2P_DISABLE=1" in lead["fix"] and report["exit_code"] == 0
    # Fewer ranks than nranks completed init: said so.
    assert "only 1 of 2 ranks" in _report(_init_complete([0], 2))["lead"]["reasoning"]
    # Training output after init: an ordinary run.
    assert _report(_init_complete([0, 1], 2) + "step 1 loss 2.3\n" * 6)["lead"] is None
