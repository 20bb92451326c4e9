"""The hostile-input sweep of issues #20 and #26 (groups 26-*): every command as a hostile user would run it, counted.

Each case runs the real `ddpdoctor` CLI in a subprocess with a wall-clock cap and passes when it
(1) ends before its cap, (2) prints no Python traceback, (3) exits with one of the codes the case allows
(always within 0-3), and (4) passes the case's own check (a secret absent from the output, a file left
untouched, a finding present). Cases that need an unprivileged user (unreadable files) run through
`setpriv --bounding-set=-dac_override,-dac_read_search` (root
without the capabilities that bypass permission bits) when this script runs as root, and are skipped otherwise.

    .venv/bin/python bench/sweep_hostile.py            # all cases, a summary line per group
    .venv/bin/python bench/sweep_hostile.py -v         # and every case
    .venv/bin/python bench/sweep_hostile.py --only redact

Results are recorded in docs/validation.md ("Hostile inputs").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "tests" / "fixtures" / "ci" / "healthy-cpu-node"
FACT_NAMES = (
    "env",
    "gpu-pci",
    "host",
    "infiniband-sysfs",
    "kernel-modules",
    "nccl-conf",
    "net-interfaces",
    "net-master-port",
    "net-resolve",
    "nvml",
    "system",
)
SECRETS = ("tok3nSecret", "pa55wordSecret", "deadbeefsig99", "AKIDcred", "dbpassSecret", "mypwdSecret",
           "slacksecretxyz", "hunter2secret")  # fmt: skip


@dataclass
class Case:
    group: str
    name: str
    argv: Sequence[str]
    codes: tuple[int, ...]
    cap_s: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    stdin: Optional[str] = None  # a path
    as_nobody: bool = False
    verify: Optional[Callable[[subprocess.CompletedProcess], str]] = None  # "" when fine, else why


@dataclass
class Outcome:
    case: Case
    ok: bool
    why: str
    seconds: float


def ddpdoctor_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddpdoctor", *args]


def run_case(case: Case, cwd: Path, root: Path = ROOT, mem_mib: int = 4096) -> Outcome:
    argv = list(case.argv)
    if shutil.which("prlimit"):
        argv = ["prlimit", f"--as={mem_mib * 1024 * 1024}", "--", *argv]
    if case.as_nobody:
        # Root without the capabilities that bypass permission bits: file access as an unprivileged user
        # (nobody itself cannot run an interpreter that lives under /root).
        argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *argv]
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "120", **case.env}
    start = time.monotonic()
    stdin = open(case.stdin, "rb") if case.stdin else subprocess.DEVNULL  # noqa: SIM115
    try:
        with subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            errors="replace", start_new_session=True,
        ) as popen:  # fmt: skip
            try:
                stdout, stderr = popen.communicate(timeout=case.cap_s)
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)  # the whole session: no probe left behind
                popen.communicate()
                return Outcome(case, False, f"still running after {case.cap_s:g}s", time.monotonic() - start)
    finally:
        if case.stdin:
            stdin.close()
    proc = subprocess.CompletedProcess(argv, popen.returncode, stdout, stderr)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    if "Traceback (most recent call last)" in out:
        return Outcome(case, False, "traceback: " + out[out.index("Traceback") :][-300:], took)
    if proc.returncode not in case.codes:
        return Outcome(case, False, f"exit {proc.returncode}, wanted {case.codes}: {out[-300:]}", took)
    if '"core.probe.crashed"' in out:
        return Outcome(case, False, "core.probe.crashed in the report", took)
    why = case.verify(proc) if case.verify else ""
    return Outcome(case, not why, why, took)


def no_secret(proc: subprocess.CompletedProcess) -> str:
    leaked = [s for s in SECRETS if s in proc.stdout or s in proc.stderr]
    return f"leaked {leaked}" if leaked else ""


def files_without_secret(*paths: Path) -> Callable[[subprocess.CompletedProcess], str]:
    def verify(proc: subprocess.CompletedProcess) -> str:
        for p in paths:
            for f in [p] if p.is_file() else sorted(p.glob("*")):
                text = f.read_text(errors="replace")
                leaked = [s for s in SECRETS if s in text]
                if leaked:
                    return f"{f.name} leaked {leaked}"
        return no_secret(proc)

    return verify


def has_finding(finding_id: str) -> Callable[[subprocess.CompletedProcess], str]:
    def verify(proc: subprocess.CompletedProcess) -> str:
        return "" if finding_id in proc.stdout else f"no {finding_id} finding"

    return verify


def snapshot_with(tmp: Path, name: str, files: dict[str, str]) -> Path:
    d = tmp / name
    shutil.copytree(HEALTHY, d)
    for fname, text in files.items():
        (d / fname).write_text(text)
    return d


def wrong_values() -> dict[str, str]:
    """JSON of every type, and a structure with strings where objects belong."""
    return {
        "string": '"abc"',
        "number": "42",
        "null": "null",
        "list": "[1, 2]",
        "bool": "true",
        "strings-inside": json.dumps({"vm": "abc", "interfaces": "abc", "holder": "abc", "files": "x"}),
        "deep": "[" * 1000 + "]" * 1000,
        "deep-object": '{"a":' * 1000 + "1" + "}" * 1000,
        "not-json": "{not json",
        "bigint": "9" * 5000,
    }


def build_cases(tmp: Path, root_user: bool) -> list[Case]:
    cases: list[Case] = []
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    fifo_py = tmp / "fifo.py"
    os.mkfifo(fifo_py)
    zero_py = tmp / "zero.py"
    zero_py.symlink_to("/dev/zero")
    big = tmp / "big.txt"
    with open(big, "wb") as fh:
        fh.truncate(80 * 1024 * 1024)  # sparse: 80 MiB over the 64 MiB cap, no disk used
    # 1. unbounded reads and special files, for every file argument
    specials = {"dev-zero": "/dev/zero", "fifo": str(fifo), "big": str(big), "dir": str(tmp)}
    for label, path in specials.items():
        cases.append(Case("1-files", f"parse df {label}", ddpdoctor_argv("parse", "df", path), (2,), 30))
        cases.append(
            Case("1-files", f"check --expect {label}", ddpdoctor_argv("check", "--expect", path), (2,), 30)
        )
        cases.append(
            Case(
                "1-files",
                f"bench-nccl --baseline {label}",
                ddpdoctor_argv("bench-nccl", "--backend", "gloo", "--baseline", path),
                (2,),
                30,
            )  # fmt: skip
        )
        cases.append(Case("1-files", f"lint {label}", ddpdoctor_argv("lint", path), (0, 1, 2, 3), 30))
        cases.append(
            Case("1-files", f"check --replay {label}", ddpdoctor_argv("check", "--replay", path), (2, 3), 30)
        )
    cases.append(Case("1-files", "parse df - </dev/zero", ddpdoctor_argv("parse", "df", "-"), (2,), 60,
                      stdin="/dev/zero"))  # fmt: skip
    cases.append(
        Case("1-files", "parse df - <big", ddpdoctor_argv("parse", "df", "-"), (2,), 60, stdin=str(big))
    )
    lintdir = tmp / "lintdir"
    lintdir.mkdir()
    os.mkfifo(lintdir / "pipe.py")
    (lintdir / "zero.py").symlink_to("/dev/zero")
    (lintdir / "loop.py").symlink_to("loop.py")
    (lintdir / "a.py").symlink_to("b.py")
    (lintdir / "b.py").symlink_to("a.py")
    (lintdir / "ok.py").write_text("import torch\n")
    # A path named on the command line that cannot be read is a usage error (exit 2, README); bad files
    # found inside a directory are DDP000 findings (exit 1).
    for p, codes in ((fifo_py, (2,)), (zero_py, (2,)), (lintdir, (0, 1))):
        cases.append(Case("1-files", f"lint {p.name}", ddpdoctor_argv("lint", str(p)), codes, 30))
    # 2. wrong types in every fact file, 3. deep nesting
    for name in FACT_NAMES:
        for label, text in wrong_values().items():
            d = snapshot_with(tmp, f"fact-{name}-{label}", {f"{name}.json": text})
            cases.append(
                Case(
                    "2-facts",
                    f"check --replay ({name}.json: {label})",
                    ddpdoctor_argv("check", "--replay", str(d), "--json"),
                    (0, 1, 3),
                    60,
                )  # fmt: skip
            )
    for name in ("env", "host"):
        d = snapshot_with(tmp, f"deep-{name}", {f"{name}.json": "[" * 1000 + "]" * 1000})
        cases.append(Case("3-nesting", f"report --replay (deep {name}.json)",
                          ddpdoctor_argv("report", "--replay", str(d)), (0,), 60))  # fmt: skip
        cases.append(Case("3-nesting", f"expect --replay (deep {name}.json)",
                          ddpdoctor_argv("expect", "--replay", str(d), "--write", "-"), (0,), 60))  # fmt: skip
    deep_json = tmp / "deep.json"
    deep_json.write_text("[" * 1000 + "]" * 1000)
    cases.append(Case("3-nesting", "bench-nccl --baseline deep.json",
                      ddpdoctor_argv("bench-nccl", "--backend", "gloo", "--baseline", str(deep_json)), (2,), 30))  # fmt: skip
    deep_toml = tmp / "deep.toml"
    deep_toml.write_text("a = " + "[" * 1000 + "]" * 1000 + "\n")
    cases.append(
        Case(
            "3-nesting",
            "check --expect deep.toml",
            ddpdoctor_argv("check", "--expect", str(deep_toml)),
            (2,),
            30,
        )
    )
    # 4. unreadable files and directories, link loops (unprivileged user)
    if root_user and shutil.which("setpriv"):
        os.chmod(tmp, 0o755)
        d = snapshot_with(tmp, "unreadable-env", {})
        os.chmod(d / "env.json", 0)
        cases.append(Case("4-unreadable", "check --replay (env.json mode 000)",
                          ddpdoctor_argv("check", "--replay", str(d), "--json"), (3,), 60, as_nobody=True,
                          verify=has_finding("core.snapshot.bad_file")))  # fmt: skip
        d2 = snapshot_with(tmp, "unreadable-txt", {})
        os.chmod(d2 / "ulimit-a.txt", 0)
        cases.append(Case("4-unreadable", "check --replay (ulimit-a.txt mode 000)",
                          ddpdoctor_argv("check", "--replay", str(d2), "--json"), (3,), 60, as_nobody=True))  # fmt: skip
        d3 = tmp / "unreadable-dir"
        d3.mkdir()
        (d3 / "x.py").write_text("import os\n")
        os.chmod(d3, 0)
        cases.append(Case("4-unreadable", "lint DIR (mode 000)", ddpdoctor_argv("lint", str(d3)), (0, 1), 30,
                          as_nobody=True))  # fmt: skip
        d4 = tmp / "lint-nested"
        (d4 / "sub").mkdir(parents=True)
        (d4 / "sub" / "y.py").write_text("import os\n")
        (d4 / "ok.py").write_text("import os\n")
        os.chmod(d4 / "sub", 0)
        cases.append(Case("4-unreadable", "lint DIR (sub-directory mode 000)", ddpdoctor_argv("lint", str(d4)),
                          (0, 1), 30, as_nobody=True))  # fmt: skip
        cases.append(Case("4-unreadable", "check --replay DIR (mode 000)",
                          ddpdoctor_argv("check", "--replay", str(d3)), (2,), 30, as_nobody=True))  # fmt: skip
        os.chmod(lintdir, 0o755)
        cases.append(Case("4-unreadable", "lint link loops as nobody", ddpdoctor_argv("lint", str(lintdir)), (0, 1),
                          30, as_nobody=True))  # fmt: skip
    # 6. huge numbers in launch variables
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "SLURM_NTASKS"):
        cases.append(Case("6-bigint", f"{var}=<5000 digits> check --only launch,network,nccl_env,mp",
                          ddpdoctor_argv("check", "--only", "launch,network,nccl_env,mp", "--json"), (1,), 60,
                          env={var: "9" * 5000}, verify=has_finding("launch.")))  # fmt: skip
    # 7. quadratic redaction and the prolog's hard deadline
    for label, value in (("x*131000", "x" * 131000), ("x-*65000", "x-" * 65000), ("a:*65000", "a:" * 65000),
                         ("sk-*40000", "sk-" * 40000), ("a://*32000", "a://" * 32000)):  # fmt: skip
        cases.append(Case("7-redos", f"FOO={label} check --prolog --timeout 5",
                          ddpdoctor_argv("check", "--prolog", "--timeout", "5"), (0, 1, 3), 9, env={"FOO": value}))  # fmt: skip
        cases.append(Case("7-redos", f"NCCL_DEBUG={label} check --timeout 5 --json",
                          ddpdoctor_argv("check", "--timeout", "5", "--json", "--only", "nccl_env,launch"),
                          (0, 1, 3), 9, env={"NCCL_DEBUG": value}))  # fmt: skip
    many = {f"FOO{i}": "x-" * 65000 for i in range(8)}
    cases.append(Case("7-redos", "eight 130 KB variables: check --prolog --timeout 5",
                      ddpdoctor_argv("check", "--prolog", "--timeout", "5"), (0, 1, 3), 9, env=many))  # fmt: skip
    # 9. a check of nothing
    empty = tmp / "empty"
    empty.mkdir()
    for cmd in ("check", "report", "expect"):
        extra = ["--write", "-"] if cmd == "expect" else []
        for label, path in (("emptydir", empty), ("/dev/zero", Path("/dev/zero"))):
            cases.append(Case("9-nothing", f"{cmd} --replay {label}",
                              ddpdoctor_argv(cmd, "--replay", str(path), *extra), (2, 3), 30))  # fmt: skip
    # 12. secrets in odd places, every output format
    conf = tmp / "nccl.conf"
    conf.write_text("NCCL_IB_AUTH_TOKEN=tok3nSecretValue\nNCCL_PASSWORD=pa55wordSecret\nNCCL_DEBUG=INFO\n")
    secret_env = {
        "NCCL_CONF_FILE": str(conf),
        "NCCL_NET_PLUGIN_URL": "https://b.s3.amazonaws.com/p.so?X-Amz-Credential=AKIDcred&X-Amz-Signature=deadbeefsig99",
        "DB_PASS": "dbpassSecret",
        "MY_PWD": "mypwdSecret",
        "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/slacksecretxyz",
    }
    for fmt in ("json", "table", "markdown", "junit", "github"):
        cases.append(Case("12-redact", f"check --format {fmt} (conf, presigned URL, odd names)",
                          ddpdoctor_argv("check", "--only", "nccl_env,launch,network", "--format", fmt, "-v"),
                          (0, 1, 3), 60, env=secret_env, verify=no_secret))  # fmt: skip
    cases.append(Case("12-redact", "check --prolog", ddpdoctor_argv("check", "--prolog", "--only", "nccl_env"),
                      (0, 1, 3), 60, env=secret_env, verify=no_secret))  # fmt: skip
    snap = tmp / "secret-snap"
    cases.append(Case("12-redact", "snapshot DIR (files)", ddpdoctor_argv("snapshot", str(snap), "--only",
                      "nccl_env,launch,network"), (0,), 60, env=secret_env, verify=files_without_secret(snap)))  # fmt: skip
    rep = tmp / "secret-report.md"
    cases.append(Case("12-redact", "report -o FILE (live)", ddpdoctor_argv("report", "-o", str(rep)), (0,), 120,
                      env=secret_env, verify=files_without_secret(rep)))  # fmt: skip
    # 13. report -o over an existing file or through a link
    existing = tmp / "existing.md"
    existing.write_text("keep me\n")
    target = tmp / "target.md"
    target.write_text("keep me too\n")
    link = tmp / "link.md"
    link.symlink_to(target)

    def untouched(proc: subprocess.CompletedProcess) -> str:
        ok = existing.read_text() == "keep me\n" and target.read_text() == "keep me too\n"
        return "" if ok else "a file was overwritten"

    hs = str(HEALTHY)
    cases.append(Case("13-overwrite", "report -o existing.md", ddpdoctor_argv("report", "--replay", hs, "-o",
                      str(existing)), (2,), 60, verify=untouched))  # fmt: skip
    cases.append(Case("13-overwrite", "report -o link.md", ddpdoctor_argv("report", "--replay", hs, "-o", str(link)),
                      (2,), 60, verify=untouched))  # fmt: skip
    cases.append(Case("13-overwrite", "report -o link.md --force", ddpdoctor_argv("report", "--replay", hs, "-o",
                      str(link), "--force"), (2,), 60, verify=untouched))  # fmt: skip
    cases.append(Case("13-overwrite", "expect --write link.md --force", ddpdoctor_argv("expect", "--replay", hs,
                      "--write", str(link), "--force"), (2,), 60, verify=untouched))  # fmt: skip
    return cases


# Round 2 (#26): file disclosure, hangs, secrets, memory, tracebacks, mixed data, garbage, small items.
FR_FIXTURES = ROOT / "tests" / "fixtures" / "flight_recorder" / "skip"
REAL_LOG = ROOT / "tests" / "fixtures" / "explain" / "real-h100" / "dup_gpu.log"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ6cTFjaSJ9.c2lnbmF0dXJlX3pxMQ"
ROUND2_SECRETS = ("Zq1authSecret", "Zq2keySecret", "Zq3pwSecret", JWT, "Zq5redis", "Zq6azure", "Zq7pass",
                  "Zq8tok", "Zq9aws", "hf_ZqZqZqZqZqZqZqZqZqZqZqZq")  # fmt: skip
ENV_MARKER = "zz-environ-marker-zz"


def lacks(*needles: str) -> Callable[[subprocess.CompletedProcess], str]:
    def verify(proc: subprocess.CompletedProcess) -> str:
        found = [n for n in needles if n in proc.stdout or n in proc.stderr]
        return f"printed {found}" if found else ""

    return verify


def says(*needles: str) -> Callable[[subprocess.CompletedProcess], str]:
    def verify(proc: subprocess.CompletedProcess) -> str:
        missing = [n for n in needles if n not in proc.stdout + proc.stderr]
        return f"does not say {missing}" if missing else ""

    return verify


def hostile_dump_dir(tmp: Path, name: str, edit: Callable[[dict, str], None]) -> Path:
    """The real torch 2.13 `skip` dumps (pickles), each edited as an attacker would."""
    import pickle

    sys.path.insert(0, str(ROOT))
    from ddpdoctor.hang.fr import load_plain_pickle

    out = tmp / name
    out.mkdir()
    for src in sorted(FR_FIXTURES.iterdir()):
        if src.name.endswith(".json"):
            continue
        raw = load_plain_pickle(src.read_bytes())
        edit(raw, src.name)
        (out / src.name).write_bytes(pickle.dumps(raw, protocol=4))
    return out


def frames_to(target: str) -> Callable[[dict, str], None]:
    def edit(raw: dict, _: str) -> None:
        for entry in raw["entries"]:
            for frame in entry.get("frames", []):
                if frame["filename"].endswith("_hang_job.py"):
                    frame["filename"], frame["line"] = target, 1

    return edit


class RasGarbageServer:
    """A local TCP server answering the RAS handshake and then `body` (threads; closed by close())."""

    def __init__(self, body: bytes) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.body = body
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.sendall(b"SERVER PROTOCOL 2\n")
                    conn.settimeout(2)
                    for reply in (b"OK\n", b"OK\n"):
                        conn.recv(4096)
                        conn.sendall(reply)
                    conn.recv(4096)
                    conn.sendall(self.body)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def build_round2_cases(tmp: Path) -> tuple[list[Case], list[Callable[[], None]]]:
    """The attacks of issue #26, one case each; returns the cases and what to close afterwards."""
    cases: list[Case] = []
    cleanup: list[Callable[[], None]] = []
    r2 = tmp / "r2"
    r2.mkdir()
    env_marker = {"PLANTED_VALUE": ENV_MARKER}
    # 1. file disclosure through frame paths
    planted = r2 / "elsewhere"
    planted.mkdir()
    (planted / "keys.py").write_text("HF_TOKEN = 'hf_ZqZqZqZqZqZqZqZqZqZqZqZq'\n")
    for label, target in (("etc-passwd", "/etc/passwd"), ("proc-environ", "/proc/self/environ"),
                          ("proc-status", "/proc/self/status"), ("planted", str(planted / "keys.py")),
                          ("etc-shadow", "/etc/shadow")):  # fmt: skip
        d = hostile_dump_dir(r2, f"fr-{label}", frames_to(target))
        check = lacks("root:", ENV_MARKER, "hf_ZqZq", "Name:\t")
        for argv in (("explain", str(d)), ("explain", str(d), "--json"), ("explain", str(d), "--format", "markdown"),
                     ("hang", "--fr", str(d), "--no-ras", "--no-stacks", "--json"),
                     ("hang", "--fr", str(d), "--no-ras", "--no-stacks")):  # fmt: skip
            cases.append(Case("26-1-disclose", f"{' '.join(argv[:1])} frames->{label} {' '.join(argv[2:])}",
                              ddpdoctor_argv(*argv), (0, 1, 3), 60, env=env_marker, verify=check))  # fmt: skip
    inside = hostile_dump_dir(r2, "fr-inside", frames_to(str(r2 / "fr-inside" / "train.py")))
    (inside / "train.py").write_text("password = 'Zq7pass'\ntoken='Zq8tok'\n")
    cases.append(Case("26-1-disclose", "explain DIR: source in the dump dir quoted redacted",
                      ddpdoctor_argv("explain", str(inside), "--json"), (0, 1), 60, verify=lacks("Zq7pass", "Zq8tok")))  # fmt: skip
    # 2. hangs
    fifo_dir = hostile_dump_dir(r2, "fr-fifo", frames_to(str(r2 / "fr-fifo" / "pipe.py")))
    os.mkfifo(fifo_dir / "pipe.py")
    kmsg_dir = hostile_dump_dir(r2, "fr-kmsg", frames_to("/proc/kmsg"))
    for label, d in (("fifo", fifo_dir), ("kmsg", kmsg_dir)):
        cases.append(Case("26-2-hang", f"explain DIR (frame -> {label})", ddpdoctor_argv("explain", str(d)),
                          (0, 1, 3), 30))  # fmt: skip
        cases.append(Case("26-2-hang", f"hang --fr (frame -> {label}) --timeout 2",
                          ddpdoctor_argv("hang", "--fr", str(d), "--no-ras", "--no-stacks", "--timeout", "2"),
                          (0, 1, 3), 30))  # fmt: skip
    for path in ("/proc/kmsg", "/proc/self/environ", "/dev/zero", "/sys/kernel/notes", "/dev/stdin"):
        cases.append(Case("26-2-hang", f"explain {path}", ddpdoctor_argv("explain", path), (2,), 30,
                          verify=lacks(ENV_MARKER)))  # fmt: skip
    for dev in ("/dev/zero", "/dev/urandom"):
        cases.append(Case("26-2-hang", f"explain < {dev}", ddpdoctor_argv("explain"), (2,), 30, stdin=dev,
                          verify=says("not a text log")))  # fmt: skip
    for n, pattern in enumerate(("*a*a*a*a*a*a*b", "*a*a*a*a*a*a*a*a*a*a*b", "**/*a*a*a*a*a*a*a*b/**", "a*a*a*a*a*a*a*[b]")):
        lint_dir = r2 / f"lint-redos-{n}"
        lint_dir.mkdir()
        (lint_dir / ".gitignore").write_text(pattern + "\n")
        (lint_dir / ("a" * 200 + ".py")).write_text("import os\n")
        cases.append(Case("26-2-hang", f"lint . with .gitignore {pattern}", ddpdoctor_argv("lint", str(lint_dir)),
                          (0, 1), 30))  # fmt: skip
    # 3. secrets: the environment (snapshot env.json, report), explain evidence lines
    leaky_env = {"CI_JOB_JWT": JWT, "ID_JWT": JWT, "REDIS_URL": "redis://:Zq5redis@cache:6379/0",
                 "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Zq6azure==;x=y",
                 "GITHUB_TOKEN": "ghs_Zq1authSecretZq1authSecretZq1auth"}  # fmt: skip
    snap = r2 / "leaky-snap"
    cases.append(Case("26-3-secrets", "snapshot DIR with CI/cloud tokens in the environment",
                      ddpdoctor_argv("snapshot", str(snap), "--only", "launch,network,nccl_env"), (0,), 60,
                      env=leaky_env, verify=files_without(snap)))  # fmt: skip
    for fmt in ("json", "table", "markdown", "junit", "github"):
        cases.append(Case("26-3-secrets", f"check --format {fmt} -v with CI/cloud tokens",
                          ddpdoctor_argv("check", "--only", "launch,network,nccl_env", "--format", fmt, "-v"),
                          (0, 1, 3), 60, env=leaky_env, verify=lacks(*ROUND2_SECRETS)))  # fmt: skip
    cases.append(Case("26-3-secrets", "report -o - (live) with CI/cloud tokens", ddpdoctor_argv("report", "-o", "-"),
                      (0,), 120, env=leaky_env, verify=lacks(*ROUND2_SECRETS, "CI_JOB_JWT")))  # fmt: skip
    log = r2 / "secrets.log"
    log.write_text(
        "conn = connect(password='Zq7pass', token='Zq8tok', api_key='Zq8tok')\n"
        "{'aws_secret_access_key': 'Zq9aws/abc'}\nREDIS_URL=redis://:Zq5redis@host\n"
        f"auth {JWT}\npython t.py --auth Zq1authSecret --key Zq2keySecret -p Zq3pwSecret\n"
        "RuntimeError: CUDA error: invalid device ordinal\n"
    )
    for fmt in ("json", "table", "markdown", "junit", "github"):
        cases.append(Case("26-3-secrets", f"explain --all --format {fmt} (secrets in evidence lines)",
                          ddpdoctor_argv("explain", str(log), "--all", "--format", fmt), (0, 1), 60,
                          verify=lacks(*ROUND2_SECRETS)))  # fmt: skip
    # 4. memory
    def memo_bomb(raw: dict, _: str) -> None:
        entry = dict(raw["entries"][0], frames=(raw["entries"][0]["frames"] * 40)[:64])
        raw["entries"] = [entry] * 300_000

    bomb = hostile_dump_dir(r2, "fr-memo-bomb", memo_bomb)
    cases.append(Case("26-4-memory", "explain DIR of three 600 KB memo-sharing dumps", ddpdoctor_argv("explain", str(bomb)),
                      (2,), 60, verify=says("expands to more than")))  # fmt: skip
    cases.append(Case("26-4-memory", "hang --fr of three memo-sharing dumps",
                      ddpdoctor_argv("hang", "--fr", str(bomb), "--no-ras", "--no-stacks"), (3,), 60))  # fmt: skip
    # 5. tracebacks
    for field_name in ("collective_seq_id", "rank", "pg_id", "p2p_seq_id"):
        def huge(raw: dict, _: str, key: str = field_name) -> None:
            if key == "rank":
                raw["rank"] = 7 * 10**4999
            else:
                raw["entries"][0][key] = 7 * 10**4999

        d = hostile_dump_dir(r2, f"fr-huge-{field_name}", huge)
        for fmt in ("table", "json", "markdown"):
            cases.append(Case("26-5-traceback", f"explain DIR ({field_name} of 5000 digits) --format {fmt}",
                              ddpdoctor_argv("explain", str(d), "--format", fmt), (0, 1, 3), 60))  # fmt: skip
    for label, body in (("communicators-5", b'{"communicators": 5}\n'), ("ranks-5", b'{"nccl_version": "2.28", "communicators": [{"ranks": 5}]}\n'),
                        ("garbage-8MB", b"\x00garbage " * (1024 * 1024)), ("text-garbage", b"hello\nworld\n" * 1000)):  # fmt: skip
        server = RasGarbageServer(body)
        cleanup.append(server.close)
        cases.append(Case("26-5-traceback", f"hang --ras-addr (RAS reply {label})",
                          ddpdoctor_argv("hang", "--ras-addr", server.addr, "--no-stacks", "--no-fr", "--timeout", "3"),
                          (0, 1, 3), 30, verify=lacks("every rank answered")))  # fmt: skip
    for n, toml in enumerate(("tool = 5\n", '[tool]\nddpdoctor = "x"\n', "[tool.ddpdoctor]\nlint = 3\n")):
        d = r2 / f"lint-pyproject-{n}"
        d.mkdir()
        (d / "pyproject.toml").write_text(toml)
        (d / "train.py").write_text("import torch\n")
        cases.append(Case("26-5-traceback", f"lint with pyproject {toml.strip()!r}", ddpdoctor_argv("lint", str(d)),
                          (0, 1, 2), 30))  # fmt: skip
    big = "9" * 400
    df = r2 / "df-huge.txt"
    df.write_text(f"Filesystem 1K-blocks Used Available Use% Mounted on\nshm {big} 0 {big} 0% /dev/shm\n")
    cases.append(Case("26-5-traceback", "parse df (400-digit sizes)", ddpdoctor_argv("parse", "df", str(df)), (0, 3), 30))
    df_snap = snapshot_with(tmp, "r2-df-huge", {"df-shm.txt": df.read_text()})
    cases.append(Case("26-5-traceback", "check --replay (df-shm.txt with 400-digit sizes)",
                      ddpdoctor_argv("check", "--replay", str(df_snap), "--json"), (0, 1, 3), 60,
                      verify=says('"area": "system"')))  # fmt: skip
    hs = str(HEALTHY)
    for argv in (("report", "--replay", hs), ("check", "--replay", hs), ("check", "--replay", hs, "--json"),
                 ("expect", "--replay", hs, "--write", "-"), ("plan", "--params", "7B", "--gpu-mem", "80G"),
                 ("explain", str(REAL_LOG)), ("parse", "df", str(HEALTHY / "df-shm.txt")),
                 ("bench-nccl", "--backend", "gloo", "--iters", "1", "--warmup", "0", "--ops", "all_reduce",
                  "--min-bytes", "1K", "--max-bytes", "1K")):  # fmt: skip
        cases.append(Case("26-5-traceback", f"{' '.join(argv[:2])} >&- (stdout closed)",
                          ["sh", "-c", '"$@" >&-', "sh", *ddpdoctor_argv(*argv)], (2,), 120,
                          verify=says("standard output is closed")))  # fmt: skip
    for enc in ("ascii", "latin-1"):
        uni = r2 / "unicode.log"
        uni.write_text("x \u2014 RuntimeError: CUDA error: invalid device ordinal \u4e2d\n")
        for argv in (("explain", str(uni), "--all"), ("report", "--replay", hs), ("check", "--replay", hs, "-v")):
            cases.append(Case("26-5-traceback", f"{argv[0]} with PYTHONIOENCODING={enc}", ddpdoctor_argv(*argv),
                              (0, 1), 60, env={"PYTHONIOENCODING": enc}))  # fmt: skip
    # 6. mixed snapshots, COLUMNS
    mixed = r2 / "mixed-snap"
    three = " & ".join(f'"$0" -m ddpdoctor snapshot {mixed} --only launch,network >/dev/null 2>&1' for _ in range(3))
    script = (f"{three} & wait; n=$(ls -A {mixed} | wc -l); "
              f'"$0" -m ddpdoctor check --replay {mixed} --only launch,network --json >/dev/null; r=$?; '
              f'echo "files=$n replay=$r"; ls -A {mixed} | grep -c "^\\.ddpdoctor" ; true')  # fmt: skip

    def one_snapshot(proc: subprocess.CompletedProcess) -> str:
        ok = "replay=0" in proc.stdout or "replay=1" in proc.stdout
        return "" if ok and proc.stdout.strip().endswith("0") else f"mixed or broken: {proc.stdout[-200:]}"

    cases.append(Case("26-6-mixed", "three snapshot DIR at once into one new directory",
                      ["sh", "-c", script, sys.executable], (0,), 120, verify=one_snapshot))  # fmt: skip
    for columns in ("0", "-1", "abc", "100000", "9" * 30):
        def width_ok(proc: subprocess.CompletedProcess) -> str:
            lines = proc.stdout.splitlines()
            if not lines:
                return "printed nothing"
            return "" if max(map(len, lines)) <= 1000 else f"a line of {max(map(len, lines))} characters"

        for argv in (("check", "--replay", hs, "-v"), ("explain", str(REAL_LOG), "--all"), ("report", "--replay", hs)):
            cases.append(Case("26-6-mixed", f"COLUMNS={columns[:8]} {argv[0]}", ddpdoctor_argv(*argv), (0, 1), 60,
                              env={"COLUMNS": columns}, verify=width_ok))  # fmt: skip
    # 7. garbage
    for tool in ("gzip", "xz", "bzip2", "zstd"):
        if shutil.which(tool) is None:
            continue
        packed = r2 / f"packed-{tool}.log"
        packed.write_bytes(subprocess.run([tool, "-c", str(REAL_LOG)], capture_output=True, check=True).stdout)
        verify = says("nccl.duplicate_gpu") if tool != "zstd" else None
        cases.append(Case("26-7-garbage", f"explain a {tool}-compressed log", ddpdoctor_argv("explain", str(packed), "--json"),
                          (1, 2) if tool == "zstd" else (1,), 60, verify=verify))  # fmt: skip
    for enc in ("utf-16", "utf-16-le", "utf-16-be"):
        wide = r2 / f"wide-{enc}.log"
        wide.write_bytes(REAL_LOG.read_text(errors="replace").encode(enc))
        cases.append(Case("26-7-garbage", f"explain a {enc} log", ddpdoctor_argv("explain", str(wide), "--json"), (1,), 60,
                          verify=says("nccl.duplicate_gpu")))  # fmt: skip
    rnd = r2 / "random.bin"
    rnd.write_bytes(os.urandom(1 << 20))
    cases.append(Case("26-7-garbage", "explain random bytes", ddpdoctor_argv("explain", str(rnd)), (2,), 30,
                      verify=says("not a text log")))  # fmt: skip
    for label, pid in (("PID 1", "1"), ("no such pid", "4000000")):
        cases.append(Case("26-7-garbage", f"hang --pid ({label})", ddpdoctor_argv("hang", "--pid", pid, "--no-ras", "--json"),
                          (3,), 60, verify=lacks('"ranks": [-', "rank -")))  # fmt: skip
    cases.append(Case("26-7-garbage", "hang --pid of a plain python process",
                      ["sh", "-c", '"$0" -c "import time; time.sleep(30)" & p=$!; "$0" -m ddpdoctor hang --pid $p --no-ras; '
                       "r=$?; kill $p; exit $r", sys.executable], (3,), 60, verify=says("not a distributed job")))  # fmt: skip

    def claim_rank0(raw: dict, _: str) -> None:
        raw["rank"] = 0

    rank0 = hostile_dump_dir(r2, "fr-all-rank0", claim_rank0)
    cases.append(Case("26-7-garbage", "explain DIR of dumps that all claim rank 0", ddpdoctor_argv("explain", str(rank0), "--json"),
                      (0, 1, 3), 60, verify=says("claims rank 0")))  # fmt: skip
    gpu_fix = ROOT / "tests" / "fixtures" / "gpu"
    others = [gpu_fix / "nvidia-smi-q__8xh100-535.161.08-gpu0-section-hw-power-brake-active-pcie-replays.txt",
              gpu_fix / "dmesg__xid-51-bad-tsg-then-xid-154-pf-flr-excerpt.txt",
              gpu_fix / "p2pBandwidthLatencyTest__2x-rtx2080ti-cannot-access-peer.txt", HEALTHY / "df-shm.txt"]  # fmt: skip
    for tool in ("ibstat", "ibstatus", "ibv_devinfo", "lsmod"):
        for other in others:
            cases.append(Case("26-7-garbage", f"parse {tool} {other.name[:30]}", ddpdoctor_argv("parse", tool, str(other)),
                              (3,), 30))  # fmt: skip
    for n, toml in enumerate(("[rdma]\nrate_gbps = nan\n", '[rdma]\nlink_layer = "Ethernet "\n', '[gpu]\nmodel = "H100 "\n',
                              "[rdma]\nrate_gbps = inf\n", f'[system]\nshm_min = "{big}G"\n')):  # fmt: skip
        path = r2 / f"expect-{n}.toml"
        path.write_text(toml)
        cases.append(Case("26-7-garbage", f"check --expect {toml.strip()[:30]!r}",
                          ddpdoctor_argv("check", "--replay", hs, "--expect", str(path)), (2,), 60))  # fmt: skip
    # 8. small
    cases.append(Case("26-8-small", "report -o - is stdout", ddpdoctor_argv("report", "--replay", hs, "-o", "-"), (0,), 60,
                      verify=says("# ddpdoctor report")))  # fmt: skip
    out_fifo = r2 / "out.md"
    os.mkfifo(out_fifo)
    cases.append(Case("26-8-small", "report -o FIFO", ddpdoctor_argv("report", "--replay", hs, "-o", str(out_fifo)), (2,), 30,
                      verify=lacks("--force")))  # fmt: skip
    cases.append(Case("26-8-small", "report header intact", ddpdoctor_argv("report", "--replay", hs, "-o", "-"), (0,), 60,
                      verify=says("`--password <value>`")))  # fmt: skip
    for argv in (("--params", "9" * 4000 + "B"), ("--params", "7B", "--gpu-mem", "9" * 4000 + "G")):
        cases.append(Case("26-8-small", f"plan {argv[-2]} <4000 digits>", ddpdoctor_argv("plan", *argv), (2,), 30,
                          verify=says("too large")))  # fmt: skip
    return cases, cleanup


