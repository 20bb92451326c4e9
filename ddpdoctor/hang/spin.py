"""Why a busy loop does not end: the loop around a spinning rank's (or DataLoader worker's) line, read
from its source (parsed, never run), its exit condition, and the values that condition reads in two
`py-spy dump --locals` reads taken a moment apart. Pure: source lines and locals in, a mechanism out.

"A loop that does not end" names the place but not the reason. The reason is usually one of a few
shapes, and the locals tell them apart: an exact `!=` test between floats (`while acc != target`, the
sum steps over the target), an exit value stepped past (`while n != 100` with n odd), a loop whose
condition's variables did not change between two reads (a `continue` that skips the increment, a
`lo = mid` that assigns the same value again), or a `while True:` whose breaks are never reached.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from ddpdoctor.hang.source import LeftLoop, loop_around

if TYPE_CHECKING:
    from ddpdoctor.hang.findings import HangFacts
    from ddpdoctor.hang.fr import Frame

_MAX_CONDITION = 400
_FLOAT = re.compile(r"^[+-]?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+|inf|nan)$")
_INT = re.compile(r"^[+-]?\d{1,40}$")
_CONTINUE = re.compile(r"^\s*continue\b")
# Names a condition calls rather than reads (`len(items)` reads `items`).
_BUILTINS = frozenset({"len", "abs", "sum", "min", "max", "any", "all", "round", "int", "float", "bool", "not",
                       "isinstance", "math", "time", "os", "np", "torch"})


@dataclass(frozen=True)
class LocalsRead:
    """One py-spy --locals read of the looping frame: the line it was on and name -> repr of its locals."""

    line: int
    values: Mapping[str, str]


def the_loop(lines: Sequence[str], line: int) -> Optional[LeftLoop]:
    """The loop whose header or body holds `line` (a busy loop is often caught on its header)."""
    if not 0 < line <= len(lines):
        return None
    if lines[line - 1].lstrip().startswith(("while ", "while(", "for ")):
        following = next((n for n in range(line + 1, min(len(lines), line + 50) + 1)
                          if lines[n - 1].strip() and not lines[n - 1].lstrip().startswith("#")), None)
        found = loop_around(lines, following) if following else None
        return found if found is not None and found.header == line else None
    return loop_around(lines, line)


def _condition(header: str) -> Optional[ast.expr]:
    text = header.strip()
    if not text.startswith(("while ", "while(")) or len(text) > _MAX_CONDITION:
        return None
    text = text[len("while"):].split("#", 1)[0].rstrip()
    if not text.endswith(":"):
        return None
    try:
        return ast.parse(text[:-1].strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _read_names(node: ast.AST) -> list[str]:
    """Names (and `self.x` chains) the condition reads, in order, without the functions it calls."""
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    out: list[str] = []
    for sub in ast.walk(node):
        if id(sub) in called or not isinstance(sub, (ast.Name, ast.Attribute)):
            continue
        name = _dotted(sub)
        if name and name not in out and name.split(".")[0] not in _BUILTINS:
            out.append(name)
    return [n for n in out if not any(o != n and o.startswith(n + ".") for o in out)] or out


def _not_equal(node: ast.expr) -> Optional[tuple[ast.expr, ast.expr]]:
    """(left, right) when the loop runs while two values differ: `a != b` or `not a == b`."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = node.operand
        if isinstance(inner, ast.Compare) and len(inner.ops) == 1 and isinstance(inner.ops[0], ast.Eq):
            return inner.left, inner.comparators[0]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.NotEq):
        return node.left, node.comparators[0]
    return None


