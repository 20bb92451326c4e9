"""Hostile text reaching the terminal (#26): control sequences planted in log lines, file names, Flight
Recorder frame names, quoted source lines, snapshot and environment values must never reach stdout or
stderr raw, in any format; the text stays visible as escapes (`\\x1b`). The one function is
`edge.redact.neutralize_controls` (`clean_text` = redaction + it). Each command runs as a real process
and its raw bytes are inspected. The attack's shapes are those of the independent pass in #26.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.edge.redact import clean_text, has_controls, neutralize_controls, redact_text
from ddpdoctor.hang.fr import load_plain_pickle

ROOT = Path(__file__).resolve().parent.parent
FR = Path(__file__).parent / "fixtures" / "flight_recorder"

# Each attack class: OSC title / clipboard 52 / hyperlink 8, CSI, DCS, C1 CSI, BEL, backspace, CR, DEL.
PAYLOADS = {
    "osc-title": "\x1b]0;PWNTITLE\x07",
    "osc52": "\x1b]52;c;ZWNobyBQV05FRA==\x07",
    "osc8": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "csi": "\x1b[2J\x1b[H",
    "dcs": "\x1bP+q544e\x1b\\",
    "c1-csi": "\u009b2J",
    "bel": "\x07\x07",
    "backspace": "abc\x08\x08\x08xyz",
    "cr": "\rOK: nothing wrong here",
    "del-bidi": "\x7f\u202eevil",
}
ALL = "".join(PAYLOADS.values())
# A raw control in the output: C0 but tab/newline, DEL, C1 (as UTF-8: C2 80..C2 9F).
RAW_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")
NCCL_LINE = (
    "[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
    "NCCLUtils.cpp:93, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9"
)
DUP_LINE = "[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60"


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: bytes | None = None):
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "HOME": str(cwd), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], cwd=cwd, env=full, capture_output=True, input=stdin,
        timeout=120,
    )  # fmt: skip


def assert_no_raw_control(proc: subprocess.CompletedProcess, *visible: str) -> None:
    both = proc.stdout + b"\n" + proc.stderr
    m = RAW_CONTROL.search(both)
    assert m is None, both[max(0, m.start() - 100) : m.start() + 60]
    text = both.decode("utf-8", "replace")
    assert "Traceback" not in text, text[-2000:]
    for word in visible:
        assert word in text, text[-3000:]


# --- the function -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_neutralize_every_class(name):
    out = neutralize_controls(f"before {PAYLOADS[name]} after\tend\n")
    assert not has_controls(out) and RAW_CONTROL.search(out.encode()) is None
    assert out.startswith("before ") and out.endswith(" after\tend\n")  # tab and newline kept
    assert "\\x" in out or "\\u" in out  # shown, not dropped


def test_neutralize_shows_what_was_there():
    assert neutralize_controls("\x1b]0;T\x07") == "\\x1b]0;T\\x07"
    assert neutralize_controls("\u009b2J") == "\\x9b2J"
    assert neutralize_controls("a\r\nb\rc") == "a\nb\\x0dc"  # a CRLF line end is no trick; a lone CR is
    assert neutralize_controls("plain ünïcode ✓ 中文\ttab\n") == "plain ünïcode ✓ 中文\ttab\n"
    assert neutralize_controls(neutralize_controls(ALL)) == neutralize_controls(ALL)


def test_clean_text_redacts_then_neutralizes():
    out = clean_text("HF_TOKEN=hf_" + "Q" * 30 + " \x1b]0;x\x07", {})
    assert "QQQQ" not in out and "\\x1b]0;x\\x07" in out


# --- every command and format -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def evil_log(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("explain")
    log = d / "rank0\x1b]0;NAMEPWN\x07.log"
    log.write_text(f"{NCCL_LINE} {ALL} tail\n{DUP_LINE}{ALL}\n")
    return log


@pytest.mark.parametrize("fmt", ["table", "markdown", "github", "junit", "json"])
def test_explain_every_format(evil_log, fmt):
    proc = run_cli("explain", str(evil_log), "--all", "--format", fmt, cwd=evil_log.parent)
    assert proc.returncode == 1, proc.stderr
    # github annotations carry no evidence lines: the file name is what they quote.
    assert_no_raw_control(proc, "Duplicate GPU", "NAMEPWN" if fmt == "github" else "PWNTITLE")
    if fmt not in ("json", "github"):  # JSON escapes them its own way (\u001b), still never raw
        assert "\\x1b]0;PWNTITLE" in proc.stdout.decode()


def test_explain_stdin_and_file_name(evil_log):
    proc = run_cli("explain", "-", cwd=evil_log.parent, stdin=f"{NCCL_LINE}\x1b]0;STDINPWN\x07\n".encode())
    assert_no_raw_control(proc, "STDINPWN")
    proc = run_cli("explain", str(evil_log), cwd=evil_log.parent)
    assert_no_raw_control(proc, "NAMEPWN")


def hostile_frames(tmp_path: Path, filename: str) -> Path:
    """The real `mismatch` dumps (torch 2.13) with every frame of the user's script renamed."""
    out = tmp_path / "fr"
    out.mkdir()
    for src in sorted((FR / "mismatch").iterdir()):
        if src.name.endswith(".json"):
            continue
        raw = load_plain_pickle(src.read_bytes())
        for entry in raw["entries"]:
            for frame in entry.get("frames", []):
                if not frame["filename"].startswith("/usr") and "site-packages" not in frame["filename"]:
                    frame["filename"] = filename
        (out / src.name).write_bytes(pickle.dumps(raw))
    return out


