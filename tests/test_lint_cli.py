"""`ddpdoctor lint` through typer's CliRunner: exit codes, selection, noqa, syntax errors, formats."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.lint import Diagnostic, discover_files
from ddpdoctor.render.lint import format_github_line

FIXTURES = Path(__file__).parent / "fixtures" / "lint"
CLEAN = FIXTURES / "torchrun_clean.py"
BUGGY = FIXTURES / "legacy_launch_local_rank.py"
TEXT_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>DDP\d{3}) (?P<msg>.+)$")

BAD_SNIPPET = """\
import torch.distributed as dist

dist.init_process_group("gloo")
"""
# DDP009 and DDP010 are opinionated (issue #16): the mechanics tests below select them explicitly.
OPINIONS = ("--extend-select", "DDP009,DDP010")
# A likely bug, reported by the default tier.
DEFAULT_BAD = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.save({}, "ckpt.pt")
"""


def run(*args: str):
    return CliRunner().invoke(app, ["lint", *args])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def codes_in(output: str) -> list[tuple[str, int, str]]:
    out = []
    for line in output.splitlines():
        m = TEXT_LINE.match(line)
        if m:
            out.append((Path(m["path"]).name, int(m["line"]), m["code"]))
    return out


def test_clean_file_exits_0() -> None:
    res = run(str(CLEAN))
    assert res.exit_code == 0, res.output
    assert "All checks passed (1 file checked)." in res.output
    assert codes_in(res.output) == []


def test_findings_exit_1_with_location_and_fix_hint() -> None:
    res = run(str(BUGGY))
    assert res.exit_code == 1
    found = codes_in(res.output)
    assert ("legacy_launch_local_rank.py", 20, "DDP013") in found
    assert ("legacy_launch_local_rank.py", 40, "DDP006") in found
    lines = res.output.splitlines()
    for i, line in enumerate(lines):
        if TEXT_LINE.match(line):
            assert lines[i + 1].startswith("    fix: "), line
    assert lines[-1].startswith("Found ") and "in 1 of 1 file" in lines[-1]


