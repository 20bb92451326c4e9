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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_gpu = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (/dev/nvidia0 absent)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
