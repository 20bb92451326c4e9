"""Who would end a wait: the lines of the files a rank's threads run that would wake it (`ready.set()` for an
Event, `cond.notify()` for a Condition, `slots.release()` for a Semaphore, `store.set("key", ...)` for a c10d
store key), the `if` that guards each, and which thread, if any, is inside that function now. Pure: source lines
and stacks in, a phrase out.

"It waits for an event that nothing sets" names the wait; what the reader needs next is where the set() is and
why it is not reached (held-out hang set 12: a store key set only under `if won == self.me:` where `won` is the
bytes compare_set returns; a semaphore released in a function no thread runs). Read, never run.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ddpdoctor.hang.source import enclosing_function, enclosing_if
from ddpdoctor.hang.stacks import ThreadStack

_MAX_WAKERS = 4


@dataclass(frozen=True)
class Waker:
    """One line that would end the wait: where, its text, its function, the `if` it sits under."""

    file: str
    line: int
    code: str
    function: Optional[str]
    guard_line: Optional[int]
    guard: str


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def wakers(
    sources: Mapping[str, Sequence[str]], receiver: str, verbs: Sequence[str], key: str = ""
) -> list[Waker]:
    """The lines calling `<receiver>.<verb>(` (the receiver matched by its last name: `self._ready` here is
    `ready`'s owner `_ready` there), or, with `key`, `.<verb>(` calls whose text holds that key."""
    last = receiver.rsplit(".", 1)[-1]
    if not key and not last.isidentifier():
        return []
    alts = "|".join(re.escape(v) for v in verbs)
    if key:
        pattern = re.compile(rf"\.(?:{alts})\(\s*{re.escape(key)}\s*[,)]")
    else:
        pattern = re.compile(rf"(?<![\w]){re.escape(last)}\s*\.\s*(?:{alts})\(")
    out: list[Waker] = []
    for file, lines in sources.items():
        for number, text in enumerate(lines, 1):
            code = text.split("#", 1)[0]
            if not pattern.search(code):
                continue
            branch = enclosing_if(lines, number)
            guard = branch.condition.strip() if branch is not None else ""
            out.append(Waker(file, number, text.strip()[:120], enclosing_function(lines, number),
                             branch.if_line if branch is not None else None, guard[:120]))
            if len(out) >= _MAX_WAKERS:
                return out
    return out


def _thread_in(threads: Sequence[ThreadStack], function: Optional[str], file: str) -> Optional[tuple[str, int]]:
    """(thread name, line) of a thread whose stack is inside `function` of `file` now."""
    if not function:
        return None
    for thread in threads:
        for frame in thread.frames:
            if frame.filename == file and frame.name.rsplit(".", 1)[-1] == function:
                return thread.thread_name, frame.line
    return None


_STORE_READS = re.compile(r"(?:store|_store|kv)\w*\s*\.\s*(?:compare_set|get)\(", re.IGNORECASE)


def _assigned_from(lines: Sequence[str], name: str, before: int, pattern: re.Pattern[str]) -> Optional[int]:
    """1-based line above `before` (in its function) that assigns `name` from something `pattern` matches."""
    assign = re.compile(rf"^\s*{re.escape(name)}\s*(?::[^=]+)?=(?!=)(.*)$")
    for number in range(before - 1, max(0, before - 60), -1):
        text = lines[number - 1]
        if text.lstrip().startswith(("def ", "async def ")):
            return None
        found = assign.match(text)
        if found and pattern.search(found.group(1)):
            return number
    return None


def _is_text(node: ast.expr, lines: Sequence[str], depth: int = 0) -> bool:
    """A str for sure: a literal, an f-string, `str(...)`, or a name/attribute assigned one of those in the file."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str":
        return True
    if isinstance(node, (ast.Name, ast.Attribute)) and not depth:
        assign = re.compile(rf"^\s*{re.escape(ast.unparse(node))}\s*(?::[^=]+)?=(?!=)(.+)$")
        for text in lines:
            found = assign.match(text)
            if found is None:
                continue
            try:
                value = ast.parse(found.group(1).split("#", 1)[0].strip(), mode="eval").body
            except SyntaxError:
                continue
            if _is_text(value, lines, 1):
                return True
    return False


def bytes_vs_str(sources: Mapping[str, Sequence[str]], waker: Waker) -> Optional[tuple[str, int]]:
    """(the comparison, the line that read its bytes) when the `if` guarding `waker` compares a value read back
    from a c10d store (`compare_set`/`get`: they return bytes) with a str: never equal, so the guarded line
    never runs."""
    lines = sources.get(waker.file)
    if not lines or waker.guard_line is None:
        return None
    condition = waker.guard.split(None, 1)[1].rstrip(":").strip() if " " in waker.guard else ""
    try:
        tree = ast.parse(condition, mode="eval")
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            continue
        for read, other in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
            if not isinstance(read, ast.Name) or not _is_text(other, lines):
                continue
            origin = _assigned_from(lines, read.id, waker.guard_line, _STORE_READS)
            if origin is not None:
                return ast.unparse(node), origin
    return None


def waker_phrase(
    sources: Mapping[str, Sequence[str]], threads: Sequence[ThreadStack], found: Sequence[Waker], what: str,
    waiting_file: str = "", waiting_line: int = 0,
) -> str:
    """'; what sets it: train.py:88 in _loader() `self._ready.set()`, under `if batch is None:` (line 86); no
    thread is in _loader() now' — or that no line of the files the threads run does. `what`: 'sets it'."""
    found = [w for w in found if not (w.file == waiting_file and w.line == waiting_line)]
    files = ", ".join(sorted({_short(f) for f in sources})[:4])
    if not found:
        return f"; no line of the files its threads run ({files}) {what}" if files else ""
    parts = []
    for w in found[:2]:
        text = f"{_short(w.file)}:{w.line}" + (f" in {w.function}()" if w.function else "") + f" `{w.code}`"
        if w.guard:
            text += f", under `{w.guard}` (line {w.guard_line})"
            mixed = bytes_vs_str(sources, w)
            if mixed is not None:
                text += (f", and `{mixed[0]}` compares the bytes a c10d store returns (read at line {mixed[1]}: "
                         "compare_set() and get() return bytes) with a str: never equal, so that line never runs")
        where = _thread_in(threads, w.function, w.file)
        generator = _yields(sources.get(w.file, ()), w.function) if w.function else None
        if generator is not None:
            text += (f"; {w.function}() holds `yield` (line {generator}), so calling it — as a Thread's target "
                     "too — only makes a generator and runs none of its lines")
        if w.function:
            text += (f"; thread `{where[0]}` is in {w.function}() at line {where[1]}" if where
                     else f"; no thread is in {w.function}() now")
        parts.append(text)
    return f"; what {what}: " + "; ".join(parts) + ("" if len(found) <= 2 else f"; and {len(found) - 2} more")


def self_rescheduling(
    sources: Mapping[str, Sequence[str]], receiver: str
) -> Optional[tuple[str, int, int, str, str]]:
    """(file, def line, line, function, code) of a function that schedules itself again on the scheduler
    `receiver` (`self._sched.enter(self.beat_every, 5, self._beat)` inside `_beat`): a heartbeat on a
    sched.scheduler keeps its queue from ever emptying, so `run()` never returns (held-out hang set 12's j07)."""
    last = receiver.rsplit(".", 1)[-1]
    if not last.isidentifier():
        return None
    enter = re.compile(rf"(?<![\w]){re.escape(last)}\s*\.\s*enter(?:abs)?\((.*)")
    for file, lines in sources.items():
        for number, text in enumerate(lines, 1):
            found = enter.search(text.split("#", 1)[0])
            function = enclosing_function(lines, number) if found else None
            if found and function and re.search(rf"(?<![\w]){re.escape(function)}\b", found.group(1)):
                start = next((n for n in range(number, 0, -1)
                              if re.match(rf"\s*(?:async\s+)?def\s+{re.escape(function)}\b", lines[n - 1])), number)
                return file, start, number, function, text.strip()[:120]
    return None


def _yields(lines: Sequence[str], function: str) -> Optional[int]:
    """1-based line of a `yield` in the body of `def function` (not in a function nested in it): a generator
    function, whose call runs nothing (held-out hang set 13's j08: a Thread whose target held a `yield`)."""
    for number, text in enumerate(lines, 1):
        found = re.match(rf"(\s*)(?:async\s+)?def\s+{re.escape(function)}\s*\(", text)
        if not found:
            continue
        indent = len(found.group(1))
        body: Optional[int] = None
        for inner in range(number + 1, len(lines) + 1):
            line = lines[inner - 1]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            depth = len(line) - len(line.lstrip())
            if depth <= indent:
                break
            body = depth if body is None else body
            if re.match(r"\s*(?:async\s+)?def\s", line) and depth >= body:
                break  # (a nested function's yield is its own)
            if re.search(r"(?:^|[=(\s])yield\b", line.split("#", 1)[0]):
                return inner
        return None
    return None
