"""The typer app that command modules register on. Importing it must stay cheap: no torch."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import typer
from typer.core import TyperCommand

from ddpdoctor import __version__
from ddpdoctor.core.model import EXIT_CODES_HELP, ExitCode

app = typer.Typer(
    name="ddpdoctor",
    help="A doctor for PyTorch distributed training: preflight checks, NCCL benchmarks, log diagnosis.\n\n"
    + EXIT_CODES_HELP,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain click help: compact at 80 columns, and `--help` needs no rich import.
    rich_markup_mode=None,
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


class _ListingCommand(TyperCommand):
    """A command whose `--help` ends with names known only by importing modules (the check areas, the
    parse tools): computed when help is shown, so starting any command stays cheap."""

    listing: Callable[[], str] = staticmethod(lambda: "")

    def format_help(self, ctx: Any, formatter: Any) -> None:
        extra = self.listing()
        if extra and extra not in (self.help or ""):
            self.help = f"{self.help or ''}\n\n{extra}"
        super().format_help(ctx, formatter)


def help_listing(listing: Callable[[], str]) -> type[TyperCommand]:
    """`@app.command(cls=help_listing(fn))`: fn() (a line naming what the command accepts) ends `--help`."""
    return type("ListingCommand", (_ListingCommand,), {"listing": staticmethod(listing)})


def json_option(help: str) -> bool:
    """The `--json` flag of a reporting command (typer.Option, typed for the signature it sits in)."""
    return typer.Option(False, "--json", help=help)


def format_option(help: str = "") -> str:
    """The `--format` option shared by check, explain (and bench-nccl): table or a machine format."""
    return typer.Option(
        "table",
        "--format",
        help=help
        or "table, json, junit (JUnit XML for CI), github (workflow annotations) or markdown. See docs/ci.md.",
    )


def expect_option(help: str) -> Optional[Path]:
    """The `--expect FILE` option of check and bench-nccl (an existing expectations TOML file)."""
    return typer.Option(None, "--expect", help=help, exists=True, dir_okay=False)


def output_option() -> Optional[Path]:
    """`-o/--output FILE`: write the --format output to FILE, atomically (docs/ci.md); '-' is stdout."""
    return typer.Option(
        None,
        "-o",
        "--output",
        parser=_output_path,
        callback=_writable_output,
        help="Write the --format output to FILE instead of stdout ('-': stdout), atomically (a temporary file "
        "in the same directory, then renamed): node_exporter's textfile collector never reads half a file.",
    )


def _output_path(text: str) -> Path:
    # Judged on the text as typed: Path() drops a trailing '/', which says "a directory".
    from ddpdoctor.edge.files import output_target_problem

    if text != "-" and text.endswith("/"):
        problem = output_target_problem(text, force=None)
        raise bad_parameter(f"cannot write {text}: {problem}")
    return Path(text)


def _writable_output(path: Optional[Path]) -> Optional[Path]:
    # Before anything runs: a check or a benchmark must not run only to lose its output.
    if path is not None:
        if str(path) == "-":
            return None  # stdout, as everywhere
        from ddpdoctor.edge.files import output_target_problem

        problem = output_target_problem(path, force=None)  # -o FILE is replaced on every run
        if problem is not None:
            raise bad_parameter(f"cannot write {path}: {problem}")
    return path


def try_write_output(path: Path, text: str) -> bool:
    """Write a command's --format output to `path` atomically; False, said in one line on stderr, when it
    could not be written (disk full, the directory removed meanwhile)."""
    from ddpdoctor.edge.files import write_atomic

    try:
        write_atomic(path, text)
    except OSError as exc:
        say(f"error: could not write {path}: {exc.strerror or exc}", err=True)
        return False
    return True


def write_output_file(path: Path, text: str) -> None:
    """try_write_output, where a failure is exit 3: the run happened, its output is lost."""
    if not try_write_output(path, text):
        raise typer.Exit(int(ExitCode.INCONCLUSIVE))


def pick_format(json_out: bool, output_format: str, known: Sequence[str]) -> str:
    """The format asked for (`--json` means json); ValueError (a usage error) for an unknown one."""
    fmt = "json" if json_out else output_format.lower()
    if fmt not in known:
        raise ValueError(f"unknown --format {fmt!r}; known: {', '.join(known)}")
    return fmt


def say(message: str, err: bool = False) -> None:
    """Print one message line (an error, a note) that may quote outside text (a file name, an environment
    value, an exception's words): secrets redacted and terminal controls made visible (edge.redact.clean_text)."""
    from ddpdoctor.edge.redact import clean_text

    typer.echo(clean_text(message), err=err)


def emit(text: str) -> None:
    """Print a rendered document as it is (already redacted by its renderer), with terminal controls made
    visible: whatever format it is, no byte of it can act on the terminal."""
    from ddpdoctor.edge.redact import neutralize_controls

    typer.echo(neutralize_controls(text), nl=False)


def bad_parameter(message: str) -> typer.BadParameter:
    """typer.BadParameter for a message that may quote outside text: cleaned as say() does."""
    from ddpdoctor.edge.redact import clean_text

    return typer.BadParameter(clean_text(message))


def usage_error(message: str) -> typer.Exit:
    """Print `error: message` on stderr and return the exit-2 exception to raise."""
    say(f"error: {message}", err=True)
    return typer.Exit(int(ExitCode.USAGE))


# Probes of check, snapshot, report and expect are bounded alike.
DEFAULT_TIMEOUT_S = 30.0
# No bound a user means is longer than a day; `inf`, `nan` and 1e12 overflow the clocks and timers.
MAX_SECONDS = 86400.0


def _seconds_between(low: float) -> Callable[[Optional[float]], Optional[float]]:
    """The check of a duration option. Done here rather than by click's min/max, which compare `nan`
    as out of range and then say it should be 'less than or equal to 86400'."""

    def check(value: Optional[float]) -> Optional[float]:
        if value is None:
            return value
        if math.isnan(value):
            raise bad_parameter("nan is not a number (a number of seconds is expected)")
        if not math.isfinite(value):
            raise bad_parameter(f"{value} is not a finite number of seconds")
        if not low <= value <= MAX_SECONDS:
            raise bad_parameter(f"{value:g} is not between {low:g} and {MAX_SECONDS:g} seconds")
        return value

    return check


def seconds_option(default: float, flag: str, help: str, min: float = 0.1) -> float:
    """A duration option: finite, at least `min`, at most a day."""
    return typer.Option(default, flag, callback=_seconds_between(min), help=help)


def timeout_option() -> float:
    """`--timeout`: the bound, in seconds, on each probe."""
    return seconds_option(DEFAULT_TIMEOUT_S, "--timeout", "Bound, in seconds, on each probe.")


def check_snapshot_dir(directory: Optional[Path]) -> Optional[Path]:
    """A `--replay DIR` that can be replayed, or typer.BadParameter (exit 2) saying why not.

    Click's own check lets a FIFO or device through (it only refuses regular files), and an empty
    directory would replay as a node where every area skipped: a check of nothing is no pass."""
    if directory is None:
        return None
    import stat

    try:
        mode = directory.stat().st_mode
    except OSError as exc:
        raise bad_parameter(f"{directory}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(mode):
        raise bad_parameter(f"{directory} is not a snapshot directory")
    try:
        names = [e.name for e in os.scandir(directory)]
    except OSError as exc:
        raise bad_parameter(
            f"cannot list snapshot directory {directory}: {exc.strerror or exc}"
        ) from None
    if not any(n.endswith((".txt", ".json")) for n in names):
        raise bad_parameter(
            f"{directory} holds no snapshot files (<command>.txt or <fact>.json; see docs/snapshot.md): "
            "replaying it would check nothing"
        )
    return directory


def replay_option(help: str) -> Optional[Path]:
    """`--replay DIR`: a snapshot directory (it must exist and hold snapshot files) read instead of
    this machine."""
    return typer.Option(
        None, "--replay", help=help, exists=True, file_okay=False, dir_okay=True, callback=check_snapshot_dir
    )


# Under torchrun the agent SIGTERMs every rank as soon as one of them exits non-zero. A rank refusing
# before init_process_group waits this long (bounded) so that its siblings, which reach the same verdict
# moments later, get to print theirs too: no rank's log may be empty.
LAUNCHER_REFUSAL_GRACE_S = 2.0


def linger_for_siblings() -> None:
    import time

    time.sleep(LAUNCHER_REFUSAL_GRACE_S)