# A raw control a terminal obeys (#26 escape class): C0 but tab/newline, DEL, C1, bidi overrides. The
# output is decoded with errors="replace", so C1 arrives as its code point.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
ESCAPES = ("\x1b]0;PWNTITLE\x07", "\x1b]52;c;ZWNobyBQV05FRA==\x07", "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
           "\x1b[2J\x1b[H", "\x1bP+q544e\x1b\\", "\u009b2J", "\x07\x07", "\rOK: nothing wrong", "\x08\x08\x7f")  # fmt: skip
OUTPUT_SECRETS = ("c0ffee15c0ffee15", "Zq40pw", "AKIAZQ41XXXXXXXXXXXX", "Zq42abcdefghijklmnopqrstuv", "Zq43rule")


def no_raw_control(*visible: str) -> Callable[[subprocess.CompletedProcess], str]:
    """No control byte reaches the terminal raw, and the planted text is still visible (escaped)."""

    def verify(proc: subprocess.CompletedProcess) -> str:
        out = proc.stdout + "\n" + proc.stderr
        m = RAW_CONTROL.search(out)
        if m:
            return f"raw {m.group(0)!r} in {out[max(0, m.start() - 60) : m.start() + 40]!r}"
        missing = [v for v in visible if v not in out]
        return f"does not show {missing}" if missing else ""

    return verify


