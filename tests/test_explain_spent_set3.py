"""The logs of held-out set 3 that explain missed when it was graded (tests/fixtures/explain/spent-set3, copied
unchanged; sources in that folder's README): the set is spent and now tunes the knowledge base, so these
check, on whole real logs, what tests/fixtures/explain/lines.json checks line by line from the source formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.explain import explain, load_knowledge_base, open_log, scan_inputs

SPENT = Path(__file__).parent / "fixtures" / "explain" / "spent-set3"
KB = load_knowledge_base()

# log -> (root cause id or None, lead id or None)
EXPECTED = {
    "h3-01-slurm-torchrun-missing": ("slurm.execve_failed", None),
    "h3-05-nccl-socket-too-many-ifaces": (None, "nccl.socket_bridge_ifaces"),
    "h3-08-nvls-multicast-fm-not-running": ("nccl.nvls_setup", None),
    "h3-09-ofi-register-mr-efa-version": ("nccl.ofi_register_mr", None),
    "h3-10-ofi-plugin-libibverbs-conflict": ("nccl.net_plugin_load", None),
    "h3-11-gloo-numeric-hostname": ("gloo.address_not_local", None),
    "h3-12-nccl-segfault-xorg-p2p": (None, "launch.mpirun_failure"),  # mpirun names rank 8: a lead since tuning set 5
    "h3-13-rdzv-wrong-master-addr": ("store.master_addr_invalid", None),
}
# Logs that show no failure, only a hazard that explains one when the run failed (the grader's cause).
HAZARD_ONLY = {"h3-05-nccl-socket-too-many-ifaces"}


def explain_file(path: Path) -> dict:
    """explain's report on one whole log, under a neutral name (as the graders ran it)."""
    with open_log(str(path)) as stream:
        return explain(KB, scan_inputs(KB, [("input.log", stream)])).to_dict()


def assert_explained(path: Path, root: str | None, lead: str | None, code: int) -> None:
    """A spent log's root cause, lead and exit code are the ones its set's test expects (sets 5 and 6)."""
    report = explain_file(path)
    assert (report["root_cause"] or {}).get("id") == root
    assert (report["lead"] or {}).get("id") == lead
    assert report["exit_code"] == code


def _explain(name: str) -> dict:
    return explain_file(SPENT / f"{name}.log")


def test_every_spent_log_has_an_expectation() -> None:
    assert sorted(p.stem for p in SPENT.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_spent_log_is_explained(name: str) -> None:
    report = _explain(name)
    root, lead = EXPECTED[name]
    assert (report["root_cause"] or {}).get("id") == root
    assert (report["lead"] or {}).get("id") == lead
    # Every one of these runs failed, and each log but one shows a failure: none of those may exit 0.
    # h3-05 is only NCCL's interface list, printed by healthy runs too: its bridges are a lead (exit 0).
    assert report["exit_code"] == (0 if name in HAZARD_ONLY else 1)


def test_failed_run_with_no_known_cause_says_so() -> None:
    # mpirun's non-zero exit is a failure sign: exit 1 and "no cause found", not "nothing found".
    report = _explain("h3-12-nccl-segfault-xorg-p2p")
    assert [c["id"] for c in report["consequences"]] == ["failure.unrecognised"]
    assert report["no_cause_found"] is not None


def test_numeric_host_name_is_named() -> None:
    root = _explain("h3-11-gloo-numeric-hostname")["root_cause"]
    assert "0.0.0.N" in root["cause"] and root["data"]["addr"] == "0.0.0.189"


def test_wrapped_interface_list_is_joined() -> None:
    # The paste put one interface per line; the bridge is on the second line after `Using`.
    lead = _explain("h3-05-nccl-socket-too-many-ifaces")["lead"]
    assert lead["data"]["iface"].startswith("br-")
