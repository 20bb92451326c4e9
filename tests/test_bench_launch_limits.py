"""bench-nccl when the machine cannot start the ranks asked for (found in the QA pass).

`bench-nccl --backend gloo --nproc 100000` used to die with an `OSError: Too many open files`
traceback out of the launcher (one pipe per rank), leaving its temporary directory behind. Running
out of a resource before any rank ran is "the ranks could not be started": exit 3 with the cause in
words, nothing left behind. (So many gloo ranks are now refused before launch, above 4 per CPU:
tests/test_bench_cli_edges.py; here a lowered open-files limit makes an allowed rank count too many.)
"""

from __future__ import annotations

import glob
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lower_open_files(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="8 gloo ranks are refused on one CPU")
def test_too_many_ranks_for_the_open_files_limit_is_inconclusive_not_a_traceback(tmp_path: Path) -> None:
    # A real launch under a real (lowered) RLIMIT_NOFILE: 8 ranks (at most 4 per CPU: not refused)
    # need 16 pipe ends beside stdin/stdout/stderr, 12 are allowed.
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor"]
        + "bench-nccl --backend gloo --nproc 8 --ops all_reduce --max-bytes 8 --iters 1 --warmup 0".split(),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        preexec_fn=_lower_open_files(12),
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode == 3, out
    assert "could not be started" in out and "Too many open files" in out, out
    assert "ulimit -n" in out and "--nproc" in out, out
    # The launcher's work directory went with it.
    assert glob.glob(os.path.join(tmp_path, "ddpdoctor-bench-*")) == []


def test_work_directory_that_cannot_be_made_is_a_start_failure_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under a limit that the pipes just fit, tempfile.mkdtemp found no descriptor left and said
    # "No usable temporary directory": that used to escape as a traceback (found with ulimit -n 20).
    import tempfile

    import ddpdoctor.bench.launcher as launcher
    from ddpdoctor.bench.plan import BenchPlan

    def no_tempdir(*args: object, **kwargs: object) -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "mkdtemp", no_tempdir)
    before = len(os.listdir("/proc/self/fd"))
    result = launcher.launch_local(
        BenchPlan(ops=("all_reduce",), sizes=(8,), iters=1, warmup=0),
        nproc=2,
        backend="gloo",
        step_timeout_s=30,
    )
    assert not result.ok and result.root_cause is not None and result.root_cause.op == "start"
    assert "No usable temporary directory" in result.root_cause.message
    assert "ulimit -n" in result.root_cause.message
    assert len(os.listdir("/proc/self/fd")) == before  # the pipes were closed