def both(*checks: Callable[[subprocess.CompletedProcess], str]) -> Callable[[subprocess.CompletedProcess], str]:
    def verify(proc: subprocess.CompletedProcess) -> str:
        return next((why for why in (c(proc) for c in checks) if why), "")

    return verify


def build_output_cases(tmp: Path) -> tuple[list[Case], list[Callable[[], None]]]:
    """The independent attack pass of #26: terminal escapes from every kind of outside text in every
    format (26-9-escape), and the secret shapes it found printed (26-10-secret)."""
    cases: list[Case] = []
    d = tmp / "r3"
    d.mkdir()
    payload = "".join(ESCAPES)
    log = d / "rank0\x1b]0;NAMEPWN\x07.log"
    log.write_text(
        "[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        f"NCCLUtils.cpp:93, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9 {payload}\n"
        f"[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60{payload}\n"
    )
    for fmt in ("table", "markdown", "github", "junit", "json"):
        cases.append(Case("26-9-escape", f"explain --all --format {fmt} (escapes in lines and the file name)",
                          ddpdoctor_argv("explain", str(log), "--all", "--format", fmt), (1,), 60,
                          verify=no_raw_control("NAMEPWN")))  # fmt: skip
    stdin_log = d / "stdin.log"
    stdin_log.write_text("[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60\x1b]0;STDINPWN\x07\n")
    cases.append(Case("26-9-escape", "explain - (escapes on stdin)", ddpdoctor_argv("explain", "-"), (1,), 60,
                      stdin=str(stdin_log), verify=no_raw_control("STDINPWN")))  # fmt: skip
    frames = hostile_dump_dir(d, "fr-esc", frames_to("/home/u/\x1b[2J\x1b]0;FRAMEPWN\x07job.py"))
    for fmt in ("table", "markdown"):
        cases.append(Case("26-9-escape", f"explain --format {fmt} DIR (frame file name with escapes)",
                          ddpdoctor_argv("explain", "--format", fmt, str(frames)), (0, 1), 60,
                          verify=no_raw_control("FRAMEPWN")))  # fmt: skip
    cases.append(Case("26-9-escape", "hang --fr DIR (frame file name with escapes)",
                      ddpdoctor_argv("hang", "--fr", str(frames), "--no-ras", "--no-stacks"), (0, 1), 60,
                      verify=no_raw_control("FRAMEPWN")))  # fmt: skip
    source = d / "job.py"
    source.write_text("x = 1  # \x1b]0;SRCPWN\x07 \x1b[2J\n")
    quoted = hostile_dump_dir(d, "fr-src", frames_to(str(source)))
    cases.append(Case("26-9-escape", "explain --all DIR (quoted source line with escapes)",
                      ddpdoctor_argv("explain", "--all", str(quoted)), (0, 1), 60, verify=no_raw_control()))  # fmt: skip
    lint_dir = d / "lint"
    lint_dir.mkdir()
    (lint_dir / "t\x1b]0;FNPWN\x07.py").write_text(
        "import os, torch\nrank = int(os.environ['RANK'])\ntorch.cuda.set_device(rank)\n"
    )
    (lint_dir / "u\u009b2J.py").write_text("import os, torch\ntorch.cuda.set_device(int(os.environ['RANK']))\n")
    for fmt in ("text", "github", "json"):
        cases.append(Case("26-9-escape", f"lint --format {fmt} (file names with ESC and C1)",
                          ddpdoctor_argv("lint", str(lint_dir), "--format", fmt), (0, 1), 60,
                          verify=no_raw_control("FNPWN")))  # fmt: skip
    cases.append(Case("26-9-escape", "plan --config (HF_HUB_CACHE with escapes in the error)",
                      ddpdoctor_argv("plan", "--config", "no/such", "--gpus", "8", "--gpu-mem", "80GiB"), (2,), 30,
                      env={"HF_HUB_CACHE": "/tmp/\x1b]0;HUBPWN\x07"}, verify=no_raw_control("HUBPWN")))  # fmt: skip
    cases.append(Case("26-9-escape", "snapshot --only with an escape in an area name",
                      ddpdoctor_argv("snapshot", str(d / "snap-x"), "--only", "gpu,\x1b]0;X\x07"), (2,), 30,
                      verify=no_raw_control("unknown area")))  # fmt: skip
    cases.append(Case("26-9-escape", "parse with an escape in the tool name",
                      ddpdoctor_argv("parse", "nvidia\x1b]0;T\x07", str(stdin_log)), (2,), 30,
                      verify=no_raw_control("unknown tool")))  # fmt: skip
    env_escapes = {"CUDA_VISIBLE_DEVICES": "0,\x1b]0;CVD\x07,1", "MASTER_ADDR": "host\x1b]0;MADDR\x07",
                   "MASTER_PORT": "29500", "SLURM_JOB_ID": "1\x1b]0;SLURM\x07", "SLURM_JOB_NODELIST": "n\x1b[2J[1-2]",
                   "SLURM_NNODES": "2", "NCCL_DEBUG": "INFO\x1b]0;ND\x07", "TORCH_DISTRIBUTED_DEBUG": "DETAIL\u009b2J"}  # fmt: skip
    for fmt in ("table", "markdown", "github", "junit", "json"):
        cases.append(Case("26-9-escape", f"check --format {fmt} -v (escapes in launch variables)",
                          ddpdoctor_argv("check", "--only", "launch,nccl_env", "--format", fmt, "-v"), (0, 1), 60,
                          env=env_escapes, verify=no_raw_control("CUDA_VISIBLE_DEVICES")))  # fmt: skip
    cases.append(Case("26-9-escape", "check --prolog (escapes in launch variables)",
                      ddpdoctor_argv("check", "--only", "launch", "--prolog"), (0, 1), 60, env=env_escapes,
                      verify=no_raw_control()))  # fmt: skip
    # 26-10: secret shapes the attack saw printed
    wandb = d / "wandb.log"
    wandb.write_text("[rank1]: NCCL WARN wandb: login with key 00000070c0ffee15c0ffee15c0ffee15c0ffee15 (x)\n")
    for fmt in ("table", "json", "markdown"):
        cases.append(Case("26-10-secret", f"explain --all --format {fmt} (a W&B key after 'key')",
                          ddpdoctor_argv("explain", str(wandb), "--all", "--format", fmt), (0, 1), 60,
                          verify=lacks(*OUTPUT_SECRETS)))  # fmt: skip
    for fmt in ("table", "json", "markdown", "junit", "github"):
        cases.append(Case("26-10-secret", f"check --format {fmt} -v (MASTER_ADDR='user:pw@host')",
                          ddpdoctor_argv("check", "--only", "launch", "--format", fmt, "-v"), (0, 1), 60,
                          env={"MASTER_ADDR": "trainer:Zq40pw@10.0.0.1", "MASTER_PORT": "29500"},
                          verify=lacks(*OUTPUT_SECRETS)))  # fmt: skip
    rule_dir = d / "rule"
    rule_dir.mkdir()
    (rule_dir / "pyproject.toml").write_text('[tool.ddpdoctor.lint]\nignore = ["hf_Zq43ruleQQQQQQQQQQQQQQQQQQQQ"]\n')
    (rule_dir / "a.py").write_text("x = 1\n")
    cases.append(Case("26-10-secret", "lint . (a token as an unknown rule id in pyproject)",
                      ddpdoctor_argv("lint", str(rule_dir)), (2,), 30, verify=lacks(*OUTPUT_SECRETS)))  # fmt: skip
    smi = d / "smi.txt"
    smi.write_text(
        "+-----------------------------------------------------------------------------------------+\n"
        "| Processes:                                                                              |\n"
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n"
        "|        ID   ID                                                               Usage      |\n"
        "|=========================================================================================|\n"
        "|    0   N/A  N/A            4242      C   python train.py --hf-token hf_Zq42abcdefghijklmnopqrstuv  1000MiB |\n"
        "+-----------------------------------------------------------------------------------------+\n"
    )
    cases.append(Case("26-10-secret", "parse nvidia-smi (a token in a process name)",
                      ddpdoctor_argv("parse", "nvidia-smi", str(smi)), (0, 3), 30, verify=lacks(*OUTPUT_SECRETS)))  # fmt: skip
    cases.append(Case("26-10-secret", "parse nvidia-smi-csv /proc/self/environ (HF_TOKEN in it)",
                      ddpdoctor_argv("parse", "nvidia-smi-csv", "/proc/self/environ"), (0, 2, 3), 30,
                      env={"HF_TOKEN": "hf_Zq42abcdefghijklmnopqrstuv"}, verify=lacks(*OUTPUT_SECRETS)))  # fmt: skip
    # A MASTER_PORT holder whose argv has a bare AWS key id and escapes.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    holder_py = d / "holder.py"
    holder_py.write_text(
        "import socket, time\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True)\n"
        "time.sleep(3600)\n"
    )
    holder = subprocess.Popen([sys.executable, str(holder_py), "--id", "AKIAZQ41XXXXXXXXXXXX", "\x1b]0;HOLDERPWN\x07"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout is not None
    holder.stdout.readline()
    env = {"MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1"}
    for fmt in ("table", "json", "markdown"):
        cases.append(Case("26-10-secret", f"MASTER_PORT holder (--id AKIA..., escapes): check --format {fmt} -v",
                          ddpdoctor_argv("check", "--only", "network", "--format", fmt, "-v"), (0, 1, 3), 60, env=env,
                          verify=both(lacks(*OUTPUT_SECRETS), no_raw_control("HOLDERPWN"))))  # fmt: skip

    def close() -> None:
        holder.kill()
        holder.wait()

    return cases, [close]


def files_without(path: Path) -> Callable[[subprocess.CompletedProcess], str]:
    def verify(proc: subprocess.CompletedProcess) -> str:
        for f in sorted(path.glob("*")):
            text = f.read_text(errors="replace")
            leaked = [s for s in ROUND2_SECRETS if s in text]
            if leaked:
                return f"{f.name} leaked {leaked}"
        return lacks(*ROUND2_SECRETS)(proc)

    return verify


def port_holder_round2(tmp: Path) -> tuple[list[Case], subprocess.Popen]:
    """A MASTER_PORT holder run as `python h.py --auth X --key X -p X --jwt JWT`: every format, snapshot,
    report (live and replayed) must show it without the values."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    holder_py = tmp / "h.py"
    holder_py.write_text(
        "import socket, time\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True)\n"
        "time.sleep(3600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, str(holder_py), "--auth", "Zq1authSecret", "--key", "Zq2keySecret", "-p", "Zq3pwSecret",
         "--jwt", JWT], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    holder.stdout.readline()
    env = {"MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "2"}
    cases = []
    for fmt in ("json", "table", "markdown", "junit", "github"):
        cases.append(Case("26-3-secrets", f"MASTER_PORT holder --auth/--key/-p/--jwt: check --format {fmt} -v",
                          ddpdoctor_argv("check", "--only", "network", "--format", fmt, "-v"), (0, 1, 3), 60, env=env,
                          verify=lacks(*ROUND2_SECRETS)))  # fmt: skip
    snap = tmp / "r2-port-snap"
    cases.append(Case("26-3-secrets", "MASTER_PORT holder: snapshot, check/report --replay",
                      ["sh", "-c", f'"$0" -m ddpdoctor snapshot {snap} --only network && "$0" -m ddpdoctor check --replay '
                       f'{snap} --only network --json; "$0" -m ddpdoctor report --replay {snap} -o -', sys.executable],
                      (0, 1, 3), 120, env=env, verify=files_without(snap)))  # fmt: skip
    cases.append(Case("26-3-secrets", "MASTER_PORT holder: report (live)", ddpdoctor_argv("report", "-o", "-"), (0,), 120,
                      env=env, verify=lacks(*ROUND2_SECRETS)))  # fmt: skip
    return cases, holder


def port_holder_case(tmp: Path) -> tuple[Case, subprocess.Popen]:
    """A process listening on MASTER_PORT whose command line carries `--password X` (space-separated)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import socket, sys, time\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True)\n"
        "time.sleep(3600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, "--password", "hunter2secret"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    holder.stdout.readline()
    snap = tmp / "port-snap"
    case = Case(
        "12-redact", "snapshot with --password X holding MASTER_PORT, then check/report --replay",
        ["sh", "-c", f'"$0" -m ddpdoctor snapshot {snap} --only network && "$0" -m ddpdoctor check --replay {snap} '
         f'--only network --json; "$0" -m ddpdoctor report --replay {snap}', sys.executable],
        (0, 1, 3), 120, env={"MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "2"},
        verify=files_without_secret(snap),
    )  # fmt: skip
    return case, holder


def build_attack3_cases(tmp: Path) -> list[Case]:
    """Group 26-7: the third black-box attack pass (issue #26): links inside snapshots, pickle bombs,
    long path names, a FIFO in the Hugging Face cache, a symlinked snapshot DIR, odd digits."""
    import pickle

    cases: list[Case] = []
    outside = tmp / "a3-outside.txt"
    outside.write_text("OUTSIDEMARKER line\n" * 5)

    def no_marker(proc: subprocess.CompletedProcess) -> str:
        return "a linked file's content was printed" if "OUTSIDEMARKER" in proc.stdout + proc.stderr else ""

    for fname in ("df-shm.txt", "ulimit-a.txt", "nvidia-smi-q.txt", "env.json"):
        d = snapshot_with(tmp, f"a3-link-{fname}", {})
        (d / fname).unlink(missing_ok=True)
        (d / fname).symlink_to(outside)
        for argv in (("check", "--replay", str(d), "-v", "--json"), ("report", "--replay", str(d), "-o", "-")):
            cases.append(Case("26-7-attack3", f"{argv[0]} --replay ({fname} -> a file outside)",
                              ddpdoctor_argv(*argv), (0, 1, 3), 60, verify=no_marker))  # fmt: skip
    fr = ROOT / "tests" / "fixtures" / "flight_recorder" / "mismatch"
    dumps = [pickle.loads((fr / f"rank_{r}").read_bytes()) for r in range(3)]
    for label, data in (("dict", b"\x80\x04}(\x8c\x07entries](" + b"}" * 16_000_000 + b"eu."),
                        ("list", b"\x80\x04}(\x8c\x07entries](" + b"]" * 12_000_000 + b"eu.")):
        d = tmp / f"a3-bomb-{label}"
        d.mkdir()
        (d / "rank_0").write_bytes(data)
        cases.append(Case("26-7-attack3", f"explain DIR ({label} bomb pickle, 16 MB)", ddpdoctor_argv("explain", str(d)),
                          (2,), 60))  # fmt: skip
    proto0 = tmp / "a3-proto0"
    proto0.mkdir()
    for r, dump in enumerate(dumps):
        (proto0 / f"rank_{r}").write_bytes(pickle.dumps(dump, protocol=0))
    cases.append(Case("26-7-attack3", "explain DIR (protocol 0 dumps: a desync)", ddpdoctor_argv("explain", str(proto0)),
                      (1,), 60))  # fmt: skip
    names = tmp / "a3-names"
    names.mkdir()
    for name, dump in zip(("rank_0", "rank_9999999", "rank_-1"), dumps):
        (names / name).write_bytes(pickle.dumps(dump))

    def no_huge_rank(proc: subprocess.CompletedProcess) -> str:
        return "rank 9999999 believed" if '"rank": 9999999' in proc.stdout else ""

    cases.append(Case("26-7-attack3", "explain --json DIR (dump names rank_9999999, rank_-1)",
                      ddpdoctor_argv("explain", "--json", str(names)), (0, 1, 2, 3), 60, verify=no_huge_rank))  # fmt: skip
    line = ("[rank{r}]:[E1121 10:00:00.000000 1 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=16, NumelOut=16, Timeout(ms)=600000) "
            "ran for 600010 milliseconds before timing out.\n")
    for label, seq in (("negative", "-5"), ("5000 digits", "9" * 5000)):
        log = tmp / f"a3-wd-{label.split()[0]}.log"
        log.write_text(line.format(r=0, s=seq) + line.format(r=1, s=seq if seq == "-5" else "1"))
        cases.append(Case("26-7-attack3", f"explain (watchdog SeqNum {label})", ddpdoctor_argv("explain", str(log)),
                          (1,), 30))  # fmt: skip
    long = "x" * 5000
    cases += [
        Case("26-7-attack3", "hang --fr <5000-char name>", ddpdoctor_argv("hang", "--fr", long, "--no-ras", "--no-stacks",
             "--timeout", "3"), (2,), 30),
        Case("26-7-attack3", "plan --config <5000-char name>", ddpdoctor_argv("plan", "--config", long, "--gpus", "8",
             "--gpu-mem", "80GiB"), (2,), 30),
        Case("26-7-attack3", "snapshot <5000-char name>", ddpdoctor_argv("snapshot", long, "--only", "launch"), (2,), 30),
    ]  # fmt: skip
    hub = tmp / "a3-hub"
    (hub / "models--evil--fifo" / "refs").mkdir(parents=True)
    os.mkfifo(hub / "models--evil--fifo" / "refs" / "main")
    cases.append(Case("26-7-attack3", "plan --config evil/fifo (refs/main a FIFO)",
                      ddpdoctor_argv("plan", "--config", "evil/fifo", "--gpus", "8", "--gpu-mem", "80GiB"), (2,), 30,
                      env={"HF_HUB_CACHE": str(hub)}))  # fmt: skip
    (tmp / "a3-real").mkdir()
    (tmp / "a3-linkdir").symlink_to(tmp / "a3-real")
    cases.append(Case("26-7-attack3", "snapshot DIR (DIR a symlink to a directory)",
                      ddpdoctor_argv("snapshot", str(tmp / "a3-linkdir"), "--only", "launch"), (2,), 60))  # fmt: skip
    arabic = str.maketrans("0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669")
    ulimit = tmp / "a3-ulimit.txt"
    ulimit.write_text("open files                          (-n) 1024\nmax user processes                  (-u) 8192\n"
                      .translate(arabic))  # fmt: skip
    cases.append(Case("26-7-attack3", "parse ulimit (Arabic-Indic digits)", ddpdoctor_argv("parse", "ulimit", str(ulimit)),
                      (3,), 30))  # fmt: skip
    for label, text in (("HTML", "<html><body><table><tr><td>GPU 0</td></tr></table></body></html>\n"),
                        ("another CSV", "a,b,c\n1,2,3\n4,5,6\n")):
        f = tmp / f"a3-csv-{label.split()[-1]}.txt"
        f.write_text(text)
        cases.append(Case("26-7-attack3", f"parse nvidia-smi-csv ({label})",
                          ddpdoctor_argv("parse", "nvidia-smi-csv", str(f)), (3,), 30))  # fmt: skip
    return cases


def build_attack3_writes_cases(tmp: Path) -> list[Case]:
    """Group 26-11: the third attack pass's write-safety findings (issue #26 W1, W3, W4, W5, T2, X2, T4,
    X1, E2): every output file goes through edge.files.write_output_file."""
    g = "26-11-attack3-writes"
    snap = str(ROOT / "tests" / "fixtures" / "ci" / "healthy-cpu-node")
    tiny = ("--backend", "gloo", "--nproc", "2", "--ops", "all_reduce", "--min-bytes", "8", "--max-bytes", "8",
            "--iters", "1", "--warmup", "0")  # fmt: skip
    w = tmp / "a3w"
    w.mkdir()
    cases: list[Case] = []

    def unchanged(path: Path, text: str) -> Callable[[subprocess.CompletedProcess], str]:
        path.write_text(text)
        return lambda proc: "" if path.read_text() == text else f"{path} was overwritten"

    keep = w / "keep.txt"
    (w / "link.json").symlink_to(keep)
    cases.append(Case(g, "bench-nccl --json LINK", ddpdoctor_argv("bench-nccl", *tiny, "--json", str(w / "link.json")),
                      (2,), 60, verify=unchanged(keep, "KEEP\n")))  # fmt: skip
    exists = w / "exists.csv"
    cases.append(Case(g, "bench-nccl --csv EXISTING", ddpdoctor_argv("bench-nccl", *tiny, "--csv", str(exists)),
                      (2,), 60, verify=unchanged(exists, "OLD\n")))  # fmt: skip
    for command, flag in (("report", "-o"), ("expect", "--write")):
        precious = w / f"precious-{command}.txt"
        precious.write_text("PRECIOUS\n")
        os.link(precious, w / f"hard-{command}.out")
        cases.append(Case(g, f"{command} {flag} HARDLINK --force",
                          ddpdoctor_argv(command, "--replay", snap, flag, str(w / f"hard-{command}.out"), "--force"),
                          (0,), 60, verify=unchanged(precious, "PRECIOUS\n")))  # fmt: skip
    shared = w / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = w / "victim"
    victim.mkdir()
    (shared / "etclink").symlink_to(victim)
    cases.append(Case(g, "report -o WORLD-WRITABLE/LINK-TO-DIR/x.md",
                      ddpdoctor_argv("report", "--replay", snap, "-o", str(shared / "etclink" / "x.md")), (2,), 60,
                      verify=lambda proc: "" if not any(victim.iterdir()) else "wrote through the linked directory"))  # fmt: skip
    cases.append(Case(g, "report -o DIR/ (trailing slash)",
                      ddpdoctor_argv("report", "--replay", snap, "-o", str(w / "newdir") + "/"), (2,), 60,
                      verify=lambda proc: "" if not (w / "newdir").exists() else "wrote a file named DIR"))  # fmt: skip
    long = "e" * 300
    cases += [
        Case(g, "expect --write <300-byte name>", ddpdoctor_argv("expect", "--replay", snap, "--write", long), (2,), 60),
        Case(g, "bench-nccl --json <300-byte name>", ddpdoctor_argv("bench-nccl", *tiny, "--json", long), (2,), 60),
        Case(g, "check -o <250-byte name> (written, not exit 3)",
             ddpdoctor_argv("check", "--replay", snap, "--only", "system", "--format", "prometheus", "-o", "p" * 250),
             (0, 1), 60),
        Case(g, "bench-nccl --min-bytes 0", ddpdoctor_argv("bench-nccl", "--backend", "gloo", "--min-bytes", "0"),
             (2,), 60),
        Case(g, "bench-nccl --max-bytes 0", ddpdoctor_argv("bench-nccl", "--backend", "gloo", "--max-bytes", "0"),
             (2,), 60),
        Case(g, "lint FILE/x.py (a path through a file)", ddpdoctor_argv("lint", str(keep / "x.py")), (2,), 30),
        Case(g, "lint <300-byte name>", ddpdoctor_argv("lint", long + ".py"), (2,), 30),
    ]  # fmt: skip
    repo = w / "repo"
    repo.mkdir()
    (repo / "a.py\n::error file=INJECTED,line=1::INJECTED-BY-NAME\nb.py").write_text(
        'import os, torch\nrank = int(os.environ["RANK"])\ntorch.cuda.set_device(rank)\n'
    )
    log = w / "rank0.log\n::error file=x::INJECTED-BY-NAME\nx.log"
    log.write_text("host:1:1 [0] misc NCCL WARN Net : Connection closed by remote peer\n")

    def no_command_line(proc: subprocess.CompletedProcess) -> str:
        hit = re.search(r"(?m)^::error file=(INJECTED|x::)", proc.stdout + proc.stderr)
        return "a file name started its own output line" if hit else ""

    for fmt in ("text", "junit"):
        cases.append(Case(g, f"lint --format {fmt} (newline in a file name)",
                          ddpdoctor_argv("lint", "--format", fmt, str(repo)), (1,), 30, verify=no_command_line))  # fmt: skip
    cases.append(Case(g, "explain (newline in a file name)", ddpdoctor_argv("explain", str(log)), (0, 1), 30,
                      verify=no_command_line))  # fmt: skip
    return cases


_FLOOD_RAS = r"""
import socket, sys
mismatch = open(sys.argv[1], "rb").read()
line = b"  Rank 5 has launched up to operation 6649 -- GPU 5 managed by process 1 on node h\n"
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    try:
        f = c.makefile("rwb")
        for raw in f:
            if raw.startswith(b"CLIENT PROTOCOL"):
                f.write(b"SERVER PROTOCOL 2\n")
            elif raw.startswith(b"SET FORMAT"):
                f.write(b"ERROR unknown\n")
            elif b"STATUS" in raw:
                f.write(mismatch + line * 300000)
                f.flush()
                break
            else:
                f.write(b"OK\n")
            f.flush()
    except OSError:
        pass
    finally:
        c.close()
"""


def build_attack3_verdict_cases(tmp: Path) -> tuple[list[Case], list[Callable[[], None]]]:
    """Group 26-12: the third attack pass's wrong actions and verdicts (/work/qa/findings.md V1, H2, M2,
    T3, O1, V2, V3): a drain of a hostlist, quadratic redaction, a huge kernel log, an undecodable RAS
    host, a flooding RAS server, negative GPU memory, a gap in the ranks called "every rank"."""
    g = "26-12-attack3-verdicts"
    cases: list[Case] = []
    bindir = tmp / "v-bin"
    bindir.mkdir()
    record = tmp / "v-scontrol.argv"
    (bindir / "scontrol").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    (bindir / "scontrol").chmod(0o755)

    def not_drained(proc: subprocess.CompletedProcess) -> str:
        if record.exists():
            drained = record.read_text()
            record.unlink()
            return f"scontrol ran: {drained!r}"
        return "" if "did not drain" in proc.stderr else "no word on why nothing was drained"

    path = f"{bindir}:{os.environ.get('PATH', '')}"
    for label, var, value in (("hostlist", "SLURMD_NODENAME", "gpu[01-99]"), ("comma", "SLURMD_NODENAME", "a,b"),
                              ("slurm-nodename-user-env", "SLURM_NODENAME", "gpu01 gpu02"),
                              ("other-host", "SLURM_NODENAME", "not-this-host-x")):
        cases.append(Case(g, f"check --prolog --on-fail drain ({var}={value!r}, {label})",
                          ddpdoctor_argv("check", "--prolog", "--on-fail", "drain", "--only", "launch"), (1,), 60,
                          env={"PATH": path, var: value, "CUDA_VISIBLE_DEVICES": "0,0"}, verify=not_drained))
    cases.append(Case(g, "check --only launch (12,000 environment variables)", ddpdoctor_argv("check", "--only", "launch"),
                      (0, 1), 60, env={f"MODULE_VAR_{i}": f"/opt/m/{i}" for i in range(12_000)}))
    big_env = snapshot_with(tmp, "v-env-140k", {})
    (big_env / "env.json").write_text(json.dumps({"PATH": "/usr/bin", **{f"NCCL_FOO_{i}": "x" * 60 for i in range(140_000)}}))

    def small_output(limit: int) -> Callable[[subprocess.CompletedProcess], str]:
        def verify(proc: subprocess.CompletedProcess) -> str:
            return "" if len(proc.stdout) < limit else f"{len(proc.stdout)} bytes of output"

        return verify

    cases.append(Case(g, "check --replay --json (env.json of 140,000 NCCL_* variables, 11 MB)",
                      ddpdoctor_argv("check", "--replay", str(big_env), "--json"), (0, 1, 3), 60,
                      # Judged, not timed out (a probe past its --timeout also prints little).
                      verify=both(small_output(2_000_000), says('"omitted": 139800'))))
    dmesg = tmp / "v-dmesg.txt"
    with dmesg.open("w") as f:
        for i in range(700_000):
            f.write(f"[{i}.0] NVRM: Xid (PCI:0000:{i % 256:02x}:00): 79, pid=1, GPU has fallen off the bus.\n")
    cases.append(Case(g, "parse dmesg (700,000 Xid lines, 52 MB)", ddpdoctor_argv("parse", "dmesg", str(dmesg)), (0,), 60,
                      verify=small_output(2_000_000)))
    hang = ("hang", "--no-stacks", "--no-fr", "--timeout", "3", "--samples", "1", "--json")  # JSON: no wrapping
    cases.append(Case(g, "hang --ras-addr <1000-char host>:1", ddpdoctor_argv(*hang, "--ras-addr", "h" * 1000 + ":1"),
                      (3,), 30, verify=says("not a valid host name")))
    cases.append(Case(g, "hang (NCCL_RAS_ADDR=<300-char host>:28028)", ddpdoctor_argv(*hang), (3,), 30,
                      env={"NCCL_RAS_ADDR": "h" * 300 + ":28028"}, verify=says("not a valid host name")))
    server_src = tmp / "v-ras-flood.py"
    server_src.write_text(_FLOOD_RAS)
    server = subprocess.Popen([sys.executable, str(server_src), str(ROOT / "tests" / "fixtures" / "nccl_ras" /
                               "synthetic-mismatch.txt")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    port = (server.stdout.readline() if server.stdout else "").strip()
    cases.append(Case(g, "hang --json (a RAS server flooding 25 MB of text)",
                      ddpdoctor_argv("hang", "--ras-addr", f"127.0.0.1:{port}", "--no-stacks", "--no-fr", "--json",
                                     "--samples", "1", "--timeout", "10"), (0, 1, 3), 60,
                      verify=small_output(1_000_000)))  # fmt: skip

    def stop_server() -> None:
        server.kill()
        server.wait()

    for label, memory in (("negative", {"total_mib": -1, "used_mib": -5, "free_mib": 10**30}),
                          ("minus-80-GiB", {"total_mib": -81559, "used_mib": 0, "free_mib": 0})):
        d = tmp / f"v-nvml-{label}"
        shutil.copytree(ROOT / "tests" / "fixtures" / "check" / "real-h100-torchrun-2ranks", d)
        nv = json.loads((d / "nvml.json").read_text())
        nv["gpus"][0]["memory"] = memory
        (d / "nvml.json").write_text(json.dumps(nv))
        (d / "env.json").write_text(json.dumps({"PATH": "/usr/bin"}))
        cases.append(Case(g, f"check --replay --only gpu (NVML memory {label})",
                          ddpdoctor_argv("check", "--replay", str(d), "--only", "gpu", "--json"), (3,), 60,
                          verify=has_finding("core.snapshot.bad_file")))
        cases.append(Case(g, f"plan --params 7B --replay (NVML memory {label})",
                          ddpdoctor_argv("plan", "--params", "7B", "--replay", str(d)), (3,), 60,
                          verify=lacks("Nothing fits on 1 x -")))
    wd = ("[rank{r}]:[E1121 10:00:00.000000 1 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
          "operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=16, NumelOut=16, Timeout(ms)=600000) "
          "ran for 600010 milliseconds before timing out.\n")
    gap = tmp / "v-rank-gap.log"
    gap.write_text(wd.format(r=0) + wd.format(r=3))
    cases.append(Case(g, "explain (watchdog reports from ranks 0 and 3 only)", ddpdoctor_argv("explain", str(gap)),
                      (0, 1), 30, verify=both(says("watchdog.unconfirmed"), lacks("no rank of the job is missing"))))
    return cases, [stop_server]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--only", help="only groups whose name contains this")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the source tree to run (e.g. an older commit, to compare)"
    )
    parser.add_argument(
        "--mem-limit",
        type=int,
        default=4096,
        help="address-space limit per command, MiB (an unbounded "
        "read of /dev/zero by an older tree must not take the machine down)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-sweep-") as t:
        tmp = Path(t)
        os.chmod(tmp, 0o755)
        cases = build_cases(tmp, os.geteuid() == 0) + build_attack3_cases(tmp) + build_attack3_writes_cases(tmp)
        holder_case, holder = port_holder_case(tmp)
        cases.append(holder_case)
        round2, cleanup = build_round2_cases(tmp)
        holder_cases, holder2 = port_holder_round2(tmp)
        output_cases, output_cleanup = build_output_cases(tmp)
        cleanup += output_cleanup
        verdict_cases, verdict_cleanup = build_attack3_verdict_cases(tmp)
        cleanup += verdict_cleanup
        cases += round2 + holder_cases + output_cases + verdict_cases
        if args.only:
            cases = [c for c in cases if args.only in c.group]
        outcomes: list[Outcome] = []
        try:
            for case in cases:
                o = run_case(case, tmp, args.root.resolve(), args.mem_limit)
                outcomes.append(o)
                if args.verbose or not o.ok:
                    print(f"{'PASS' if o.ok else 'FAIL'} {o.seconds:5.1f}s [{case.group}] {case.name}"
                          + ("" if o.ok else f": {o.why}"), flush=True)  # fmt: skip
        finally:
            for proc in (holder, holder2):
                proc.kill()
                proc.wait()
            for close in cleanup:
                close()
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.case.group, []).append(o)
    for g, os_ in sorted(groups.items()):
        print(
            f"{g:14s} {sum(o.ok for o in os_):4d}/{len(os_):<4d} passed, slowest {max(o.seconds for o in os_):.1f}s"
        )
    passed = sum(o.ok for o in outcomes)
    print(f"total          {passed:4d}/{len(outcomes):<4d} passed")
    return 0 if passed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
