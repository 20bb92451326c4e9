"""Held-out set 8 is spent and now tunes the knowledge base: the 32 logs it did not get right when graded at
5ddf1db (12 of 44 right; tests/fixtures/explain/spent-set8, copied unchanged; threads and causes in its README)
are a check on whole real logs. Figures on this set are tuning figures. Logs whose cause is not in the log (a hang
with no error line, an EFA security group, a driver update seen only as a refused connection) keep the generic
answer or a lead; the expectation pins it so a change is seen."""

from __future__ import annotations

from pathlib import Path

SPENT = Path(__file__).parent / "fixtures" / "explain" / "spent-set8"

# log -> (root cause id or None, lead id or None, exit code)
EXPECTED = {
    "a01": (None, None, 0),
    "a02": (None, "nccl.socket_bridge_ifaces", 0),
    "a03": (None, None, 0),
    "b01": (None, "watchdog.unconfirmed", 1),
    "b02": (None, "watchdog.unconfirmed", 1),
    "b04": ("deepspeed.visible_devices_ignored", None, 1),
    "c01": (None, None, 1),
    "c02": ("nccl.cuda_failure", None, 1),
    "c03": ("message.stated_cause", None, 1),
    "c05": ("gpu.fabric_manager", None, 1),
    "c06": ("nccl.loopback_peer", None, 1),
    "c07": (None, None, 0),
    "c08": ("nccl.socket_refused", None, 1),
    "d02": ("ddp.unused_parameters", None, 1),
    "d03": (None, "nccl.system_error", 1),
    "d07": ("timeout.outlasted_by_local_work", None, 1),
    "d08": ("c10d.not_initialized", None, 1),
    "e01": ("nccl.topology_reverse_path", None, 1),
    "e02": (None, "nccl.system_error", 1),
    "e03": ("gloo.network_unreachable", None, 1),
    "e04": ("nccl.cuda_failure", None, 1),
    "e06": ("rpc.tensorpipe_transport", None, 1),
    "e07": ("rpc.tensorpipe_transport", None, 1),
    "f02": (None, "distributed.exception", 1),
    "f03": ("nccl.invalid_argument", None, 1),
    "f04": (None, "nccl.socket_bridge_ifaces", 0),
    "f05": ("fsdp.module_on_cpu", None, 1),
    "f06": ("ddp.device_ids_module", None, 1),
    "f07": (None, None, 0),
    "f08": ("python.exception", None, 1),
    "g03": ("store.barrier_timeout", None, 1),
    "g05": ("ddp.device_ids_module", None, 1),
}


