"""Which files `ddpdoctor lint PATH...` reads: *.py under directories, honouring .gitignore files.

The .gitignore support covers the common patterns (globs, `**`, `/`-anchoring, trailing `/` for
directories, `!` negation, comments); it is not a full reimplementation of git's matcher. Files named
explicitly on the command line are always linted.

Reading is bounded and never blocks (`read_source`, edge/files.py): a `.py` that is a FIFO, a link to
/dev/zero, a link loop or an unreadable file or directory is reported by the linter as unreadable,
never hangs and never raises.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ddpdoctor.edge.files import GITIGNORE_LIMIT, SOURCE_FILE_LIMIT, read_user_bytes, read_user_text

# Directories not linted, with the reason the report gives (the list ruff skips, plus __pycache__).
# `build` and `dist` are skipped only when they are not a Python package (issue #24: a framework's
# `dist/utils.py` package was skipped without a word); every skipped directory is reported.
_SKIP_REASONS = {
    ".bzr": "version control",
    ".direnv": "environment",
    ".eggs": "installed dependencies",
    ".git": "version control",
    ".git-rewrite": "version control",
    ".hg": "version control",
    ".ipynb_checkpoints": "notebook checkpoints",
    ".mypy_cache": "tool cache",
    ".nox": "test environments",
    ".pants.d": "build output",
    ".pyenv": "environment",
    ".pytest_cache": "tool cache",
    ".pytype": "tool cache",
    ".ruff_cache": "tool cache",
    ".svn": "version control",
    ".tox": "test environments",
    ".venv": "virtual environment",
    ".vscode": "editor settings",
    "__pycache__": "bytecode cache",
    "__pypackages__": "installed dependencies",
    "_build": "build output",
    "buck-out": "build output",
    "build": "build output",
    "dist": "build output",
    "node_modules": "installed dependencies",
    "site-packages": "installed dependencies",
    "venv": "virtual environment",
}
# Skipped by name even when they hold an __init__.py (a virtualenv's packages are packages too).
_ALWAYS_SKIP = frozenset(_SKIP_REASONS) - {"build", "dist", "_build"}
SKIP_DIRS = frozenset(_SKIP_REASONS)


@dataclass(frozen=True)
class IgnoreRule:
    base: Path  # the directory holding the .gitignore
    regex: re.Pattern
    negate: bool
    dir_only: bool


def _translate(pattern: str) -> str:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                if pattern.startswith("**/", i):
                    out.append("(?:.*/)?")
                    i += 3
                else:
                    out.append(".*")
                    i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            close = pattern.find("]", i + 2)
            if close == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : close]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = close
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_gitignore(text: str, base: Path) -> list[IgnoreRule]:
    """The rules of one .gitignore file whose directory is `base`."""
    rules: list[IgnoreRule] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        prefix = "^" if anchored else "^(?:.*/)?"
        try:
            regex = re.compile(prefix + _translate(line) + "$")
        except re.error:
            continue  # a pattern we cannot read is skipped, never fatal
        rules.append(IgnoreRule(base, regex, negate, dir_only))
    return rules


def is_ignored(path: Path, is_dir: bool, rules: Sequence[IgnoreRule]) -> bool:
    """git's rule: the last matching pattern decides."""
    ignored = False
    for r in rules:
        try:
            rel = path.relative_to(r.base).as_posix()
        except ValueError:
            continue
        if rel == "." or (r.dir_only and not is_dir):
            continue
        if r.regex.match(rel):
            ignored = not r.negate
    return ignored


def read_source(path: Path) -> bytes:
    """The bytes of a file to lint: regular files only, at most SOURCE_FILE_LIMIT bytes.

    OSError (with strerror) for anything else: a directory we cannot list (PermissionError), a FIFO or
    device (InputRefused, judged before opening), a link loop (ELOOP), a file too large."""
    if os.path.isdir(path):
        with os.scandir(path):  # an unreadable directory raises its own PermissionError here
            pass
    return read_user_bytes(path, SOURCE_FILE_LIMIT)


