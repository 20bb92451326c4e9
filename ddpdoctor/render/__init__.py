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


def _new_console(**kwargs: Any) -> Console:
    from rich.console import Console

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
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
