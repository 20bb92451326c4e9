"""`ddpdoctor lint PATH...`: static checks of DDP training scripts (ast only; scripts are never run)."""

from __future__ import annotations

from typing import List, Optional

import typer

from ddpdoctor.cli.app import app, emit, usage_error
from ddpdoctor.cli.check import split_names

# Formats rendered by ddpdoctor/render/formats.py (the others by ddpdoctor/render/lint.py).
CI_ONLY_FORMATS = ("junit", "markdown")
LINT_EXIT_HELP = "Exit codes: 0 no findings; 1 findings (or a file that does not parse); 2 usage error (a path named that is missing or unreadable)."


@app.command(
    help="Find DDP pitfalls in training scripts before they cost a cluster: a collective only rank 0 "
    "reaches, fork-started CUDA, the GPU picked from the global rank, hard-coded ports, set_epoch "
    "forgotten, every rank saving, and more. Files and directories (*.py, honouring .gitignore), linted "
    "as one project (imports between them followed; a script named alone brings the local modules it "
    "imports; excluded directories are listed). The default tier reports likely bugs; opinionated "
    "rules via --extend-select or [tool.ddpdoctor.lint] in pyproject.toml. Silence a line with "
    "`# noqa: DDPxxx`. "
    "Rules in docs/lint.md.\n\n" + LINT_EXIT_HELP
)
def lint(
    paths: List[str] = typer.Argument(..., help="Files or directories to lint."),
    select: Optional[List[str]] = typer.Option(
        None,
        "--select",
        help="Run these rule ids or prefixes instead of the default tier (comma-separated), e.g. "
        "DDP003,DDP01; ALL for every rule.",
    ),
    extend_select: Optional[List[str]] = typer.Option(
        None,
        "--extend-select",
        help="Add rules to the default tier, e.g. the opinionated DDP009 (timeout) or DDP010 (destroy).",
    ),
    ignore: Optional[List[str]] = typer.Option(
        None, "--ignore", help="Skip these rule ids or prefixes (comma-separated)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (same as --format json)."),
    fmt: str = typer.Option(
        "text",
        "--format",
        help="Output format: text (or table), json, github (annotations), junit (JUnit XML) or markdown. "
        "See docs/ci.md.",
    ),
) -> None:
    from ddpdoctor.lint import lint_paths, select_rules
    from ddpdoctor.lint.config import load_lint_config
    from ddpdoctor.render.lint import FORMATS, render_lint_report
    from ddpdoctor.render.progress import StderrProgress

    fmt = "text" if fmt.lower() == "table" else fmt.lower()
    if fmt not in FORMATS and fmt not in CI_ONLY_FORMATS:
        known = ", ".join((*FORMATS, *CI_ONLY_FORMATS))
        raise usage_error(f"unknown format {fmt!r}; choose one of {known} (table means text)")
    if json_out:
        if fmt not in ("text", "json"):
            raise usage_error(f"--json conflicts with --format {fmt}")
        fmt = "json"
    try:
        config = load_lint_config(paths)
        chosen = split_names(select)
        # --select on the command line is the whole choice: the file's select and extend-select step aside.
        rules = select_rules(
            chosen or config.select,
            [*config.ignore, *split_names(ignore)],
            [*([] if chosen else config.extend_select), *split_names(extend_select)],
        )
        with StderrProgress("lint", unit="bytes") as progress:

            def advance(done: int, total: int, where: str) -> None:
                progress.set_total(total)
                progress.update(done)
                if where:
                    progress.describe(where)

            report = lint_paths(paths, rules, on_progress=advance)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    except FileNotFoundError as exc:
        raise usage_error(f"no such file or directory: {exc}") from None
    except OSError as exc:  # a path named on the command line that cannot be used (edge.files.InputRefused)
        from ddpdoctor.edge.files import refusal_text

        raise usage_error(refusal_text(exc)) from None
    if fmt in CI_ONLY_FORMATS:
        from ddpdoctor.render.formats import document_from_lint, render_document

        emit(render_document(fmt, document_from_lint(report.to_dict())))
    else:
        render_lint_report(report, fmt)
    raise typer.Exit(report.exit_code)
