"""Issue #26, third attack pass (/work/qa/findings.md V1, H2, M2, T3, O1, V2, V3): inputs that made a
command act on the wrong thing (drain other nodes), run away in time or memory, crash, or give a
verdict the input does not support. Each test runs the real command on an input shaped like the
reviewer's reproduction."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from ddpdoctor.edge.redact import REDACTED, redact_data
from ddpdoctor.edge.slurm import drain_for
from ddpdoctor.parsers.dmesg import MAX_EVENTS, parse_dmesg

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def run_cli(*args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, env=full, capture_output=True, text=True,
        errors="replace", timeout=timeout,
    )  # fmt: skip


# --- V1: the drain names one node, this one ----------------------------------------------------------


def fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A `scontrol` that records its argv (the reviewer's fake): what a real one would have drained."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "scontrol.argv"
    script = bindir / "scontrol"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    script.chmod(0o755)
    return bindir, record


def prolog_drain(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    bindir, record = fake_scontrol(tmp_path)
    base = {k: v for k, v in os.environ.items() if k not in ("SLURMD_NODENAME", "SLURM_NODENAME")}
    full = {**base, "PATH": f"{bindir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "0,0", **env}
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "check", "--prolog", "--on-fail", "drain", "--only", "launch"],
        cwd=tmp_path, env={**full, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return out, record


def test_a_hostlist_node_name_drains_nothing(tmp_path: Path) -> None:
    for i, (var, value) in enumerate(
        [("SLURMD_NODENAME", "gpu[01-99]"), ("SLURMD_NODENAME", "a,b"), ("SLURM_NODENAME", "gpu01 gpu02")]
    ):
        d = tmp_path / str(i)
        d.mkdir()
        out, record = prolog_drain(d, **{var: value})
        assert out.returncode == 1, out.stderr  # CUDA_VISIBLE_DEVICES=0,0 fails: the drain is tried
        assert not record.exists(), record.read_text()
        assert "did not drain" in out.stderr and "one plain Slurm node name" in out.stderr


def test_another_hosts_name_drains_nothing(tmp_path: Path) -> None:
    out, record = prolog_drain(tmp_path, SLURM_NODENAME="some-other-node")
    assert not record.exists()
    assert "is not this host" in out.stderr


def test_this_hosts_name_is_drained(tmp_path: Path) -> None:
    host = socket.gethostname().split(".")[0]
    out, record = prolog_drain(tmp_path, SLURMD_NODENAME=host)
    assert record.read_text().splitlines()[:3] == ["update", f"nodename={host}", "state=drain"], out.stderr
    assert drain_for(None, {"SLURMD_NODENAME": "gpu[1-2]"}) is None  # nothing failed: nothing said


# --- H2: redacting a large environment is linear ---------------------------------------------------


def test_an_environment_of_12k_variables_is_redacted_whole() -> None:
    env = {f"MODULE_VAR_{i}": f"/opt/m/{i}" for i in range(12000)}
    secrets = {f"SVC_{i}_TOKEN": f"tok-{i:05d}-Zq9xY" for i in range(3000)}
    env.update(secrets)
    env["DB_URL"] = "postgres://db/x?opt=tok-00042-Zq9xY"  # another variable's secret, verbatim
    out = redact_data(env, env)
    assert out["MODULE_VAR_11999"] == "/opt/m/11999"
    assert all(out[k] == REDACTED for k in secrets)
    assert "tok-00042" not in out["DB_URL"] and REDACTED in out["DB_URL"]


def test_check_with_12k_variables_completes(tmp_path: Path) -> None:
    extra = {f"MODULE_VAR_{i}": f"/opt/m/{i}" for i in range(12000)}
    out = run_cli("check", "--only", "launch", cwd=tmp_path, env=extra)
    assert out.returncode == 0, out.stderr[-2000:]


def test_replay_of_140k_nccl_variables_is_summarised(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    shutil.copytree(FIXTURES / "check" / "real-h100-torchrun-2ranks", snap)
    env = {"PATH": "/usr/bin", **{f"NCCL_FOO_{i}": "x" * 60 for i in range(140000)}}
    (snap / "env.json").write_text(json.dumps(env))
    out = run_cli("check", "--replay", str(snap), "--only", "nccl_env", "--json", cwd=tmp_path, timeout=300)
    report = json.loads(out.stdout)
    unknown = [f for f in report["findings"] if f["id"] == "nccl_env.unknown"]
    assert len(unknown) == 201
    assert unknown[-1]["data"]["omitted"] == 140000 - 200
    assert len(out.stdout) < 2_000_000


# --- M2: a huge kernel log keeps a bounded number of events -----------------------------------------


def test_a_million_xid_lines_keep_a_bounded_number_of_events() -> None:
    n = 200_000
    text = "".join(
        f"[{i}.0] NVRM: Xid (PCI:0000:{i % 256:02x}:00): 79, pid=1, GPU has fallen off the bus.\n" for i in range(n)
    )
    parsed = parse_dmesg(text)
    assert len(parsed["xids"]) == MAX_EVENTS
    assert parsed["omitted"]["xids"] == n - MAX_EVENTS
    # The first and the last events are the ones kept: when it began, what it is now.
    assert parsed["xids"][0]["timestamp"] == 0.0 and parsed["xids"][-1]["timestamp"] == float(n - 1)


def test_a_multiline_fallen_off_the_bus_still_finds_its_bus() -> None:
    text = (
        "[ 12.5] NVRM: The NVIDIA GPU 0000:b3:00.0\r\n"
        "NVRM: (PCI ID: 10de:2330) installed in this system has\r\n"
        "NVRM: fallen off the bus and is not responding to commands.\r\n"
    )
    parsed = parse_dmesg(text)
    assert [f["bus_id"] for f in parsed["fallen_off_bus"]] == ["0000:b3:00"]
    assert parsed["fallen_off_bus"][0]["timestamp"] == 12.5
    assert "omitted" not in parsed


# --- T3: a RAS host name that cannot be a DNS name --------------------------------------------------


def test_a_ras_host_label_over_63_characters_is_a_bad_address(tmp_path: Path) -> None:
    for args, env in (
        (["--ras-addr", "h" * 1000 + ":1"], {}),
        ([], {"NCCL_RAS_ADDR": "h" * 300 + ":28028"}),  # the job's own variable, as hang reads it
    ):
        out = run_cli("hang", "--no-stacks", "--no-fr", "--timeout", "3", "--samples", "1", "--json", *args,
                      cwd=tmp_path, env=env)
        assert out.returncode == 3, out.stderr[-2000:]
        assert "Traceback" not in out.stderr
        assert "not a valid host name" in out.stdout


# --- O1: a flooding RAS server -----------------------------------------------------------------------


def test_a_flooding_ras_reply_is_bounded_in_json() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_hang_ras import FIX as RAS_FIX
    from test_hang_ras import RasServer
    from typer.testing import CliRunner

    from ddpdoctor.cli import app
    from ddpdoctor.hang.ras import MAX_LISTED_RANKS

    # The real-shaped mismatch report, then the same "behind" line 200,000 times (16 MiB are read).
    line = b"  Rank 5 has launched up to operation 6649 -- GPU 5 managed by process 1 on node h\n"
    reply = b"SERVER PROTOCOL 2\nOK\n" + (RAS_FIX / "synthetic-mismatch.txt").read_bytes() + line * 200_000
    server = RasServer(reply, old_nccl=True)
    res = CliRunner().invoke(app, ["hang", "--ras-addr", server.addr, "--no-stacks", "--no-fr", "--json",
                                   "--samples", "1", "--timeout", "10"])
    data = json.loads(res.stdout[res.stdout.index("{"):])
    assert len(data["ras"]["ranks_behind"]) == MAX_LISTED_RANKS
    assert data["ras"]["omitted"]["ranks_behind"] > 100_000
    assert len(res.stdout) < 1_000_000


# --- V2: readings that cannot be -------------------------------------------------------------------


def snapshot_with_gpu_memory(tmp_path: Path, memory: dict) -> Path:
    """The real H100 torchrun snapshot with GPU 0's NVML memory reading replaced."""
    snap = tmp_path / "snap"
    shutil.copytree(FIXTURES / "check" / "real-h100-torchrun-2ranks", snap)
    nv = json.loads((snap / "nvml.json").read_text())
    nv["gpus"][0]["memory"] = memory
    (snap / "nvml.json").write_text(json.dumps(nv))
    (snap / "env.json").write_text(json.dumps({"PATH": "/usr/bin"}))
    return snap


