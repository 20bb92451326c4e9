"""Hostile inputs, round 2 (#26): no file disclosure through frame paths, no hang on special files, no
secret in any output, bounded unpickling, clear exit codes instead of tracebacks, no mixed snapshots,
no verdict on garbage. Real shapes: the torch 2.13 Flight Recorder fixtures rewritten as an attacker
would, real processes, real files. The whole-command sweep is bench/sweep_hostile.py.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.edge.files import read_quoted_source, source_roots
from ddpdoctor.hang.fr import load_plain_pickle

ROOT = Path(__file__).resolve().parent.parent
FR = Path(__file__).parent / "fixtures" / "flight_recorder"
SECRET = "hf_" + "Q" * 30


def invoke(*args: str, **kw):
    return CliRunner().invoke(app, list(args), **kw)


def run_cli(*args: str, cwd: Path, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", **kw.pop("env", {})}
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, env=env, capture_output=True, text=True,
        errors="replace", timeout=timeout, **kw,
    )  # fmt: skip


def hostile_dumps(tmp_path: Path, filename: str, scenario: str = "skip") -> Path:
    """The real `skip` dumps with every user frame pointing at `filename` (what a hostile writer does)."""
    out = tmp_path / "fr"
    out.mkdir()
    for src in sorted((FR / scenario).iterdir()):
        if src.name.endswith(".json"):
            continue
        raw = load_plain_pickle(src.read_bytes())
        for entry in raw["entries"]:
            for frame in entry.get("frames", []):
                if frame["filename"].endswith("_hang_job.py"):
                    frame["filename"] = filename
                    frame["line"] = 1
        (out / src.name).write_bytes(pickle.dumps(raw))
    return out


# 1. file disclosure through frame paths


@pytest.mark.parametrize("target", ["/etc/passwd", "/proc/self/environ", "/proc/self/status"])
def test_explain_fr_never_quotes_system_files(tmp_path, target, monkeypatch):
    monkeypatch.setenv("PLANTED_VALUE", "zz-environ-marker-zz")
    fr = hostile_dumps(tmp_path, target)
    monkeypatch.chdir(tmp_path)
    for argv in (("explain", str(fr), "--json"), ("explain", str(fr)), ("hang", "--fr", str(fr), "--json",
                 "--no-ras", "--no-stacks")):  # fmt: skip
        result = invoke(*argv)
        assert result.exit_code in (0, 1, 3), result.output
        assert "root:" not in result.output and "zz-environ-marker-zz" not in result.output
        assert "Name:" not in result.output  # /proc/self/status


def test_quoted_source_outside_the_tree_is_not_read_inside_it_is_redacted(tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    planted = outside / "keys.py"
    planted.write_text(f"HF_TOKEN = '{SECRET}'\n")
    (tmp_path / "a").mkdir()
    fr = hostile_dumps(tmp_path / "a", str(planted))
    monkeypatch.chdir(tmp_path / "a")
    assert SECRET not in invoke("explain", str(fr), "--json").output
    # Inside the dump's directory the file is quoted, with its secrets redacted.
    (tmp_path / "b").mkdir()
    inside = tmp_path / "b" / "fr" / "train.py"
    fr = hostile_dumps(tmp_path / "b", str(inside))
    inside.write_text(f"password = '{SECRET}' ; api_key='abc123def456'\n")
    text = read_quoted_source(str(inside), source_roots([str(fr)]))
    assert text is not None and "password" in text
    assert SECRET not in text and "abc123def456" not in text
    assert SECRET not in invoke("explain", str(fr), "--json").output


def test_quoted_source_refuses_special_and_foreign_files(tmp_path):
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    link = tmp_path / "link.py"
    link.symlink_to("/etc/hostname")
    roots = source_roots([str(tmp_path), "/", "/etc", "/proc/self"])
    assert roots == [os.path.realpath(tmp_path)]  # `/` and system directories are never a source tree
    start = time.monotonic()
    assert read_quoted_source(str(fifo), roots) is None  # opened without blocking, refused by fstat
    assert time.monotonic() - start < 5
    assert read_quoted_source(str(link), roots) is None  # resolves into /etc
    assert read_quoted_source("/proc/kmsg", ["/proc"]) is None
    mine = tmp_path / "mine.py"
    mine.write_text("x = 1\n")
    os.chmod(mine, 0o600)
    assert read_quoted_source(str(mine), roots, owner_uid=os.getuid()) == "x = 1\n"
    # A file the rank's user could not read (another owner, not world-readable) is not quoted.
    assert read_quoted_source(str(mine), roots, owner_uid=os.getuid() + 12345) is None


def test_live_rank_exec_of_a_system_file_is_not_quoted(tmp_path):
    """A rank running `exec(compile(src, "/etc/passwd", "exec"))`: its frame names /etc/passwd, its tree
    is its cwd; read_sources_into quotes its own script but never the system file."""
    from ddpdoctor.hang.findings import HangFacts
    from ddpdoctor.hang.fr import Frame
    from ddpdoctor.hang.probe_io import read_sources_into
    from ddpdoctor.hang.procs import Job, Worker
    from ddpdoctor.hang.stacks import RankStack, ThreadStack

    script = tmp_path / "train.py"
    script.write_text("import time\nexec(compile('time.sleep(60)', '/etc/passwd', 'exec'))\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        worker = Worker(proc.pid, 0, 0, (sys.executable, str(script)), {})
        facts = HangFacts(host="h", job=Job(None, (), [worker]))
        for name in ("/etc/passwd", str(script)):
            facts.stacks = [RankStack(0, proc.pid, [ThreadStack("MainThread", (Frame(name, 1, "<module>"),))])]
            read_sources_into(facts)
        assert list(facts.sources) == [str(script)]
    finally:
        proc.kill()
        proc.wait()


# 3. secrets in every output: one redaction function, a corpus of real secret shapes

JWT = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJuYW1lc3BhY2VfaWQiOiIxIiwicHJvamVjdF9pZCI6IjIifQ.c2lnbmF0dXJlX2hlcmU"
# (text, the secret that must go, a word that must stay)
SECRET_CORPUS = [
    ("python holder.py --auth Zq1authSecret --port 1", "Zq1authSecret", "holder.py"),
    ("server --key Zq2keySecret", "Zq2keySecret", "server"),
    ("mysql -p Zq3pwSecret -h db", "Zq3pwSecret", "mysql"),
    (f"client --jwt {JWT}", JWT, "client"),
    ("run --password=Zq4pw --auth=Zq5auth", "Zq4pw", "run"),
    ("conn(password='Zq6pass', host='db')", "Zq6pass", "host='db'"),
    ("login(token='Zq7tok')", "Zq7tok", "login"),
    ("init(api_key='Zq8key')", "Zq8key", "init"),
    ("{'aws_secret_access_key': 'Zq9AwsSecretKey/abc+def', 'region': 'us'}", "Zq9AwsSecretKey", "region"),
    ("aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", "aws_access_key_id"),
    ("AWS_SESSION_TOKEN=ASIAZZZZZZZZZZZZZZZZ", "ASIAZZZZZZZZZZZZZZZZ", "AWS_SESSION_TOKEN"),
    ("REDIS_URL=redis://:Zq10pw@cache:6379/0", "Zq10pw", "cache:6379"),
    ("postgres://trainer:Zq11pw@db.internal/x", "Zq11pw", "db.internal"),
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zq12Az+key==;EndpointSuffix=core.windows.net",
     "Zq12Az", "AccountName=acct"),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=Zq13sas=", "Zq13sas",
     "SharedAccessKeyName=root"),
    ("https://acct.blob.core.windows.net/c?sv=2022&sig=Zq14sig%3D", "Zq14sig", "acct.blob"),
    ("SharedAccessSignature=sv=2022&sr=c&sig=Zq15sig", "Zq15sig", "SharedAccessSignature"),
    ("token: ya29.a0AfH6SMBZq16googleOAuthTokenxx", "Zq16google", "token"),
    ("key AIzaSyZq17abcdefghijklmnopqrstuvwxyz012", "Zq17abc", "key"),
    ('"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvZq18\\n-----END PRIVATE KEY-----\\n"', "Zq18", "private_key"),
    (f"CI_JOB_JWT={JWT}", JWT, "CI_JOB_JWT"),
    (f"CI_JOB_JWT_V2: {JWT}", JWT, "CI_JOB_JWT_V2"),
    (f"ID_JWT={JWT}", JWT, "ID_JWT"),
    ("CI_JOB_TOKEN=Zq19citoken", "Zq19citoken", "CI_JOB_TOKEN"),
    ("GITHUB_TOKEN=ghs_Zq20abcdefghijklmnopqrstuvwxyz0123", "Zq20", "GITHUB_TOKEN"),
    ("runner glrt-Zq21abcdefghijklmnopqrst", "Zq21", "runner"),
    ("ACTIONS_ID_TOKEN_REQUEST_TOKEN=Zq22req", "Zq22req", "ACTIONS_ID_TOKEN_REQUEST_TOKEN"),
    ("HF_TOKEN=hf_Zq23abcdefghijklmnopqrstuvwx", "Zq23", "HF_TOKEN"),
    ("using hf_Zq24abcdefghijklmnopqrstuvwx now", "Zq24", "using"),
    ("WANDB_API_KEY=Zq25" + "a" * 36, "Zq25", "WANDB_API_KEY"),
    ("git clone https://x-access-token:ghp_Zq26abcdefghijklmnopqrstuvwxyz@github.com/o/r", "Zq26", "github.com"),
    ("Authorization: Bearer Zq27bearerTokenValue", "Zq27", "Authorization"),
    # the independent attack pass of #26
    ("wandb: login with key 00000070c0ffee15c0ffee15c0ffee15c0ffee15 (WANDB", "c0ffee15", "wandb: login with key"),
    ("wandb login local-" + "ab12" * 10, "ab12ab12", "wandb login"),
    ("MASTER_ADDR='u:Zq30pw@host' is not a host name", "Zq30pw", "@host'"),
    ("MASTER_ADDR=trainer:Zq31pw@10.0.0.1", "Zq31pw", "@10.0.0.1"),
    ("python holder.py --id AKIAZQ32XXXXXXXXXX 6000", "AKIAZQ32", "--id"),
    ("role AROAZQ33ABCDEFGHIJKL assumed", "AROAZQ33", "assumed"),
    ("python train.py --hf-token hf_Zq34abcdefghijklmnopqrstuv", "Zq34", "train.py"),
    ("rank 5 (pid 4 on evil-ghp_Zq35abcdefghijklmnopqrstuvwxyz) is behind", "Zq35", "is behind"),
]

# Look-alikes that must come out unchanged: the new shapes must not eat ordinary log text.
NOT_SECRETS = [
    "git@github.com:org/repo.git",
    "host01:1234:5678 [0] NCCL INFO Channel 00/02 : 0 1",
    "commit 0123456789abcdef0123456789abcdef01234567 (HEAD)",
    "[rank0]:[W1121 10:00:00.000 init.py:12] warning",
    "MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 user@host",
    "pip install scikit-learn sk-learn-extra",
    "AKIAB is a word",
    "/home/u/job.py:47 `x = key[0]`",
]


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_secret_lookalikes_stay(text):
    from ddpdoctor.edge.redact import redact_text

    assert redact_text(text, {}) == text


@pytest.mark.parametrize("text,secret,keep", SECRET_CORPUS)
def test_secret_corpus(text, secret, keep):
    from ddpdoctor.edge.redact import redact_text

    out = redact_text(text, {})
    assert secret not in out and keep in out, out


def test_secret_named_environment_values():
    from ddpdoctor.edge.redact import REDACTED, redact_env

    env = redact_env({"CI_JOB_JWT": JWT, "ID_JWT": "x", "REDIS_URL": "redis://:pw12345@h:1",
                      "AZURE_STORAGE_CONNECTION_STRING": "a=b;AccountKey=Zq1;c=d", "NCCL_DEBUG": "INFO"})  # fmt: skip
    assert env["CI_JOB_JWT"] == env["ID_JWT"] == REDACTED
    assert "pw12345" not in env["REDIS_URL"] and "Zq1" not in env["AZURE_STORAGE_CONNECTION_STRING"]
    assert env["NCCL_DEBUG"] == "INFO"


@pytest.fixture
def port_holder(tmp_path):
    """A real process listening on a port, started as `python h.py --auth X --key X -p X --jwt JWT` (a
    short command line: every value lies inside the 120 characters a summary shows)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import socket, time\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    (tmp_path / "h.py").write_text(code)
    argv = [sys.executable, str(tmp_path / "h.py"), "--auth", "Zq1authSecret", "--key", "Zq2keySecret", "-p", "Zq3pwSecret",
            "--jwt", JWT]  # fmt: skip
    holder = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "up\n"
    yield port
    holder.kill()
    holder.wait()


