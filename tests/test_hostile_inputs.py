"""Hostile inputs (#20): every user file is read bounded and regular-only, bad snapshot facts become one
finding, deep nesting and huge numbers are usage errors or findings, secrets never leave, nothing is
overwritten, and the prolog's bound holds even when a thread holds the GIL.

The whole-command sweep (the issue's commands, counted) is bench/sweep_hostile.py; results in
docs/validation.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.checks.launch import parse_launch_env
from ddpdoctor.cli import app
from ddpdoctor.core.engine import PROBE_CRASHED, SNAPSHOT_BAD_FILE, SNAPSHOT_EMPTY
from ddpdoctor.edge.files import (
    InputRefused,
    load_json_text,
    load_toml_text,
    read_stdin_bytes,
    read_user_bytes,
    write_output_file,
)
from ddpdoctor.edge.redact import REDACTED, redact_text
from ddpdoctor.edge.sources import LiveSources, ReplaySources

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = Path(__file__).parent / "fixtures" / "ci" / "healthy-cpu-node"
DEEP = "[" * 1000 + "]" * 1000


def invoke(*args: str, **kw):
    return CliRunner().invoke(app, list(args), **kw)


def snapshot_with(tmp_path: Path, files: dict[str, str]) -> Path:
    d = tmp_path / "snap"
    shutil.copytree(HEALTHY, d)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def replay_json(directory: Path, *extra: str) -> tuple[int, dict]:
    res = invoke("check", "--replay", str(directory), "--json", *extra)
    assert res.exit_code in (0, 1, 3), res.output
    return res.exit_code, json.loads(res.stdout)


def ids(data: dict) -> list[str]:
    return [f["id"] for f in data["findings"]]


# ---------------------------------------------------------------- 1. bounded, regular-only reads


def test_reader_refuses_special_files_before_opening(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # open() on it would block until a writer came
    link = tmp_path / "zero.py"
    link.symlink_to("/dev/zero")
    for path, kind in ((fifo, "FIFO"), (Path("/dev/zero"), "character device"), (link, "character device"),
                       (tmp_path, "directory")):  # fmt: skip
        with pytest.raises(InputRefused, match=kind) as info:
            read_user_bytes(path, 1024)
        assert isinstance(info.value, OSError) and info.value.strerror.startswith("not a regular file")


def test_reader_refuses_files_over_the_cap(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2049)
    with pytest.raises(InputRefused, match="too large"):
        read_user_bytes(big, 2048)
    assert read_user_bytes(big, 2049) == b"x" * 2049
    # /proc files say size 0: the cap is enforced while reading, too.
    with pytest.raises(InputRefused, match="too large"):
        read_user_bytes("/proc/self/status", 16)


def test_stdin_is_bounded_and_a_closed_stdin_is_refused() -> None:
    import io

    with pytest.raises(InputRefused, match="too large"):
        read_stdin_bytes(10, io.BytesIO(b"y" * 11))
    closed = io.BytesIO(b"")
    closed.close()
    with pytest.raises(InputRefused, match="closed"):
        read_stdin_bytes(10, closed)


@pytest.mark.parametrize(
    "args",
    [
        ("parse", "df", "{}"),
        ("check", "--only", "system", "--expect", "{}"),
        ("bench-nccl", "--backend", "gloo", "--baseline", "{}"),
        ("check", "--replay", "{}"),
    ],
)
@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_every_file_argument_refuses_special_files(
    tmp_path: Path, args: tuple[str, ...], special: str
) -> None:
    path = special
    if special == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    argv = [sys.executable, "-m", "ddpdoctor", *(a.replace("{}", path) for a in args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr


def test_parse_stdin_from_dev_zero_is_a_usage_error() -> None:
    with open("/dev/zero", "rb") as zero:
        proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "parse", "df", "-"], stdin=zero,
                              capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2 and "too large" in proc.stderr


def test_lint_never_hangs_on_fifos_device_links_or_link_loops(tmp_path: Path) -> None:
    d = tmp_path / "proj"
    d.mkdir()
    os.mkfifo(d / "pipe.py")
    (d / "zero.py").symlink_to("/dev/zero")
    (d / "loop.py").symlink_to("loop.py")
    (d / "a.py").symlink_to("b.py")
    (d / "b.py").symlink_to("a.py")
    (d / "ok.py").write_text("import os\n")
    for target in (d, d / "pipe.py", d / "zero.py", d / "loop.py"):
        proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "lint", "--json", str(target)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        if target == d:
            assert proc.returncode in (0, 1), proc.stderr
            assert "cannot read file" in proc.stdout  # found inside a directory: a DDP000 finding
        else:
            # Named on the command line: an unreadable file is a usage error (README's exit codes, #26 X1).
            assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


# ---------------------------------------------------------------- 2, 3. fact shapes, deep nesting


@pytest.mark.parametrize(
    "name, text, where",
    [
        ("system", '"abc"', "(top level)"),
        ("net-resolve", '{"vm": "abc"}', ".vm"),
        ("net-interfaces", '{"interfaces": "abc"}', ".interfaces"),
        ("net-interfaces", '{"interfaces": ["abc"]}', ".interfaces[0]"),
        ("net-master-port", '{"port": 1, "holder": "abc"}', ".holder"),
        ("nccl-conf", '{"files": {"/etc/nccl.conf": 3}}', "./etc/nccl.conf"),
        ("env", DEEP, "nested more than"),
        ("host", DEEP, "nested more than"),
        ("nvml", "[1]", "(top level)"),
    ],
)
def test_a_bad_fact_file_is_one_finding_naming_it(tmp_path: Path, name: str, text: str, where: str) -> None:
    files = {f"{name}.json": text}
    if name == "net-master-port":  # read only when the environment names a port
        files["env.json"] = json.dumps({"MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1"})
    d = snapshot_with(tmp_path, files)
    code, data = replay_json(d)
    assert PROBE_CRASHED.id not in ids(data)
    (bad,) = [f for f in data["findings"] if f["id"] == SNAPSHOT_BAD_FILE.id]
    assert f"{name}.json" in bad["summary"] and where in bad["summary"]
    assert code != 0  # a replay with an unusable file is inconclusive (3) at best, never a pass


def test_special_files_inside_a_snapshot_are_findings_not_hangs(tmp_path: Path) -> None:
    d = snapshot_with(tmp_path, {})
    (d / "ulimit-a.txt").unlink()
    os.mkfifo(d / "ulimit-a.txt")
    (d / "env.json").unlink()
    (d / "env.json").symlink_to("/dev/zero")
    (d / "df-shm.txt").unlink()
    (d / "df-shm.txt").symlink_to("df-shm.txt")  # a link loop
    code, data = replay_json(d)
    bad = {f["data"]["file"]: f["summary"] for f in data["findings"] if f["id"] == SNAPSHOT_BAD_FILE.id}
    assert set(bad) == {"ulimit-a.txt", "env.json", "df-shm.txt"}, bad
    # A link is refused as a link, whatever it points to (a link to /etc/shadow must never be read).
    assert "FIFO" in bad["ulimit-a.txt"] and "symbolic link" in bad["env.json"]
    assert code == 3 and PROBE_CRASHED.id not in ids(data)


@pytest.mark.parametrize("cmd", [("report", "--replay", "{}"), ("expect", "--replay", "{}", "--write", "-")])
def test_deep_env_and_host_do_not_break_report_or_expect(tmp_path: Path, cmd: tuple[str, ...]) -> None:
    d = snapshot_with(tmp_path, {"env.json": DEEP, "host.json": DEEP})
    res = invoke(*(a.replace("{}", str(d)) for a in cmd))
    assert res.exit_code == 0, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_deep_json_and_toml_are_value_errors() -> None:
    with pytest.raises(ValueError, match="nested"):
        load_json_text(DEEP)
    with pytest.raises(ValueError, match="nested"):
        load_json_text("[" * 70 + "]" * 70)  # within Python's recursion limit, past ours
    with pytest.raises(ValueError, match="nested"):
        load_toml_text("a = " + DEEP)
    assert load_json_text("[[1]]") == [[1]]


def test_deep_expect_toml_and_baseline_are_usage_errors(tmp_path: Path) -> None:
    toml = tmp_path / "deep.toml"
    toml.write_text("a = " + DEEP + "\n")
    res = invoke("check", "--replay", str(HEALTHY), "--expect", str(toml))
    assert res.exit_code == 2 and "not valid TOML" in res.output
    baseline = tmp_path / "deep.json"
    baseline.write_text(DEEP)
    res = invoke("bench-nccl", "--backend", "gloo", "--baseline", str(baseline))
    assert res.exit_code == 2 and "--baseline" in res.output


# ---------------------------------------------------------------- 4. unreadable paths (unprivileged)


# Unprivileged for file access: root without the two capabilities that bypass permission bits. (The
# user nobody cannot run this interpreter, which lives under /root; for reading files the effect is the
# same: a mode-000 file or directory cannot be opened.)
UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def _as_nobody(*args: str) -> subprocess.CompletedProcess:
    argv = [*UNPRIVILEGED, sys.executable, "-m", "ddpdoctor", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to run as nobody (setpriv)"
)


@needs_root
def test_unreadable_snapshot_file_is_a_finding(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    d = snapshot_with(tmp_path, {})
    os.chmod(d, 0o755)
    os.chmod(d / "env.json", 0)
    os.chmod(d / "ulimit-a.txt", 0)
    proc = _as_nobody("check", "--replay", str(d), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    bad = {f["data"]["file"] for f in data["findings"] if f["id"] == SNAPSHOT_BAD_FILE.id}
    assert bad == {"env.json", "ulimit-a.txt"} and proc.returncode == 3


@needs_root
def test_unreadable_lint_directories_are_reported_not_raised(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    (top / "ok.py").write_text("import os\n")
    (top / "sub" / "x.py").write_text("import os\n")
    os.chmod(top / "sub", 0)
    proc = _as_nobody("lint", "--json", str(top))
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    assert "Permission denied" in proc.stdout
    os.chmod(top, 0)
    proc = _as_nobody("lint", "--json", str(top))
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1, 2), proc.stderr


# ---------------------------------------------------------------- 6. huge numbers


def test_a_5000_digit_world_size_is_malformed_like_abc() -> None:
    env = parse_launch_env({"WORLD_SIZE": "9" * 5000, "RANK": "abc"})
    assert set(env.malformed) == {"WORLD_SIZE", "RANK"}
    assert len(env.malformed["WORLD_SIZE"]) < 200  # the value is shown shortened


def test_a_5000_digit_world_size_crashes_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "9" * 5000)
    monkeypatch.setenv("RANK", "0")
    res = invoke("check", "--only", "launch,network,nccl_env,mp", "--json")
    data = json.loads(res.stdout)
    assert PROBE_CRASHED.id not in ids(data)
    assert "launch.var.malformed" in ids(data) and res.exit_code == 1


# ---------------------------------------------------------------- 7. linear redaction, prolog bound

ADVERSARIAL = ['"x" * 2**20', '"x-" * 2**19', '"a:" * 2**19', '"sk-" * 350_000', '"a://" * 260_000',
               '"--password" * 100_000', '"A_TOKEN" * 150_000', '"?sig=&" * 170_000', '"hf_" * 350_000',
               '"Bearer " * 150_000']  # fmt: skip


def test_redaction_work_is_bounded_on_1mb_adversarial_values() -> None:
    """Each 1 MB value under a CPU-time limit (not a wall-clock assertion): the old quadratic patterns
    needed hours of CPU on these; linear ones need a fraction of a second, far under the 60 s limit."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (60, 60))\n"
        "from ddpdoctor.edge.redact import redact_text\n"
        f"for value in [{', '.join(ADVERSARIAL)}]:\n"
        "    redact_text('FOO=' + value, {})\n"
        "print('done')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", (proc.returncode, proc.stderr[-500:])


