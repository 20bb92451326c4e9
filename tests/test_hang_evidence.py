"""Stale, foreign and partial Flight Recorder dumps never decide `ddpdoctor hang`'s verdict.

One real gloo job under a real torchrun agent hangs in the `mismatch` scenario of tests/_hang_job.py
(rank 1 broadcasts where ranks 0 and 2 all_reduce). Its TORCH_FR_DUMP_TEMP_FILE points at a folder
holding the real dumps of another script (tests/fixtures/flight_recorder/sleep: /home/user/train/
_hang_job.py, where rank 2 is behind): those once produced a confident verdict blaming rank 2.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from _hang_harness import HungJob, marker_line

from ddpdoctor.hang.fr import load_plain_pickle

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "docs" / "schemas" / "hang.schema.json").read_text())
FOREIGN = REPO / "tests" / "fixtures" / "flight_recorder" / "sleep"
JOB_FILE = REPO / "tests" / "_hang_job.py"


def run_hang(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "hang", "--json", "--no-ras", *args],
        capture_output=True, timeout=120, cwd=REPO, env=dict(os.environ, COLUMNS="200"),
    )
    report = json.loads(out.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["exit_code"] == out.returncode
    return report


def hang_on(job, *args: str) -> dict:
    """run_hang on a running job's pid; the test is skipped where py-spy cannot attach (a stack without frames)."""
    report = run_hang("--pid", str(job.proc.pid), *args)
    if not all(s["frames"] for s in report["stacks"]):
        pytest.skip("py-spy cannot attach here")
    return report


def _copy_foreign(folder: Path, age_s: float = 0.0) -> Path:
    """The other script's dumps as fr_<rank>, aged by age_s seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(3):
        target = folder / f"fr_{rank}"
        shutil.copyfile(FOREIGN / f"rank_{rank}", target)
        if age_s:
            old = time.time() - age_s
            os.utime(target, (old, old))
    return folder / "fr_"


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mismatch")
    stale = _copy_foreign(tmp / "stale", age_s=86400)  # yesterday's dumps, before the job started
    job = HungJob("mismatch", tmp, TORCH_FR_DUMP_TEMP_FILE=str(stale))
    try:
        job.wait_for_dumps()
        yield job, tmp
    finally:
        job.kill()
        assert job.alive() == []


def _readable(report: dict) -> bool:
    return bool(report["stacks"]) and all(s["frames"] for s in report["stacks"])


def _assert_live_culprit(report: dict) -> None:
    verdict = report["verdict"]
    assert verdict["source"] != "flight_recorder", verdict
    assert verdict["culprit_ranks"] == [1], verdict
    assert verdict["culprits"][0]["line"] == marker_line("mismatch")
    assert "/home/user/train" not in verdict["summary"]


def test_stale_dumps_in_the_jobs_folder_are_named_not_trusted(hung):
    job, _ = hung
    report = run_hang("--pid", str(job.proc.pid))
    if not _readable(report):
        pytest.skip("py-spy cannot attach here")
    fr = report["flight_recorder"]
    assert len(fr["ignored"]) == 3 and all("before the live ranks started" in i["why"] for i in fr["ignored"]), fr
    assert fr["ranks"] == []
    finding = next(f for f in report["findings"] if f["id"] == "hang.flight_recorder")
    assert finding["severity"] == "warn" and "no dump of the live job" in finding["summary"]
    _assert_live_culprit(report)


def test_fresh_dumps_of_another_script_are_named_not_trusted(hung, tmp_path):
    # --fr at another job's dumps, written just now: their frames are in a file no live rank runs.
    job, _ = hung
    report = run_hang("--pid", str(job.proc.pid), "--fr", str(_copy_foreign(tmp_path / "other")))
    if not _readable(report):
        pytest.skip("py-spy cannot attach here")
    ignored = report["flight_recorder"]["ignored"]
    assert len(ignored) == 3 and all("which no live rank runs" in i["why"] for i in ignored), ignored
    assert "/home/user/train/_hang_job.py" in ignored[0]["why"]
    _assert_live_culprit(report)


def test_partial_dumps_are_skipped_and_ranks_without_dump_named(hung, tmp_path):
    job, _ = hung
    folder = tmp_path / "own"
    folder.mkdir()
    for rank in (0, 1):
        shutil.copyfile(f"{job.prefix}{rank}", folder / f"fr_rank_{rank}")
    # Rank 2's dump is still being written: half of it under the name the writer renames later.
    data = Path(f"{job.prefix}2").read_bytes()
    (folder / "fr_rank_2.tmp").write_bytes(data[: len(data) // 2])
    report = run_hang("--pid", str(job.proc.pid), "--fr", str(folder))
    fr = report["flight_recorder"]
    assert fr["skipped_partial"] == [str(folder / "fr_rank_2.tmp")]
    assert fr["ranks"] == [0, 1] and fr["ranks_without_dump"] == [2] and fr["errors"] == []
    finding = next(f for f in report["findings"] if f["id"] == "hang.flight_recorder")
    assert "all ranks agree" not in finding["summary"] and "rank 2" in finding["summary"], finding
    assert "partial" in finding["summary"]


def test_dumps_that_contradict_the_live_stacks_do_not_decide(hung, tmp_path):
    # The other script's dumps with their file names rewritten to the live script's (derived from the
    # real fixture, only the path changed): they are kept, blame rank 2 (behind), while live rank 2
    # waits in all_reduce exactly where rank 0 does. The live stacks decide, and the report says so.
    job, _ = hung
    folder = tmp_path / "same-file"
    folder.mkdir()
    for rank in range(3):
        raw = load_plain_pickle((FOREIGN / f"rank_{rank}").read_bytes())
        for entry in raw["entries"]:
            for frame in entry.get("frames") or []:
                if frame.get("filename", "").endswith("_hang_job.py"):
                    frame["filename"] = str(JOB_FILE)
        (folder / f"fr_{rank}").write_bytes(pickle.dumps(raw))
    report = run_hang("--pid", str(job.proc.pid), "--fr", str(folder / "fr_"))
    if not _readable(report):
        pytest.skip("py-spy cannot attach here")
    assert report["flight_recorder"]["ranks"] == [0, 1, 2] and report["flight_recorder"]["ignored"] == []
    _assert_live_culprit(report)
    assert "disagree with the live stacks" in report["verdict"]["summary"]


def test_json_only_dumps_take_file_and_line_from_the_live_stacks(hung, tmp_path):
    # The JSON form of a dump has no Python frames: the verdict still quotes the line, from the stacks.
    job, _ = hung
    folder = tmp_path / "json"
    folder.mkdir()
    for rank in range(3):
        shutil.copyfile(f"{job.prefix}{rank}.json", folder / f"fr_rank_{rank}.json")
    report = run_hang("--pid", str(job.proc.pid), "--fr", str(folder))
    if not _readable(report):
        pytest.skip("py-spy cannot attach here")
    verdict = report["verdict"]
    assert verdict["source"] == "flight_recorder" and verdict["culprit_ranks"] == [1], verdict
    assert f"_hang_job.py:{marker_line('mismatch')}" in verdict["summary"], verdict["summary"]
    others_line = marker_line("mismatch") + 2  # the all_reduce of the else branch
    assert f"_hang_job.py:{others_line}" in verdict["summary"], verdict["summary"]
