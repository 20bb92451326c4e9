"""bench-nccl at its edges: output paths, stdout sharing, refusals and their JSON, the start allowance,
the correctness line of runs that measured nothing, --baseline/--expect misuse, the largest --timeout.

Real ranks (gloo on CPU, 2 ranks, one tiny size) where a run is needed; a refused or rejected command
must not launch anything, which the in-process tests prove by making the launcher fail if called.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
from typer.testing import CliRunner

import ddpdoctor.bench.launcher as launcher
from ddpdoctor.bench.plan import FAULT_ENV, BenchPlan
from ddpdoctor.bench.results import judge_correctness
from ddpdoctor.cli import app

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((REPO / "docs" / "schemas" / "bench.schema.json").read_text())
# Real nccl-tests output (provenance in tests/fixtures/bench/README.md): not a bench-nccl --json.
NCCL_TESTS_TEXT = (
    REPO
    / "tests"
    / "fixtures"
    / "bench"
    / "all_reduce_perf__2x-rtx2080ti-single-process-g2-pcie-no-p2p-4GBps.txt"
)
TINY = (
    "--backend",
    "gloo",
    "--nproc",
    "2",
    "--ops",
    "all_reduce",
    "--min-bytes",
    "8",
    "--max-bytes",
    "8",
    "--iters",
    "1",
    "--warmup",
    "0",
)
LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and k != FAULT_ENV}
    env.update(COLUMNS="200", NO_COLOR="1", **extra)
    return env


def _bench(*args: str, limit_s: float = 90, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "bench-nccl", *args],
        capture_output=True,
        text=True,
        env=_env(**extra),
        cwd=REPO,
        timeout=limit_s,
    )


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make any launch fail the test: a usage error must be raised before anything starts."""
    calls: list[str] = []

    def refuse(*args: object, **kwargs: object) -> None:
        calls.append("launched")
        raise AssertionError("bench-nccl launched ranks although the command was invalid")

    monkeypatch.setattr(launcher, "launch_local", refuse)
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return calls


def _invoke(*args: str):
    return CliRunner().invoke(app, ["bench-nccl", *args])


# 1. Output paths are checked before launch; a write that still fails at the end is not exit 0.


@pytest.mark.parametrize("flag", ["--json", "--csv"])
def test_unwritable_output_is_a_usage_error_before_launch(
    flag: str, tmp_path: Path, no_launch: list[str]
) -> None:
    for path, why in (
        ("/proc/nope/x.out", "does not exist"),
        (str(tmp_path), "is a directory"),
        (str(tmp_path / "missing" / "x.out"), "does not exist"),
    ):
        result = _invoke(*TINY, flag, path)
        assert result.exit_code == 2, result.output
        assert f"cannot write {flag} {path}" in result.output and why in result.output
        assert "nothing was run" in result.output
    assert no_launch == []


@pytest.mark.parametrize("flag", ["--json", "--csv"])
def test_output_that_cannot_be_opened_is_refused_before_launch(
    flag: str, tmp_path: Path, no_launch: list[str]
) -> None:
    # /proc exists and looks writable to access() as root, but no file can be created in it: only
    # opening the file proves it (issue #20 item 11). A FIFO without a reader is refused, not waited on.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/proc/x.json", str(fifo)):
        result = _invoke(*TINY, flag, path)
        assert result.exit_code == 2, result.output
        assert f"cannot write {flag} {path}" in result.output and "nothing was run" in result.output
    assert no_launch == []
    # A file created by the check is removed again: a refused run leaves nothing behind.
    fresh = tmp_path / "fresh.json"
    result = _invoke(*TINY, flag, str(fresh), "--ops", "all_gather", "--min-busbw", "1")
    assert result.exit_code == 2 and not fresh.exists()


