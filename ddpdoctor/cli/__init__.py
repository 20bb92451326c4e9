"""Command-line entry point. Each module in this package (besides app) registers its commands."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Mapping

from ddpdoctor.cli.app import app


def _register_commands() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "app":
            importlib.import_module(f"{__name__}.{info.name}")


_register_commands()


def last_words(exc: BaseException, env: Mapping[str, str]) -> str:
    """One line naming an uncaught exception with this rank and host: under torchrun/srun a rank's
    stderr is often all a user gets of it, and must never be empty (the traceback follows it)."""
    import socket

    rank = env.get("RANK") or env.get("SLURM_PROCID")
    local = env.get("LOCAL_RANK") or env.get("SLURM_LOCALID")
    who = (
        f"rank {rank}" + (f" (local rank {local})" if local is not None else "")
        if rank is not None
        else "process"
    )
    message = str(exc).splitlines()[0][:500] if str(exc) else ""
    return f"ddpdoctor {who} on {socket.gethostname()} died: {type(exc).__name__}: {message}"


def main() -> None:
    try:
        app()
    except Exception as exc:  # the last resort: a bug must still leave its reason on this rank's stderr
        import os
        import sys

        sys.stderr.write(last_words(exc, os.environ) + "\n")
        sys.stderr.flush()
        raise


__all__ = ["app", "main"]
