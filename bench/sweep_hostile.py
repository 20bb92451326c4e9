"""The hostile-input sweep of issue #20: every command as a hostile user would run it, counted.

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
    for p in (fifo_py, zero_py, lintdir):
        cases.append(Case("1-files", f"lint {p.name}", ddpdoctor_argv("lint", str(p)), (0, 1), 30))
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
        cases = build_cases(tmp, os.geteuid() == 0)
        holder_case, holder = port_holder_case(tmp)
        cases.append(holder_case)
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
            holder.kill()
            holder.wait()
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