def test_malformed_launcher_variable_is_refused(
    no_launch: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # RANK=abc used to start local ranks and exit 0 (issue #20 item 10); `check` reports it as
    # launch.var.malformed, and bench-nccl now refuses it the same way, JSON refusal included.
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = _invoke(*TINY)
    assert result.exit_code == 2, result.output
    assert "RANK='abc' is not an integer" in result.output and "fix:" in result.output
    result = _invoke(*TINY, "--format", "json")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert [f["id"] for f in doc["refusals"]] == ["launch.var.malformed"] and doc["exit_code"] == 2
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("SLURM_NTASKS", "x")
    result = _invoke(*TINY)
    assert result.exit_code == 2 and "SLURM_NTASKS='x'" in result.output
    assert no_launch == []


def test_output_in_read_only_directory_refused(tmp_path: Path, no_launch: list[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    result = _invoke(*TINY, "--json", str(ro / "x.json"))
    assert result.exit_code == 2 and "not writable" in result.output


def test_write_failing_at_the_end_is_not_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpdoctor.cli.bench as bench_cli

    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    # The path passes the pre-launch check (as if the directory vanished during the run), then fails.
    monkeypatch.setattr(bench_cli, "_check_outputs", lambda *args: None)
    result = _invoke(*TINY, "--json", "/proc/nope/x.json")
    assert "cannot write --json /proc/nope/x.json" in result.output
    assert result.exit_code == 1, result.output


# 2. --csv - is stdout, like --json -; both at once is a usage error.


def test_json_and_csv_both_on_stdout_is_a_usage_error(no_launch: list[str]) -> None:
    result = _invoke(*TINY, "--json", "-", "--csv", "-")
    assert result.exit_code == 2 and "both print to stdout" in result.output
    result = _invoke(*TINY, "--format", "json", "--csv", "-")
    assert result.exit_code == 2 and "both print to stdout" in result.output
    assert no_launch == []


# 6. An invalid MASTER_PORT is refused, never silently replaced by a free port.


@pytest.mark.parametrize("port", ["0", "99999", "abc"])
def test_invalid_master_port_refused_before_launch(port: str, tmp_path: Path) -> None:
    out = tmp_path / "refused.json"
    proc = _bench(*TINY, "--json", str(out), MASTER_PORT=port)
    assert proc.returncode == 2, proc.stderr
    assert f"MASTER_PORT={port!r} is not a port number from 1 to 65535" in proc.stderr
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["refusals"]] == ["bench.master_port.invalid"]
    assert data["launch"] is None and data["rows"] == []
    jsonschema.validate(data, SCHEMA)


# 5. The JSON of a refused launch validates against the published schema.


def test_refused_nccl_json_validates_against_schema(tmp_path: Path) -> None:
    # CUDA_VISIBLE_DEVICES="" hides every GPU, so NCCL is refused on any machine, GPU node or not.
    out = tmp_path / "ref.json"
    proc = _bench("--backend", "nccl", "--json", str(out), CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stderr
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    env = data["environment"]
    assert "world_size" not in env  # no rank was planned: nothing to describe, never 0
    assert env["python"] == sys.version.split()[0]
    assert data["exit_code"] == 2 and data["refusals"][0]["id"] == "bench.nccl.no_cuda"


# 7. --baseline must be an earlier bench-nccl --json.


def test_baseline_that_is_not_a_bench_json_is_a_usage_error(tmp_path: Path, no_launch: list[str]) -> None:
    result = _invoke(*TINY, "--baseline", str(NCCL_TESTS_TEXT))
    assert result.exit_code == 2, result.output
    assert "must be the output of an earlier `ddpdoctor bench-nccl --json FILE` run" in result.output
    assert "it is not JSON" in result.output and "Expecting value" not in result.output
    other = tmp_path / "other.json"
    other.write_text('{"schema": "ddpdoctor.check/1"}')
    result = _invoke(*TINY, "--baseline", str(other))
    assert result.exit_code == 2 and "no 'rows' list" in result.output
    assert no_launch == []


# 10. --pairwise outside a launcher names itself, not check --cluster.


def test_pairwise_outside_a_launcher_names_pairwise(no_launch: list[str]) -> None:
    result = _invoke("--pairwise")
    assert result.exit_code == 2
    assert "bench-nccl --pairwise" in result.output and "check --cluster" not in result.output


# 11./12. Help texts say what the code does.


def _help_text(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"})
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_nproc_help_matches_the_cpu_default() -> None:
    from ddpdoctor.bench.preflight import LaunchFacts, plan_launch

    text = _help_text("bench-nccl")
    assert "4 on CPU)" not in text
    assert "4 but at most the usable CPUs, and at least 2" in text
    facts = LaunchFacts()  # no GPU, CPU-only torch
    assert plan_launch(facts, "auto", None, cpu_count=2).nproc == 2
    assert plan_launch(facts, "auto", None, cpu_count=64).nproc == 4
    assert plan_launch(facts, "auto", None, cpu_count=1).nproc == 2


def test_report_bench_help_matches_its_sizes_and_rounds_numbers() -> None:
    from ddpdoctor.bench.sizes import parse_size
    from ddpdoctor.ci.report import BENCH_ARGS
    from ddpdoctor.render.report import _bench_section

    args = dict(zip(BENCH_ARGS[::2], BENCH_ARGS[1::2]))
    lo, hi = parse_size(args["--min-bytes"]), parse_size(args["--max-bytes"])
    assert f"{lo // 2**20} MiB to {hi // 2**20} MiB" in _help_text("report")
    row = {"op": "all_reduce", "size": 1048576, "time_us": 7623.220999994373, "algbw": 0.137551234,
           "busbw": 0.137551234, "wrong": 0}  # fmt: skip
    lines = _bench_section(SimpleNamespace(bench={"rows": [row]}, bench_error=""))
    assert lines[-1] == "| all_reduce | 1048576 | 7623.2 | 0.14 | 0.14 | 0 |"


# 3. A run that measured nothing never prints the correctness OK line.


def test_no_rows_means_no_correctness_claim() -> None:
    assert judge_correctness([]) is None
    assert judge_correctness([{"op": "sendrecv", "size": 8, "wrong": None}]) is None
    ok = judge_correctness([{"op": "all_reduce", "size": 8, "wrong": 0}])
    assert ok is not None and not ok.failed and "(1 checked)" in ok.summary


def test_ranks_dying_before_any_row_print_no_ok_line(tmp_path: Path) -> None:
    out = tmp_path / "dead.json"
    proc = _bench(
        *TINY, "--timeout", "20", "--json", str(out), **{FAULT_ENV: "rank=0,op=all_reduce,size=8,action=kill"}
    )
    assert proc.returncode == 1, proc.stderr
    assert "# OK" not in proc.stdout and "matched the expected values" not in proc.stdout
    data = json.loads(out.read_text())
    assert data["rows"] == [] and all(v["id"] != "bench.correctness" for v in data["verdicts"])
    jsonschema.validate(data, SCHEMA)


# 4. The rank start (interpreter + torch import) is not held to --timeout, but it is still bounded.


def test_tiny_run_with_a_one_second_timeout_completes() -> None:
    proc = _bench(*TINY, "--timeout", "1")
    assert proc.returncode == 0, proc.stderr
    assert "# OK: every measured result matched the expected values (1 checked)" in proc.stdout


def _slow_start_env(tmp_path: Path, seconds: float) -> dict[str, str]:
    """PYTHONPATH with a sitecustomize that delays the zygote's interpreter start by `seconds`."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import time\ntime.sleep({seconds})\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_slow_start_is_not_a_step_timeout(tmp_path: Path) -> None:
    plan = BenchPlan(ops=("all_reduce",), sizes=(8,), iters=1, warmup=0)
    result = launcher.launch_local(
        plan, nproc=2, backend="gloo", step_timeout_s=1, env=_slow_start_env(tmp_path, 2.5)
    )
    assert result.ok, result.root_cause and result.root_cause.describe()
    assert [r["op"] for r in result.rows] == ["all_reduce"]


def test_start_past_its_allowance_is_reported_stuck_in_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "START_ALLOWANCE_S", 1.5)
    assert launcher.start_limit(1.0) == 1.5 and launcher.start_limit(90.0) == 90.0
    plan = BenchPlan(ops=("all_reduce",), sizes=(8,), iters=1, warmup=0)
    began = time.monotonic()
    result = launcher.launch_local(
        plan, nproc=2, backend="gloo", step_timeout_s=1, env=_slow_start_env(tmp_path, 60)
    )
    assert time.monotonic() - began < 30  # bounded: did not wait for the 60 s start
    assert result.timed_out and not result.ok
    root = result.root_cause
    assert root is not None and root.kind == "stuck" and root.op == "start"
    assert f"rank {root.rank} in start: no progress" in root.describe()
    assert "limit 1.5s" in root.message


# 13. + 8. + 2.: the largest --timeout runs; --csv - is stdout; an --expect without bench thresholds.


def test_largest_timeout_csv_on_stdout_and_expect_without_thresholds(tmp_path: Path) -> None:
    expect = tmp_path / "node.toml"
    expect.write_text('name = "cpu box"\n')
    out = tmp_path / "run.json"
    proc = _bench(*TINY, "--timeout", "86400", "--csv", "-", "--json", str(out), "--expect", str(expect))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "OverflowError" not in proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["op"], r["size"], r["wrong"]) for r in rows] == [("all_reduce", "8", "0")]
    assert not Path(REPO / "-").exists()
    assert "has no [busbw_min_gbps] table: nothing in this run is judged from it" in proc.stderr
    data = json.loads(out.read_text())
    jsonschema.validate(data, SCHEMA)
    assert data["config"]["timeout_s"] == 86400 and data["environment"]["world_size"] == 2
    assert any("[busbw_min_gbps]" in n for n in data["notes"])
    assert data["expectations"] == []


# 8. Sizes and rank counts the host cannot hold are refused before launch, never left to the OOM killer.


def test_absurd_max_bytes_refused_before_launch(tmp_path: Path, no_launch: list[str]) -> None:
    out = tmp_path / "refused.json"
    args = list(TINY)
    args[args.index("--max-bytes") + 1] = "99999999999999999999999"
    result = _invoke(*args, "--json", str(out))
    assert result.exit_code == 2, result.output
    assert "ceiling" in result.output
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["refusals"]] == ["bench.max_bytes.too_large"]
    jsonschema.validate(data, SCHEMA)
    assert no_launch == []


def test_max_bytes_above_available_memory_refused(
    monkeypatch: pytest.MonkeyPatch, no_launch: list[str]
) -> None:
    import psutil

    # The host's real available memory, shrunk to 1 GiB so that 1G buffers x 2 ranks cannot fit.
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=1024**3))
    result = _invoke("--backend", "gloo", "--nproc", "2", "--ops", "all_gather", "--max-bytes", "1G")
    assert result.exit_code == 2, result.output
    assert "bench.max_bytes.too_large" in result.output or "do not fit in memory" in result.output
    assert "all_gather" in result.output and "1.0 GiB is available" in result.output
    assert no_launch == []


def test_gloo_nproc_far_above_the_cpus_refused(no_launch: list[str]) -> None:
    result = _invoke("--backend", "gloo", "--nproc", "500", "--max-bytes", "8")
    assert result.exit_code == 2, result.output
    assert "--nproc 500 gloo ranks" in result.output and "per CPU" in result.output
    assert no_launch == []


def test_pairwise_absurd_max_bytes_refused_before_the_process_group(
    monkeypatch: pytest.MonkeyPatch, no_launch: list[str]
) -> None:
    import ddpdoctor.cli.cluster as cluster_cli

    monkeypatch.setattr(cluster_cli, "run_pairwise_command", lambda **kw: no_launch.append("pairwise"))
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    result = _invoke("--pairwise", "--backend", "gloo", "--max-bytes", "99999999999999999999")
    assert result.exit_code == 2, result.output
    assert "ceiling" in result.output and no_launch == []


@pytest.mark.nogpu  # on a GPU node auto picks NCCL (and refuses more ranks than GPUs)
def test_auto_backend_on_a_cpu_node_says_gloo_in_the_first_line() -> None:
    # The README's `bench-nccl --nproc 8` on a node without a usable GPU runs gloo on CPU: the first line
    # of the output says so, not only a note on stderr, so nobody reads the figures as NCCL's.
    tiny = list(TINY)
    tiny[tiny.index("gloo")] = "auto"
    proc = _bench(*tiny, "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("# ddpdoctor bench-nccl: backend gloo on CPU, not NCCL ("), first
    assert "torch is a CPU-only build" in first or "no GPU is visible" in first
    # Asked for by name, gloo is what the user wanted: the line stays as nccl-tests has it.
    assert "not NCCL" not in _bench(*TINY, "--timeout", "60").stdout.splitlines()[0]