@pytest.mark.parametrize(
    "args",
    [
        ["--select", "DDP999"],
        ["--ignore", "XYZ"],
        ["--format", "sarif"],
        ["--json", "--format", "github"],
        ["--no-such-flag"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    res = run(str(BUGGY), *args)
    assert res.exit_code == 2, res.output


def test_missing_path_and_no_path_exit_2(tmp_path: Path) -> None:
    assert run(str(tmp_path / "nope.py")).exit_code == 2
    assert CliRunner().invoke(app, ["lint"]).exit_code == 2


def test_select_and_ignore(tmp_path: Path) -> None:
    f = write(tmp_path / "t.py", BAD_SNIPPET)
    # The default tier reports likely bugs only: a missing timeout and destroy are opinions.
    default = run(str(f))
    assert default.exit_code == 0 and codes_in(default.output) == []
    assert {c for _, _, c in codes_in(run(str(f), *OPINIONS).output)} == {"DDP009", "DDP010"}
    assert {c for _, _, c in codes_in(run(str(f), "--extend-select", "DDP009").output)} == {"DDP009"}
    only = run(str(f), "--select", "DDP009")
    assert only.exit_code == 1 and {c for _, _, c in codes_in(only.output)} == {"DDP009"}
    # Comma lists, repeated options and prefixes, like ruff.
    both = run(str(f), "--select", "DDP009,DDP001", "--select", "DDP01")
    assert {c for _, _, c in codes_in(both.output)} == {"DDP009", "DDP010"}
    ignored = run(str(f), *OPINIONS, "--ignore", "DDP009", "--ignore", "DDP010")
    assert ignored.exit_code == 0 and codes_in(ignored.output) == []
    prefix = run(str(f), "--select", "DDP00")
    assert {c for _, _, c in codes_in(prefix.output)} == {"DDP009"}
    assert run(str(f), "--select", "ALL", "--ignore", "DDP0").exit_code == 0


def test_noqa_bare_and_specific(tmp_path: Path) -> None:
    bare = write(tmp_path / "bare.py", BAD_SNIPPET.replace('("gloo")', '("gloo")  # noqa'))
    assert run(str(bare), *OPINIONS).exit_code == 0
    specific = write(tmp_path / "specific.py", BAD_SNIPPET.replace('("gloo")', '("gloo")  # noqa: DDP009'))
    res = run(str(specific), *OPINIONS)
    assert {c for _, _, c in codes_in(res.output)} == {"DDP010"}
    listed = write(tmp_path / "listed.py", BAD_SNIPPET.replace('("gloo")', '("gloo")  # NOQA:DDP009, DDP010'))
    assert run(str(listed), *OPINIONS).exit_code == 0
    other = write(tmp_path / "other.py", BAD_SNIPPET.replace('("gloo")', '("gloo")  # noqa: DDP001'))
    assert {c for _, _, c in codes_in(run(str(other), *OPINIONS).output)} == {"DDP009", "DDP010"}


def test_noqa_on_last_line_of_multiline_call(tmp_path: Path) -> None:
    f = write(
        tmp_path / "multi.py",
        """\
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
        )  # noqa: DDP009
        dist.destroy_process_group()
        """,
    )
    assert run(str(f)).exit_code == 0


def test_syntax_error_reported_and_other_files_still_linted(tmp_path: Path) -> None:
    write(tmp_path / "a_broken.py", "import torch\ndef f(:\n    pass\n")
    write(tmp_path / "b_buggy.py", BAD_SNIPPET)
    write(tmp_path / "c_clean.py", "x = 1\n")
    res = run(str(tmp_path), "--select", "DDP009")
    assert res.exit_code == 1
    found = codes_in(res.output)
    assert ("a_broken.py", 2, "DDP000") in found
    assert ("b_buggy.py", 3, "DDP009") in found
    broken = next(line for line in res.output.splitlines() if "a_broken.py" in line)
    assert "syntax error" in broken and re.search(r"a_broken\.py:2:\d+: DDP000", broken)
    assert "in 2 of 3 files" in res.output


def test_undecodable_and_null_byte_files_do_not_crash(tmp_path: Path) -> None:
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    (tmp_path / "latin.py").write_bytes(b"s = '\xff\xfe'\n")
    res = run(str(tmp_path), "--json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert {d["code"] for d in data["diagnostics"]} == {"DDP000"}
    assert data["files_checked"] == 2


def test_json_output(tmp_path: Path) -> None:
    f = write(tmp_path / "t.py", BAD_SNIPPET)
    for args in (["--json"], ["--format", "json"], ["--json", "--format", "json"]):
        res = run(str(f), *OPINIONS, *args)
        assert res.exit_code == 1
        data = json.loads(res.stdout)
        assert data["schema"] == "ddpdoctor.lint/1"
        assert data["exit_code"] == 1 and data["files_checked"] == 1
        assert data["counts"] == {"DDP009": 1, "DDP010": 1}
        first = data["diagnostics"][0]
        assert set(first) == {"path", "line", "col", "code", "name", "message", "fix"}
        assert (first["line"], first["col"], first["code"]) == (3, 1, "DDP009")
    clean = json.loads(run(str(CLEAN), "--json").stdout)
    assert clean["exit_code"] == 0 and clean["diagnostics"] == []


def test_github_format(tmp_path: Path) -> None:
    f = write(tmp_path / "t.py", BAD_SNIPPET)
    res = run(str(f), *OPINIONS, "--format", "github")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert len(lines) == 2
    pattern = re.compile(r"^::error file=(?P<file>[^,]+),line=3,col=1,title=(?P<code>DDP\d{3})::(?P<msg>.+)$")
    matches = [pattern.match(line) for line in lines]
    assert all(matches), lines
    assert {m["code"] for m in matches if m} == {"DDP009", "DDP010"}
    assert all("%0Afix: " in line for line in lines)


def test_github_escaping() -> None:
    d = Diagnostic("dir,x/a:b.py", 3, 1, "DDP009", "50% of it\nsecond", "do this")
    line = format_github_line(d)
    assert line.startswith("::error file=dir%2Cx/a%3Ab.py,line=3,col=1,title=DDP009::")
    assert line.endswith("::50%25 of it%0Asecond%0Afix: do this")


def test_output_never_contains_source_text(tmp_path: Path) -> None:
    secret = "hf_SECRETTOKEN1234567890"
    f = write(
        tmp_path / "leaky.py",
        f"""\
        import os
        import torch
        import torch.distributed as dist
        os.environ["MASTER_PORT"] = "12355"  # token {secret}
        dist.init_process_group("gloo", init_method="tcp://user:{secret}@10.0.0.1:23456")
        torch.save({{}}, "s3://bucket/ckpt.pt?token={secret}")
        """,
    )
    for args in ([], ["--json"], ["--format", "github"]):
        res = run(str(f), "--extend-select", "DDP004", *args)
        assert res.exit_code == 1
        assert secret not in res.output
        assert "DDP004" in res.output and "DDP007" in res.output


def test_character_columns_on_non_ascii_lines(tmp_path: Path) -> None:
    f = write(tmp_path / "u.py", 'import torch.distributed as dist\né = 1; dist.init_process_group("gloo")\n')
    data = json.loads(run(str(f), "--json", "--select", "DDP009").stdout)
    # "é" is two bytes in UTF-8: the AST offset is 8 bytes, the editor column is character 8 (1-based).
    assert data["diagnostics"][0]["col"] == 8


def test_directory_discovery_honours_gitignore(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "# generated\n*_gen.py\n/outputs/\nlogs/\n!keep_gen.py\n")
    write(tmp_path / "train.py", BAD_SNIPPET)
    write(tmp_path / "model_gen.py", BAD_SNIPPET)
    write(tmp_path / "keep_gen.py", BAD_SNIPPET)
    write(tmp_path / "outputs" / "run.py", BAD_SNIPPET)
    write(tmp_path / "src" / "outputs" / "kept.py", BAD_SNIPPET)  # /outputs/ is anchored at the root
    write(tmp_path / "src" / "logs" / "skipped.py", BAD_SNIPPET)
    write(tmp_path / "src" / ".gitignore", "local_*.py\n")
    write(tmp_path / "src" / "local_tmp.py", BAD_SNIPPET)
    write(tmp_path / "src" / "util.py", BAD_SNIPPET)
    write(tmp_path / ".venv" / "lib" / "site.py", BAD_SNIPPET)
    write(tmp_path / "__pycache__" / "x.py", BAD_SNIPPET)
    write(tmp_path / "notes.txt", "not python")
    found = sorted(p.relative_to(tmp_path).as_posix() for p in discover_files([tmp_path]))
    assert found == ["keep_gen.py", "src/outputs/kept.py", "src/util.py", "train.py"]
    # Linting a subdirectory still applies the .gitignore files above it.
    assert sorted(p.name for p in discover_files([tmp_path / "src"])) == ["kept.py", "util.py"]
    # A file named explicitly is linted even when ignored.
    res = run(str(tmp_path / "model_gen.py"), "--json")
    assert json.loads(res.stdout)["files_checked"] == 1
    data = json.loads(run(str(tmp_path), "--json").stdout)
    assert data["files_checked"] == 4


def test_empty_directory_exits_0(tmp_path: Path) -> None:
    res = run(str(tmp_path))
    assert res.exit_code == 0 and "No Python files found" in res.output


def test_lint_never_imports_or_runs_the_script_nor_torch(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    script = write(
        tmp_path / "evil.py",
        f"""\
        open({str(marker)!r}, "w").write("executed")
        import torch.distributed as dist
        dist.init_process_group("gloo")
        """,
    )
    code = (
        "import sys\n"
        "from ddpdoctor.cli import main\n"
        f"sys.argv = ['ddpdoctor', 'lint', '--select', 'ALL', {str(script)!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
        "print('TORCH_LOADED' if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) else 'NO_TORCH')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "EXIT 1" in out.stdout and out.stdout.strip().endswith("NO_TORCH"), out.stdout + out.stderr
    assert not marker.exists()


def test_pre_commit_hooks_file_runs_the_lint_command(tmp_path: Path) -> None:
    # Without a YAML parser in the test environment, read the two fields pre-commit needs by hand.
    text = (Path(__file__).resolve().parent.parent / ".pre-commit-hooks.yaml").read_text()
    ids = re.findall(r"^- id: (\S+)$", text, re.M)
    entries = re.findall(r"^  entry: (.+)$", text, re.M)
    assert ids == ["ddpdoctor-lint", "ddpdoctor-lint-system"]
    assert set(entries) == {"ddpdoctor lint"}
    assert re.findall(r"^  types: \[python\]$", text, re.M) and "language: python" in text
    # pre-commit appends the staged file names to the entry.
    argv = entries[0].split()[1:] + [str(write(tmp_path / "t.py", DEFAULT_BAD)), str(CLEAN)]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 1 and "DDP007" in res.output


def test_a_failing_rule_is_reported_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from ddpdoctor.lint import RULES, lint_source

    def broken(facts):  # a rule with a bug
        raise KeyError("boom")

    monkeypatch.setitem(RULES, "DDP011", dataclasses.replace(RULES["DDP011"], check=broken))
    diags = lint_source(BAD_SNIPPET, "t.py")
    assert {d.code for d in diags} == {"DDP000", "DDP009", "DDP010"}
    assert any("internal error in rule DDP011" in d.message for d in diags)
