"""Held-out set 9 is spent and now tunes the knowledge base: the 34 logs it did not get right when graded at
4169505 (14 of 48 right; tests/fixtures/explain/spent-set9, copied unchanged; threads and causes in its README)
are a check on whole real logs. Figures on this set are tuning figures. Logs whose cause is not in the log, or
that only a library's own bug explains (fairscale, an elastic release), keep the generic answer or a lead; the
expectation pins it so a change is seen."""

from __future__ import annotations

from pathlib import Path

from test_explain_spent_set3 import assert_explained

SPENT = Path(__file__).parent / "fixtures" / "explain" / "spent-set9"

# log -> (root cause id or None, lead id or None, exit code)
EXPECTED = {
    "a02": ("nccl.cuda_driver_old", None, 1),
    "a03": ("gloo.address_family", None, 1),
    "a04": (None, "nccl.internal_error", 1),
    "b01": ("rdzv.store_unreachable", None, 1),
    "b02": (None, "distributed.exception", 1),
    "b04": ("ddp.unused_parameters", None, 1),
    "c01": ("nccl.warn.proxy", None, 1),
    "c02": (None, None, 0),
    "c03": (None, None, 1),
    "c05": (None, "launch.init_hang", 0),
    "c06": ("nccl.warn.p2p", None, 1),
    "c07": (None, "watchdog.timeout", 1),
    "e03": ("watchdog.straggler", None, 1),
    "e06": ("store.port_in_use", None, 1),
    "e07": ("device.invalid_ordinal", None, 1),
    "f01": ("python.library_exception", None, 1),
    "f02": ("python.library_exception", None, 1),
    "f03": ("message.stated_cause", None, 1),
    "f04": ("python.library_exception", None, 1),
    "f05": (None, "watchdog.timeout", 1),
    "f06": ("rdzv.closed", None, 1),
    "f07": ("message.stated_cause", None, 1),
    "f08": ("deepspeed.no_hostfile", None, 1),
    "g03": ("ddp.ready_twice", None, 1),
    "g04": ("c10d.not_initialized", None, 1),
    "g05": (None, "distributed.exception", 1),
    "h01": ("nccl.cuda_init_error", None, 1),
    "h02": (None, None, 0),
    "h03": (None, "nccl_tests.hang", 0),
    "h04": ("extension.undefined_symbol", None, 1),
    "h05": ("nccl.ib_modify_qp", None, 1),  # since session 13 (was the catalogue's nccl.warn.ib)
    "h06": ("nccl.ofi_no_provider", None, 1),
    "h07": ("nccl.warn.socket", None, 1),
    "h08": ("nccl.gdr_disabled", None, 1),
}



def test_the_cuda_runtime_unloading_is_never_the_cause() -> None:
    """g05 (pytorch/pytorch, gloo): a gloo `Read timeout` and, at teardown, `what(): driver shutting down`
    (cudaErrorCudartUnloading). The CUDA line is the process exiting, a consequence (catalogue class
    cuda.teardown); graded at 4169505 it was named the root cause as a driver/runtime mismatch."""
    assert EXPECTED["g05"][0] is None
    assert_explained(SPENT / "g05.log", None, "distributed.exception", 1)
