"""bench-nccl rows of several scopes (whole world, intra-node, inter-node): judging, output rows, tables.

The rows across real torchrun agents are tested in tests/test_cluster_loopback.py; these tests pin the
pure parts: which rows the summaries and verdicts judge, and how each scope is written and shown.
"""

from __future__ import annotations

import time

from typer.testing import CliRunner

from ddpdoctor.bench.launcher import _handle_message
from ddpdoctor.bench.outcome import LaunchResult, RankState
from ddpdoctor.bench.results import (
    ROW_FIELDS,
    compare_baseline,
    csv_rows,
    judge_baseline,
    judge_correctness,
    judge_min_busbw,
    output_row,
    split_scopes,
    summarize,
    summarize_scopes,
)
from ddpdoctor.cli import app
from ddpdoctor.render.bench import scope_heading

NODE0, NODE1 = "node 0 (gpu-a)", "node 1 (gpu-b)"


def _row(op: str, size: int, busbw: float, scope: str = "", node: str = "", nranks: int = 4, wrong: int = 0):
    row = {"op": op, "size": size, "dtype": "float32", "busbw": busbw, "wrong": wrong, "nranks": nranks}
    if scope:
        row.update(scope=scope, node=node)
    return row


def _run() -> list[dict]:
    """A 2-node x 2-rank job as join_as_rank returns it: world rows, then the scoped ones."""
    return [
        _row("all_reduce", 8, 1.0),
        _row("all_reduce", 16, 2.0),
        _row("all_reduce", 8, 50.0, "intra-node", NODE0, 2),
        _row("all_reduce", 16, 60.0, "intra-node", NODE0, 2),
        _row("all_reduce", 8, 40.0, "intra-node", NODE1, 2),
        _row("all_reduce", 16, 45.0, "intra-node", NODE1, 2),
        _row("all_reduce", 8, 0.5, "inter-node", "all nodes", 2),
        _row("all_reduce", 16, 0.8, "inter-node", "all nodes", 2),
    ]


def test_summary_and_min_busbw_judge_the_whole_world_only() -> None:
    # The intra-node rows are 30x faster (NVLink vs the network): they must not lift the world's peak.
    (ar,) = summarize(_run(), ["all_reduce"])
    assert (ar.peak_busbw, ar.avg_busbw, ar.rows) == (2.0, 1.5, 2)
    assert judge_min_busbw([ar], 10.0).failed
    assert judge_min_busbw([ar], 2.0).failed is False


def test_scope_summaries_per_table_in_order() -> None:
    scoped = summarize_scopes(_run(), ["all_reduce"])
    assert [(s.scope, s.node, s.nranks) for s in scoped] == [
        ("intra-node", NODE0, 2),
        ("intra-node", NODE1, 2),
        ("inter-node", "all nodes", 2),
    ]
    assert [s.ops[0].peak_busbw for s in scoped] == [60.0, 45.0, 0.8]
    assert scoped[2].to_dict()["summary"][0]["peak_size"] == 16
    assert summarize_scopes(_run()[:2], ["all_reduce"]) == []  # one node: no scoped tables


def test_split_scopes_puts_the_world_first_then_intra_then_inter() -> None:
    rows = _run()
    shuffled = [rows[6], rows[2], rows[0], rows[4], rows[7], rows[3], rows[1], rows[5]]
    assert [(scope, node, len(mine)) for scope, node, mine in split_scopes(shuffled)] == [
        ("world", None, 2),
        ("intra-node", NODE0, 2),
        ("intra-node", NODE1, 2),
        ("inter-node", "all nodes", 2),
    ]


def test_baseline_compares_whole_world_rows_of_both_runs() -> None:
    # A baseline written by a multi-node run holds intra-node rows with the same (op, size, dtype): they
    # must not stand in for the world's numbers, or every world row would look like a 30x regression.
    baseline = [output_row(r) for r in _run()]
    (ratio,) = compare_baseline(_run(), baseline, ["all_reduce"], tolerance=0.1)
    assert (ratio.baseline_busbw, ratio.busbw, ratio.ratio, ratio.sizes) == (2.0, 2.0, 1.0, 2)
    assert not judge_baseline([ratio], 0.1).failed
    # A file from before scopes existed has no `scope`: its rows are the whole world.
    old = [{k: v for k, v in r.items() if k not in ("scope", "node")} for r in baseline[:2]]
    slower = [dict(r, busbw=r["busbw"] / 2) if not r.get("scope") else r for r in _run()]
    (ratio,) = compare_baseline(slower, old, ["all_reduce"], tolerance=0.1)
    assert ratio.ratio == 0.5 and ratio.regressed


def test_wrong_elements_fail_in_any_scope_and_name_it() -> None:
    rows = _run()
    rows[4] = dict(rows[4], wrong=7)
    verdict = judge_correctness(rows)
    assert verdict.failed and f"(intra-node, {NODE1}): 7" in verdict.summary
    rows = _run()
    rows[7] = dict(rows[7], wrong=1)
    assert "16 B (inter-node): 1" in judge_correctness(rows).summary


def test_output_rows_carry_scope_and_node() -> None:
    assert ROW_FIELDS[-2:] == ("scope", "node")
    world, intra = output_row(_run()[0]), output_row(_run()[2])
    assert (world["scope"], world["node"]) == ("world", None)
    assert (intra["scope"], intra["node"]) == ("intra-node", NODE0)
    assert list(world) == list(ROW_FIELDS)
    flat = csv_rows(_run(), {"host": "gpu-a", "gpus": ["H100", "H100"]})
    assert [(r["scope"], r["node"]) for r in flat][1:4] == [
        ("world", None),
        ("intra-node", NODE0),
        ("intra-node", NODE0),
    ]
    assert flat[0]["env_gpus"] == "H100;H100"


def test_scope_headings() -> None:
    assert scope_heading("world", None, 16) == "# == whole world: 16 ranks =="
    assert scope_heading("intra-node", NODE1, 8) == f"# == intra-node: {NODE1}, 8 ranks =="
    assert scope_heading("inter-node", "all nodes", 2) == "# == inter-node: one rank per node, 2 ranks =="


def test_spawned_rank_wait_gets_its_own_limit() -> None:
    # A rank waiting on others (reporter.wait) is judged by the limit it sent, not the step timeout;
    # its next ordinary step goes back to the step timeout.
    result = LaunchResult(world_size=1, backend="gloo")
    result.ranks[0] = RankState(rank=0, since=time.monotonic())
    _handle_message(result, {"kind": "step", "rank": 0, "op": "waiting", "size": 0, "timeout_s": 90.0}, None)
    assert result.ranks[0].limit == 90.0 and result.ranks[0].op == "waiting"
    _handle_message(result, {"kind": "step", "rank": 0, "op": "all_reduce", "size": 8}, None)
    assert result.ranks[0].limit is None


def test_pairwise_outside_a_launcher_stops_without_benchmarking() -> None:
    # Not under torchrun/srun: --pairwise refuses (exit 2) and the collective benchmark never starts
    # (it would start local ranks and print nccl-tests tables).
    result = CliRunner().invoke(
        app, ["bench-nccl", "--pairwise", "--backend", "gloo", "--max-bytes", "4K", "--timeout", "10"]
    )
    assert result.exit_code == 2, result.output
    assert "--pairwise measures between nodes" in result.output
    assert "Collective test" not in result.output and "ddpdoctor bench-nccl:" not in result.output
