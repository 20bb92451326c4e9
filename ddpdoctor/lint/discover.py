"""Which files `ddpdoctor lint PATH...` reads: *.py under directories, honouring .gitignore files.

The .gitignore support covers the common patterns (globs, `**`, `/`-anchoring, trailing `/` for
directories, `!` negation, comments); it is not a full reimplementation of git's matcher. Files named
explicitly on the command line are always linted.

Reading is bounded and never blocks (`read_source`, edge/files.py): a `.py` that is a FIFO, a link to
/dev/zero, a link loop or an unreadable file or directory is reported by the linter as unreadable,
never hangs and never raises.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ddpdoctor.edge.files import (
    GITIGNORE_LIMIT,
    SOURCE_FILE_LIMIT,
    InputRefused,
    describe_file_type,
    read_user_bytes,
    read_user_text,
    user_path_mode,
)

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


# A .gitignore pattern as tokens, matched by a set-of-states simulation: time is linear in the path for a
# given pattern, whatever the pattern (a backtracking regex of `*a*a*a*a*a*a*b` against a 200-character
# name takes minutes). Token kinds: a literal character, `?`, a `[...]` class, `*` (no `/`), `**` (any),
# and `**/` (zero or more whole directories: two slots, its entry, which may be skipped, and its inside,
# which only a `/` leaves).
_LIT, _ONE, _CLASS, _STAR, _ANY, _DIRS, _DIRS_IN = range(7)


@dataclass(frozen=True)
class GlobPattern:
    tokens: tuple[tuple[int, object], ...]

    def match(self, text: str) -> bool:
        """Whether the whole of `text` matches (fnmatch with FNM_PATHNAME, git's `**` rules)."""
        tokens = self.tokens
        states = self._closure({0})
        for c in text:
            following: set[int] = set()
            for i in states:
                if i == len(tokens):
                    continue
                kind, arg = tokens[i]
                if kind == _LIT:
                    if c == arg:
                        following.add(i + 1)
                elif kind == _ONE:
                    if c != "/":
                        following.add(i + 1)
                elif kind == _CLASS:
                    if c != "/" and _class_matches(arg, c):
                        following.add(i + 1)
                elif kind == _STAR:
                    if c != "/":
                        following.add(i)
                elif kind == _ANY:
                    following.add(i)
                elif kind == _DIRS:  # enter the directories, or a `/` ends an empty-named one
                    following.add(i + 1)
                    if c == "/":
                        following.add(i + 2)
                else:  # _DIRS_IN: anything, and a `/` may end the directories
                    following.add(i)
                    if c == "/":
                        following.add(i + 1)
            if not following:
                return False
            states = self._closure(following)
        return len(tokens) in states

    def _closure(self, states: set[int]) -> set[int]:
        """Add the states reachable without a character: past `*`, `**` and `**/`, which match nothing."""
        out = set(states)
        stack = list(states)
        while stack:
            i = stack.pop()
            kind = self.tokens[i][0] if i < len(self.tokens) else None
            skip_to = i + 2 if kind == _DIRS else i + 1 if kind in (_STAR, _ANY) else None
            if skip_to is not None and skip_to not in out:
                out.add(skip_to)
                stack.append(skip_to)
        return out


def _class_matches(spec: object, c: str) -> bool:
    negated, ranges = spec  # type: ignore[misc]
    inside = any(lo <= c <= hi for lo, hi in ranges)
    return inside != negated


def _parse_class(body: str) -> tuple[bool, tuple[tuple[str, str], ...]]:
    negated = body[:1] in ("!", "^")
    if negated:
        body = body[1:]
    ranges = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            ranges.append((body[i], body[i + 2]))
            i += 3
        else:
            ranges.append((body[i], body[i]))
            i += 1
    return negated, tuple(ranges)


def compile_glob(pattern: str, anchored: bool) -> GlobPattern:
    """A .gitignore pattern (without `!` and trailing `/`); unanchored ones match in any directory."""
    dirs = [(_DIRS, None), (_DIRS_IN, None)]
    tokens: list[tuple[int, object]] = [] if anchored else list(dirs)
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**/", i):
                tokens += dirs
                i += 3
                continue
            if pattern.startswith("**", i):
                tokens.append((_ANY, None))
                i += 2
                continue
            if not (tokens and tokens[-1][0] == _STAR):  # `***` is `*`: no repeated states
                tokens.append((_STAR, None))
        elif c == "?":
            tokens.append((_ONE, None))
        elif c == "[" and pattern.find("]", i + 2) != -1:
            close = pattern.find("]", i + 2)
            tokens.append((_CLASS, _parse_class(pattern[i + 1 : close])))
            i = close
        elif c == "\\" and i + 1 < n:
            i += 1
            tokens.append((_LIT, pattern[i]))
        else:
            tokens.append((_LIT, c))
        i += 1
    return GlobPattern(tuple(tokens))


@dataclass(frozen=True)
class IgnoreRule:
    base: Path  # the directory holding the .gitignore
    glob: GlobPattern
    negate: bool
    dir_only: bool


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
        rules.append(IgnoreRule(base, compile_glob(line, anchored), negate, dir_only))
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
        if r.glob.match(rel):
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
    if name not in _ALWAYS_SKIP and (_exists(directory / "__init__.py") or _holds_python(directory)):
        # A source package, or a folder of modules, that happens to be called build/ or dist/ (mmengine's
        # `dist/utils.py`): build output keeps its modules deeper (setuptools' build/lib*/pkg/, a wheel's
        # files in dist/ are archives), never directly inside.
        return None
    return reason


def _holds_python(directory: Path) -> bool:
    """Whether `directory` itself holds a .py file (not below it); unreadable counts as no."""
    try:
        with os.scandir(directory) as entries:
            return any(e.name.endswith(".py") and e.is_file(follow_symlinks=False) for e in entries)
    except OSError:
        return False


# Launch scripts beside the code: how the repository says its programs are started (DDP013 reads them). Bounded:
# a few dozen small files, never a data file that happens to end in .sh.
LAUNCH_SUFFIXES = (".sh", ".bash", ".slurm", ".sbatch")
LAUNCH_MAX_FILES = 64
LAUNCH_MAX_BYTES = 64 * 1024
# The repository's documentation (README.md, docs/*.rst) says how to launch as often as a script does (`python -m
# torch.distributed.launch --nproc_per_node=8 train.py ...` in a README's code block). Only its command lines
# are kept (_DOC_COMMAND): prose that names the launcher is no launch.
DOC_SUFFIXES = (".md", ".rst")
DOC_MAX_FILES = 32
_DOC_COMMAND = re.compile(rb"^[^\n]*\btorch[./]distributed[./]launch\b[^\n]*\.py\b[^\n]*$", re.MULTILINE)


def _evidence_slot(taken: Sequence[Path], name: str) -> bool:
    """A launch script or a documentation file, and room for one more of its kind."""
    if name.endswith(LAUNCH_SUFFIXES):
        return sum(not p.name.lower().endswith(DOC_SUFFIXES) for p in taken) < LAUNCH_MAX_FILES
    if name.lower().endswith(DOC_SUFFIXES):
        return sum(p.name.lower().endswith(DOC_SUFFIXES) for p in taken) < DOC_MAX_FILES
    return False


def _walk(
    top: Path, excluded: Optional[list[tuple[Path, str]]] = None, launchers: Optional[list[Path]] = None
) -> Iterable[Path]:
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
            elif launchers is not None and _evidence_slot(launchers, name) and not is_ignored(here / name, False, rules):
                launchers.append(top / (here / name).relative_to(absolute))
    while unreadable:
        yield top / Path(unreadable.pop()).relative_to(absolute)


def discover_files(
    paths: Sequence[Path], excluded: Optional[list[tuple[Path, str]]] = None, launchers: Optional[list[Path]] = None
) -> list[Path]:
    """Expand files and directories into the Python files to lint, in a stable order, without duplicates.
    `excluded`, when given, receives each directory left out and why (build output, a virtualenv,
    .gitignore): never skipped silently. `launchers`, when given, receives the launch scripts (*.sh, *.slurm,
    *.sbatch) found in the named directories (at most LAUNCH_MAX_FILES): read, never run.

    Raises FileNotFoundError for a path that does not exist (a path through a file included), and
    InputRefused for one that cannot be used (a name too long, a loop of links, a FIFO or device): usage
    errors for the command line (exit 2, README's exit codes), not findings. A file found inside a named
    directory that cannot be read is a DDP000 finding instead (lint_file).
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        mode = user_path_mode(p)
        if mode is None:
            raise FileNotFoundError(str(p))
        is_dir = stat.S_ISDIR(mode)
        if not is_dir and not stat.S_ISREG(mode):
            raise InputRefused(errno.EINVAL, f"not a regular file ({describe_file_type(mode)})", p)
        found: Iterable[Path] = _walk(p, excluded, launchers) if is_dir else [p]
        for f in found:
            key = Path(os.path.realpath(f))
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out


def read_launch_scripts(scripts: Sequence[Path]) -> bytes:
    """The text of the launch scripts, each cut at LAUNCH_MAX_BYTES, and the launch command lines of the
    documentation files; unreadable ones are left out (they are evidence only, never linted)."""
    out = []
    for script in scripts[: LAUNCH_MAX_FILES + DOC_MAX_FILES]:
        try:
            with open(script, "rb") as fh:
                text = fh.read(LAUNCH_MAX_BYTES)
        except OSError:
            continue
        if script.name.lower().endswith(DOC_SUFFIXES):
            text = b"\n".join(m.group(0).strip() for m in _DOC_COMMAND.finditer(text))
        out.append(text)
    return b"\n".join(out)
