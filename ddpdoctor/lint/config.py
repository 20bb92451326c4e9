"""`[tool.ddpdoctor.lint]` in pyproject.toml: which rules a project runs, like ruff's `[tool.ruff.lint]`.

    [tool.ddpdoctor.lint]
    select = ["DDP0"]            # replaces the default tier
    extend-select = ["DDP009"]   # adds opinionated rules to it
    ignore = ["DDP013"]

The nearest pyproject.toml at or above the first path linted (or the working directory) is read; a file
without the table is ignored. Command-line options win: --select replaces `select` and `extend-select`,
--extend-select and --ignore add to the lists.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ddpdoctor.edge.files import TOML_FILE_LIMIT, load_toml_text, read_user_text

KEYS = ("select", "extend-select", "ignore")


@dataclass
class LintConfig:
    select: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    source: Optional[str] = None  # the pyproject.toml it came from


def find_pyproject(paths: Sequence[str]) -> Optional[Path]:
    # abspath, not resolve(): a link loop among the paths is lint's to report, not a crash here.
    start = Path(os.path.abspath(paths[0] if paths else os.getcwd()))
    if not os.path.isdir(start):
        start = start.parent
    for d in [start, *start.parents]:
        candidate = d / "pyproject.toml"
        try:
            if candidate.is_file():
                return candidate
        except OSError:  # an unreadable directory on the way up: look further up
            continue
    return None


def parse_lint_config(text: str, source: str = "pyproject.toml") -> LintConfig:
    """The [tool.ddpdoctor.lint] table of a pyproject.toml's text. Raises ValueError when it is malformed."""
    try:
        data = load_toml_text(text)
    except ValueError as exc:
        raise ValueError(f"{source}: not valid TOML ({exc})") from None
    tool = data.get("tool", {})
    # `tool = 5` is another tool's mistake, not a lint setting: lint with the defaults.
    ours = tool.get("ddpdoctor", {}) if isinstance(tool, dict) else {}
    if not isinstance(ours, dict):
        raise ValueError(f"{source}: [tool.ddpdoctor] must be a table")
    table = ours.get("lint", {})
    if not isinstance(table, dict):
        raise ValueError(f"{source}: [tool.ddpdoctor.lint] must be a table")
    config = LintConfig(source=source)
    for key in table:
        if key not in KEYS:
            raise ValueError(
                f"{source}: unknown key {key!r} in [tool.ddpdoctor.lint]; known: {', '.join(KEYS)}"
            )
    for key in KEYS:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{source}: [tool.ddpdoctor.lint] {key} must be a list of rule ids")
        setattr(config, key.replace("-", "_"), value)
    return config


def load_lint_config(paths: Sequence[str]) -> LintConfig:
    """The lint table of the nearest pyproject.toml (an empty config when there is none)."""
    found = find_pyproject(paths)
    if found is None:
        return LintConfig()
    try:
        text = read_user_text(found, TOML_FILE_LIMIT)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise ValueError(f"{found}: {exc.strerror}") from None
        return LintConfig()  # unreadable: lint with the defaults rather than not at all
    return parse_lint_config(text, str(found))
