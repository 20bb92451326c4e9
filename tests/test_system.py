"""The system area, fed with real captured `df` and `ulimit -a` outputs through snapshot directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.checks import system
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import ExitCode, Severity
from ddpdoctor.edge.sources import LiveSources, RecordingSources, ReplaySources
from ddpdoctor.parsers.df import find_mount, parse_df

FIX = Path(__file__).parent / "fixtures"
SHM_1G_87 = FIX / "system" / "df-shm__docker-shm-size-1g-87pct-used-zombie-dataloader-workers.txt"
SHM_64M = FIX / "check" / "df-shm__docker-default-64m-94pct-used.txt"
NO_SHM_STDERR = FIX / "check" / "df-shm__no-dev-shm-stderr.txt"
ULIMIT_BASH4 = FIX / "system" / "ulimit-a__bash4-memlock-64k-openfiles-1024-default.txt"
ULIMIT_BASH5 = FIX / "system" / "ulimit-a__bash5-with-R-line-memlock-5128731.txt"

BIG_SYSTEM = {
    "os": "Linux-5.15-x86_64",
    "kernel": "5.15",
    "machine": "x86_64",
    "python": "3.11.7",
    "cpu_count": 64,
    "cpu_affinity": 64,
    "mem_total_bytes": 512 * 1024**3,
    "cgroup_memory_limit_bytes": None,
    "container": {"kinds": ["docker"]},
}


def snapshot_dir(tmp_path: Path, df: Path | None = None, ulimit: Path | None = None, info=None) -> Path:
    d = tmp_path / "snap"
    d.mkdir()
    if df is not None:
        shutil.copy(df, d / "df-shm.txt")
    if ulimit is not None:
        shutil.copy(ulimit, d / "ulimit-a.txt")
    if info is not None:
        (d / "system.json").write_text(json.dumps(info))
    return d


def run_system(directory: Path):
    return run_checks(ReplaySources(directory), [system.AREA], timeout_s=10)


def by_id(report) -> dict:
    return {f.id: f for f in report.findings}


def test_docker_default_64m_shm_fails(tmp_path: Path) -> None:
    report = run_system(snapshot_dir(tmp_path, SHM_64M, ULIMIT_BASH5, BIG_SYSTEM))
    found = by_id(report)
    assert found["system.shm.size"].severity == Severity.FAIL
    assert "64 MiB" in found["system.shm.size"].summary
    assert "--shm-size" in found["system.shm.size"].fix
    assert found["system.shm.use"].severity == Severity.WARN  # 94% used
    assert report.exit_code() == ExitCode.FAILED


def test_one_gib_shm_nearly_full_warns(tmp_path: Path) -> None:
    found = by_id(run_system(snapshot_dir(tmp_path, SHM_1G_87, ULIMIT_BASH5, BIG_SYSTEM)))
    # df -h prints 1.0G: exactly the warn threshold is not below it.
    assert found["system.shm.size"].severity == Severity.OK
    assert found["system.shm.size"].data["size_bytes"] == 1024**3
    assert found["system.shm.use"].severity == Severity.OK  # 87% < 90%


def test_low_open_files_limit_warns(tmp_path: Path) -> None:
    found = by_id(run_system(snapshot_dir(tmp_path, SHM_1G_87, ULIMIT_BASH4, BIG_SYSTEM)))
    nofile = found["system.ulimit.nofile"]
    assert nofile.severity == Severity.WARN and nofile.data["nofile"] == 1024
    assert "ulimit -n" in nofile.fix


def test_df_missing_from_snapshot_is_a_skip_not_a_pass(tmp_path: Path) -> None:
    # "Not available there": the snapshot does not hold it, so the check is skipped, never passed.
    report = run_system(snapshot_dir(tmp_path, None, ULIMIT_BASH5, BIG_SYSTEM))
    found = by_id(report)
    assert found["system.shm.unreadable"].severity == Severity.SKIP
    assert "df-shm.txt not in snapshot" in found["system.shm.unreadable"].summary
    assert "system.shm.size" not in found and "system.shm.use" not in found


def test_df_failing_without_dev_shm_is_an_error(tmp_path: Path) -> None:
    # Real df stderr with /dev/shm absent, stored the way `ddpdoctor snapshot` stores a failed command.
    d = snapshot_dir(tmp_path, None, ULIMIT_BASH5, BIG_SYSTEM)
    (d / "df-shm.txt").write_text("")
    meta = {
        "argv": ["df", "-k", "/dev/shm"],
        "returncode": 1,
        "timed_out": False,
        "stderr": NO_SHM_STDERR.read_text(),
    }
    (d / "df-shm.meta.json").write_text(json.dumps(meta))
    found = by_id(run_system(d))
    f = found["system.shm.unreadable"]
    assert f.severity == Severity.ERROR
    assert "No such file or directory" in f.summary


def test_missing_df_binary_on_live_machine_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real runner, with a PATH on which neither df nor bash exist.
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    report = run_checks(LiveSources(), [system.AREA], timeout_s=10)
    found = by_id(report)
    assert found["system.shm.unreadable"].severity == Severity.ERROR
    assert "df: command not found" in found["system.shm.unreadable"].summary
    assert found["system.limits.unreadable"].severity == Severity.ERROR
    assert report.exit_code() == ExitCode.INCONCLUSIVE


def test_cgroup_limit_far_below_ram_warns(tmp_path: Path) -> None:
    info = dict(BIG_SYSTEM, cgroup_memory_limit_bytes=8 * 1024**3)
    found = by_id(run_system(snapshot_dir(tmp_path, SHM_1G_87, ULIMIT_BASH5, info)))
    assert found["system.cgroup.memory_limit"].severity == Severity.WARN
    assert "8.0 GiB" in found["system.cgroup.memory_limit"].summary
    assert found["system.container"].summary == "Running in docker"


def test_live_system_area_records_and_replays_identically(tmp_path: Path) -> None:
    rec = RecordingSources()
    live = run_checks(rec, [system.AREA], timeout_s=20)
    rec.write(tmp_path / "snap")
    replayed = run_system(tmp_path / "snap")
    assert [(f.id, f.severity, f.summary) for f in live.findings] == [
        (f.id, f.severity, f.summary) for f in replayed.findings
    ]


def test_shm_fixture_parses_to_docker_default() -> None:
    entry = find_mount(parse_df(SHM_64M.read_text()), "/dev/shm")
    assert entry is not None
    assert entry.filesystem == "shm" and entry.size_bytes == 64 * 1024**2 and entry.use_percent == 94


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_system_judge_never_raises_on_garbage(text: str) -> None:
    from ddpdoctor.edge.runner import CommandResult

    res = CommandResult(argv=("df", "-k", "/dev/shm"), returncode=0, stdout=text)
    facts = system.SystemFacts(info={}, ulimit=CommandResult(argv=("bash",), stdout=text), df_shm=res)
    findings = system.check_system(facts)
    assert {f.id for f in findings} & {"system.shm.size", "system.shm.unreadable"}
