"""Python tracebacks as printed by CPython's traceback module (Lib/traceback.py): `Traceback (most recent call
last):`, frames `  File "PATH", line N, in NAME` each followed by its source line (and, from 3.11, `^^^` markers),
then the exception line `Type: message` (or a bare `Type`). Chained tracebacks print the cause first, so the last
block is the one that ended the program. A launcher may prefix every line (`[rank1]: `, `1: `)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^(?:\[(?:rank|default) ?\d+\]: ?|\d{1,5}: )")
_HEADER = "Traceback (most recent call last):"
# A frame line's text (also searched for in bytes by explain's scanner, behind any rank prefix).
FRAME_PATTERN = r'File "(?P<file>[^"\n]{1,400})", line (?P<line>\d{1,7}), in (?P<func>\S{1,120})'
_FRAME = re.compile(r"^\s*" + FRAME_PATTERN)
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]{0,120}?)(?::\s?(?P<message>.*))?$")


# An installed package's file: `.../site-packages/fairscale/optim/oss.py`, an egg
# (`.../site-packages/fairscale-0.4.0-py3.8.egg/fairscale/...`) or a Debian `dist-packages` tree.
_INSTALLED = re.compile(
    r"[/\\](?:site|dist)-packages[/\\](?:(?P<egg>[A-Za-z0-9_.]+?)-(?P<version>\d[\w.+]*?)-py[\d.]+\.egg[/\\])?"
    r"(?P<package>[A-Za-z_][\w]*)(?:[/\\]|\.py$)"
)
# The standard library (`/usr/lib/python3.10/multiprocessing/queues.py`, `...\Lib\socket.py`), not a package in it.
_STDLIB = re.compile(r"[/\\](?:lib[/\\]python\d(?:\.\d+)?|Lib)[/\\](?!(?:site|dist)-packages)(?P<module>[A-Za-z_]\w*)")


def raising_package(path: str) -> tuple[str, str] | None:
    """(package, version or "") when a traceback frame's file is an installed package's, ("python", "") for
    the standard library, None for anything else (the user's own code, a source checkout)."""
    if path.startswith("<"):
        return "python", ""  # `<frozen runpy>`, `<string>`: the interpreter's own
    m = _INSTALLED.search(path)
    if m:
        return m.group("package"), m.group("version") or ""
    if _STDLIB.search(path):
        return "python", ""
    return None


@dataclass(frozen=True)
class TracebackFrame:
    file: str
    line: int
    func: str


@dataclass(frozen=True)
class PyTraceback:
    exception: str  # `KeyError: 'lr'`, as printed (first line of the message)
    frames: tuple[TracebackFrame, ...] = field(default_factory=tuple)

    @property
    def type_name(self) -> str:
        return self.exception.split(":", 1)[0].strip()

    def own_frame(self) -> TracebackFrame | None:
        """The innermost frame in the program's own code (not an installed package or the standard library)."""
        return next((f for f in reversed(self.frames) if raising_package(f.file) is None), None)


def last_traceback(text: str) -> PyTraceback | None:
    """The last complete traceback in `text` (its frames and exception line), or None when there is none or the
    last one is cut off before its exception line."""
    lines = [_PREFIX.sub("", raw, count=1) for raw in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.strip() == _HEADER]
    for start in reversed(starts):
        frames: list[TracebackFrame] = []
        for line in lines[start + 1 :]:
            m = _FRAME.match(line)
            if m:
                frames.append(TracebackFrame(m["file"], int(m["line"]), m["func"]))
                continue
            if line[:1] in (" ", "\t") or not line.strip():
                continue  # the frame's source line, its ^^^ markers, or a blank line
            found = _EXCEPTION.match(line.strip())
            if found and frames:
                return PyTraceback(line.strip()[:300], tuple(frames))
            break
    return None
