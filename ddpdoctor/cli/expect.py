"""`ddpdoctor expect --write FILE`: an expectations file from this (healthy) node, as a starting point."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Optional

import typer

from ddpdoctor.cli.app import app, emit, replay_option, say, timeout_option, usage_error


@app.command(
    help="Write an expectations file (TOML) from what this node shows: GPU model and count, driver, CUDA, "
    "NCCL, NVLink, HCAs, kernel modules, /dev/shm. Review it, then use it with `check --expect FILE` "
    "(and `bench-nccl --expect FILE`). Format in docs/ci.md."
)
def expect(
    write: str = typer.Option(..., "--write", help="File to write ('-' prints it)."),
    replay: Optional[Path] = replay_option(
        "Read the facts from a snapshot directory instead of this machine."
    ),
    name: Optional[str] = typer.Option(None, "--name", help="A name for this node type (default: the host)."),
    force: bool = typer.Option(False, "--force", help="Overwrite FILE if it exists."),
    timeout: float = timeout_option(),
) -> None:
    from ddpdoctor.ci.expect import expectations_from_facts, render_expectations_toml
    from ddpdoctor.ci.node_facts import gather_node_facts
    from ddpdoctor.core.engine import load_hostname
    from ddpdoctor.edge.sources import LiveSources, ReplaySources

    to_stdout = write == "-"
    if not to_stdout:
        from ddpdoctor.edge.files import output_target_problem, shown_path

        # Before any probe runs, and without a traceback for a name the system refuses (too long).
        problem = output_target_problem(write, force=force)
        if problem is not None:
            raise usage_error(f"cannot write {shown_path(write)}: {problem}")
    # Leaving the block kills any probe still running (a hung tool, or Ctrl-C): nothing is orphaned.
    with ReplaySources(replay) if replay is not None else LiveSources() as sources:
        sources.deadline = time.monotonic() + timeout
        host = load_hostname(sources) if replay is not None else socket.gethostname()
        facts = gather_node_facts(sources)
    tables, notes = expectations_from_facts(facts)
    origin = f"snapshot {replay}" if replay is not None else f"host {host}"
    text = render_expectations_toml(tables, notes, name or host, origin)
    if to_stdout:
        emit(text)
    else:
        from ddpdoctor.edge.files import write_output_file

        try:
            write_output_file(write, text, force=force)
        except OSError as exc:
            raise usage_error(f"cannot write {shown_path(write)}: {exc.strerror or exc}") from None
        say(
            f"wrote {write}" + (f" ({len(notes)} facts unavailable, see its comments)" if notes else "")
        )
    raise typer.Exit(0)
