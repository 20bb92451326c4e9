"""Consequences (lost Ray actors, elastic restarts, ChildFailedError, SIGTERM to siblings) are never the root
cause nor the lead; with no root cause the best-supported lead is printed by default, marked as a lead.

The logs are built from real lines quoted in tests/fixtures/explain/lines.json (sources there): a Ray
restart cascade over a gloo error, torchrun's wrapper over a c10d store timeout, the --master_addr hint."""

from __future__ import annotations

import io
import json
from pathlib import Path

from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.explain import explain, load_knowledge_base, scan_inputs

KB = load_knowledge_base()
LINES: dict[str, list[str]] = {}
for _item in json.loads((Path(__file__).parent / "fixtures" / "explain" / "lines.json").read_text())["lines"]:
    LINES.setdefault(_item["signature"], []).append(_item["line"])

RAY_OVER_GLOO = "\n".join(
    [
        LINES["gloo.connection_closed"][0],  # RVC-Project/Retrieval-based-Voice-Conversion-WebUI#1882
        LINES["ray.actor_lost"][0],
        LINES["launch.elastic_restart"][0],
        LINES["launch.sigterm_siblings"][0],  # hpcaitech/ColossalAI#3514
        LINES["ray.actor_lost"][0],
    ]
) + "\n"


def run(text: str):
    return explain(KB, scan_inputs(KB, [("job.log", io.BytesIO(text.encode()))]))


def test_restart_cascade_is_never_root_nor_lead_over_a_gloo_error() -> None:
    ex = run(RAY_OVER_GLOO)
    assert ex.root is None
    assert ex.lead is not None and ex.lead.id == "gloo.connection_closed"
    ids = {d.id for d in ex.consequences}
    assert {"ray.actor_lost", "launch.elastic_restart", "launch.sigterm_siblings"} <= ids
    doc = ex.to_dict()
    assert doc["root_cause"] is None
    assert doc["lead"]["id"] == "gloo.connection_closed" and doc["lead"]["kind"] == "lead"
    assert "not a confirmed cause" in doc["lead"]["note"]


def test_c10d_error_is_the_lead_under_torchrun_wrappers() -> None:
    log = "\n".join(
        [
            LINES["launch.sigterm_siblings"][1],  # NVIDIA/nvidia-resiliency-ext#18
            LINES["store.connect_timeout"][1],  # pytorch/pytorch#107021
            LINES["launch.child_failed"][0],  # lzhxmu/CPPO#6
        ]
    ) + "\n"
    ex = run(log)
    assert ex.root is None
    assert ex.lead is not None and ex.lead.id == "store.connect_timeout"


def test_lead_hint_outranks_the_symptom_it_explains() -> None:
    # NVIDIA/nccl#1267's torchrun warning: with c10d rendezvous --master_addr is ignored.
    log = LINES["launch.master_addr_ignored"][0] + "\n" + LINES["store.connect_timeout"][1] + "\n"
    ex = run(log)
    assert ex.root is None
    assert ex.lead is not None and ex.lead.id == "launch.master_addr_ignored"


def test_only_consequences_give_no_lead() -> None:
    ex = run(LINES["launch.sigterm_siblings"][0] + "\n" + LINES["ray.actor_lost"][0] + "\n")
    assert ex.root is None and ex.lead is None
    assert ex.to_dict()["lead"] is None


def test_a_root_cause_leaves_no_lead() -> None:
    ex = run(RAY_OVER_GLOO + LINES["device.cuda_oom"][0] + "\n")
    assert ex.root is not None and ex.root.id == "device.cuda_oom"
    assert ex.lead is None


def test_lead_is_printed_by_default_in_text_and_json(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    log = tmp_path / "job.log"
    log.write_text(RAY_OVER_GLOO)
    res = CliRunner().invoke(app, ["explain", str(log)])
    assert res.exit_code == 1
    assert "no cause found in these logs" in res.output
    assert "LEAD (not a confirmed cause)" in res.output and "[gloo.connection_closed]" in res.output
    res = CliRunner().invoke(app, ["explain", "--json", str(log)])
    doc = json.loads(res.output)
    assert doc["root_cause"] is None and doc["lead"]["id"] == "gloo.connection_closed"