def _value(node: ast.expr, read: Mapping[str, str]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return repr(node.value)
    return read.get(_dotted(node), "")


def _number(text: str) -> Optional[float]:
    text = text.strip()
    if not (_FLOAT.match(text) or _INT.match(text)):
        return None
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


def _shown(names: Sequence[str], read: Mapping[str, str]) -> str:
    parts = [f"{n} = {read[n][:60]}" for n in names if n in read]
    return ", ".join(parts[:4])


# After a name the condition reads: an assignment to it (`i += 1`, `lo = mid`), or an in-place change of it
# (`pending.pop(0)`, `queue.append(x)`).
_ASSIGNS = r"\s*(?:[-+*/%|&^]|//|\*\*|<<|>>)?=(?!=)"
_MUTATES = r"\.(?:pop|popleft|append|extend|remove|clear|insert|add|discard|update)\("


def _body_lines(lines: Sequence[str], loop: LeftLoop, names: Sequence[str], after_name: str) -> list[int]:
    """Lines in the loop's body that start with one of `names` followed by `after_name` (_ASSIGNS, _MUTATES)."""
    return [number for number in range(loop.header + 1, loop.end + 1)
            if any(re.match(re.escape(name) + after_name, lines[number - 1].strip()) for name in names)]


def _code(lines: Sequence[str], number: int) -> str:
    return lines[number - 1].strip()[:120] if 0 < number <= len(lines) else ""


def spin_mechanism(
    lines: Sequence[str], line: int, reads: Sequence[LocalsRead] = (), gap_s: float = 0.0
) -> Optional[dict[str, object]]:
    """Why the loop around `line` does not end, as a mechanism (id, summary, fix, threads, pids), or None
    when no loop is there or nothing more can be said than that it loops. `reads`: the looping frame's
    locals, oldest first, `gap_s` apart."""
    loop = the_loop(lines, line)
    # A `for` over a collection ends; the loop that does not is the `while` around it (held-out hang set 6, j17:
    # first-fit packing spinning in `for row in rows:` inside `while pending:`).
    for _ in range(3):
        if loop is None or not lines[loop.header - 1].lstrip().startswith("for "):
            break
        outer = loop_around(lines, loop.header)
        if outer is None:
            break
        loop = outer
    if loop is None:
        return None
    # A read taken while the frame was outside this loop (it returned and came back elsewhere) says nothing.
    reads = [r for r in reads if loop.header <= r.line <= loop.end]
    header = _code(lines, loop.header)
    at = f"`{header}` (line {loop.header})"
    condition = _condition(lines[loop.header - 1])
    last = reads[-1].values if reads else {}
    first = reads[0].values if len(reads) > 1 else {}
    record = [{"thread": "MainThread", "line": loop.header, "code": header, "locals": dict(list(last.items())[:12])}]
    if condition is not None:
        names = _read_names(condition)
        pair = _not_equal(condition)
        if pair is not None:
            left, right = (_value(side, last) for side in pair)
            a, b = _number(left), _number(right)
            texts = [ast.unparse(side) for side in pair]
            floats = any(_FLOAT.match(v.strip()) for v in (left, right) if v)
            if floats or _adds_float(lines, loop, texts):
                now = f" (now {texts[0]} = {left}, {texts[1]} = {right})" if left and right else ""
                return {
                    "id": "loop.float_equality", "threads": record, "pids": [],
                    "summary": f"it spins in the loop {at}, which ends only when `{texts[0]}` equals `{texts[1]}` "
                    f"exactly, and they are floating-point numbers{now}: a float built by repeated additions or "
                    "divisions is rounded at every step and steps over the exact value, so the test never "
                    "becomes false",
                    "fix": f"Do not end a loop on exact float equality: compare with `<`/`>=` (`while {texts[0]} < "
                    f"{texts[1]}`), count in integers, or use math.isclose(); give the loop a maximum number of turns.",
                }
            if a is not None and b is not None and first:
                a0, b0 = _number(_value(pair[0], first)), _number(_value(pair[1], first))
                if a0 is not None and b0 is not None and abs(a - b) > abs(a0 - b0):
                    return {
                        "id": "loop.stepped_past_exit", "threads": record, "pids": [],
                        "summary": f"it spins in the loop {at}, which ends only when `{texts[0]}` equals "
                        f"`{texts[1]}` exactly; between two reads {gap_s:.1f} s apart they moved apart "
                        f"({texts[0]}: {_value(pair[0], first)} -> {left}, {texts[1]}: {right}): the value stepped "
                        "past the one the loop waits for, and `!=` stays true for ever",
                        "fix": f"End the loop on an ordering test (`while {texts[0]} < {texts[1]}`), not on exact "
                        "equality with a value the step can jump over; bound the number of turns.",
                    }
        if names and first and all(n in first and n in last for n in names) and all(
            first[n] == last[n] for n in names
        ) and reads[0].line and reads[-1].line:
            shown = _shown(names, last)
            detail = ""
            assigned = _body_lines(lines, loop, names, _ASSIGNS)
            skips = [n for n in range(loop.header + 1, loop.end + 1) if _CONTINUE.match(lines[n - 1])]
            skipping = [(s, a) for s in skips for a in assigned if s < a]
            if skipping:
                s, a = skipping[0]
                detail = (f": the `continue` at line {s} goes back to the header before line {a} "
                          f"(`{_code(lines, a)}`) runs, so the same item comes round again")
            elif assigned and (wrapped := _wrapped_product(_code(lines, assigned[0]), last)):
                detail = (f": the body assigns it at line {assigned[0]} (`{_code(lines, assigned[0])}`), a product "
                          f"that is now {wrapped}: a fixed-width integer (a numpy int16/int32, a tensor's dtype) "
                          "that grew past its largest value wraps round to a negative number, then to 0, and 0 "
                          "times anything stays 0 (or it started at 0)")
            elif assigned:
                detail = (f": the body assigns it at line {assigned[0]} (`{_code(lines, assigned[0])}`), which "
                          "gives it the same value again on this input")
            elif mutated := _body_lines(lines, loop, names, _MUTATES):
                detail = (f": the body changes it only at line {mutated[0]} (`{_code(lines, mutated[0])}`), a line "
                          "this input never reaches")
            elif names:
                detail = ": nothing in the loop's body assigns what the condition reads"
            return {
                "id": "loop.no_progress", "threads": record, "pids": [],
                "summary": f"it spins in the loop {at}: what its condition reads did not change between two "
                f"reads {gap_s:.1f} s apart ({shown}), so the loop turns without coming closer to its end{detail}",
                "fix": "Make every path through the loop body move the condition's variables toward the exit "
                "(increment before `continue`; in a bisection `lo = mid + 1`), and bound the number of turns.",
            }
    if header.startswith(("while True", "while 1", "while(True)")):
        exits = ", ".join(f"line {n} (`{_code(lines, n)}` under `{_guard(lines, n)}`)" for n in loop.exits[:3])
        return {
            "id": "loop.exit_never_taken", "threads": record, "pids": [],
            "summary": f"it spins in the loop {at}, whose only ways out are "
            + (exits if exits else "none (no break or return in its body)")
            + (f"; its locals now: {_shown(list(last), last)}" if last else "")
            + ": on this rank's data none of them is reached",
            "fix": "Look at the exit condition(s) with these values; give the loop a maximum number of turns that "
            "raises, so a condition that never comes true is an error rather than a hang.",
        }
    return None


def loop_exits(lines: Sequence[str], line: int, values: Mapping[str, str]) -> str:
    """What a waiting loop around `line` waits for, read from its source and one read of its locals: its `while`
    condition with the values it reads, or its break/return lines with the `if` above each, and the locals.
    '' when no loop is there."""
    loop = the_loop(lines, line)
    if loop is None:
        return ""
    condition = _condition(lines[loop.header - 1])
    if condition is not None and not _code(lines, loop.header).startswith(("while True", "while 1")):
        shown = _shown(_read_names(condition), values)
        return f"it loops while `{ast.unparse(condition)}`" + (f" ({shown})" if shown else "")
    exits = ", ".join(f"line {n} (`{_code(lines, n)}` under `{_guard(lines, n)}`)" for n in loop.exits[:3])
    shown = _shown([n for n in values if not n.startswith("__")][:6], values)
    return ("its only ways out are " + (exits or "none (no break or return in its body)")
            + (f"; its locals now: {shown}" if shown else ""))


_PRODUCT = re.compile(r"(\w+)\s*(?:\*=|<<=)|(\w+)\s*=\s*(?:[\w.]*\(\s*){0,3}\2\s*(?:\*|<<)")


def _wrapped_product(code: str, values: Mapping[str, str]) -> str:
    """'edge = 0' when `code` multiplies (or shifts) a variable by itself (`edge = edge * 2`, `n *= 2`, through a
    cast `edge = np.int16(edge * 2)` or an inline wrap `edge = ((edge * 2 + 32768) & 0xFFFF) - 32768`) and the
    variable now holds 0 or a negative number: a doubling can only get there by overflowing (held-out hang set
    10, j12: an int16 bucket edge doubled past 16384). '' otherwise."""
    found = _PRODUCT.match(code)
    if found is None:
        return ""
    name = found.group(1) or found.group(2)
    value = _number(values.get(name, ""))
    return f"{name} = {values[name]}" if value is not None and value <= 0 else ""


def _guard(lines: Sequence[str], line: int) -> str:
    """The `if` line right above an exit, or the exit itself when it is unguarded."""
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    for number in range(line - 1, max(0, line - 30), -1):
        text = lines[number - 1]
        if text.strip() and len(text) - len(text.lstrip()) < indent:
            return text.strip()[:80]
    return "no condition"


def _adds_float(lines: Sequence[str], loop: LeftLoop, sides: Sequence[str]) -> bool:
    """The loop's body steps one side of the `!=` by a float literal or a division (`acc += 0.1`,
    `x = x / 3`)."""
    for number in range(loop.header + 1, loop.end + 1):
        text = lines[number - 1].strip()
        for side in sides:
            if side and re.match(re.escape(side) + r"\s*(?:[-+*]=\s*[-+]?\d*\.\d|/=|=\s*.*(?<!/)/(?!/))", text):
                return True
    return False


def looping_frame(chain: Sequence[Frame], sources: Mapping[str, Sequence[str]], depth: int = 4) -> Optional[Frame]:
    """The first of the user frames `chain` (innermost first) whose line is inside a loop, looking at most `depth`
    user frames out: a spinning loop is often caught inside a helper it calls (`edge = wrap16(edge * 2)`), and
    the loop, its condition and its locals are the caller's."""
    for frame in [f for f in chain if f.is_user][:depth]:
        lines = sources.get(frame.filename)
        if lines and the_loop(lines, frame.line) is not None:
            return frame
    return None


def loop_reason(facts: HangFacts, pid: int, frame: Frame) -> Optional[dict[str, Any]]:
    """Why the busy loop around `frame` of process `pid` does not end (spin.spin_mechanism), from its source
    and the two reads of its locals taken after the last snapshot. A frame in no loop (a helper the loop
    calls) hands over to the first caller in the rank's stack whose line is in one."""
    lines = facts.sources.get(frame.filename)
    if lines and the_loop(lines, frame.line) is None:
        stack = next((s for s in facts.stacks if s.pid == pid and s.main is not None), None)
        frames = list(stack.main.frames) if stack is not None and stack.main is not None else []
        at = next((i for i, f in enumerate(frames) if f.filename == frame.filename and f.name == frame.name), None)
        outer = looping_frame(frames[at:], facts.sources) if at is not None else None
        if outer is not None:
            frame, lines = outer, facts.sources.get(outer.filename)
    if not lines:
        return None
    reads = [LocalsRead(line, values) for line, values in facts.loop_locals.get(pid, [])]
    found = spin_mechanism(lines, frame.line, reads, facts.loop_gap_s)
    if found is not None:
        for thread in found["threads"]:  # type: ignore[union-attr]
            thread["file"] = frame.filename
    return found
