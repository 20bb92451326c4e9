"""The REAL ibstat / ibv_devinfo / ibstatus binaries (Debian's infiniband-diags and ibverbs-utils, which
.ci/run installs): on a machine without RDMA hardware the rdma area must give a clean skip."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from ddpdoctor.checks.rdma import AREA, IBSTAT, IBSTATUS, IBV_DEVINFO
from ddpdoctor.cli import app
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import Severity
from ddpdoctor.edge.runner import run_argv
from ddpdoctor.edge.sources import LiveSources
from ddpdoctor.parsers.ibstat import parse_ibstat
from ddpdoctor.parsers.ibstatus import parse_ibstatus
from ddpdoctor.parsers.ibv_devinfo import parse_ibv_devinfo

MISSING = [tool for tool in ("ibstat", "ibv_devinfo") if shutil.which(tool) is None]


def _has_rdma_hardware() -> bool:
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"{', '.join(MISSING)} not installed (apt-get install infiniband-diags ibverbs-utils; .ci/run does)",
    ),
    pytest.mark.skipif(
        _has_rdma_hardware(), reason="this host has RDMA devices: the no-device skip does not apply"
    ),
]


def test_real_tools_report_no_devices() -> None:
    ibstat = run_argv(IBSTAT.argv, timeout_s=20)
    assert ibstat.found and not ibstat.timed_out
    assert parse_ibstat(ibstat.stdout + ibstat.stderr).devices == []
    devinfo = run_argv(IBV_DEVINFO.argv, timeout_s=20)
    assert devinfo.found and not devinfo.timed_out and devinfo.returncode != 0
    parsed = parse_ibv_devinfo(devinfo.stdout + devinfo.stderr)
    # "No IB devices found" (ib_core loaded) or "Failed to get IB devices list: ..." (no RDMA in the kernel)
    assert parsed.devices == [] and parsed.errors
    if shutil.which("ibstatus"):
        status = run_argv(IBSTATUS.argv, timeout_s=20)
        assert parse_ibstatus(status.stdout + status.stderr).devices == []


def test_live_rdma_area_is_a_clean_skip() -> None:
    report = run_checks(LiveSources(), [AREA], timeout_s=30)
    by_id = {f.id: f for f in report.findings}
    skip = by_id["rdma.devices.absent"]
    assert skip.severity == Severity.SKIP and "TCP sockets" in skip.summary
    sources = {e.source for e in skip.evidence}
    assert {"ibstat", "ibv_devinfo -v"} <= sources  # the real binaries ran and are shown
    # No RDMA: no port, memlock or tool-error verdicts, and nothing inconclusive from the RDMA probes.
    assert not {"rdma.port.state", "rdma.memlock", "rdma.tools.errors"} & set(by_id)
    assert all(f.severity != Severity.ERROR for f in report.findings)


def test_cli_check_only_rdma_exits_zero() -> None:
    res = CliRunner().invoke(app, ["check", "--only", "rdma", "--json"])
    assert res.exit_code == 0, res.output
    ids = {f["id"]: f["severity"] for f in json.loads(res.output)["findings"]}
    assert ids["rdma.devices.absent"] == "skip"
