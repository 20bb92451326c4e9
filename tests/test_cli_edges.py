"""Edge cases found by black-box QA: bad snapshot directories, conflicting flags, unbounded reads of
NCCL config files, the MASTER_PORT torchrun picks, wording, and docs that must list every emitted id."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from ddpdoctor.checks.nccl_env import CONF_READ_LIMIT, check_conf_files, read_conf_file, read_nccl_conf
from ddpdoctor.checks.network import NetFacts, check_master_port
from ddpdoctor.cli.app import app
from ddpdoctor.core.model import Severity

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


# --- 1, 2: snapshot DIR is validated before any probe runs ------------------------------------------


def _no_probe_may_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpdoctor.core.engine

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("probes ran before the snapshot directory was validated")

    monkeypatch.setattr(ddpdoctor.core.engine, "run_checks", refuse)


@pytest.mark.parametrize(
    "make_path, message",
    [
        (lambda tmp: tmp / "file.txt", "exists and is not a directory"),
        (lambda tmp: tmp / "file.txt" / "sub", "cannot create snapshot directory"),
        (lambda tmp: Path("/proc/ddpdoctor-no-such-dir"), "cannot create snapshot directory"),
    ],
)
def test_snapshot_to_a_bad_path_is_a_usage_error_before_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_path, message: str
) -> None:
    (tmp_path / "file.txt").write_text("not a directory\n")
    _no_probe_may_run(monkeypatch)
    res = invoke("snapshot", str(make_path(tmp_path)), "--only", "system")
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert (tmp_path / "file.txt").read_text() == "not a directory\n"


def test_snapshot_refuses_a_non_empty_directory_and_keeps_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "nvidia-smi-q.txt"
    old.write_text("==============NVSMI LOG==============\n")
    _no_probe_may_run(monkeypatch)
    for extra in ([], ["--only", "system"]):
        res = invoke("snapshot", str(tmp_path), *extra)
        assert res.exit_code == 2, res.output
        assert "not empty" in res.output and "new directory" in res.output
    assert old.read_text() == "==============NVSMI LOG==============\n"  # never deleted


def test_snapshot_into_a_new_then_an_empty_directory_and_replay(tmp_path: Path) -> None:
    new = tmp_path / "a" / "b"
    res = invoke("snapshot", str(new), "--only", "system", "--timeout", "20")
    assert res.exit_code == 0, res.output
    assert (new / "env.json").is_file() and (new / "df-shm.txt").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke("snapshot", str(empty), "--only", "system", "--timeout", "20").exit_code == 0
    res = invoke("check", "--replay", str(empty), "--only", "system", "--json")
    assert res.exit_code in (0, 1, 3)
    assert json.loads(res.stdout)["source"] == f"replay:{empty}"


def test_snapshot_docs_say_dir_must_be_new_or_empty() -> None:
    assert "DIR must be new or empty" in (DOCS / "snapshot.md").read_text()


# --- 3: NCCL config files are read boundedly, never from a FIFO or device ----------------------------


def test_nccl_conf_file_dev_zero_is_a_finding_not_gigabytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_CONF_FILE", "/dev/zero")
    conf = read_nccl_conf()
    assert "/dev/zero" not in conf["files"]
    assert conf["unreadable"]["/dev/zero"] == "not a regular file (character device)"
    (f,) = check_conf_files(conf)
    assert f.id == "nccl_env.conf_file.unreadable" and f.severity == Severity.WARN and f.fix
    assert "/dev/zero" in f.summary


def test_nccl_conf_file_fifo_does_not_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "nccl.fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("NCCL_CONF_FILE", str(fifo))
    result: dict = {}
    # A thread, so that a regression (open() blocking on the FIFO) fails the test instead of hanging it.
    t = threading.Thread(target=lambda: result.update(read_nccl_conf()), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the stuck open() so the thread ends, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("reading NCCL_CONF_FILE blocked on a FIFO")
    assert result["unreadable"][str(fifo)] == "not a regular file (FIFO)"


def test_nccl_conf_file_read_is_bounded_and_missing_named_file_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "nccl.conf"
    big.write_text("NCCL_DEBUG=WARN\n" + "#" * (3 * CONF_READ_LIMIT))
    text = read_conf_file(str(big))
    assert len(text) == CONF_READ_LIMIT and text.startswith("NCCL_DEBUG=WARN\n")
    monkeypatch.setenv("NCCL_CONF_FILE", str(tmp_path / "absent.conf"))
    conf = read_nccl_conf()
    assert conf["unreadable"] == {str(tmp_path / "absent.conf"): "does not exist"}


def test_check_cli_with_dev_zero_conf_is_bounded() -> None:
    env = {**os.environ, "NCCL_CONF_FILE": "/dev/zero"}
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "check", "--only", "nccl_env", "--timeout", "3", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    ids = {f["id"]: f for f in json.loads(proc.stdout)["findings"]}
    assert ids["nccl_env.conf_file.unreadable"]["severity"] == "warn"
    assert "core.probe.timeout" not in ids


# --- 4: MASTER_PORT picked by torchrun is not the user's choice ---------------------------------------


@pytest.fixture(scope="module")
def torchrun_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment a real `torchrun --standalone` gives its worker."""
    tmp = tmp_path_factory.mktemp("torchrun")
    script = tmp / "dump_env.py"
    script.write_text("import json, os, sys\njson.dump(dict(os.environ), open(sys.argv[1], 'w'))\n")
    out = tmp / "env.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    proc = subprocess.run(
        [*argv, str(script), str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def _port_facts(env: dict[str, str], port: int) -> NetFacts:
    return NetFacts(env=env, port={"port": port, "holder": None, "ephemeral_range": [port - 1, port + 1]})


def test_master_port_from_torchrun_in_ephemeral_range_is_info(torchrun_env: dict[str, str]) -> None:
    assert "TORCHELASTIC_RUN_ID" in torchrun_env and "MASTER_PORT" in torchrun_env
    port = int(torchrun_env["MASTER_PORT"])
    (eph,) = [
        f for f in check_master_port(_port_facts(torchrun_env, port)) if f.id == "net.master_port.ephemeral"
    ]
    assert eph.severity == Severity.INFO and eph.data["set_by_launcher"] is True
    # The same port chosen by hand (no torchrun agent around) still warns.
    user = {k: v for k, v in torchrun_env.items() if not k.startswith("TORCHELASTIC_")}
    (eph,) = [f for f in check_master_port(_port_facts(user, port)) if f.id == "net.master_port.ephemeral"]
    assert eph.severity == Severity.WARN


def test_check_under_torchrun_env_does_not_warn_about_master_port(torchrun_env: dict[str, str]) -> None:
    res = invoke("check", "--only", "network", "--json", "--strict", "--timeout", "20", env=torchrun_env)
    findings = json.loads(res.stdout)["findings"]
    assert not [f for f in findings if f["id"] == "net.master_port.ephemeral" and f["severity"] == "warn"]


# --- 5: conflicting or meaningless flags -------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--json", "--format", "junit"], "--json and --format junit conflict"),
        (["--prolog", "--json"], "--prolog"),
        (["--prolog", "--format", "markdown"], "--prolog"),
        (["--hosts", "gpu[01-02]"], "--hosts applies only with --cluster"),
        (["--join-timeout", "5"], "--join-timeout applies only with --cluster"),
        (["--only", "launch", "--skip", "launch"], "leave no area to check"),
        (["--skip", "gpu,launch,mp,nccl,nccl_env,network,rdma,system,torch"], "leave no area to check"),
    ],
)
def test_conflicting_check_flags_are_usage_errors(args: list[str], message: str) -> None:
    res = invoke("check", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_snapshot_of_no_area_is_a_usage_error(tmp_path: Path) -> None:
    res = invoke("snapshot", str(tmp_path / "s"), "--only", "system", "--skip", "system")
    assert res.exit_code == 2 and "leave no area" in res.output


def test_json_with_format_json_is_fine() -> None:
    res = invoke("check", "--json", "--format", "json", "--only", "system", "--timeout", "20")
    assert res.exit_code in (0, 1, 3)
    assert json.loads(res.stdout)["schema"] == "ddpdoctor.check/1"


@pytest.mark.parametrize(
    "value, said",
    [
        ("inf", "not a finite number"),
        ("nan", "nan is not a number"),
        ("-1", "not between 0.1 and 86400"),
        ("86401", "not between 0.1 and 86400"),
    ],
)
def test_timeout_must_be_finite_and_at_most_a_day(value: str, said: str) -> None:
    res = invoke("check", "--only", "system", "--timeout", value)
    assert res.exit_code == 2 and said in res.output, res.output
    assert "less than or equal" not in res.output  # click's range check misread nan as too large


def test_check_and_parse_help_list_what_they_accept() -> None:
    from ddpdoctor.checks import load_areas
    from ddpdoctor.parsers import load_parse_tools

    shown = " ".join(invoke("check", "--help").output.split())
    assert all(f" {a.name}," in shown or f" {a.name}." in shown for a in load_areas()), shown
    shown = " ".join(invoke("parse", "--help").output.split()).replace("- ", "-")
    assert all(f" {t}," in shown or f" {t}." in shown for t in load_parse_tools()), shown


def test_timeout_of_a_day_works() -> None:
    res = invoke("check", "--only", "system", "--timeout", "86400", "--json")
    assert res.exit_code in (0, 1, 3), res.output
    assert json.loads(res.stdout)["areas"] == ["system"]


# --- 6: wording --------------------------------------------------------------------------------------


def test_torch_probe_timeout_shows_sub_second_durations() -> None:
    from ddpdoctor.checks.torch import probe_failure
    from ddpdoctor.edge.runner import CommandResult

    f = probe_failure(CommandResult(argv=("python",), timed_out=True, duration_s=0.1, stdout="x"))
    assert f is not None and "within 0.1s" in f.summary


def test_shm_sizes_are_human() -> None:
    from ddpdoctor.ci.expectations import human_size

    assert human_size(24684084 * 1024) == "23.5 GiB"
    assert human_size(16 * 1024**3) == "16 GiB"
    assert human_size(512) == "512 B"


def test_one_more_check_passed_is_singular() -> None:
    from ddpdoctor.core.model import Finding, Report
    from ddpdoctor.render import console
    from ddpdoctor.render.check import render_check_report

    report = Report(host="h", findings=[Finding("system.x", Severity.OK, "X", "fine", area="system")])
    with console().capture() as cap:
        render_check_report(report, verbose=False, strict=False, area_titles={"system": "System"})
    assert "1 more check passed" in cap.get()


def test_lint_unknown_format_lists_every_format(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("x = 1\n")
    res = invoke("lint", str(tmp_path / "t.py"), "--format", "bogus")
    assert res.exit_code == 2
    for fmt in ("text", "json", "github", "junit", "markdown"):
        assert fmt in res.output


def test_info_findings_have_null_fix_in_json() -> None:
    data = json.loads(invoke("check", "--only", "system", "--json", "--timeout", "20").stdout)
    quiet = [f for f in data["findings"] if f["severity"] in ("ok", "info", "skip")]
    assert quiet and all(f["fix"] is None or f["fix"] for f in quiet)
    assert any(f["fix"] is None for f in quiet)
    jsonschema.validate(data, json.loads((DOCS / "schemas" / "check.schema.json").read_text()))


# --- 7: docs list every emitted id; schemas exist for every JSON document ----------------------------


def _bench_ids_in_source() -> set[str]:
    """Every literal `bench.*` finding id in the code that builds bench-nccl documents."""
    ids: set[str] = set()
    for path in [*(ROOT / "ddpdoctor" / "bench").glob("*.py"), ROOT / "ddpdoctor" / "render" / "formats.py"]:
        ids |= set(re.findall(r"[\"'](bench\.[a-z_]+(?:\.[a-z_]+)*)[\"']", path.read_text()))
    return ids - {"bench.json", "bench.refused", "bench.verdict"}  # a file name; defensive fallbacks


def test_every_emitted_bench_id_is_in_checks_md() -> None:
    from ddpdoctor.render.formats import document_from_bench

    doc = document_from_bench(
        {
            "launch": {"ok": False, "timed_out": True, "root_cause": {"rank": 1}},
            "verdicts": [
                {"id": "bench.correctness", "failed": True, "summary": "3 wrong"},
                {"id": "bench.min_busbw", "failed": False, "summary": "ok"},
                {"id": "bench.baseline", "failed": False, "summary": "ok"},
            ],
            "summary": [{"op": "all_reduce", "peak_busbw": 1.0, "peak_size": 8, "avg_busbw": 0.5}],
        }
    )
    emitted = {re.sub(r"^bench\.busbw\..*", "bench.busbw.OP", f.id) for f in doc.findings}
    assert {"bench.launch", "bench.correctness", "bench.busbw.OP"} <= emitted
    text = (DOCS / "checks.md").read_text()
    for fid in emitted | _bench_ids_in_source():
        assert f"`{fid}`" in text, f"{fid} is emitted but not documented in docs/checks.md"
    (correct,) = [f for f in doc.findings if f.id == "bench.correctness"]
    assert correct.severity == Severity.FAIL and correct.fix


def test_docs_name_every_lint_format() -> None:
    lint_md = (DOCS / "lint.md").read_text()
    assert "--format text|json|github|junit|markdown" in lint_md


@pytest.mark.slow
def test_cluster_json_validates_against_its_schema() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from _cluster_agents import Agents, agent_env, describe, find_json, torchrun_argv, wait_listening

    from ddpdoctor.edge.ports import pick_free_port

    schema = json.loads((DOCS / "schemas" / "cluster.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    port = pick_free_port()
    args = ["check", "--cluster", "--json", "--only", "system", "--timeout", "15", "--join-timeout", "60"]
    start = time.monotonic()
    with Agents() as agents:
        agents.start(torchrun_argv(1, f"127.0.0.1:{port}", "ddpdoctor-schema", args), agent_env())
        wait_listening("127.0.0.1", port)
        runs = agents.wait_all(120)
    assert time.monotonic() - start < 150  # bounded, did not hang
    _, report = find_json(runs, "ddpdoctor.cluster/")
    jsonschema.validate(report, schema)
    assert report["nodes"] and report["nodes"][0]["status"] == "reported", describe(runs)
    # The schema is strict enough to reject a broken document.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**report, "nodes": [{"label": "x", "status": "gone"}]}, schema)