@pytest.mark.parametrize("fmt", ["table", "markdown", "github"])
def test_flight_recorder_frame_names(tmp_path, fmt):
    dumps = hostile_frames(tmp_path, "/home/u/\x1b[2J\x1b]0;FRAMEPWN\x07job.py")
    proc = run_cli("explain", "--format", fmt, str(dumps), cwd=tmp_path)
    assert_no_raw_control(proc, "FRAMEPWN")


def test_hang_frame_names(tmp_path):
    dumps = hostile_frames(tmp_path, "/home/u/\u009b2J\x1b]0;FRAMEPWN\x07job.py")
    proc = run_cli("hang", "--fr", str(dumps), "--no-ras", "--no-stacks", cwd=tmp_path)
    assert_no_raw_control(proc, "FRAMEPWN")


def test_quoted_source_line(tmp_path):
    """A frame pointing at a real file whose line holds escapes: the quoted line is shown, neutralised."""
    job = tmp_path / "job.py"
    job.write_text("\n" * 200 + "x = 1  # \x1b]0;SRCPWN\x07 \x1b[2J\n" * 1000)
    dumps = hostile_frames(tmp_path, str(job))
    proc = run_cli("explain", "--all", str(dumps), cwd=tmp_path)
    assert_no_raw_control(proc)


@pytest.mark.parametrize("fmt", ["text", "github", "json"])
def test_lint_file_names(tmp_path, fmt):
    # A multi-node program (Slurm's node id) choosing its GPU by the global rank: a default-tier finding that
    # names the file.
    (tmp_path / "t\x1b]0;FNPWN\x07.py").write_text("import os, torch\nrank = int(os.environ['RANK'])\n"
                                                   "node = int(os.environ['SLURM_NODEID'])\n"
                                                   "torch.cuda.set_device(rank)\n")  # fmt: skip
    (tmp_path / "u\u009b2J.py").write_text("import torch\n")
    proc = run_cli("lint", str(tmp_path), "--format", fmt, cwd=tmp_path)
    assert_no_raw_control(proc, "FNPWN")


def test_lint_unknown_rule_names_no_secret(tmp_path):
    secret = "hf_" + "Z" * 30
    (tmp_path / "pyproject.toml").write_text(f'[tool.ddpdoctor.lint]\nignore = ["{secret}\x1b]0;R\x07"]\n')
    (tmp_path / "a.py").write_text("x = 1\n")
    proc = run_cli("lint", ".", cwd=tmp_path)
    assert secret.encode() not in proc.stdout + proc.stderr
    assert_no_raw_control(proc)


def test_plan_error_names_env_path(tmp_path):
    proc = run_cli("plan", "--config", "no/such", "--gpus", "8", "--gpu-mem", "80GiB", cwd=tmp_path,
                   env={"HF_HUB_CACHE": "/tmp/\x1b]0;HUBPWN\x07"})  # fmt: skip
    assert proc.returncode == 2
    assert_no_raw_control(proc, "HUBPWN")


def test_unknown_area_and_parse_tool(tmp_path):
    proc = run_cli("check", "--only", "gpu,\x1b]0;X\x07", cwd=tmp_path)
    assert proc.returncode == 2
    assert_no_raw_control(proc, "unknown area")
    proc = run_cli("parse", "nvidia\x1b]0;T\x07", "-", cwd=tmp_path, stdin=b"x")
    assert proc.returncode == 2
    assert_no_raw_control(proc, "unknown tool")


HOSTILE_ENV = {
    "CUDA_VISIBLE_DEVICES": "0,\x1b]0;CVD\x07,1",
    "MASTER_ADDR": "host\x1b]0;MADDR\x07",
    "MASTER_PORT": "29500",
    "SLURM_JOB_ID": "1\x1b]0;SLURM\x07",
    "SLURM_JOB_NODELIST": "n\x1b[2J[1-2]",
    "SLURM_NNODES": "2",
    "NCCL_DEBUG": "INFO\x1b]0;ND\x07",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL\u009b2J",
}


@pytest.mark.parametrize("fmt", ["table", "markdown", "github", "junit", "json"])
def test_check_environment_values(tmp_path, fmt):
    proc = run_cli("check", "--only", "launch,nccl_env", "-v", "--format", fmt, cwd=tmp_path, env=HOSTILE_ENV)
    assert proc.returncode in (0, 1), proc.stderr
    assert_no_raw_control(proc, "CUDA_VISIBLE_DEVICES")


def test_check_prolog_line(tmp_path):
    proc = run_cli("check", "--only", "launch", "--prolog", cwd=tmp_path, env=HOSTILE_ENV)
    assert_no_raw_control(proc)


def test_rich_styles_still_work(tmp_path, evil_log):
    """Neutralising the text must leave rich's own styling alone: a forced terminal still gets colours."""
    proc = run_cli("explain", str(evil_log), cwd=tmp_path, env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    out = proc.stdout
    assert b"\x1b[" in out  # rich's styles (SGR) are there
    for m in re.finditer(rb"\x1b", out):  # and every ESC in the output is one of them
        assert re.match(rb"\x1b\[[0-9;]*m", out[m.start() :]), out[m.start() - 40 : m.start() + 40]
    assert b"PWNTITLE" in out


# --- secrets: the shapes of the attack (the corpus is in test_hostile_round2.py) -----------------------


def test_parse_output_is_redacted(tmp_path):
    token = "hf_" + "Q" * 30
    proc = run_cli("parse", "nvidia-smi-csv", "/proc/self/environ", cwd=tmp_path, env={"HF_TOKEN": token})
    assert token.encode() not in proc.stdout + proc.stderr
    text = f"HF_TOKEN={token}\x00PATH=/bin\x00"
    assert token not in redact_text(text, {})
