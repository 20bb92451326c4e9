from __future__ import annotations

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(autouse=True)
def _stable_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pin the width so rendered tables are the same everywhere.
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("NO_COLOR", "1")
    from ddpdoctor.render import reset_consoles

    reset_consoles()


FAKE_GPU_NODE = FIXTURES / "gpu" / "real-h100"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fake-gpu",
        action="store_true",
        help="Run the suite as if this machine had the real H100 node of tests/fixtures/gpu/real-h100 "
        "(faked at the I/O edge only: tests/fake_gpu/sitecustomize.py), to find tests that assume no GPU.",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background (`make test &`, a CI step under a non-interactive shell) inherits
    # SIGINT ignored, and every child would keep ignoring it, as ddpdoctor rightly does: the tests that
    # press Ctrl-C on a child would then wait on a command that never hears it. A handled signal is reset
    # to its default across exec, so the children see SIGINT as a user's terminal would deliver it.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not config.getoption("--fake-gpu"):
        return
    import importlib.util

    fake_dir = Path(__file__).parent / "fake_gpu"
    os.environ["DDPDOCTOR_TEST_FAKE_GPU"] = str(FAKE_GPU_NODE)
    # Subprocesses (python -m ddpdoctor ...) load the same fakes through sitecustomize.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(fake_dir), os.environ.get("PYTHONPATH")) if p)
    spec = importlib.util.spec_from_file_location("ddpdoctor_fake_gpu", fake_dir / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # installs the fakes in this process (the env var is set)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_gpu = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (/dev/nvidia0 absent)")
    # A test that checks what ddpdoctor says on a machine without GPUs must not run where the machine (or
    # the --fake-gpu edge) has one: it would be testing the wrong machine.
    looks_like_gpu = has_gpu or config.getoption("--fake-gpu")
    skip_nogpu = pytest.mark.skip(
        reason="judges a machine without NVIDIA GPUs; this one has one (or --fake-gpu)"
    )
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "nogpu" in item.keywords and looks_like_gpu:
            item.add_marker(skip_nogpu)
