"""The one place that imports rich: one console for stdout, one for stderr, and JSON output.

Each command's human output lives in its own module here (check.py, bench.py, ...); commands never
build their own Console.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# rich is imported on first use: machine formats (--json, junit, ...) never pay for it.
_console: Console | None = None
_err_console: Console | None = None


# COLUMNS as rich would take it, but sane: 0 or garbage printed nothing at all, 100000 made 300 KB lines.
DEFAULT_WIDTH = 80
MAX_WIDTH = 1000


def console_width(env: Any = None) -> int | None:
    """The width from COLUMNS (None when unset: rich asks the terminal); 80 when it is not a positive
    number, at most MAX_WIDTH."""
    import os

    text = (os.environ if env is None else env).get("COLUMNS")
    if text is None:
        return None
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or int(text) <= 0:
        return DEFAULT_WIDTH
    return min(int(text), MAX_WIDTH)


def _raise_broken_pipe() -> None:
    # rich's own handling exits 1 ("a check failed"); as an error, click and cli.main make it exit 2.
    raise BrokenPipeError(32, "standard output was closed by its reader")


def _neutralize_rich_text() -> None:
    """Make every string rich lays out go through neutralize_controls (edge/redact.py).

    rich's Text already passes each string it is given (Text(...), append, a table cell, markup) through
    `rich.text.strip_control_codes`, which drops BEL, BS, CR, VT and FF but lets ESC and the C1 controls
    (U+009B is CSI) through: a log line's `ESC]0;title BEL` then set the terminal's title. Our function
    takes its place there, before layout (widths are measured on the visible escapes) and before rich adds
    its own styling sequences, which are not text and so keep working. Renderers also hand rich cleaned
    strings (clean_text); this is the guarantee for any string one of them forgets."""
    import rich.text

    from ddpdoctor.edge.redact import neutralize_controls

    rich.text.strip_control_codes = neutralize_controls  # type: ignore[assignment]


def _new_console(**kwargs: Any) -> Console:
    from rich.console import Console

    _neutralize_rich_text()

    made = Console(width=console_width(), **kwargs)
    made.on_broken_pipe = _raise_broken_pipe  # type: ignore[method-assign]
    return made


def console() -> Console:
    global _console
    if _console is None:
        _console = _new_console(highlight=False, soft_wrap=False)
    return _console


def err_console() -> Console:
    global _err_console
    if _err_console is None:
        _err_console = _new_console(stderr=True, highlight=False)
    return _err_console


def reset_consoles() -> None:
    """Forget the consoles (tests swap sys.stdout between runs)."""
    global _console, _err_console
    _console = _err_console = None


def print_json(data: Any) -> None:
    """JSON on stdout, redacted (redact_data: every output path redacts, `parse` output included). Terminal
    controls need nothing: json.dumps escapes them all (ensure_ascii also writes C1 as \\u009b)."""
    from ddpdoctor.edge.redact import redact_data

    sys.stdout.write(json.dumps(redact_data(data), indent=2, default=str) + "\n")
    sys.stdout.flush()
