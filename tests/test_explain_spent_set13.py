"""Held-out set 13 is spent and now tunes the knowledge base: the 21 logs it did not get right when graded at
7c0b92e (20 of 41 right; tests/fixtures/explain/spent-set13, copied unchanged; threads and causes in its README)
are a check on whole real logs. Figures on this set are tuning figures. Logs whose cause is not in the log (a
silent hang, a service mesh, a driver that breaks P2P) keep the generic answer, a lead or nothing; the
expectation pins it so a change is seen."""

from __future__ import annotations

import io
from pathlib import Path

from test_explain_spent_set3 import explain_file

from ddpdoctor.explain.kb import load_knowledge_base
from ddpdoctor.explain.reason import explain
from ddpdoctor.explain.scan import scan_inputs

SPENT = Path(__file__).parent / "fixtures" / "explain" / "spent-set13"

# log -> (root cause id or None, lead id or None, exit code)
EXPECTED = {
    "a01": ("nccl.ib_modify_qp", None, 1),  # one RoCE HCA of the node unusable: excluding it is the fix
    "a02": ("nccl.ib_retry_exceeded", None, 1),  # NIC-to-NIC inside the node unreachable (NCCL_NET_DISABLE_INTRA)
    "a07": (None, None, 0),  # an Istio sidecar breaks NCCL's connections: nothing in the log
    "b02": (None, "store.connect_timeout", 1),
    "b03": (None, "watchdog.heartbeat", 1),  # a train/eval branch that differs by rank: only the code shows it
    "b04": ("nccl.nvls_setup", None, 1),  # NVLS with an NCCL newer than the driver's CUDA
    "c02": (None, None, 0),  # a FileLock on NFS hangs at exit: nothing distributed in the log
    "c03": (None, None, 1),  # metric keys that differ by rank: a cut traceback through Lightning's sync
    "c04": ("nccl.warn.message_truncated", None, 1),
    "c05": ("device.ordinal_renumbered", None, 1),
    "c08": (None, "nccl.socket_closed", 1),  # NCCL_SOCKET_IFNAME=^docker0 lets NCCL use lo (not in the log)
    "d02": (None, "nccl.invalid_usage", 1),  # two ranks on GPU 0, without NCCL's 'Duplicate GPU' line
    "d05": (None, "watchdog.timeout", 1),
    "e01": (None, None, 0),  # broken GPU P2P: the paste has no failure line
    "e02": (None, "watchdog.unconfirmed", 1),
    "e03": ("timeout.outlasted_by_local_work", None, 1),
    "e05": ("gloo.full_mesh", None, 1),
    "e06": (None, "store.socket_timeout", 1),
    "f05": ("message.stated_cause", None, 1),
    "f06": ("message.stated_cause", None, 1),
    "f08": ("message.stated_cause", None, 1),
}


def test_invalid_ordinal_in_a_ray_worker_is_the_renumbered_gpu_id() -> None:
    """c05: Ray Train's prepare_model set the physical GPU id; graded at 7c0b92e the cause led with 'more
    processes than GPUs' (partial)."""
    root = explain_file(SPENT / "c05.log")["root_cause"]
    assert "CUDA_VISIBLE_DEVICES" in root["title"] and "ray.get_gpu_ids()" in root["cause"]


def test_gloo_full_mesh_names_the_interface_gloo_picked() -> None:
    root = explain_file(SPENT / "e05.log")["root_cause"]
    assert root["fix"].startswith("Set GLOO_SOCKET_IFNAME")


def test_lightning_refusal_is_quoted_as_the_stated_cause() -> None:
    """f05, f08: 'is not compatible with an interactive environment' was a generic unhandled exception."""
    for name in ("f05", "f08"):
        root = explain_file(SPENT / f"{name}.log")["root_cause"]
        assert "not compatible with an interactive environment" in root["title"], root


def test_message_truncated_on_the_socket_transport_leads_with_mismatched_sizes() -> None:
    """c04: pipeline stages that sent and received tensors of different dtypes; the cause led with an NCCL
    2.19/2.20 bootstrap bug (partial)."""
    cause = explain_file(SPENT / "c04.log")["root_cause"]["cause"]
    assert cause.index("different sizes") < cause.index("2.19")


def test_traceback_glued_to_a_bar_just_past_the_default_timeout() -> None:
    """e03: the paste ends in a progress bar at 30:09 with a traceback glued to it and no timeout line; 30
    minutes is init_process_group's default."""
    bar = "Running tokenizer on dataset:  47%|####8     | 1695000/3634744 [{t}<33:25, 967.30 examples/s]"
    log = bar + "Traceback (most recent call last):\n  File \"train.py\", line 14, in <module>\n    main()\n"
    kb = load_knowledge_base()
    root = explain(kb, scan_inputs(kb, [("x.log", io.BytesIO(log.format(t="30:09").encode()))])).root
    assert root is not None and root.id == "timeout.outlasted_by_local_work" and "47%" in root.cause
    # Far from the default (12 minutes), a cut traceback says nothing about a timeout.
    root = explain(kb, scan_inputs(kb, [("x.log", io.BytesIO(log.format(t="12:09").encode()))])).root
    assert root is None or root.id != "timeout.outlasted_by_local_work"
