"""ddpdoctor under a real Slurm: srun steps, `hang` on an srun job, the Prolog and the drain mode.

The session fixture starts a one-node cluster of Debian's munged, slurmctld and slurmd on 127.0.0.1
(tests/_slurm.py: its own slurm.conf, munge key, ports and state directories in a temporary directory)
and kills it at the end; where the packages are missing or do not start (not root, no slurm-wlm), every
test here skips, saying why. `.ci/run` installs them. Draining the node is ddpdoctor's act; resuming it
is the admin's, done here by the fixture after each test that drains.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _slurm import NO_PROLOG, SlurmCluster, SlurmUnavailable, free_port

from ddpdoctor.edge.slurm import drain_node, slurm_node_name
from ddpdoctor.hang.procs import Job, Worker, select_job

REPO = Path(__file__).resolve().parent.parent
DDPDOCTOR = [sys.executable, "-m", "ddpdoctor"]
HANG_JOB = REPO / "tests" / "_hang_job.py"
SRUN_RANK = REPO / "tests" / "_srun_rank.py"
CI_DOC = REPO / "docs" / "ci.md"
# An expectation no machine meets, and one every machine does: a failing and a passing node check that
# need no GPU. /dev/shm is read on every Linux machine.
FAILING_EXPECT = '[system]\nshm_min = "100T"\n'
PASSING_EXPECT = '[system]\nshm_min = "1M"\n'


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        cluster.stop()
        pytest.skip(f"no test Slurm cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def admin(slurm):
    """The cluster, put back as it was after the test: the empty Prolog, no job left, the node resumed
    (the admin's act after reading the reason)."""
    yield slurm
    slurm.write_prolog(NO_PROLOG)
    slurm.run("scancel", "--full", "-u", "root")
    if "DRAIN" in slurm.show_node().get("State", ""):
        slurm.resume()


def expect_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def srun(slurm: SlurmCluster, *argv: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return slurm.run("srun", *argv, timeout=timeout, env={**slurm.env, "COLUMNS": "200", **env}, cwd=REPO)


# --- srun steps: one verdict, and the step's exit code is the verdict's ------------------------------


@pytest.mark.parametrize("expect", [PASSING_EXPECT, FAILING_EXPECT], ids=["healthy", "failing"])
def test_check_cluster_under_srun(slurm, tmp_path, expect):
    toml = expect_file(tmp_path, expect)
    out = srun(slurm, "-n", "2", *DDPDOCTOR, "check", "--cluster", "--only", "system,launch", "--expect", str(toml),
               "--json")  # fmt: skip
    report = json.loads(out.stdout)  # one document: only rank 0 prints
    assert report["launcher"] == "slurm" and report["world_size"] == 2
    assert out.returncode == report["exit_code"] == (0 if expect == PASSING_EXPECT else 1), out.stderr
    ids = {f["id"] for f in report["findings"]} | {
        f["id"] for node in report["nodes"] for f in node.get("findings", [])
    }
    assert ("expect.system.shm" in json.dumps(report)) and ids


def test_check_cluster_table_under_srun_prints_one_summary(slurm, tmp_path):
    toml = expect_file(tmp_path, FAILING_EXPECT)
    out = srun(slurm, "-n", "2", *DDPDOCTOR, "check", "--cluster", "--only", "system", "--expect", str(toml))
    assert out.returncode == 1, out.stderr
    summaries = [line for line in out.stdout.splitlines() if line.startswith("Summary:")]
    assert len(summaries) == 1 and summaries[0].endswith("-> exit 1"), out.stdout


@pytest.mark.parametrize("min_busbw", [None, "1000000"], ids=["pass", "below-min-busbw"])
def test_bench_under_srun(slurm, min_busbw):
    args = ["bench-nccl", "--backend", "gloo", "--ops", "all_reduce", "--min-bytes", "16K", "--max-bytes", "32K",
            "--iters", "2", "--warmup", "1", "--format", "json"]  # fmt: skip
    if min_busbw:
        args += ["--min-busbw", min_busbw]
    out = srun(slurm, "-n", "2", *DDPDOCTOR, *args, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    doc = json.loads(out.stdout)  # one document: rank 0's
    assert doc["config"]["world_size"] == 2 and doc["config"]["backend"] == "gloo"
    assert doc["environment"].get("launcher") == "slurm"
    assert doc["launch"]["ok"] is True
    assert [r["size"] for r in doc["rows"]] == [16384, 32768]
    assert out.returncode == doc["exit_code"] == (1 if min_busbw else 0), out.stderr


def test_bench_under_srun_without_master_addr_refuses_on_every_rank(slurm):
    out = srun(slurm, "-n", "2", *DDPDOCTOR, "bench-nccl", "--backend", "gloo", "--ops", "all_reduce")
    assert out.returncode == 2
    assert out.stderr.count("MASTER_ADDR/MASTER_PORT are not set") == 2, out.stderr


# --- hang on an srun job -------------------------------------------------------------------------------


def test_hang_finds_the_ranks_of_a_hung_srun_job(slurm, admin, tmp_path):
    prefix = tmp_path / "fr_"
    name = f"ddpdoctor-hang-{os.getpid()}"
    env = {**slurm.env, "HANG_FR_PREFIX": str(prefix), "HANG_FR_AFTER": "1", "TORCH_FR_BUFFER_SIZE": "200",
           "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    log = open(tmp_path / "job.log", "wb")
    job = subprocess.Popen(
        ["srun", "-n", "2", "-J", name, sys.executable, str(SRUN_RANK), str(HANG_JOB), "sleep"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not all(Path(f"{prefix}{r}").exists() for r in (0, 1)):
            assert job.poll() is None, (tmp_path / "job.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the srun job did not reach its hang"
            time.sleep(0.3)
        job_id = slurm.run("squeue", "-h", "-n", name, "-o", "%i").stdout.strip()
        assert job_id.isdigit(), job_id
        # As docs/hang.md says: a step inside the hung job's allocation.
        out = srun(slurm, "--overlap", "--jobid", job_id, "-n", "1", *DDPDOCTOR, "hang", "--json")
        report = json.loads(out.stdout)
        assert out.returncode == report["exit_code"] == 1, out.stderr
        assert sorted(r["rank"] for r in report["job"]["ranks"]) == [0, 1]
        assert report["verdict"]["culprit_ranks"] == [1], report["verdict"]
        culprit = report["verdict"]["culprits"][0]
        assert culprit["file"] == str(HANG_JOB) and "HANG-LINE sleep" in culprit["where"]
    finally:
        slurm.run("scancel", "-n", name)
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait(timeout=30)
        log.close()
    deadline = time.monotonic() + 30
    while slurm.run("squeue", "-h", "-n", name, "-o", "%i").stdout.strip():
        assert time.monotonic() < deadline, "the hung job outlived scancel"
        time.sleep(0.5)


def test_only_the_ranks_of_the_slurm_job_asked_about():
    def job(pid: int, slurm_job: str) -> Job:
        return Job(None, (), [Worker(pid, 0, 0, ("python",), {"RANK": "0", "SLURM_JOB_ID": slurm_job})])

    jobs = [
        job(10, "7"),
        job(20, "8"),
        Job(30, ("torchrun",), [Worker(31, 0, 0, ("python",), {"RANK": "0"})]),
    ]
    assert select_job(jobs, None, [], "8")[0] is jobs[1]
    assert "3 jobs" in select_job(jobs, None, [], None)[1]
    # None of job 99's ranks here: all the jobs are candidates again, and it asks for --pid.
    assert "3 jobs" in select_job(jobs, None, [], "99")[1]


# --- the Prolog and the drain mode ---------------------------------------------------------------------


def documented_script(marker: str) -> str:
    """The bash script of docs/ci.md whose first comment names `marker`."""
    for block in re.finditer(r"```bash\n(.*?)```", CI_DOC.read_text(), re.S):
        if marker in block.group(1).splitlines()[1]:
            return block.group(1)
    raise AssertionError(f"no script {marker} in docs/ci.md")


def installed(script: str, toml: Path) -> str:
    """The documented script with this checkout's ddpdoctor and the test's expectations file."""
    return script.replace(
        "/opt/ddpdoctor/bin/ddpdoctor", str(Path(sys.executable).parent / "ddpdoctor")
    ).replace("/etc/ddpdoctor/node.toml", str(toml))


def first_failing_id(toml: Path) -> str:
    """What the drain reason must name: the first line of `check --prolog` on this node."""
    out = subprocess.run([*DDPDOCTOR, "check", "--prolog", "--expect", str(toml), "--timeout", "20"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
    assert out.returncode != 0 and out.stdout, out.stderr
    return out.stdout.splitlines()[0].split(":", 1)[0]


def test_prolog_of_a_healthy_node_lets_the_job_run(admin, tmp_path):
    admin.write_prolog(
        installed(
            documented_script("/etc/slurm/prolog.d/ddpdoctor.sh"), expect_file(tmp_path, PASSING_EXPECT)
        )
    )
    out = srun(admin, "-n", "1", "echo", "ran")
    assert out.returncode == 0 and out.stdout.strip() == "ran", out.stderr
    assert "DRAIN" not in admin.show_node()["State"]


def test_failing_prolog_drains_the_node_with_ddpdoctors_reason(admin, tmp_path):
    toml = expect_file(tmp_path, FAILING_EXPECT)
    admin.write_prolog(installed(documented_script("/etc/slurm/prolog.d/ddpdoctor.sh"), toml))
    out = srun(admin, "-n", "1", "echo", "ran")
    assert out.returncode != 0 and "ran" not in out.stdout
    assert "prolog" in out.stderr.lower(), out.stderr
    node = admin.show_node()
    assert "DRAIN" in node["State"], node
    # Slurm keeps the reason ddpdoctor gave (it does not overwrite it with "Prolog error").
    assert node["Reason"].startswith(f"ddpdoctor: {first_failing_id(toml)} ["), node["Reason"]


def test_drain_mode_drains_with_the_first_failing_id(admin, tmp_path):
    toml = expect_file(tmp_path, FAILING_EXPECT)
    env = {**admin.env, "SLURMD_NODENAME": admin.host}
    out = admin.run(*DDPDOCTOR, "check", "--prolog", "--on-fail", "drain", "--only", "system", "--expect", str(toml),
                    "--timeout", "20", env=env, cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stdout.startswith("expect.system.shm: ")
    assert f"drained node {admin.host}" in out.stderr
    node = admin.show_node()
    assert "DRAIN" in node["State"]
    assert node["Reason"].startswith("ddpdoctor: expect.system.shm ["), node["Reason"]


def test_drain_mode_leaves_a_healthy_node_alone(admin, tmp_path):
    toml = expect_file(tmp_path, PASSING_EXPECT)
    out = admin.run(*DDPDOCTOR, "check", "--prolog", "--on-fail", "drain", "--only", "system", "--expect", str(toml),
                    env={**admin.env, "SLURMD_NODENAME": admin.host}, cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    assert admin.show_node()["State"] == "IDLE"


def test_the_health_check_program_drains(admin, tmp_path):
    """docs/ci.md's HealthCheckProgram, run as slurmd would (SLURMD_NODENAME set; Slurm ignores its exit
    code, so the drain is the whole effect)."""
    toml = expect_file(tmp_path, FAILING_EXPECT)
    script = tmp_path / "ddpdoctor-health.sh"
    script.write_text(installed(documented_script("/etc/slurm/ddpdoctor-health.sh"), toml))
    script.chmod(0o755)
    out = admin.run(str(script), env={**admin.env, "SLURMD_NODENAME": admin.host}, timeout=120)
    assert out.returncode == 1, out.stderr
    assert admin.show_node()["Reason"].startswith(f"ddpdoctor: {first_failing_id(toml)} [")


# --- the drain call itself -------------------------------------------------------------------------------


def test_node_name_from_slurm_variables_then_hostname():
    assert slurm_node_name({"SLURMD_NODENAME": "gpu07", "SLURM_NODENAME": "x"}) == "gpu07"
    assert slurm_node_name({"SLURM_NODENAME": "gpu08"}) == "gpu08"
    assert slurm_node_name({"SLURMD_NODENAME": " "}) == os.uname().nodename.split(".")[0]


def test_drain_without_scontrol_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no scontrol
    outcome = drain_node("gpu07", "ddpdoctor: x.y")
    assert not outcome.ok
    assert outcome.describe() == "ddpdoctor: could not drain node gpu07: scontrol: command not found"
