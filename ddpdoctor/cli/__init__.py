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

    # The variables as set, unparsed: a dying rank's last line shows what the launcher gave it, even
    # a value core.launchenv would call malformed.
    rank = env.get("RANK") or env.get("SLURM_PROCID")
    local = env.get("LOCAL_RANK") or env.get("SLURM_LOCALID")
    who = (
        f"rank {rank}" + (f" (local rank {local})" if local is not None else "")
        if rank is not None
        else "process"
    )
    message = str(exc).splitlines()[0][:500] if str(exc) else ""
    return f"ddpdoctor {who} on {socket.gethostname()} died: {type(exc).__name__}: {message}"


class _ClosedStdout:
    """Standard output when the command was started with it closed (`>&-`): Python leaves sys.stdout
    None and print() then drops everything without a word (exit 0 with the output lost). Writing raises
    EPIPE instead, which click turns into its broken-pipe exit and main() into a usage error."""

    encoding = "utf-8"
    errors = "replace"

    def write(self, text: str) -> int:
        import errno

        raise BrokenPipeError(errno.EPIPE, "standard output is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("standard output is closed")

    def writable(self) -> bool:
        return True


def _guard_stdio() -> bool:
    """Make standard output safe to print to; True when it was closed at start.

    A stdout whose encoding cannot hold a character (PYTHONIOENCODING=ascii, a latin-1 terminal) gets it
    replaced rather than raising UnicodeEncodeError half-way through a report."""
    import sys

    closed = sys.stdout is None
    if closed:
        sys.stdout = _ClosedStdout()  # type: ignore[assignment]
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace" if stream is sys.stdout else "backslashreplace")
            except (ValueError, OSError):  # a detached or already closed stream: nothing to configure
                pass
    return closed


def _stdout_broke() -> bool:
    """Whether click met EPIPE on standard output (it swaps sys.stdout for its PacifyFlushWrapper)."""
    import sys

    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


# The signal that stopped the command, if any: 130 (Ctrl-C) or 143 (SIGTERM), as README documents.
_stopped_by: list[int] = []


def _on_stop_signal(signum: int, frame: object) -> None:
    import signal

    code = getattr(frame, "f_code", None)
    if code is not None and code.co_filename.startswith("<frozen importlib"):
        # Inside the import machinery, where an exception raised in a weakref callback (a module lock's
        # clean-up, `_get_module_lock.<locals>.cb`) is printed and dropped: the stop would be lost and the
        # command would run on. Deliver the signal again a moment later, outside it.
        import os
        import threading

        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        return
    _stopped_by.append(130 if signum == signal.SIGINT else 143)
    # As Ctrl-C: context managers and finally blocks run, so probes and ranks are killed, never orphaned.
    raise KeyboardInterrupt


def _install_stop_signals() -> None:
    """SIGINT and SIGTERM stop every command the same way, with exit 130 / 143 (a command that handles
    them itself, bench-nccl, replaces these handlers while it runs)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                signal.signal(signum, _on_stop_signal)
        except (OSError, ValueError):  # an embedded interpreter may not allow it
            pass


def _exit_stopped(code: int) -> None:
    """Leave after a stop signal, its cleanup done: 130 for Ctrl-C; for SIGTERM die of the signal itself,
    so a shell reports 143 and a launcher (torchrun: "Signal 15", exitcode -15) sees a terminated rank,
    as before cleanup ran."""
    import os
    import signal
    import sys

    if code == 143:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    raise SystemExit(code) from None


def main() -> None:
    import sys

    closed = _guard_stdio()
    _install_stop_signals()
    try:
        app()
    except SystemExit as exc:
        if _stopped_by and exc.code not in (0, None):
            # typer/click turn any KeyboardInterrupt into 130 (or "Aborted!" and 1): say which signal it was.
            _exit_stopped(_stopped_by[0])
        if _stopped_by or not _stdout_broke():
            raise
    except KeyboardInterrupt:
        _exit_stopped(_stopped_by[0] if _stopped_by else 130)
    except BrokenPipeError:
        pass  # written outside click's handler (at exit, in a callback): the same as below
    except Exception as exc:  # the last resort: a bug must still leave its reason on this rank's stderr
        import os

        sys.stderr.write(last_words(exc, os.environ) + "\n")
        sys.stderr.flush()
        raise
    # Here only when standard output could not take the output: say so, and exit 2 (README: usage
    # error), never 0 with the output lost nor 1, which means "a check failed".
    if closed:
        why = "Error: standard output is closed; the output was lost. Redirect it to a file, or use -o FILE."
    else:  # `| head`: short, the reader chose to stop
        why = "Error: standard output was closed by its reader (broken pipe); the rest of the output was lost."
    try:
        sys.stderr.write(why + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    import os

    # Point fd 1 at /dev/null: the interpreter's final flush must not raise again on the broken pipe.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
    except OSError:
        pass
    raise SystemExit(2)


__all__ = ["app", "main"]
