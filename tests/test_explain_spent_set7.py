"""Held-out set 7 is spent and now tunes the knowledge base: the 29 logs it did not get right when graded at
323a1ef (13 of 42 right; tests/fixtures/explain/spent-set7, copied unchanged; threads and causes in its README)
are a check on whole real logs. Figures on this set are tuning figures. Logs whose cause is not in the log (a
two-line watchdog message, a hang with no error line, a Kubernetes sidecar seen only as a stuck start) keep the
generic answer or a lead; the expectation pins it so a change is seen."""

from __future__ import annotations

from pathlib import Path

from test_explain_spent_set3 import explain_file

SPENT = Path(__file__).parent / "fixtures" / "explain" / "spent-set7"

# log -> (root cause id or None, lead id or None, exit code)
EXPECTED = {
    "v01": ("message.stated_cause", None, 1),
    "v02": (None, "watchdog.unconfirmed", 1),
    "v03": (None, None, 0),
    "w02": ("store.bind_permission_denied", None, 1),
    "w03": ("rdzv.store_unreachable", None, 1),
    "w05": (None, "watchdog.unconfirmed", 1),
    "w06": ("launch.ssh_unreachable", None, 1),
    "x01": ("rpc.tensorpipe_transport", None, 1),
    "x04": (None, None, 1),
    "x05": ("rpc.tensorpipe_transport", None, 1),
    "x06": ("rpc.tensorpipe_transport", None, 1),
    "x07": ("gloo.store_wait_timeout", None, 1),
    "x09": ("nccl.topology", None, 1),
    "x10": ("python.api_mismatch", None, 1),
    "x11": ("python.api_mismatch", None, 1),
    "y02": (None, None, 1),
    "y04": (None, None, 1),
    "y05": ("nccl.cuda_failure", None, 1),
    "y08": (None, "watchdog.timeout", 1),
    "y11": ("store.port_in_use", None, 1),
    "y12": ("python.api_mismatch", None, 1),
    "y13": (None, "watchdog.unconfirmed", 1),
    "y14": ("ddp.unused_parameters", None, 1),
    "z01": ("nccl.duplicate_gpu", None, 1),
    "z03": ("nccl.shm_removed", None, 1),
    "z04": ("nccl.memlock", None, 1),
    "z05": (None, "watchdog.timeout", 1),
    "z06": ("accelerate.shape_mismatch", None, 1),
    "z07": ("python.exception", None, 1),
}



def test_a_failure_shown_only_by_a_cpp_exception_or_signal_is_no_healthy_run() -> None:
    # libstdc++'s `what():`, gloo's store wait, c10's watchdog backtrace: failures, never exit 0.
    for name in ("x01", "x07", "y08", "x04"):
        assert explain_file(SPENT / f"{name}.log")["exit_code"] == 1, name


def test_a_version_mismatch_names_the_call() -> None:
    cause = explain_file(SPENT / "y12.log")["root_cause"]
    assert cause["id"] == "python.api_mismatch" and "site-packages" in cause["fix"]
