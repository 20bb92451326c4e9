"""`ddpdoctor parse TOOL FILE --json`: a cluster tool's text output as JSON."""

from __future__ import annotations

import typer

from ddpdoctor.cli.app import app, help_listing, say, usage_error

PARSE_EXIT_CODES = (
    "Exit codes: 0 parsed; 2 usage error (unknown tool, unreadable or special file, input too large); "
    "3 nothing recognised: FILE is not this tool's output (or is empty); the empty structure is still "
    "printed."
)


def _tool_listing() -> str:
    from ddpdoctor.parsers import load_parse_tools

    return "Tools: " + ", ".join(load_parse_tools()) + "."


@app.command(
    cls=help_listing(_tool_listing),
    help="Turn a tool's text output (nvidia-smi, ibstat, nccl-tests, ...) into JSON. FILE '-' reads stdin. "
    "TOOL 'list' prints the known tools. Contracts in docs/parse.md.\n\n" + PARSE_EXIT_CODES,
)
def parse(
    tool: str = typer.Argument(
        ..., help="Tool whose output FILE holds, e.g. nvidia-smi-q, ibstat; 'list' for all."
    ),
    file: str = typer.Argument("-", help="File to read ('-' for stdin)."),
    json_out: bool = typer.Option(True, "--json/--no-json", help="Print JSON (the only output format)."),
) -> None:
    from ddpdoctor.parsers import load_parse_tools, recognised_nothing, to_jsonable
    from ddpdoctor.render import print_json

    tools = load_parse_tools()
    if tool == "list":
        say("\n".join(tools))
        raise typer.Exit(0)
    if tool not in tools:
        raise usage_error(f"unknown tool {tool!r}; known: {', '.join(tools)}")
    from ddpdoctor.edge.files import TOOL_OUTPUT_LIMIT, read_stdin_bytes, read_user_bytes

    try:
        data = (
            read_stdin_bytes(TOOL_OUTPUT_LIMIT) if file == "-" else read_user_bytes(file, TOOL_OUTPUT_LIMIT)
        )
    except OSError as exc:
        raise usage_error(f"cannot read {file}: {exc.strerror or exc}") from None
    parsed = to_jsonable(tools[tool](data.decode("utf-8", errors="replace")))
    print_json(parsed)
    if recognised_nothing(parsed):
        # Another tool's output (or an empty file) must not pass as "parsed, nothing wrong".
        why = (
            "the input is empty"
            if not data.strip()
            else "another tool's output? `ddpdoctor parse list` names the tools"
        )
        say(f"error: nothing recognised as {tool} output in {file} ({why}); exit 3", err=True)
        raise typer.Exit(3)
    raise typer.Exit(0)
