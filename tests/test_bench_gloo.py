"""bench-nccl on real gloo ranks (CPU): every op, several dtypes, world sizes 2-4, table and JSON."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from ddpdoctor.bench.launcher import launch_local
from ddpdoctor.bench.math import OPS, bandwidths, coll_counts
from ddpdoctor.bench.plan import FAULT_ENV, BenchPlan
from ddpdoctor.cli import app
from ddpdoctor.parsers.nccl_tests import parse_nccl_tests

SIZES = ["8", "64", "512", "4096"]


def _bench(tmp_path: Path, *args: str, env: dict | None = None):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app,
        [
            "bench-nccl",
            "--backend",
            "gloo",
            "--min-bytes",
            "8",
            "--max-bytes",
            "4K",
            "--step-factor",
            "8",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--timeout",
            "60",
            "--json",
            str(out),
            "--force",  # several runs of one test write the same file; an existing one needs --force
            *args,
        ],
        env=env,
    )
    return result, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("nproc, dtype", [(2, "float16"), (3, "bfloat16"), (4, "float32")])
def test_every_op_every_size_correct(tmp_path: Path, nproc: int, dtype: str) -> None:
    result, data = _bench(tmp_path, "--nproc", str(nproc), "--dtype", dtype)
    assert result.exit_code == 0, result.output
    assert data["environment"]["backend"] == "gloo" and data["environment"]["world_size"] == nproc
    assert data["environment"]["torch"].startswith("2.")
    rows = data["rows"]
    # Every op at every requested size, in JSON ...
    assert {(r["op"], r["requested_bytes"]) for r in rows} == {(op, int(s)) for op in OPS for s in SIZES}
    for r in rows:
        assert {"op", "size", "count", "dtype", "time_us", "algbw", "busbw", "wrong"} <= set(r)
        assert r["dtype"] == dtype and r["wrong"] == 0 and r["nranks"] == nproc
        assert r["time_us"] > 0
        # The row's numbers follow nccl-tests' formulas from its own time.
        c = coll_counts(r["op"], r["requested_bytes"], 2 if dtype != "float32" else 4, nproc)
        assert (r["size"], r["count"]) == (c.size_bytes, c.count)
        algbw, busbw = bandwidths(c, r["time_us"] / 1e6)
        assert r["algbw"] == pytest.approx(algbw) and r["busbw"] == pytest.approx(busbw)
    # ... and in the printed table, which parses back as nccl-tests output.
    table = parse_nccl_tests(result.output)
    assert len(table.rows) == len(OPS) * len(SIZES)
    printed = {(r["test"], r["size"]) for r in table.rows}
    assert printed == {(r["op"], r["size"]) for r in rows}
    assert all(r["out_of_place"]["wrong"] == 0 for r in table.rows)
    assert "peak busbw" in result.output


def test_csv_has_rows_and_environment(tmp_path: Path) -> None:
    out = tmp_path / "bench.csv"
    result, _ = _bench(tmp_path, "--nproc", "2", "--ops", "all_reduce,broadcast", "--csv", str(out))
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 * len(SIZES)
    assert (
        rows[0]["op"] == "all_reduce"
        and rows[0]["env_backend"] == "gloo"
        and rows[0]["env_world_size"] == "2"
    )
    assert float(rows[-1]["busbw"]) > 0


def test_wrong_element_fails_with_exit_1(tmp_path: Path) -> None:
    # A real rank flips one element of its all_reduce result at 512 B (test-only hook).
    env = {FAULT_ENV: "rank=1,op=all_reduce,size=512,action=corrupt"}
    result, data = _bench(tmp_path, "--nproc", "2", "--ops", "all_reduce", env=env)
    assert result.exit_code == 1, result.output
    wrong = {r["requested_bytes"]: r["wrong"] for r in data["rows"]}
    assert wrong == {8: 0, 64: 0, 512: 1, 4096: 0}
    assert any(v["id"] == "bench.correctness" and v["failed"] for v in data["verdicts"])


def test_min_busbw_and_baseline_verdicts(tmp_path: Path) -> None:
    result, data = _bench(tmp_path, "--nproc", "2", "--ops", "all_reduce", "--min-busbw", "100000")
    assert result.exit_code == 1 and "below --min-busbw" in result.output
    baseline = tmp_path / "base.json"
    data["rows"] = [dict(r, busbw=(r["busbw"] or 0) * 1000) for r in data["rows"]]  # a 1000x faster past
    baseline.write_text(json.dumps(data))
    result, data2 = _bench(tmp_path, "--nproc", "2", "--ops", "all_reduce", "--baseline", str(baseline))
    assert result.exit_code == 1 and "REGRESSED" in result.output
    assert data2["baseline"][0]["op"] == "all_reduce" and data2["baseline"][0]["regressed"]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    for args in (
        ["--ops", "gather"],
        ["--min-bytes", "lots"],
        ["--dtype", "int8"],
        ["--backend", "mpi"],
        ["--min-bytes", "1M", "--max-bytes", "1K"],
        ["--ops", "broadcast", "--min-busbw", "1"],
    ):
        result = runner.invoke(app, ["bench-nccl", *args])
        assert result.exit_code == 2, (args, result.output)


def test_world_size_one_and_no_check(tmp_path: Path) -> None:
    result, data = _bench(tmp_path, "--nproc", "1", "--ops", "all_reduce,sendrecv", "--no-check")
    assert result.exit_code == 0, result.output
    sendrecv = [r for r in data["rows"] if r["op"] == "sendrecv"]
    assert all(r["skipped"] and r["busbw"] is None for r in sendrecv)
    assert all(r["wrong"] is None for r in data["rows"])
    # all_reduce on one rank moves nothing between ranks: busbw factor 2(n-1)/n = 0.
    assert all(r["busbw"] == 0 for r in data["rows"] if r["op"] == "all_reduce")


def test_launcher_api_reusable_and_leaves_no_process() -> None:
    result = launch_local(
        BenchPlan(ops=("all_reduce",), sizes=(1024,), iters=1, warmup=0),
        nproc=2,
        backend="gloo",
        step_timeout_s=60,
    )
    assert result.ok and len(result.rows) == 1 and result.rows[0]["wrong"] == 0
    assert sorted(result.results()) == [0, 1]
    for pid in result.pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _torchrun(tmp_path: Path, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os
    import sys

    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", **(env_extra or {}))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    torchrun = Path(sys.executable).parent / "torchrun"
    return subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "ddpdoctor",
            "bench-nccl",
            "--backend",
            "gloo",
            "--min-bytes",
            "1K",
            "--max-bytes",
            "4K",
            "--iters",
            "2",
            "--warmup",
            "1",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )


def test_joins_as_rank_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "j.json"
    proc = _torchrun(tmp_path, "--ops", "all_reduce,sendrecv", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Joined, not spawned: two ranks, and only rank 0 printed.
    assert proc.stdout.count("# Collective test: all_reduce") == 1
    data = json.loads(out.read_text())
    assert data["environment"]["launcher"] == "torchrun" and data["environment"]["world_size"] == 2
    assert len(data["rows"]) == 2 * 3 and all(r["wrong"] == 0 for r in data["rows"])
    # One node: the whole-world run only, no intra-/inter-node tables.
    assert {(r["scope"], r["node"]) for r in data["rows"]} == {("world", None)}
    assert data["scope_summary"] == [] and "# == " not in proc.stdout


def test_joined_rank_watchdog_dumps_stack_and_exits(tmp_path: Path) -> None:
    proc = _torchrun(
        tmp_path,
        "--ops",
        "all_reduce",
        "--timeout",
        "4",
        env_extra={FAULT_ENV: "rank=1,op=all_reduce,size=2048,action=hang"},
    )
    assert proc.returncode != 0
    assert "Timeout" in proc.stderr and "_maybe_fault" in proc.stderr
