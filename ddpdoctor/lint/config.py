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

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

# A pyproject.toml is small; a bigger one is not ours to parse.
MAX_PYPROJECT_BYTES = 1 << 20
KEYS = ("select", "extend-select", "ignore")


@dataclass
class LintConfig:
    select: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    source: Optional[str] = None  # the pyproject.toml it came from


def find_pyproject(paths: Sequence[str]) -> Optional[Path]:
    start = Path(paths[0]) if paths else Path.cwd()
    start = start.resolve()
    if not start.is_dir():
        start = start.parent
    for d in [start, *start.parents]:
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def parse_lint_config(text: str, source: str = "pyproject.toml") -> LintConfig:
    """The [tool.ddpdoctor.lint] table of a pyproject.toml's text. Raises ValueError when it is malformed."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML ({exc})") from None
    table = data.get("tool", {}).get("ddpdoctor", {}).get("lint", {})
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
        with open(found, "rb") as fh:
            raw = fh.read(MAX_PYPROJECT_BYTES + 1)
    except OSError:
        return LintConfig()
    if len(raw) > MAX_PYPROJECT_BYTES:
        raise ValueError(f"{found}: larger than {MAX_PYPROJECT_BYTES} bytes, not read")
    return parse_lint_config(raw.decode("utf-8", "replace"), str(found))
