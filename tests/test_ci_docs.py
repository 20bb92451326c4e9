"""Every ddpdoctor command line in docs/ci.md parses with the real CLI (options, types, choices), so the
documented integrations use only documented flags."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer

from ddpdoctor.cli import app

# typer vendors click; reach its classes through typer's public names only.
BAD_PARAMETER = typer.BadParameter
USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
DOC = Path(__file__).resolve().parent.parent / "docs" / "ci.md"
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.M | re.S)
# Where a shell command ends: a redirect, a pipe, a substitution's close, a list operator.
SHELL_END = re.compile(r"\s(?:>>?|\||2>|&&|\|\||;)|\)")


def extract_commands(markdown: str) -> list[list[str]]:
    """argv (after `ddpdoctor`) of every ddpdoctor invocation in the doc's code blocks."""
    found: list[list[str]] = []
    for block in FENCE.finditer(markdown):
        if block.group("lang") == "toml":
            continue
        for line in block.group("body").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line)  # shell and YAML comments
            array = re.search(r"\[(\s*\"ddpdoctor\".*?)\]", line)
            if array:  # Kubernetes `command: ["ddpdoctor", ...]`
                found.append(json.loads(f"[{array.group(1)}]")[1:])
                continue
            m = re.search(r"(?:^|[\s/\"'(])ddpdoctor (?P<rest>[a-z].*)$", line)
            if not m:
                continue
            rest = SHELL_END.split(m.group("rest"), maxsplit=1)[0]
            found.append(shlex.split(rest))
    return found


def parse_only(argv: list[str]) -> typer.Context:
    """Parse argv like `ddpdoctor ARGV` does, without running the command. A path option that must exist
    but does not on this machine (/etc/ddpdoctor/node.toml) counts as parsed."""
    group = typer.main.get_command(app)
    name, *rest = argv
    command = group.get_command(typer.Context(group), name)
    assert command is not None, f"unknown command {name!r}"
    try:
        return command.make_context(name, rest)
    except BAD_PARAMETER as exc:
        if "does not exist" in exc.format_message():
            return typer.Context(command)
        raise


COMMANDS = extract_commands(DOC.read_text())


def test_the_doc_covers_the_four_integrations_and_the_report() -> None:
    text = DOC.read_text()
    for heading in (
        "## GitHub Actions on a self-hosted GPU runner",
        "## GitLab CI with a JUnit report",
        "## Kubernetes init container",
        "## Slurm Prolog and HealthCheckProgram",
        "## Bug reports: `ddpdoctor report`",
    ):
        assert heading in text
    assert "state=drain reason=" in text and "--on-fail drain" in text
    joined = [" ".join(c) for c in COMMANDS]
    assert any("--format github" in c for c in joined)
    assert any("--format junit" in c for c in joined)
    assert any("--format markdown" in c for c in joined)
    assert sum("--prolog" in c for c in joined) >= 3  # Prolog (drain mode, by hand), HealthCheckProgram
    assert any(c.startswith("report") for c in joined)
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_every_documented_command_parses(argv: list[str]) -> None:
    parse_only(argv)


def test_inline_commands_in_tables_parse() -> None:
    text = DOC.read_text()
    inline = re.findall(r"`ddpdoctor ([a-z][^`]*)`", text)
    checked = 0
    for cmd in inline:
        # A synopsis (`--format a|b`, `[--bench]`, `--format ...`) is not a command line.
        if "|" in cmd or "[" in cmd or "..." in cmd:
            continue
        parse_only(shlex.split(cmd))
        checked += 1
    assert checked >= 3


def test_the_checker_rejects_an_undocumented_flag() -> None:
    with pytest.raises(USAGE_ERROR):
        parse_only(["check", "--no-such-flag"])
    with pytest.raises(BAD_PARAMETER):
        parse_only(["check", "--timeout", "soon"])
    assert extract_commands("```bash\nout=$(ddpdoctor check --prolog --timeout 20 2>&1)\n```") == [
        ["check", "--prolog", "--timeout", "20"]
    ]
