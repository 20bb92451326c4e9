"""torch and multiprocessing areas: the real torch-info subprocess, broken/hanging/crashing torch
packages (real subprocesses importing a fake `torch`), and the pure judges."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.checks import multiprocessing as mp_area
from ddpdoctor.checks import torch as torch_area
from ddpdoctor.checks.multiprocessing import check_start_method
from ddpdoctor.checks.torch import check_torch_info, parse_torch_info
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import ExitCode, Severity
from ddpdoctor.edge import torch_info
from ddpdoctor.edge.sources import LiveSources, RecordingSources, ReplaySources

CUDA_TORCH = {
    "version": "2.4.0+cu121",
    "path": "/opt/venv/lib/python3.11/site-packages/torch",
    "cuda": "12.1",
    "hip": None,
    "cudnn": 90100,
    "nccl": "2.20.5",
    "backends": {"distributed": True, "nccl": True, "gloo": True, "mpi": False, "ucc": False},
    "cuda_available": True,
    "device_count": 8,
}


def info(torch=None, **extra):
    base = {
        "schema": torch_info.SCHEMA,
        "python": {"version": "3.11.7", "executable": "/usr/bin/python3"},
        "platform": "linux",
        "mp_start_method": "fork",
        "mp_start_methods": ["fork", "spawn", "forkserver"],
        "nvidia_device_files": [],
        "nvidiactl": False,
        "torch": torch,
        "errors": {},
    }
    base.update(extra)
    return base


def only(findings, fid: str):
    (f,) = [f for f in findings if f.id == fid]
    return f


def fake_torch(tmp_path: Path, body: str) -> LiveSources:
    """Sources whose torch-info subprocess imports `torch` from tmp_path (a real subprocess)."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    return LiveSources(env={**os.environ, "PYTHONPATH": str(tmp_path)})


# ------------------------------------------------------------------ real subprocesses


@pytest.mark.skipif(
    bool(os.environ.get("DDPDOCTOR_TEST_FAKE_GPU")),
    reason="--fake-gpu answers the probe with another node's output",
)
def test_real_torch_info_on_this_machine() -> None:
    import torch

    report = run_checks(LiveSources(), [torch_area.AREA, mp_area.AREA], timeout_s=120)
    found = {f.id: f for f in report.findings}
    assert found["torch.import"].severity == Severity.OK
    assert torch.__version__ in found["torch.version"].summary
    assert found["torch.version"].data["cuda"] == torch.version.cuda
    backends = found["torch.distributed.backends"]
    assert backends.data["backends"]["gloo"] is True  # real gloo on CPU
    if torch.version.cuda is None:
        assert found["torch.nccl"].severity == Severity.SKIP
        assert "CPU-only" in found["torch.cuda"].summary
    assert found["mp.start_method"].data["start_method"] in ("fork", "spawn", "forkserver")
    assert report.exit_code() != ExitCode.INCONCLUSIVE


def test_missing_library_at_import_is_a_fail_with_the_error(tmp_path: Path) -> None:
    sources = fake_torch(
        tmp_path,
        "print('noise on stdout from a library')\n"
        "raise ImportError('libcudart.so.12: cannot open shared object file: No such file or directory')\n",
    )
    report = run_checks(sources, [torch_area.AREA, mp_area.AREA], timeout_s=60)
    f = only(report.findings, "torch.import")
    assert f.severity == Severity.FAIL
    assert "libcudart.so.12" in f.summary
    assert "pip install torch" in f.fix
    # The start method is still known: it is read before torch is imported.
    assert only(report.findings, "mp.start_method").severity == Severity.INFO
    assert report.exit_code() == ExitCode.FAILED


def test_hanging_torch_import_is_bounded_and_an_error(tmp_path: Path) -> None:
    sources = fake_torch(tmp_path, "import time\ntime.sleep(60)\n")
    start = time.monotonic()
    report = run_checks(sources, [torch_area.AREA, mp_area.AREA], timeout_s=2.0)
    assert time.monotonic() - start < 2.0 + 1.0
    sev = {f.area: f.severity for f in report.findings}
    assert sev == {"torch": Severity.ERROR, "mp": Severity.ERROR}
    assert report.exit_code() == ExitCode.INCONCLUSIVE


def test_segfaulting_torch_import_is_an_error(tmp_path: Path) -> None:
    sources = fake_torch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    report = run_checks(sources, [torch_area.AREA], timeout_s=60)
    f = only(report.findings, "torch.probe")
    assert f.severity == Severity.ERROR and "signal 11" in f.summary


def test_torch_info_runs_once_for_both_areas(tmp_path: Path) -> None:
    class Counting(LiveSources):
        runs = 0

        def run(self, cmd):
            if cmd.id == "torch-info":
                Counting.runs += 1
            return super().run(cmd)

    base = fake_torch(tmp_path, "raise ImportError('nope')\n")
    sources = Counting(env=base.env)
    run_checks(sources, [torch_area.AREA, mp_area.AREA], timeout_s=60)
    assert Counting.runs == 1


def test_snapshot_replays_to_the_same_findings(tmp_path: Path) -> None:
    rec = RecordingSources()
    live = run_checks(rec, [torch_area.AREA, mp_area.AREA], timeout_s=120)
    rec.write(tmp_path)
    assert json.loads((tmp_path / "torch-info.txt").read_text())["schema"] == torch_info.SCHEMA
    replayed = run_checks(ReplaySources(tmp_path), [torch_area.AREA, mp_area.AREA], timeout_s=10)
    assert [(f.id, f.severity, f.summary) for f in live.findings] == [
        (f.id, f.severity, f.summary) for f in replayed.findings
    ]


