"""Command-line entry point. Each module in this package (besides app) registers its commands."""

from __future__ import annotations

import importlib
import pkgutil

from ddpdoctor.cli.app import app


def _register_commands() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "app":
            importlib.import_module(f"{__name__}.{info.name}")


_register_commands()


def main() -> None:
    app()


__all__ = ["app", "main"]
