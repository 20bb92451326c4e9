"""The merge of `ddpdoctor hang --cluster`, on its own: hand-built per-node reports in the documented
ddpdoctor.hang/1 schema (each validated against docs/schemas/hang.schema.json before it is merged), and
the merged report validated against docs/schemas/hang-cluster.schema.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import jsonschema
import pytest
from referencing import Registry, Resource

from ddpdoctor.cluster.report import LOST, MISSING, NO_DATA, REPORTED, NodeIdentity, NodeResult
from ddpdoctor.hang.merge import merge_hang_reports
from ddpdoctor.render.hang import render_hang_cluster_markdown

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"
NODE_SCHEMA = json.loads((SCHEMAS / "hang.schema.json").read_text())
CLUSTER_SCHEMA = json.loads((SCHEMAS / "hang-cluster.schema.json").read_text())
REGISTRY = Registry().with_resources(
    [(s["$id"], Resource.from_contents(s)) for s in (NODE_SCHEMA, CLUSTER_SCHEMA)]
)

TRAIN = "/job/train.py"
WAITING = (f"{TRAIN}:55 in main() (in all_reduce)", "all_reduce")
SLEEPING = (f"{TRAIN}:54 in main(), inside sleep()", None)


def validate_cluster(data: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(CLUSTER_SCHEMA, registry=REGISTRY).validate(data)


def node_report(
    host: str,
    ranks: dict[int, tuple[int, Optional[tuple[str, Optional[str]]]]],
    world: int,
    kind: str = "none",
    summary: str = "no sign of a hang",
    severity: str = "ok",
    culprits: Optional[list[dict[str, Any]]] = None,
    source: Optional[str] = None,
    last_enqueued: Optional[dict[int, int]] = None,
    fr_ranks: Optional[list[int]] = None,
) -> dict[str, Any]:
    """A ddpdoctor.hang/1 report as one node prints it: ranks {rank: (pid, (where, waiting_in) or None)}."""
    stacks = [
        {
            "rank": rank, "pid": pid, "where": stack[0] if stack else None,
            "waiting_in": stack[1] if stack else None, "frames": [stack[0]] if stack else [],
            "error": None if stack else "Permission denied", "error_kind": None if stack else "permission",
        }
        for rank, (pid, stack) in sorted(ranks.items())
    ]
    groups: dict[tuple[str, Optional[str]], list[int]] = {}
    for rank, (_, stack) in sorted(ranks.items()):
        if stack:
            groups.setdefault(stack, []).append(rank)
    culprits = culprits or []
    fr = None
    if last_enqueued is not None:
        fr = {"ranks": fr_ranks or sorted(last_enqueued), "divergences": [], "errors": [],
              "last_enqueued": {"0": {str(r): s for r, s in last_enqueued.items()}}}
    report = {
        "schema": "ddpdoctor.hang/1",
        "tool": {"name": "ddpdoctor", "version": "0.0.0"},
        "host": host,
        "duration_s": 0.8,
        "exit_code": {"fail": 1, "error": 3}.get(severity, 0),
        "verdict": {
            "kind": kind, "summary": summary, "culprit_ranks": [c["rank"] for c in culprits], "other_ranks": [],
            "culprits": culprits, "collective": None, "tie": False, "fix": "", "source": source,
        },
        "job": {"agent_pid": 100, "world_size": world,
                "ranks": [{"rank": r, "local_rank": i, "pid": pid} for i, (r, (pid, _)) in enumerate(sorted(ranks.items()))]},
        "stacks": stacks,
        "stack_groups": [{"ranks": rs, "where": w, "waiting_in": wi} for (w, wi), rs in groups.items()],
        "ras": None,
        "flight_recorder": fr,
        "findings": [{"id": "hang.verdict", "area": "hang", "severity": severity, "title": "Why the job hangs",
                      "summary": summary, "evidence": [], "fix": None, "data": {}}],
    }
    jsonschema.validate(report, NODE_SCHEMA)
    return report


def node(i: int, host: str, status: str = REPORTED, detail: str = "") -> NodeResult:
    ident = NodeIdentity(rank=i, hostname=host, node_rank=i, pid=9000 + i, launcher="slurm")
    return NodeResult(label=ident.label, status=status, identity=None if status == MISSING else ident, detail=detail)


def merge(nodes: list[NodeResult], reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = merge_hang_reports(nodes, reports, join_timeout_s=60, launcher="slurm").to_dict()
    validate_cluster(data)
    return data


def test_rank_behind_on_another_node_is_named_with_host_and_pid() -> None:
    # node a: ranks 0-1 wait in all_reduce (locally "all_waiting", nothing to blame there); node b: rank 2
    # waits too, rank 3 sleeps (locally a stack outlier). Across nodes: rank 3 on gpu-b, pid 4003.
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    reports = {
        a.label: node_report("gpu-a", {0: (4000, WAITING), 1: (4001, WAITING)}, 4, "all_waiting",
                             "every local rank waits", "warn", source="stacks"),
        b.label: node_report("gpu-b", {2: (4002, WAITING), 3: (4003, SLEEPING)}, 4),
    }
    data = merge([a, b], reports)
    verdict = data["verdict"]
    assert verdict["kind"] == "stack_outlier"
    assert verdict["culprit_ranks"] == [3]
    assert verdict["culprits"] == [{"rank": 3, "node": "node 1 (gpu-b)", "host": "gpu-b", "pid": 4003,
                                    "where": SLEEPING[0], "file": TRAIN, "line": 54}]
    assert verdict["other_ranks"] == [0, 1, 2]
    assert "rank 3 (pid 4003 on gpu-b, node 1 (gpu-b))" in verdict["summary"]
    assert f"ranks 0-2 wait in all_reduce at {TRAIN}:55 in main() (node 0 (gpu-a), node 1 (gpu-b))" in verdict["summary"]
    assert data["exit_code"] == 1 and data["findings"][0]["severity"] == "fail"
    assert data["job"] == {"world_size": 4, "ranks_seen": [0, 1, 2, 3], "ranks_unseen": []}
    assert data["stack_groups"][0]["ranks"] == [0, 1, 2]
    assert data["stack_groups"][0]["nodes"] == ["node 0 (gpu-a)", "node 1 (gpu-b)"]
    assert [n["report"]["host"] for n in data["nodes"]] == ["gpu-a", "gpu-b"]


def test_two_single_rank_nodes_tie_names_the_rank_not_in_a_collective() -> None:
    # One rank per node: 1 against 1, the one waiting in a collective is the victim.
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    reports = {
        a.label: node_report("gpu-a", {0: (10, WAITING)}, 2, "all_waiting", "waits", "warn", source="stacks"),
        b.label: node_report("gpu-b", {1: (11, SLEEPING)}, 2),
    }
    verdict = merge([a, b], reports)["verdict"]
    assert verdict["culprit_ranks"] == [1] and verdict["culprits"][0]["host"] == "gpu-b"
    assert verdict["node"] == "node 1 (gpu-b)"


def test_flight_recorder_seqs_of_every_node_together() -> None:
    # Each node read only its own ranks' dumps (no stacks): rank 1's last collective is #3, rank 0's #4.
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    reports = {
        a.label: node_report("gpu-a", {0: (10, None)}, 2, severity="ok", last_enqueued={0: 4}),
        b.label: node_report("gpu-b", {1: (11, None)}, 2, severity="ok", last_enqueued={1: 3}),
    }
    verdict = merge([a, b], reports)["verdict"]
    assert verdict["kind"] == "behind" and verdict["source"] == "flight_recorder"
    assert verdict["culprit_ranks"] == [1] and verdict["other_ranks"] == [0]
    assert verdict["culprits"][0] | {"where": None} == {
        "rank": 1, "node": "node 1 (gpu-b)", "host": "gpu-b", "pid": 11, "where": None, "file": None, "line": None}
    assert "#3" in verdict["summary"] and "#4" in verdict["summary"]


def test_node_verdict_from_shared_dumps_is_placed_on_the_node_that_runs_the_rank() -> None:
    # Node a read every rank's dumps (shared filesystem) and blames rank 3, which runs on node b.
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    culprit = {"rank": 3, "pid": None, "host": None, "where": None, "file": None, "line": None}
    reports = {
        a.label: node_report("gpu-a", {0: (10, WAITING), 1: (11, WAITING)}, 4, "behind",
                             "rank 3 is behind: its last collective was all_reduce #3", "fail", [culprit],
                             "flight_recorder", {0: 4, 1: 4, 2: 4, 3: 3}, [0, 1, 2, 3]),
        b.label: node_report("gpu-b", {2: (12, WAITING), 3: (13, SLEEPING)}, 4, "stack_outlier",
                             "rank 3 is not where the others are", "fail",
                             [culprit | {"pid": 13, "host": "gpu-b"}], "stacks"),
    }
    verdict = merge([a, b], reports)["verdict"]
    assert verdict["kind"] == "behind" and verdict["node"] == "node 0 (gpu-a)"
    record = verdict["culprits"][0]
    assert (record["node"], record["host"], record["pid"], record["line"]) == ("node 1 (gpu-b)", "gpu-b", 13, 54)
    assert verdict["summary"].startswith("node 0 (gpu-a): rank 3 is behind")
    assert "rank 3 runs on node 1 (gpu-b) as pid 13" in verdict["summary"]


def test_stopped_rank_wins() -> None:
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    stopped = {"rank": 0, "pid": 10, "host": "gpu-a", "where": None, "file": None, "line": None}
    reports = {
        a.label: node_report("gpu-a", {0: (10, None)}, 2, "stopped", "rank 0 is not running", "fail",
                             [stopped], "stacks"),
        b.label: node_report("gpu-b", {1: (11, SLEEPING)}, 2),
    }
    verdict = merge([a, b], reports)["verdict"]
    assert verdict["kind"] == "stopped" and verdict["culprit_ranks"] == [0]
    assert verdict["culprits"][0]["host"] == "gpu-a"


def test_missing_and_lost_nodes_are_named_when_the_others_only_wait() -> None:
    a = node(0, "gpu-a")
    b = NodeResult(label="node 1 (gpu-b)", status=MISSING, detail="rank 1, expected on gpu-b per SLURM_JOB_NODELIST")
    c = node(2, "gpu-c", LOST, "no heartbeat for 10s (process died or network lost)")
    reports = {a.label: node_report("gpu-a", {0: (10, WAITING), 1: (11, WAITING)}, 6, "all_waiting", "w", "warn",
                                    source="stacks")}
    data = merge([a, b, c], reports)
    verdict = data["verdict"]
    assert verdict["kind"] == "unanswered" and verdict["culprits"] == []
    assert "node 1 (gpu-b), node 2 (gpu-c) did not answer" in verdict["summary"]
    assert "ranks 2-5 ran on no node that answered" in verdict["summary"]
    ids = [(f["id"], f["severity"]) for f in data["findings"]]
    assert ids == [("hang.cluster.verdict", "fail"), ("cluster.node.missing", "fail"), ("cluster.node.lost", "fail")]
    assert "gpu-b" in data["findings"][1]["summary"]
    assert [n["status"] for n in data["nodes"]] == ["reported", "missing", "lost"]
    assert data["nodes"][1]["report"] is None
    assert data["job"]["ranks_unseen"] == [2, 3, 4, 5]
    assert data["exit_code"] == 1


def test_culprit_found_while_a_node_is_missing_names_both() -> None:
    a, b = node(0, "gpu-a"), node(1, "gpu-b", NO_DATA, "its report did not arrive")
    reports = {a.label: node_report("gpu-a", {0: (10, WAITING), 1: (11, WAITING), 2: (12, SLEEPING)}, 4)}
    data = merge([a, b], reports)
    assert data["verdict"]["culprit_ranks"] == [2]
    assert data["verdict"]["summary"].endswith("(no answer from node 1 (gpu-b))")
    assert [f["id"] for f in data["findings"]] == ["hang.cluster.verdict", "cluster.gather.failed"]


def test_every_rank_of_every_node_waits_in_the_same_collective() -> None:
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    reports = {
        a.label: node_report("gpu-a", {0: (10, WAITING)}, 2, "all_waiting", "w", "warn", source="stacks"),
        b.label: node_report("gpu-b", {1: (11, WAITING)}, 2, "all_waiting", "w", "warn", source="stacks"),
    }
    data = merge([a, b], reports)
    assert data["verdict"]["kind"] == "all_waiting" and data["verdict"]["other_ranks"] == [0, 1]
    assert "network" in data["verdict"]["summary"]
    assert data["findings"][0]["severity"] == "warn" and data["exit_code"] == 0


def test_nothing_readable_anywhere_is_inconclusive() -> None:
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    reports = {
        n.label: node_report(n.identity.hostname, {i: (10 + i, None)}, 2, "none", "inconclusive: py-spy missing",
                             "error")
        for i, n in enumerate((a, b))
    }
    data = merge([a, b], reports)
    assert data["verdict"]["kind"] == "none" and data["exit_code"] == 3
    assert data["verdict"]["summary"].startswith("inconclusive")


@pytest.mark.parametrize(
    "garbage",
    [{}, {"job": "x", "stacks": [1, None], "verdict": []}, {"stacks": [{"rank": "0", "where": 5}], "flight_recorder":
     {"last_enqueued": {"0": {"x": "y", "1": True}}}}, {"job": {"ranks": [{"rank": True}]}, "verdict": {"kind": 3}}],
)
def test_garbage_reports_never_crash(garbage: Any) -> None:
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    reports = {a.label: garbage, b.label: node_report("gpu-b", {1: (11, WAITING)}, 2)}
    result = merge_hang_reports([a, b], reports, join_timeout_s=60).to_dict()
    assert result["findings"][0]["id"] == "hang.cluster.verdict"


def test_markdown_names_culprit_and_every_node() -> None:
    a, b = node(0, "gpu-a"), node(1, "gpu-b", LOST, "no heartbeat")
    reports = {a.label: node_report("gpu-a", {0: (10, WAITING), 1: (11, SLEEPING), 2: (12, WAITING)}, 3)}
    text = render_hang_cluster_markdown(merge([a, b], reports))
    assert "rank 1 on node 0 (gpu-a) (host gpu-a pid 11)" in text
    assert "| node 1 (gpu-b) | lost | no heartbeat |" in text


def test_text_names_culprit_every_node_and_the_merged_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    from ddpdoctor.render.hang import render_hang_cluster_text

    a, b = node(0, "gpu-a"), node(1, "gpu-b", MISSING, "rank 1, expected on gpu-b per SLURM_JOB_NODELIST")
    reports = {a.label: node_report("gpu-a", {0: (10, WAITING), 1: (11, SLEEPING), 2: (12, WAITING)}, 3)}
    render_hang_cluster_text(merge([a, b], reports))
    out = capsys.readouterr().out
    assert "FAIL  verdict: rank 1 (pid 11 on gpu-a, node 0 (gpu-a)) is not where" in out
    assert "culprit: rank 1 on node 0 (gpu-a) (host gpu-a pid 11)" in out
    assert "1 of 2 nodes answered" in out and "did not answer (missing)" in out
    assert "never joined" in out
    assert f"ranks 0, 2 (node 0 (gpu-a)): {WAITING[0]}" in out


def test_cli_cluster_needs_a_launcher_and_hosts_needs_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    res = CliRunner().invoke(app, ["hang", "--cluster", "--no-ras"])
    assert res.exit_code == 2 and "hang --cluster runs under a launcher" in res.output
    res = CliRunner().invoke(app, ["hang", "--hosts", "gpu[1-2]", "--no-ras"])
    assert res.exit_code == 2 and "--hosts applies only with --cluster" in res.output
    res = CliRunner().invoke(app, ["hang", "--join-timeout", "5", "--hosts", "a", "--no-ras"])
    assert res.exit_code == 2 and "--join-timeout and --hosts apply only with --cluster" in res.output


def test_a_node_whose_ranks_progress_makes_the_job_progressing() -> None:
    # Node b's snapshots saw its ranks finish collectives: the job's collectives complete, so a single
    # snapshot of node a (rank 1 asleep between steps) blames nobody.
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    reports = {
        a.label: node_report("gpu-a", {0: (10, WAITING), 1: (11, SLEEPING)}, 4),
        b.label: node_report("gpu-b", {2: (12, WAITING), 3: (13, WAITING)}, 4, "progressing",
                             "progressing, not hung: rank 2 finished collectives", "ok", source="progress"),
    }
    data = merge([a, b], reports)
    assert data["verdict"]["kind"] == "progressing" and data["verdict"]["culprit_ranks"] == []
    assert data["exit_code"] == 0 and "node 1 (gpu-b)" in data["verdict"]["summary"]


def test_a_spinning_rank_on_a_node_is_the_culprit() -> None:
    a, b = node(0, "gpu-a"), node(1, "gpu-b")
    spinner = [{"rank": 3, "pid": 13, "host": "gpu-b", "where": f"{TRAIN}:20 in spin()", "file": TRAIN, "line": 20}]
    reports = {
        a.label: node_report("gpu-a", {0: (10, WAITING), 1: (11, WAITING)}, 4, "all_waiting", "waits", "warn",
                             source="stacks"),
        b.label: node_report("gpu-b", {2: (12, WAITING), 3: (13, (f"{TRAIN}:20 in spin()", None))}, 4, "spinning",
                             "rank 3 spins", "fail", culprits=spinner, source="progress"),
    }
    data = merge([a, b], reports)
    assert data["verdict"]["culprit_ranks"] == [3] and data["exit_code"] == 1
