"""The typer app that command modules register on. Importing it must stay cheap: no torch."""

from __future__ import annotations

import typer

from ddpdoctor import __version__
from ddpdoctor.model import EXIT_CODES_HELP

app = typer.Typer(
    name="ddpdoctor",
    help="A doctor for PyTorch distributed training: preflight checks, NCCL benchmarks, log diagnosis.\n\n"
    + EXIT_CODES_HELP,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddpdoctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """ddpdoctor."""
