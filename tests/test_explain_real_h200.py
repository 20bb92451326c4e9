"""`explain` on real failures captured on the lent H200 node (tests/fixtures/explain/README.md, real-h200):
each run's whole output, as torchrun printed it, names the cause the script provoked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app

LOGS = Path(__file__).parent / "fixtures" / "explain" / "real-h200"

EXPECTED = {
    # log: (root cause id, a phrase of its title or cause that names the provoked mechanism)
    "ordinal": ("device.invalid_ordinal", "more processes than GPUs"),
    "cpu_tensor": ("c10d.cpu_tensor_nccl", "CPU tensor"),
    "device_assert": ("catalogue.cuda.kernel_fault", "device assert"),
    "gather_dtype": ("message.stated_cause", "same type as input tensor"),
    "gather_size": ("message.stated_cause", "world_size times input tensor size"),
    "ifname": ("nccl.no_socket_interface", "NCCL_SOCKET_IFNAME"),
    "net_ib": ("nccl.net_plugin_none", "NCCL_NET=IB"),
    "comm_id": ("nccl.comm_id_no_subnet", "NCCL_COMM_ID"),
    "nccl_oom": ("nccl.cuda_failure", "out of memory"),
    "oom": ("device.cuda_oom", "out of memory"),
}


def _explain(name: str) -> dict:
    result = CliRunner().invoke(app, ["explain", str(LOGS / f"{name}.log"), "--json"])
    report = json.loads(result.stdout)
    report["_exit"] = result.exit_code
    return report


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_h200_failure_is_named(name: str) -> None:
    meta = json.loads((LOGS / "meta.json").read_text())
    assert meta[name]["exit"] == 1  # the run failed, as the log shows
    report = _explain(name)
    root = report["root_cause"]
    expected_id, phrase = EXPECTED[name]
    assert root and root["id"] == expected_id, root
    assert phrase.lower() in (root["title"] + " " + root["cause"]).lower(), root
    assert report["_exit"] == 1


def test_healthy_run_with_an_unknown_nccl_algo_is_not_a_failure() -> None:
    assert json.loads((LOGS / "meta.json").read_text())["algo"]["exit"] == 0
    report = _explain("algo")
    assert report["root_cause"] is None and report["_exit"] == 0