HOLDER_SECRETS = ("Zq1authSecret", "Zq2keySecret", "Zq3pwSecret", JWT, "Zq4ci", "Zq5redis", "Zq6azure")
LEAKY_ENV = {"CI_JOB_JWT": JWT, "ID_JWT": "Zq4ciJwtValue", "REDIS_URL": "redis://:Zq5redis@h:6379",
             "AZURE_CONN": "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Zq6azure==;x=y"}  # fmt: skip


def test_port_holder_and_environment_secrets_never_leave(tmp_path, port_holder):
    env = {"MASTER_PORT": str(port_holder), "MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "2",
           **LEAKY_ENV}  # fmt: skip
    snap = tmp_path / "snap"
    out = []
    for fmt in ("json", "table", "markdown", "junit", "github"):
        result = run_cli("check", "--only", "network,launch", "--format", fmt, "-v", cwd=tmp_path, env=env)
        assert "Traceback" not in result.stderr
        out.append(result.stdout + result.stderr)
    assert "in use by PID" in out[0] and "--auth <redacted>" in out[0]  # the holder seen, shown redacted
    result = run_cli("snapshot", str(snap), "--only", "network,launch", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    out += [p.read_text(errors="replace") for p in snap.iterdir()]
    report = run_cli("report", "--replay", str(snap), "-o", "-", cwd=tmp_path, env=env)
    live_report = run_cli("report", "-o", "-", cwd=tmp_path, env=env, timeout=120)
    out += [report.stdout, live_report.stdout]
    for secret in HOLDER_SECRETS:
        assert not any(secret in text for text in out), secret
    assert "CI_JOB_JWT" not in live_report.stdout  # only the variables that shape a job are embedded


def test_report_header_survives_its_own_redaction():
    from ddpdoctor.edge.redact import describe_redaction, redact_text

    text = describe_redaction()
    assert redact_text(text, {}) == text and text.count("`") % 2 == 0


# 2. nothing blocks, nothing backtracks

GITIGNORE_CASES = [
    "*.py", "/build", "build/", "**/foo", "a/**/b", "a/**", "[!a]*.txt", "[a-c]?.py", "*.py[co]", "a?c",
    "docs/*.md", "\\#x", "x/**/y/*.py", "*a*a*a*b", "**/*.log", "a/b",
]  # fmt: skip
GITIGNORE_PATHS = [
    "a.py", "x/a.py", "build", "x/build", "foo", "a/b/foo", "a/b", "a/x/y/b", "a/x", "b.txt", "a.txt",
    "c/b.txt", "b1.py", "d1.py", "x.pyc", "abc", "docs/r.md", "docs/x/r.md", "#x", "x/q/y/z.py",
    "aaab", "xaaxab", "s/t.log", "a/bb",
]  # fmt: skip


@pytest.mark.parametrize("pattern", GITIGNORE_CASES)
def test_gitignore_matching_agrees_with_git(tmp_path, pattern):
    """The linear matcher against git itself (`git check-ignore --no-index`) on files."""
    from ddpdoctor.lint.discover import is_ignored, parse_gitignore

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(pattern + "\n")
    git = subprocess.run(
        ["git", "-C", str(tmp_path), "check-ignore", "--no-index", "--stdin"], input="\n".join(GITIGNORE_PATHS),
        capture_output=True, text=True,
    )  # fmt: skip
    ignored_by_git = set(git.stdout.split())
    rules = parse_gitignore(pattern + "\n", tmp_path)

    def ignored(path: str) -> bool:  # as the walker sees it: an ignored directory is never entered
        parts = path.split("/")
        parents = ("/".join(parts[:k]) for k in range(1, len(parts)))
        return any(is_ignored(tmp_path / d, True, rules) for d in parents) or is_ignored(tmp_path / path, False, rules)

    ours = {p for p in GITIGNORE_PATHS if ignored(p)}
    assert ours == ignored_by_git


def test_lint_with_a_backtracking_gitignore_pattern_ends(tmp_path):
    (tmp_path / ".gitignore").write_text("*a*a*a*a*a*a*a*a*b\n")
    (tmp_path / ("a" * 200 + ".py")).write_text("import os\n")
    result = run_cli("lint", str(tmp_path), "--json", cwd=tmp_path, timeout=60)  # a cap, not a timing
    assert result.returncode in (0, 1), result.stderr


REAL_LOG = Path(__file__).parent / "fixtures" / "explain" / "real-h100" / "dup_gpu.log"


def _root_cause(result) -> str:
    import json

    return (json.loads(result.stdout).get("root_cause") or {}).get("id", "")


@pytest.mark.parametrize("tool", ["gzip", "xz", "bzip2", "zstd"])
def test_compressed_logs_are_decoded_or_refused_by_name(tmp_path, tool):
    """Real compressors on a real log: the same root cause as the plain log, or (zstd without a zstd
    module) exit 2 naming the way out; never "nothing recognised"."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    expected = _root_cause(invoke("explain", str(REAL_LOG), "--json"))
    assert expected
    packed = tmp_path / "rank0.log"  # no suffix: the format is told by magic bytes, not the name
    packed.write_bytes(subprocess.run([tool, "-c", str(REAL_LOG)], capture_output=True, check=True).stdout)
    result = invoke("explain", str(packed), "--json")
    if result.exit_code == 2:
        assert tool == "zstd" and "zstd -dc" in result.output
    else:
        assert _root_cause(result) == expected
    with open(packed, "rb") as stdin:  # and through stdin
        piped = run_cli("explain", "--json", cwd=tmp_path, stdin=stdin)
    assert piped.returncode == result.exit_code and "Traceback" not in piped.stderr


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_logs_are_decoded(tmp_path, encoding):
    expected = _root_cause(invoke("explain", str(REAL_LOG), "--json"))
    log = tmp_path / "rank0.log"
    log.write_bytes(REAL_LOG.read_text(errors="replace").encode(encoding))
    assert _root_cause(invoke("explain", str(log), "--json")) == expected


@pytest.mark.parametrize("path", ["/proc/kmsg", "/proc/self/environ", "/dev/zero", "/dev/null", "/sys/kernel/notes"])
def test_explain_refuses_kernel_and_device_files_without_reading(tmp_path, path):
    result = run_cli("explain", path, cwd=tmp_path, timeout=60)  # a cap: /proc/kmsg used to block forever
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "not a log" in result.stderr or "not a regular file" in result.stderr or "no such" in result.stderr


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_explain_stdin_of_binary_data_is_a_usage_error(tmp_path, device):
    with open(device, "rb") as stdin:
        result = run_cli("explain", cwd=tmp_path, stdin=stdin, timeout=60)
    assert result.returncode == 2 and "not a text log" in result.stderr, result.stderr


def test_hang_fr_frame_naming_kmsg_or_a_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "fr" / "pipe.py"
    fr = hostile_dumps(tmp_path, str(fifo))
    os.mkfifo(fifo)
    for target in (str(fifo), "/proc/kmsg"):
        if target == "/proc/kmsg":
            shutil.rmtree(fr)
            fr = hostile_dumps(tmp_path, target)
        result = run_cli("hang", "--fr", str(fr), "--no-ras", "--no-stacks", "--json", cwd=tmp_path, timeout=60)
        assert result.returncode in (0, 1, 3) and "Traceback" not in result.stderr


# 4. memory: a pickle's shared references cannot expand without bound


def _real_dump(name: str = "rank_0") -> dict:
    return load_plain_pickle((FR / "skip" / name).read_bytes())


def test_shared_reference_pickle_is_refused_by_its_object_count(tmp_path):
    raw = _real_dump()
    entry = dict(raw["entries"][0], frames=(raw["entries"][0]["frames"] * 40)[:64])
    raw["entries"] = [entry] * 300_000  # one entry, memoized: 600 KB on disk, 2.5 GB once expanded
    data = pickle.dumps(raw, protocol=4)
    assert len(data) < 1024 * 1024
    from ddpdoctor.hang.fr import DumpError, parse_dump

    with pytest.raises(DumpError, match="expands to more than"):
        parse_dump(data)
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "rank_0").write_bytes(data)
    result = run_cli("explain", str(tmp_path / "fr"), cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "expands to more than" in result.stderr


def test_frames_kept_per_entry_are_capped_and_keep_the_user_frame():
    from ddpdoctor.hang.fr import MAX_FRAMES_KEPT, build_dump

    raw = _real_dump()
    frames = raw["entries"][0]["frames"]
    library = [f for f in frames if "site-packages" in f["filename"] or f["filename"].startswith("<")]
    user = next(f for f in frames if f["filename"].endswith("_hang_job.py"))
    library = library or [{"filename": "<frozen x>", "line": 1, "name": "f"}]
    raw["entries"][0]["frames"] = (library * 40)[:40] + [user] + library * 64
    first = build_dump(raw).entries[0]
    assert len(first.frames) <= MAX_FRAMES_KEPT and first.user_frame().filename == user["filename"]


def test_budget_is_shared_by_the_files_of_a_directory(tmp_path, monkeypatch):
    from ddpdoctor.hang import probe_io

    for name in ("rank_0", "rank_1", "rank_2"):
        shutil.copy(FR / "skip" / name, tmp_path / name)
    monkeypatch.setattr(probe_io, "MAX_FR_FILES", 2)
    reads = probe_io.read_dumps(str(tmp_path))
    assert [r.dump is not None for r in reads] == [True, True, False]
    assert "1 file(s)" in reads[2].error and "left out" in reads[2].error


# 5 and 7. huge integers, and dumps that all claim rank 0


@pytest.mark.parametrize("field", ["collective_seq_id", "rank", "pg_id", "line"])
def test_huge_integers_in_a_dump_are_no_traceback(tmp_path, field):
    raw = _real_dump()
    huge = 7 * 10**4999  # 5000 digits (int("7" * 5000) itself is refused past 4300)
    if field == "rank":
        raw["rank"] = huge
    elif field == "line":
        raw["entries"][0]["frames"][0]["line"] = huge
    else:
        raw["entries"][0][field] = huge
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "rank_0").write_bytes(pickle.dumps(raw))
    for fmt in ("--json", "--format=table", "--format=markdown"):
        result = run_cli("explain", str(tmp_path / "fr"), fmt, cwd=tmp_path)
        assert "Traceback" not in result.stderr and result.returncode in (0, 1, 3), result.stderr[-500:]


def test_dumps_that_all_claim_rank_0_are_named_not_dropped(tmp_path):
    (tmp_path / "fr").mkdir()
    for i, name in enumerate(("rank_0", "rank_1", "rank_2")):
        raw = _real_dump(name)
        raw["rank"] = 0
        (tmp_path / "fr" / f"dump_{chr(97 + i)}").write_bytes(pickle.dumps(raw))
    from ddpdoctor.hang.probe_io import read_dumps

    reads = read_dumps(str(tmp_path / "fr"))
    assert sum(r.dump is not None for r in reads) == 1
    errors = [r.error for r in reads if r.dump is None]
    assert len(errors) == 2 and all("claims rank 0" in e for e in errors)
    result = run_cli("explain", str(tmp_path / "fr"), "--json", cwd=tmp_path)
    assert all(f"dump_{c}: claims rank 0" in result.stdout for c in "bc")


# 5. closed or broken standard output, and an encoding that cannot hold every character

HEALTHY = Path(__file__).parent / "fixtures" / "ci" / "healthy-cpu-node"
STDOUT_COMMANDS = [
    ("check", "--only", "launch"),
    ("check", "--only", "launch", "--json"),
    ("report", "--replay", str(HEALTHY)),
    ("expect", "--replay", str(HEALTHY), "--write", "-"),
    ("explain", str(REAL_LOG)),
    ("explain", str(REAL_LOG), "--json"),
    ("plan", "--help"),
    ("lint", str(ROOT / "tests" / "_hang_job.py")),
]


def _closed_stdout_run(argv: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, timeout=120,
        preexec_fn=lambda: os.close(1),  # `>&-`: started with fd 1 closed
    )  # fmt: skip


@pytest.mark.parametrize("argv", STDOUT_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_closed_stdout_is_exit_2_with_a_reason(tmp_path, argv):
    result = _closed_stdout_run(argv, tmp_path)
    assert "Traceback" not in result.stderr, result.stderr[-800:]
    assert result.returncode == 2 and "standard output is closed" in result.stderr


def test_broken_pipe_is_exit_2_without_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    for argv in (("check", "--only", "launch,network", "-v"), ("explain", str(REAL_LOG), "--json", "--all")):
        reader_gone = subprocess.Popen(
            [sys.executable, "-m", "ddpdoctor", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert reader_gone.stdout is not None and reader_gone.stderr is not None
        reader_gone.stdout.close()  # the reader goes away before the first write (`| head -0`)
        stderr = reader_gone.stderr.read()
        assert reader_gone.wait(timeout=120) == 2 and "Traceback" not in stderr, stderr[-800:]


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_stdout_that_cannot_encode_gets_replacements(tmp_path, encoding):
    log = tmp_path / "rank0.log"
    log.write_text("x \u2014 RuntimeError: CUDA error: invalid device ordinal \u00e9 \u4e2d\n")
    for argv in (("explain", str(log), "--all"), ("report", "--replay", str(HEALTHY))):
        result = run_cli(*argv, cwd=tmp_path, env={"PYTHONIOENCODING": encoding})
        assert "Traceback" not in result.stderr and result.returncode in (0, 1), result.stderr[-800:]


# 6. COLUMNS


@pytest.mark.parametrize("columns,width", [("0", 80), ("-5", 80), ("abc", 80), ("100000", 1000), ("9" * 50, 80)])
def test_columns_zero_or_huge(tmp_path, columns, width):
    from ddpdoctor.render import console_width

    assert console_width({"COLUMNS": columns}) == width
    result = run_cli("check", "--replay", str(HEALTHY), cwd=tmp_path, env={"COLUMNS": columns})
    lines = result.stdout.splitlines()
    assert lines and "Summary" in result.stdout  # COLUMNS=0 used to print nothing
    assert max(len(line) for line in lines) <= width


# 8. report -o - and -o FIFO


def test_report_dash_is_stdout_and_fifo_is_refused_without_suggesting_force(tmp_path):
    result = run_cli("report", "--replay", str(HEALTHY), "-o", "-", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("# ddpdoctor report")
    assert not (tmp_path / "-").exists()
    fifo = tmp_path / "out.md"
    os.mkfifo(fifo)
    result = run_cli("report", "--replay", str(HEALTHY), "-o", str(fifo), cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "not a regular file (FIFO)" in result.stderr
    assert "--force" not in result.stderr


# 5. lint's pyproject.toml, RAS replies of the wrong shape


@pytest.mark.parametrize("toml,code", [
    ("tool = 5\n", (0, 1)),
    ("[tool]\nddpdoctor = \"x\"\n", (2,)),
    ("[tool.ddpdoctor]\nlint = 3\n", (2,)),
    ("[tool.ddpdoctor.lint]\nignore = 5\n", (2,)),
])  # fmt: skip
def test_lint_pyproject_of_the_wrong_shape(tmp_path, toml, code):
    (tmp_path / "pyproject.toml").write_text(toml)
    (tmp_path / "train.py").write_text("import torch\n")
    result = run_cli("lint", str(tmp_path), cwd=tmp_path)
    assert result.returncode in code and "Traceback" not in result.stderr, result.stderr[-500:]
    if code == (2,):
        assert "must be" in result.stderr


RAS_FIX = Path(__file__).parent / "fixtures" / "nccl_ras"


@pytest.mark.parametrize("body", [
    '{"communicators": 5}',
    '{"nccl_version": "2.28.9", "communicators": [{"ranks": 5, "missing_ranks": "x"}]}',
    '{"communicators": [5, "x", null]}',
    '{"a": 1}',
    "x" * 100_000,
    "\x00\x01garbage\n" * 1000,
])  # fmt: skip
def test_ras_reply_of_the_wrong_shape_is_no_verdict(body):
    from ddpdoctor.hang.ras import parse_ras

    try:
        status = parse_ras(body)
    except ValueError:
        return  # "RAS: garbage", never "every rank answered"
    assert status.nccl_version  # only a reply that names itself a RAS status is read at all


def test_real_ras_replies_still_parse():
    from ddpdoctor.hang.ras import parse_ras, split_reply

    for path in sorted(RAS_FIX.iterdir()):
        data = path.read_bytes()
        body = split_reply(data)[1] if data.startswith(b"SERVER") else data.decode()
        status = parse_ras(body)
        assert status.nccl_version or status.comms


# 5 and 7. parse: huge numbers, and another tool's output

GPU_FIX = Path(__file__).parent / "fixtures" / "gpu"
OTHER_TOOLS = [
    GPU_FIX / "nvidia-smi-q__8xh100-535.161.08-gpu0-section-hw-power-brake-active-pcie-replays.txt",
    GPU_FIX / "dmesg__xid-51-bad-tsg-then-xid-154-pf-flr-excerpt.txt",
    GPU_FIX / "dmesg__h100-fallen-off-bus-multiline-no-xid-570.158.01.txt",
    GPU_FIX / "p2pBandwidthLatencyTest__2x-rtx2080ti-cannot-access-peer.txt",
    GPU_FIX / "nvidia-smi__unable-to-determine-device-handle-unknown-error.txt",
    HEALTHY / "df-shm.txt",
    HEALTHY / "lspci-vvv.txt",
]


@pytest.mark.parametrize("tool", ["ibstat", "ibstatus", "ibv_devinfo", "lsmod"])
@pytest.mark.parametrize("other", OTHER_TOOLS, ids=lambda p: p.name[:40])
def test_parse_on_another_tools_output_is_exit_3(tool, other):
    result = invoke("parse", tool, str(other))
    assert result.exit_code == 3, result.output[-400:]


def test_lsmod_and_proc_modules_still_parse():
    from ddpdoctor.parsers.modules import parse_modules

    lsmod = (
        "Module                  Size  Used by\nnvidia_uvm           1421312  0\nnvidia_modeset       1208320  1 "
        "nvidia_drm\nnvidia              56569856  2 nvidia_uvm,nvidia_modeset\nib_core               462848  8 "
        "rdma_cm,ib_ipoib,iw_cm,ib_umad,rdma_ucm,ib_uverbs,mlx5_ib,ib_cm\n"
    )  # fmt: skip
    proc = (
        "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n"
        "nvidia 56569856 2 nvidia_uvm,nvidia_modeset, Live 0xffffffffc0a00000 (POE)\n"
        "mlx5_core 2322432 1 mlx5_ib, Live 0x0000000000000000\n"
    )
    assert [m.name for m in parse_modules(lsmod)] == ["nvidia_uvm", "nvidia_modeset", "nvidia", "ib_core"]
    assert [m.name for m in parse_modules(proc)] == ["nvidia_peermem", "nvidia", "mlx5_core"]
    assert parse_modules(proc)[1].used_by == ["nvidia_uvm", "nvidia_modeset"]


@pytest.mark.parametrize("digits", [25, 400, 5000])
def test_df_with_huge_numbers_is_no_overflow(tmp_path, digits):
    big = "9" * digits
    text = f"Filesystem     1K-blocks  Used Available Use% Mounted on\nshm {big} 0 {big} {big}% /dev/shm\n"
    (tmp_path / "df.txt").write_text(text)
    result = invoke("parse", "df", str(tmp_path / "df.txt"))
    assert result.exit_code in (0, 3) and result.exception is None or isinstance(result.exception, SystemExit)
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap)
    (snap / "df-shm.txt").write_text(text)
    replay = invoke("check", "--replay", str(snap), "--json", "--only", "system")
    assert replay.exception is None or isinstance(replay.exception, SystemExit)
    assert '"core.probe.crashed"' not in replay.output and '"area": "system"' in replay.output


# 7. hang --pid of something that is no job


def test_hang_pid_of_pid_1_a_plain_python_process_or_no_process(tmp_path):
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid, words in ((1, "not a distributed job"), (plain.pid, "not a distributed job"),
                           (4_000_000, "no such process")):  # fmt: skip
            result = run_cli("hang", "--pid", str(pid), "--no-ras", "--json", cwd=tmp_path, timeout=60)
            assert result.returncode == 3 and words in result.stdout, result.stdout[-600:]
            assert "rank -" not in result.stdout
    finally:
        plain.kill()
        plain.wait()


def test_a_rank_of_unknown_number_is_shown_by_pid_never_as_a_negative_rank():
    from ddpdoctor.hang.findings import HangFacts
    from ddpdoctor.hang.fr import Frame
    from ddpdoctor.hang.stacks import RankStack, ThreadStack
    from ddpdoctor.hang.verdict import judge_hang
    from ddpdoctor.render.hang import _stack_lines

    frame = Frame("/job/train.py", 3, "<module>")
    facts = HangFacts(host="h", stacks=[RankStack(None, 26649, [ThreadStack("MainThread", (frame,))])])
    data = judge_hang(facts).to_dict()
    groups = data["facts"]["stack_groups"] if "facts" in data else data["stack_groups"]
    assert groups[0]["ranks"] == [] and groups[0]["pids_rank_unknown"] == [26649]
    line = _stack_lines({"stack_groups": groups})[0]
    assert "pid 26649 (rank unknown)" in line and "-26649" not in line


# 7 and 8. expectations and plan values


@pytest.mark.parametrize("toml,why", [
    ("[rdma]\nrate_gbps = nan\n", "finite"),
    ("[rdma]\nrate_gbps = inf\n", "finite"),
    ('[rdma]\nlink_layer = "Ethernet "\n', "trailing spaces"),
    ('[gpu]\nmodel = " H100"\n', "trailing spaces"),
    ('[kernel]\nmodules = ["nvidia_peermem "]\n', "trailing spaces"),
    (f'[system]\nshm_min = "{"9" * 400}G"\n', "not a size"),
    ("[system]\nshm_min = -5\n", "negative"),
])  # fmt: skip
def test_expectations_with_nan_or_stray_spaces_are_refused(tmp_path, toml, why):
    path = tmp_path / "expect.toml"
    path.write_text(toml)
    result = invoke("check", "--replay", str(HEALTHY), "--expect", str(path))
    assert result.exit_code == 2 and why in result.output, result.output[-400:]


@pytest.mark.parametrize("argv", [("--params", "9" * 4000 + "B"), ("--params", "7B", "--gpu-mem", "9" * 4000 + "G")])
def test_plan_names_a_huge_value_by_its_length(argv):
    result = invoke("plan", *argv)
    assert result.exit_code == 2 and "too large" in result.output and "9" * 100 not in result.output


# 6. snapshots started at once into one new directory


def test_concurrent_snapshots_into_one_directory_do_not_mix(tmp_path):
    target = tmp_path / "snap"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "ddpdoctor", "snapshot", str(target), "--only", "launch,network"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]  # fmt: skip
    outcomes = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2, 2], outcomes
    assert all("snapshot" in err for code, err in outcomes if code == 2)
    names = sorted(p.name for p in target.iterdir())
    assert names and not any(name.startswith(".ddpdoctor") for name in names)  # the claim is gone
    assert invoke("check", "--replay", str(target), "--only", "launch,network", "--json").exit_code in (0, 1)


# 8. Ctrl-C and SIGTERM: 130 and 143 for every command (README's exit-code table)


# SIGTERM: the command cleans up, then dies of the signal (a shell reports 143, torchrun "Signal 15").
@pytest.mark.parametrize("signame,code", [("SIGINT", 130), ("SIGTERM", -15)])
def test_interrupted_command_exits_130_or_143(tmp_path, signame, code):
    import signal

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # explain waiting on stdin that never ends: a command stuck in a read, as a user would stop it.
    proc = subprocess.Popen([sys.executable, "-m", "ddpdoctor", "explain"], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(3)  # past the imports, into the read
        proc.send_signal(getattr(signal, signame))
        assert proc.wait(timeout=60) == code
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SECRET_CORPUS), st.text(max_size=200), st.text(max_size=200))
def test_secret_corpus_survives_no_surrounding_text(case, before, after):
    """Each secret shape, between random lines of text, never leaves redact_text."""
    from ddpdoctor.edge.redact import redact_text

    text, secret, _ = case
    assert secret not in redact_text(f"{before}\n{text}\n{after}", {})


@pytest.mark.parametrize("spec", ["/proc", "/proc/self", "/proc/kmsg", "/proc/self/env", "/sys/kernel"])
def test_flight_recorder_spec_under_proc_or_sys_reads_nothing(tmp_path, spec):
    """A job's own TORCH_FR_DUMP_TEMP_FILE (or a typo) naming kernel files: no file there is read."""
    from ddpdoctor.hang.probe_io import fr_candidates

    assert fr_candidates(spec) == ([], [])
    result = run_cli("explain", spec, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_an_argv_kept_as_a_list_is_redacted_across_elements():
    from ddpdoctor.edge.redact import REDACTED, redact_data

    argv = ["python", "t.py", "--auth", "Zq1", "--key", "Zq2", "-p", "Zq3", "--jwt", JWT, "--port", "29500"]
    out = redact_data({"argv": argv}, {})["argv"]
    assert out == ["python", "t.py", "--auth", REDACTED, "--key", REDACTED, "-p", REDACTED, "--jwt", REDACTED,
                   "--port", "29500"]  # fmt: skip