def test_snapshot_without_torch_info_is_a_skip(tmp_path: Path) -> None:
    report = run_checks(ReplaySources(tmp_path), [torch_area.AREA], timeout_s=10)
    f = only(report.findings, "torch.probe")
    assert f.severity == Severity.SKIP and "torch-info.txt not in snapshot" in f.summary


# ------------------------------------------------------------------ pure judges


def test_cuda_build_on_gpu_node_that_cannot_use_cuda_fails_with_driver_warning() -> None:
    torch = dict(CUDA_TORCH, cuda_available=False, device_count=0)
    msg = "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)."
    findings = check_torch_info(
        info(
            torch,
            nvidia_device_files=["/dev/nvidia0"],
            nvidiactl=True,
            errors={"cuda_available.warning": msg},
        )
    )
    f = only(findings, "torch.cuda")
    assert f.severity == Severity.FAIL and "driver on your system is too old" in f.summary
    assert "nvidia-smi" in f.fix


def test_cpu_wheel_on_gpu_node_fails() -> None:
    torch = dict(CUDA_TORCH, cuda=None, cudnn=None, nccl=None, cuda_available=False, device_count=0)
    torch["backends"] = dict(torch["backends"], nccl=False)
    f = only(check_torch_info(info(torch, nvidia_device_files=["/dev/nvidia0"])), "torch.cuda")
    assert f.severity == Severity.FAIL and "CPU-only build" in f.summary


def test_healthy_cuda_torch() -> None:
    findings = check_torch_info(info(CUDA_TORCH, nvidia_device_files=["/dev/nvidia0"]))
    assert only(findings, "torch.cuda").severity == Severity.OK
    assert only(findings, "torch.nccl").summary == "NCCL 2.20.5"
    assert "cuDNN 90100" in only(findings, "torch.version").summary
    assert only(findings, "torch.distributed.backends").severity == Severity.OK


def test_cuda_build_without_nccl_backend_fails() -> None:
    torch = dict(CUDA_TORCH, backends={"distributed": True, "nccl": False, "gloo": True})
    assert only(check_torch_info(info(torch)), "torch.distributed.backends").severity == Severity.FAIL


def test_no_torch_distributed_fails() -> None:
    torch = dict(CUDA_TORCH, backends={"distributed": False})
    err = {"distributed": "ValueError: The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL."}
    f = only(check_torch_info(info(torch, errors=err)), "torch.distributed.backends")
    assert f.severity == Severity.FAIL and "TORCH_DISTRIBUTED_DEBUG" in f.summary


def test_unreadable_nccl_version_on_cuda_build_warns() -> None:
    torch = dict(CUDA_TORCH, nccl=None)
    f = only(check_torch_info(info(torch, errors={"nccl": "AttributeError: _nccl_version"})), "torch.nccl")
    assert f.severity == Severity.WARN


@pytest.mark.parametrize(
    "raw, text", [((2, 21, 5), "2.21.5"), (2708, "2.7.8"), (21905, "2.19.5"), (None, None)]
)
def test_nccl_version_formats(raw, text) -> None:
    assert torch_info._nccl_version_text(raw) == text


def test_mp_fork_with_cuda_is_info_with_the_fix() -> None:
    findings = check_start_method(info(CUDA_TORCH))
    f = only(findings, "mp.fork_cuda")
    assert f.severity == Severity.INFO and "spawn" in f.summary and "set_start_method('spawn'" in f.fix
    assert only(check_start_method(info(None)), "mp.fork_cuda").severity == Severity.SKIP
    assert (
        only(check_start_method(info(None, mp_start_method="spawn")), "mp.fork_cuda").severity == Severity.OK
    )
    assert only(check_start_method(info(None, mp_start_method=None)), "mp.unknown").severity == Severity.ERROR


def test_parse_tolerates_a_stray_line_before_the_json() -> None:
    assert parse_torch_info('warning: something\n{"schema": "x"}\n') == {"schema": "x"}
    assert parse_torch_info("[1, 2]") is None
    assert parse_torch_info("") is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
KEYS = [
    "python",
    "platform",
    "mp_start_method",
    "mp_start_methods",
    "nvidia_device_files",
    "nvidiactl",
    "torch",
    "errors",
    "import_error",
]
TORCH_KEYS = ["version", "path", "cuda", "hip", "cudnn", "nccl", "backends", "cuda_available", "device_count"]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(KEYS), JSON),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(TORCH_KEYS), JSON)),
)
def test_judges_never_raise_on_odd_json(top: dict, torch) -> None:
    data = dict(top)
    if torch is not None:
        data["torch"] = torch
    for f in check_torch_info(data) + check_start_method(data):
        assert f.id.startswith(("torch.", "mp.")) and f.summary


@given(st.text())
def test_parse_any_text(text: str) -> None:
    result = parse_torch_info(text)
    assert result is None or isinstance(result, dict)


def test_torch_info_keeps_the_numpy_warning_out_of_its_output(tmp_path) -> None:
    # Without numpy, torch warns "Failed to initialize NumPy" at import: noise that used to land in the
    # torch area's evidence, cluster output and torchrun logs. A sitecustomize hides numpy from the child.
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['numpy'] = None\n")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)])}
    hidden = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert "Failed to initialize NumPy" in hidden.stderr  # the premise: torch does warn here
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor.edge.torch_info"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["torch"]["version"]
    assert "NumPy" not in proc.stderr, proc.stderr
