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


def console() -> Console:
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(highlight=False, soft_wrap=False)
    return _console


def err_console() -> Console:
    global _err_console
    if _err_console is None:
        from rich.console import Console

        _err_console = Console(stderr=True, highlight=False)
    return _err_console


def reset_consoles() -> None:
    """Forget the consoles (tests swap sys.stdout between runs)."""
    global _console, _err_console
    _console = _err_console = None


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()
