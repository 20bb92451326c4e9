"""Output of `ddpdoctor lint`: text (`path:line:col: DDPxxx message` + fix hint), JSON, GitHub annotations.

Only code locations, rule ids, messages and fix hints are printed: never the script's source text, so
no secret written in a script can leak into CI logs.
"""

from __future__ import annotations

import sys

from rich.text import Text

from ddpdoctor.edge.redact import neutralize_controls, one_line
from ddpdoctor.lint import Diagnostic, LintReport
from ddpdoctor.render import console, print_json

FORMATS = ("text", "json", "github")


def format_text_line(d: Diagnostic) -> str:
    """`path:line:col: DDPxxx message` (the ruff/flake8 shape editors and CI parse)."""
    return f"{one_line(d.path)}:{d.line}:{d.col}: {d.code} {d.message}"


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def format_github_line(d: Diagnostic) -> str:
    """A GitHub Actions workflow command: `::error file=...,line=...,col=...,title=DDPxxx::message`."""
    message = d.message + (f"\nfix: {d.fix}" if d.fix else "")
    return (
        f"::error file={_gh_property(d.path)},line={d.line},col={d.col},title={_gh_property(d.code)}"
        f"::{_gh_data(message)}"
    )


def _summary(report: LintReport) -> str:
    n_files = len(report.files)
    if not n_files:
        return "No Python files found under the given paths."
    if not report.diagnostics:
        return f"All checks passed ({n_files} file{'s' if n_files != 1 else ''} checked)."
    with_findings = len({d.path for d in report.diagnostics})
    counts = ", ".join(f"{code} x{n}" for code, n in report.counts().items())
    n = len(report.diagnostics)
    return (
        f"Found {n} finding{'s' if n != 1 else ''} in {with_findings} of {n_files} "
        f"file{'s' if n_files != 1 else ''} ({counts})."
    )


def scope_notes(report: LintReport, limit: int = 5) -> list[str]:
    """What was linted beyond the paths given, and what was left out and why (never in silence)."""
    notes: list[str] = []
    if report.followed:
        shown = ", ".join(report.followed[:limit]) + (" ..." if len(report.followed) > limit else "")
        notes.append(f"Followed {len(report.followed)} local module(s) the given script(s) import: {shown}")
    if report.not_followed:
        shown = ", ".join(f"{m} ({why})" for m, why in report.not_followed[:limit])
        more = f" and {len(report.not_followed) - limit} more" if len(report.not_followed) > limit else ""
        notes.append(f"Not followed: {shown}{more}")
    if report.excluded:
        shown = ", ".join(f"{p} ({why})" for p, why in report.excluded[:limit])
        more = f" and {len(report.excluded) - limit} more" if len(report.excluded) > limit else ""
        notes.append(
            f"Excluded {len(report.excluded)} director{'y' if len(report.excluded) == 1 else 'ies'}: {shown}{more}"
        )
    if report.chunked:
        notes.append(report.chunked[0].upper() + report.chunked[1:] + ".")
    return notes


def render_lint_text(report: LintReport) -> None:
    con = console()
    for d in report.diagnostics:
        line = Text.assemble(
            (f"{one_line(d.path)}:{d.line}:{d.col}:", "bold"), " ", (d.code, "bold red"), " ", d.message
        )
        con.print(line, soft_wrap=True)
        if d.fix:
            con.print(Text.assemble("    ", ("fix:", "cyan"), " ", d.fix), soft_wrap=True)
    con.print(Text(_summary(report), style="bold"), soft_wrap=True)
    for note in scope_notes(report):
        con.print(Text(one_line(note)), soft_wrap=True)


def render_lint_github(report: LintReport) -> None:
    for d in report.diagnostics:
        # A file name is outside text: its controls are shown, never sent (the github format has no rich).
        sys.stdout.write(neutralize_controls(format_github_line(d)) + "\n")
    sys.stdout.flush()


def render_lint_json(report: LintReport) -> None:
    print_json(report.to_dict())


def render_lint_report(report: LintReport, fmt: str) -> None:
    {"text": render_lint_text, "json": render_lint_json, "github": render_lint_github}[fmt](report)