def test_negative_gpu_memory_is_a_bad_file_not_a_pass(tmp_path: Path) -> None:
    snap = snapshot_with_gpu_memory(tmp_path, {"total_mib": -1, "used_mib": -5, "free_mib": 10**30})
    out = run_cli("check", "--replay", str(snap), "--only", "gpu", "--json", cwd=tmp_path)
    assert out.returncode == 3, out.stdout[-2000:]
    bad = [f for f in json.loads(out.stdout)["findings"] if f["id"] == "core.snapshot.bad_file"]
    assert bad and "total_mib" in bad[0]["summary"]


def test_plan_refuses_a_snapshot_with_negative_gpu_memory(tmp_path: Path) -> None:
    snap = snapshot_with_gpu_memory(tmp_path, {"total_mib": -81559, "used_mib": 0, "free_mib": 0})
    out = run_cli("plan", "--params", "7B", "--replay", str(snap), cwd=tmp_path)
    assert out.returncode == 3
    assert "nvml.json is unusable" in out.stderr and "GiB" not in out.stdout
    # The same snapshot with a real reading plans.
    ok = snapshot_with_gpu_memory(tmp_path / "ok", {"total_mib": 81559, "used_mib": 0, "free_mib": 81559})
    assert "79.6 GiB" in run_cli("plan", "--params", "7B", "--replay", str(ok), cwd=tmp_path).stdout


# --- V3: "every rank" only when every rank reported --------------------------------------------------

WATCHDOG = (
    "[rank{r}]:[E1121 10:00:00.000000 1 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=16, NumelOut=16, Timeout(ms)=600000) ran for 600010 "
    "milliseconds before timing out.\n"
)


def explain_ranks(tmp_path: Path, ranks: list[int]) -> dict:
    log = tmp_path / f"ranks-{'-'.join(map(str, ranks))}.log"
    log.write_text("".join(WATCHDOG.format(r=r) for r in ranks))
    out = run_cli("explain", str(log), "--json", cwd=tmp_path)
    return json.loads(out.stdout)


def test_a_gap_in_the_ranks_is_not_an_all_ranks_hang(tmp_path: Path) -> None:
    text = json.dumps(explain_ranks(tmp_path, [0, 3]))
    assert "watchdog.unconfirmed" in text and "watchdog.hang" not in text
    assert "no rank of the job is missing" not in text
    assert "rank(s) 1, 2 left no line here" in text


def test_every_rank_reporting_is_still_a_hang(tmp_path: Path) -> None:
    text = json.dumps(explain_ranks(tmp_path, [0, 1, 2, 3]))
    assert "watchdog.hang" in text and "no rank of the job is missing" in text