def _read_gitignore(directory: Path) -> list[IgnoreRule]:
    try:
        text = read_user_text(directory / ".gitignore", GITIGNORE_LIMIT)
    except OSError:
        return []
    return parse_gitignore(text, directory)


def _exists(path: Path) -> bool:
    """Path.exists() that answers False instead of raising (PermissionError, link loops)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _repo_root(start: Path) -> Optional[Path]:
    for d in [start, *start.parents]:
        if _exists(d / ".git"):
            return d
    return None


def _ancestor_rules(directory: Path) -> list[IgnoreRule]:
    """The .gitignore files from the repository root down to `directory`'s parent."""
    root = _repo_root(directory)
    if root is None:
        return []
    chain = [d for d in [directory, *directory.parents] if d == root or root in d.parents]
    rules: list[IgnoreRule] = []
    for d in reversed(chain[1:]):
        rules.extend(_read_gitignore(d))
    return rules


def _skip_reason(directory: Path, name: str) -> Optional[str]:
    """Why a directory is not linted by its name, or None to lint it."""
    reason = _SKIP_REASONS.get(name)
    if reason is None:
        return None
    if name not in _ALWAYS_SKIP and _exists(directory / "__init__.py"):
        return None  # a source package that happens to be called build/ or dist/
    return reason


def _walk(top: Path, excluded: Optional[list[tuple[Path, str]]] = None) -> Iterable[Path]:
    # os.path.realpath, not Path.resolve(): it never raises on a link loop.
    absolute = Path(os.path.realpath(top))
    inherited = _ancestor_rules(absolute)
    rules_at: dict[str, list[IgnoreRule]] = {}
    unreadable: list[str] = []
    # A directory os.walk cannot list is yielded as it is: the linter then reports it as unreadable
    # instead of the walk skipping it in silence (or raising).
    for dirpath, dirnames, filenames in os.walk(absolute, onerror=lambda e: unreadable.append(e.filename)):
        while unreadable:
            yield top / Path(unreadable.pop()).relative_to(absolute)
        here = Path(dirpath)
        parent_rules = rules_at.get(str(here.parent), inherited) if here != absolute else inherited
        rules = parent_rules + _read_gitignore(here)
        rules_at[dirpath] = rules
        kept = []
        for d in sorted(dirnames):
            reason = _skip_reason(here / d, d)
            if reason is None and is_ignored(here / d, True, rules):
                reason = ".gitignore"
            if reason is None:
                kept.append(d)
            elif excluded is not None and reason not in ("version control", "bytecode cache", "tool cache"):
                # Said in the report (what a user might have meant to lint); VCS and caches go unsaid.
                excluded.append((top / (here / d).relative_to(absolute), reason))
        dirnames[:] = kept
        for name in sorted(filenames):
            if name.endswith(".py") and not is_ignored(here / name, False, rules):
                yield top / (here / name).relative_to(absolute)
    while unreadable:
        yield top / Path(unreadable.pop()).relative_to(absolute)


def discover_files(paths: Sequence[Path], excluded: Optional[list[tuple[Path, str]]] = None) -> list[Path]:
    """Expand files and directories into the Python files to lint, in a stable order, without duplicates.
    `excluded`, when given, receives each directory left out and why (build output, a virtualenv,
    .gitignore): never skipped silently.

    Raises FileNotFoundError for a path that does not exist (a usage error for the command line).
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        try:
            is_dir = os.path.isdir(p)
            os.lstat(p)
        except FileNotFoundError:
            raise FileNotFoundError(str(p)) from None
        except (OSError, ValueError):
            is_dir = False  # lint_file reports why it cannot be read
        found: Iterable[Path] = _walk(p, excluded) if is_dir else [p]
        for f in found:
            key = Path(os.path.realpath(f))
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out
