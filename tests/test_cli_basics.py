from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from ddpdoctor.cli import app

NO_TORCH = (
    "import sys\n"
    "from ddpdoctor.cli import main\n"
    "sys.argv = ['ddpdoctor', ARG]\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
    "print('TORCH_LOADED' if bad else 'NO_TORCH')\n"
)


def _run_no_torch(arg: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH.replace("ARG", repr(arg))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


def test_help_does_not_import_torch() -> None:
    out = _run_no_torch("--help")
    assert "Exit codes" in out
    assert out.strip().endswith("NO_TORCH")


def test_version_does_not_import_torch() -> None:
    out = _run_no_torch("--version")
    assert "ddpdoctor" in out and out.strip().endswith("NO_TORCH")


def test_python_dash_m_works() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("ddpdoctor ")


def test_unknown_area_is_usage_error() -> None:
    res = CliRunner().invoke(app, ["check", "--only", "nonexistent-area"])
    assert res.exit_code == 2


def test_unknown_option_is_usage_error() -> None:
    res = CliRunner().invoke(app, ["check", "--no-such-flag"])
    assert res.exit_code == 2


def test_parse_unknown_tool_is_usage_error() -> None:
    res = CliRunner().invoke(app, ["parse", "no-such-tool", "-"], input="")
    assert res.exit_code == 2


def test_parse_ulimit_from_stdin(fixtures_dir) -> None:
    text = (fixtures_dir / "system" / "ulimit-a__bash4-memlock-64k-openfiles-1024-default.txt").read_text()
    res = CliRunner().invoke(app, ["parse", "ulimit", "-"], input=text)
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["limits"]["l"]["value"] == 64 and data["limits"]["n"]["value"] == 1024