def test_the_hard_deadline_ends_a_process_whose_gil_is_held(tmp_path: Path) -> None:
    """A worker thread stuck in a C call that never releases the GIL (here an exponential regex) starves
    the in-process timer; the backstop process must still end the run, say why, and leave no child."""
    script = (
        "import re, subprocess, threading\n"
        "from ddpdoctor.ci.prolog import arm_hard_deadline\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "arm_hard_deadline(1.0)\n"
        "t = threading.Thread(target=lambda: re.match(r'(a|aa)+$', 'a' * 64 + 'b'))\n"
        "t.start(); t.join()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode in (3, -9), proc.stderr
    pid_line, reason = proc.stdout.splitlines()[:2]
    assert reason.startswith("core.prolog.deadline: ddpdoctor check did not finish within 1s")
    import psutil

    pid = int(pid_line)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_an_armed_bound_leaves_no_backstop_behind() -> None:
    from ddpdoctor.ci.prolog import arm_hard_deadline

    bound = arm_hard_deadline(300)
    assert bound.backstop is not None and bound.backstop.poll() is None
    bound.cancel()
    assert bound.backstop.poll() is not None
    assert not [t for t in threading.enumerate() if t is bound.timer and t.is_alive()]


# ---------------------------------------------------------------- 9. a check of nothing


def test_replaying_nothing_is_never_healthy(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (empty, Path("/dev/zero")):
        for cmd in (["check"], ["report"], ["expect", "--write", "-"]):
            res = invoke(cmd[0], "--replay", str(target), *cmd[1:])
            assert res.exit_code == 2, (cmd, target, res.output)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a snapshot file\n")
    code, data = replay_json(junk)
    assert code == 3 and SNAPSHOT_EMPTY.id in ids(data)


# ---------------------------------------------------------------- 12. one redaction at the edge

SECRETS = ("tok3nSecretValue", "pa55wordSecret", "deadbeefsig99", "AKIDcred", "dbpassSecret", "mypwdSecret",
           "slacksecretxyz", "hunter2secret")  # fmt: skip
PRESIGNED = "https://b.s3.amazonaws.com/p.so?X-Amz-Credential=AKIDcred&X-Amz-Signature=deadbeefsig99"


def secret_snapshot(tmp_path: Path) -> Path:
    env = json.loads((HEALTHY / "env.json").read_text())
    env.update({"NCCL_CONF_FILE": "/tmp/nccl.conf", "NCCL_NET_PLUGIN_URL": PRESIGNED, "DB_PASS": "dbpassSecret",
                "MY_PWD": "mypwdSecret", "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/slacksecretxyz",
                "MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1"})  # fmt: skip
    conf = {
        "files": {"/tmp/nccl.conf": "NCCL_IB_AUTH_TOKEN=tok3nSecretValue\nNCCL_PASSWORD=pa55wordSecret\n"}
    }
    port = {"port": 29500, "ephemeral_range": [32768, 60999],
            "holder": {"pid": 7, "name": "python", "address": "0.0.0.0:29500", "is_our_launcher": False,
                       "cmdline": "python serve.py --password hunter2secret --port 29500"}}  # fmt: skip
    return snapshot_with(
        tmp_path,
        {
            "env.json": json.dumps(env),
            "nccl-conf.json": json.dumps(conf),
            "net-master-port.json": json.dumps(port),
        },
    )


@pytest.mark.parametrize("fmt", ["json", "table", "markdown", "junit", "github", "prolog", "report"])
def test_no_output_format_shows_a_secret_from_a_snapshot(tmp_path: Path, fmt: str) -> None:
    d = secret_snapshot(tmp_path)
    if fmt == "report":
        res = invoke("report", "--replay", str(d))
    elif fmt == "prolog":
        res = invoke("check", "--replay", str(d), "--prolog")
    else:
        res = invoke("check", "--replay", str(d), "--format", fmt, "-v")
    assert res.exit_code in (0, 1, 3), res.output
    leaked = [s for s in SECRETS if s in res.output]
    assert not leaked, leaked


def test_live_facts_are_redacted_where_they_enter() -> None:
    with LiveSources() as sources:
        value = sources.fact("nccl-conf", lambda: {"files": {"/p": "NCCL_IB_AUTH_TOKEN=tok3nSecretValue\n"}})
    assert value == {"files": {"/p": f"NCCL_IB_AUTH_TOKEN={REDACTED}\n"}}


@pytest.mark.parametrize(
    "text, secret",
    [
        ("python serve.py --password hunter2secret --port 1", "hunter2secret"),
        ("python serve.py -db-pass hunter2secret", "hunter2secret"),
        (f"NCCL_NET_PLUGIN={PRESIGNED}", "deadbeefsig99"),
        ("DB_PASS=dbpassSecret MY_PWD=mypwdSecret", "dbpassSecret"),
        ("DB_PASS=dbpassSecret MY_PWD=mypwdSecret", "mypwdSecret"),
        ("SLACK_WEBHOOK_URL=https://hooks.slack.com/services/T0/B0/slacksecretxyz", "slacksecretxyz"),
        ("see https://hooks.slack.com/services/T0/B0/slacksecretxyz", "slacksecretxyz"),
    ],
)
def test_redaction_catches_the_forms_that_leaked(text: str, secret: str) -> None:
    assert secret not in redact_text(text, {})


def test_redaction_leaves_ordinary_text_alone() -> None:
    for text in ("PWD=/home/me", "OLDPWD=/tmp", "--bypass-cache 1", "NCCL_IB_PKEY=0x8001", "AUTHOR=me",
                 "--port 29500", "https://example.com/a?b=c"):  # fmt: skip
        assert redact_text(text, {}) == text


# ---------------------------------------------------------------- 13. report -o never overwrites


def test_report_refuses_to_overwrite_or_follow_links(tmp_path: Path) -> None:
    existing = tmp_path / "existing.md"
    existing.write_text("keep me\n")
    target = tmp_path / "target.md"
    target.write_text("keep me too\n")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    for out, extra in ((existing, ()), (link, ()), (link, ("--force",))):
        res = invoke("report", "--replay", str(HEALTHY), "-o", str(out), *extra)
        assert res.exit_code == 2, res.output
    assert existing.read_text() == "keep me\n" and target.read_text() == "keep me too\n"
    res = invoke("report", "--replay", str(HEALTHY), "-o", str(existing), "--force")
    assert res.exit_code == 0 and existing.read_text().startswith("#")


def test_write_new_file_is_atomic_about_links_and_existing_files(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.write_text("old")
    link = tmp_path / "l"
    link.symlink_to(target)
    with pytest.raises(InputRefused, match="exists"):
        write_output_file(target, "new")
    with pytest.raises(InputRefused, match="symbolic link"):
        write_output_file(link, "new", force=True)
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(InputRefused, match="regular"):
        write_output_file(fifo, "new", force=True)
    write_output_file(tmp_path / "n", "new")
    assert (tmp_path / "n").read_text() == "new" and target.read_text() == "old"


def test_a_replay_source_names_the_bad_file() -> None:
    src = ReplaySources(HEALTHY)
    assert src.fact("host", lambda: None) == "vm"
    assert src.problems == {} and src.used == {"host.json"}
