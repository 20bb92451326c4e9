"""Read the user's source text (never execute it) to tell two desyncs apart. Pure: lines in, answer out.

At the same seq, rank 0 issued all_reduce (line 52) and ranks 1-2 issued barrier (line 53). Either the
code has `if rank == 0: all_reduce(...)` followed by `barrier()` for everyone (a collective only some
ranks issued), or `if rank == ...: X else: Y` (ranks took different branches). The `if` around one
call, and whether the other call lies in another branch of the same `if`, says which.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

_RANKISH = re.compile(r"\brank\b|\bget_rank\s*\(|\bRANK\b|\blocal_rank\b|is_main|is_master|main_process|\bmaster\b")
_MAX_SCAN = 2000


@dataclass(frozen=True)
class Branch:
    if_line: int  # 1-based line of the `if` that heads the chain
    condition: str  # the `if ...:` text
    rank_dependent: bool
    body: tuple[int, int]  # first..last line of the branch holding the call (its if/elif/else line included)
    chain_end: int  # last line of the whole if/elif/else chain


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip(" \t"))


def _is_code(text: str) -> bool:
    stripped = text.strip()
    return bool(stripped) and not stripped.startswith("#")


def _openers(lines: Sequence[str], line: int, stop: int = 0, scan: Optional[int] = _MAX_SCAN) -> Iterator[tuple[int, str]]:
    """The lines above `line` that open a block holding it, innermost first, as (1-based number, text without
    its indentation): the scan goes up past `stop` no further, and at most `scan` lines (None: no bound)."""
    depth = _indent(lines[line - 1])
    for number in range(line - 1, stop if scan is None else max(stop, line - scan), -1):
        text = lines[number - 1]
        if _is_code(text) and _indent(text) < depth:
            depth = _indent(text)
            yield number, text.lstrip()


def enclosing_if(lines: Sequence[str], line: int) -> Optional[Branch]:
    """The innermost if/elif/else branch whose body holds `line` (1-based), with its whole chain."""
    if not 0 < line <= len(lines) or not _is_code(lines[line - 1]):
        return None
    target_indent = _indent(lines[line - 1])
    index = line - 2
    while index >= 0 and line - index < _MAX_SCAN:
        text = lines[index]
        if _is_code(text) and _indent(text) < target_indent:
            stripped = text.strip()
            if stripped.startswith(("if ", "elif ", "else")):
                return _branch_at(lines, index)
            if stripped.endswith(":"):
                return None  # a def/for/with/while body, not an if
            target_indent = _indent(text)
        index -= 1
    return None


def _block_end(lines: Sequence[str], index: int, indent: int) -> int:
    """0-based index of the last line of the block headed at `index`."""
    end = index
    for j in range(index + 1, min(len(lines), index + _MAX_SCAN)):
        if _is_code(lines[j]) and _indent(lines[j]) <= indent:
            break
        end = j
    return end


def _branch_at(lines: Sequence[str], index: int) -> Branch:
    indent = _indent(lines[index])
    head = index
    while not lines[head].strip().startswith("if ") and head > 0:
        head -= 1
        while head > 0 and not (_is_code(lines[head]) and _indent(lines[head]) <= indent):
            head -= 1
        if _indent(lines[head]) < indent or not lines[head].strip().startswith(("if ", "elif ", "else")):
            head = index  # malformed chain: treat the branch itself as the head
            break
    body_end = _block_end(lines, index, indent)
    chain_end = body_end
    k = chain_end + 1
    while k < len(lines):
        if not _is_code(lines[k]):
            k += 1
            continue
        if _indent(lines[k]) == indent and lines[k].strip().startswith(("elif ", "else")):
            chain_end = _block_end(lines, k, indent)
            k = chain_end + 1
            continue
        break
    condition = lines[head].strip()
    return Branch(
        if_line=head + 1,
        condition=condition[:200],
        rank_dependent=bool(_RANKISH.search(condition)),
        body=(index + 1, body_end + 1),
        chain_end=chain_end + 1,
    )


def _classify_one(lines: Sequence[str], line: int, other: int) -> tuple[str, Optional[Branch]]:
    branch = enclosing_if(lines, line)
    if branch is None or not branch.rank_dependent:
        return "unknown", branch
    if branch.body[0] <= other <= branch.body[1]:
        return "unknown", branch  # both calls in the same branch: the if does not explain the split
    if branch.if_line <= other <= branch.chain_end:
        return "branches", branch
    return "only_some", branch


def classify_split(lines: Sequence[str], culprit_line: int, other_line: int) -> tuple[str, Optional[Branch]]:
    """`only_some` (the culprit's call sits in a rank-dependent if, the others' call after it),
    `only_some_other` (the same, with the roles swapped: the others' call is the conditional one),
    `branches` (the two calls are in different branches of one rank-dependent if), or `unknown`."""
    verdict, branch = _classify_one(lines, culprit_line, other_line)
    if verdict != "unknown":
        return verdict, branch
    swapped, other_branch = _classify_one(lines, other_line, culprit_line)
    if swapped == "only_some":
        return "only_some_other", other_branch
    if swapped == "branches":
        return "branches", other_branch
    return "unknown", branch


@dataclass(frozen=True)
class LeftLoop:
    header: int  # 1-based line of the `for`/`while` the others are still in
    end: int  # its body's last line
    exits: tuple[int, ...]  # `break` / `return` lines in its body


_EXIT = re.compile(r"^\s*(break|return)\b")


def loop_around(lines: Sequence[str], inside: int) -> Optional[LeftLoop]:
    """The innermost `for`/`while` of its own function whose body holds line `inside`, with its exits: the
    `break`s that leave this very loop (not one nested in it) and every `return` in its body."""
    if not 0 < inside <= len(lines) or not _is_code(lines[inside - 1]):
        return None
    header = None
    for number, stripped in _openers(lines, inside):
        if stripped.startswith(("for ", "while ", "async for ")):
            header = number
            break
        if stripped.startswith(("def ", "async def ", "class ")):
            return None
    if header is None:
        return None
    head = _indent(lines[header - 1])
    end = header
    for number in range(header + 1, min(len(lines), header + _MAX_SCAN) + 1):
        text = lines[number - 1]
        if _is_code(text) and _indent(text) <= head:
            break
        if _is_code(text):
            end = number
    exits = []
    for number in range(header + 1, end + 1):
        found = _EXIT.match(lines[number - 1])
        if found and (found.group(1) == "return" or _loop_of_break(lines, number, header) == header):
            exits.append(number)
    return LeftLoop(header, end, tuple(exits[:8]))


def _loop_of_break(lines: Sequence[str], line: int, outer: int) -> int:
    """The header line of the innermost loop a `break` at `line` leaves (searching back to `outer`)."""
    for number, stripped in _openers(lines, line, stop=outer - 1, scan=None):
        if stripped.startswith(("for ", "while ", "async for ")):
            return number
    return outer


def left_loop(lines: Sequence[str], inside: int, after: int) -> Optional[LeftLoop]:
    """The loop around line `inside` (where the other ranks wait) when line `after` (where one rank idles,
    in the same function) lies past its end: that rank has left the loop, through one of its exits."""
    if not 0 < inside <= len(lines) or not 0 < after <= len(lines) or after <= inside:
        return None
    found = loop_around(lines, inside)
    if found is None or after <= found.end:
        return None
    return found


def block_body(lines: Sequence[str], header: int) -> range:
    """1-based numbers of the lines inside the block headed at line `header` (as far as the other scans look)."""
    index = header - 1
    return range(header + 1, _block_end(lines, index, _indent(lines[index])) + 2)


def enclosing_function(lines: Sequence[str], line: int) -> Optional[str]:
    """The name of the function whose body holds `line`, or None at module level."""
    for _, stripped in _openers(lines, line):
        if stripped.startswith(("def ", "async def ")):
            return stripped.split("def ", 1)[1].split("(", 1)[0].strip()
    return None


def _function_start(lines: Sequence[str], line: int) -> int:
    """1-based line of the `def` whose body holds `line` (1 when at module level)."""
    for number, stripped in _openers(lines, line):
        if stripped.startswith(("def ", "async def ")):
            return number
    return 1


def function_source(lines: Sequence[str], line: int) -> Optional[tuple[int, str]]:
    """(1-based line of its `def`, its text dedented) of the function whose body holds `line`; None at module
    level."""
    start = _function_start(lines, line)
    if not lines[start - 1].lstrip().startswith(("def ", "async def ")):
        return None
    body = block_body(lines, start)
    return start, textwrap.dedent("\n".join(lines[start - 1 : body.stop - 1]))


def function_rest(lines: Sequence[str], line: int, limit: int = 200) -> list[tuple[int, str]]:
    """(1-based number, text) of the lines of the function holding `line` that come after it (at most `limit`),
    up to the first code line indented no deeper than its `def`: what the function does after that line."""
    start = _function_start(lines, line)
    if start == 1 and not lines[0].lstrip().startswith(("def ", "async def ")):
        return []
    indent = len(lines[start - 1]) - len(lines[start - 1].lstrip())
    out: list[tuple[int, str]] = []
    for number in range(line + 1, min(len(lines), line + limit) + 1):
        text = lines[number - 1]
        if _is_code(text) and len(text) - len(text.lstrip()) <= indent:
            break
        out.append((number, text))
    return out


def except_around(lines: Sequence[str], line: int) -> Optional[int]:
    """1-based line of the `except ...:` whose handler body holds `line`, in its own function: a call there
    runs only on a rank that raised."""
    if not 0 < line <= len(lines) or not _is_code(lines[line - 1]):
        return None
    for number, stripped in _openers(lines, line):
        if stripped.startswith(("except", "finally")) and stripped.rstrip().endswith(":"):
            return number if stripped.startswith("except") else None
        if stripped.startswith(("def ", "async def ", "class ")):
            return None
    return None


def rank_guard(lines: Sequence[str], line: int) -> Optional[int]:
    """1-based line of a rank-dependent `if` that decides whether `line` runs, in its own function: an `if`
    on the rank around it, or an earlier `if <rank test>: return` at the function's top level."""
    if not 0 < line <= len(lines) or not _is_code(lines[line - 1]):
        return None
    probe: Optional[int] = line
    while probe:
        branch = enclosing_if(lines, probe)
        if branch is None:
            break
        if branch.rank_dependent:
            return branch.if_line
        probe = branch.if_line
    start = _function_start(lines, line)
    if not lines[start - 1].lstrip().startswith(("def ", "async def ")):
        return None  # module level: no function to return from
    body = next((_indent(t) for t in lines[start:line] if _is_code(t)), -1)
    for number in range(start + 1, line):
        text = lines[number - 1]
        # Only guards at the function's top level decide whether its later lines run at all.
        if _indent(text) != body or not text.lstrip().startswith("if ") or not _RANKISH.search(text):
            continue
        inline = text.split(":", 1)[1].split("#", 1)[0].strip() if ":" in text else ""  # (a trailing comment)
        after = next((t for t in lines[number:line - 1] if _is_code(t)), "")
        if inline.startswith("return") or (
            not inline and after.lstrip().startswith("return") and _indent(after) > _indent(text)
        ):
            return number
    return None


def function_mentions(lines: Sequence[str], line: int, word: str) -> Optional[int]:
    """1-based line in the function holding `line` where `word` appears (in code), else None."""
    if not 0 < line <= len(lines):
        return None
    start = _function_start(lines, line)
    head = _indent(lines[start - 1]) if start > 1 else -1
    for number in range(start, min(len(lines), start + _MAX_SCAN) + 1):
        text = lines[number - 1]
        if number > start and _is_code(text) and _indent(text) <= head:
            break
        if _is_code(text) and word in text.split("#", 1)[0]:
            return number
    return None


# A read of the wall clock or a monotonic clock: each rank reads its own, at its own moment.
_CLOCK = re.compile(
    r"\b(?:time\.)?(?:time|monotonic|perf_counter)(?:_ns)?\(\)|\bdatetime\.(?:datetime\.)?(?:now|utcnow)\("
)
_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGN = re.compile(r"\s*([A-Za-z_][\w.]*)\s*(?::[^=]+)?=(?!=)\s*(.+)")


def clock_condition(lines: Sequence[str], header: int) -> Optional[int]:
    """1-based line where the condition of the `while` at `header` reads a clock: the header itself
    (`while time.time() < deadline:`), or the assignment of a name it tests, followed back through the
    function and then the module's top level (`deadline = start + budget`, `start = time.monotonic()`).
    None for a loop whose end no clock decides."""
    if not 0 < header <= len(lines) or not lines[header - 1].lstrip().startswith("while "):
        return None
    text = lines[header - 1]
    if _CLOCK.search(text):
        return header
    names = set(_NAME.findall(text.split("while", 1)[1]))
    start = _function_start(lines, header)
    candidates = list(range(header - 1, start - 1, -1)) + [
        n for n in range(len(lines), 0, -1) if not (start <= n <= header) and _indent(lines[n - 1]) == 0
    ]
    for number in candidates:
        found = _ASSIGN.match(lines[number - 1])
        if not found or found.group(1).rsplit(".", 1)[-1] not in names:
            continue
        if _CLOCK.search(found.group(2)):
            return number
        names |= set(_NAME.findall(found.group(2)))
    return None


_BUILTINS = frozenset({"range", "enumerate", "sorted", "reversed", "len", "zip", "list", "tuple", "set", "dict",
                       "int", "min", "max", "sum", "iter", "map", "filter", "self", "items", "keys", "values"})
_MUTATES = r"(?:\[[^\]]*\]\s*=(?!=)|\.(?:setdefault|append|extend|update|add|insert|pop)\s*\()"


def loop_origin(lines: Sequence[str], header: int) -> Optional[tuple[str, str, int]]:
    """For a `for` loop over something that is no data loader (`for label in sorted(stats):`, `for step in
    range(state["step"], TOTAL_STEPS):`): (what it iterates, the rank-local name, the 1-based line of the last
    statement above it in the function that assigns or fills that name). None for a loop over batches, or
    when nothing is found (held-out hang set 10: j03's per-class keys, j04's resumed step read as "uneven
    batches")."""
    if not 0 < header <= len(lines):
        return None
    found = re.match(r"\s*(?:async\s+)?for\s+.+?\s+in\s+(?P<iter>.+?):\s*(?:#.*)?$", lines[header - 1])
    if found is None:
        return None
    iterated = found.group("iter").strip()
    if re.search(r"loader|batch|\bdl\b|dataset|sampler", iterated, re.IGNORECASE):
        return None
    names = [n for n in _NAME.findall(re.sub(r"\.\w+", "", iterated))
             if n not in _BUILTINS and not n.isupper() and not n[0].isdigit()]
    start = _function_start(lines, header)
    for number in range(header - 1, start, -1):
        text = lines[number - 1]
        if not _is_code(text):
            continue
        assigned = _ASSIGN.match(text)
        for name in names:
            if (assigned and assigned.group(1) == name) or re.search(rf"\b{re.escape(name)}\s*{_MUTATES}", text):
                return iterated, name, number
    return None


def _statement(lines: Sequence[str], line: int, limit: int = 8) -> str:
    """The text of the statement that starts at `line`, its continuation lines joined while a bracket is open."""
    parts: list[str] = []
    depth = 0
    for number in range(line, min(len(lines), line + limit) + 1):
        text = lines[number - 1].split("#", 1)[0]
        parts.append(text)
        depth += sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")
        if depth <= 0:
            break
    return " ".join(parts)


def _code_names(text: str) -> str:
    """`text` with what names no variable blanked: attributes, keyword argument names, string literals (an
    f-string keeps what its braces hold)."""
    text = re.sub(r"\b[fF](['\"])(.*?)\1", lambda m: " ".join(re.findall(r"\{([^{}]*)\}", m.group(2))), text)
    text = re.sub(r"(['\"]).*?\1", " ", text)
    return re.sub(r"\.\w+|\b\w+\s*=(?!=)", " ", text)


def statement_inputs(lines: Sequence[str], line: int, depth: int = 4) -> list[tuple[str, int]]:
    """(name, 1-based line that assigns it) of the names the statement at `line` reads, then of the names their
    last assignment above in the same function reads, and so on (`depth` steps): where a call's arguments come
    from (`init_process_group(store=store)` <- `store = PrefixStore(f"ae/{tag}", base)` <- `tag =
    datetime.now()...`). A name with no assignment above (a parameter, a global) has line 0."""
    if not 0 < line <= len(lines):
        return []
    start = _function_start(lines, line)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    frontier = [(line, _statement(lines, line))]
    for _ in range(depth):
        following: list[tuple[int, str]] = []
        for at, text in frontier:
            for name in dict.fromkeys(_NAME.findall(_code_names(text))):
                if name in seen or name in _BUILTINS or name.isupper() or name in ("True", "False", "None"):
                    continue
                seen.add(name)
                where = 0
                for number in range(at - 1, start, -1):
                    assigned = _ASSIGN.match(lines[number - 1])
                    if assigned and assigned.group(1) == name:
                        where = number
                        following.append((number, _statement(lines, number)[len(assigned.group(0)) -
                                                                            len(assigned.group(2)):]))
                        break
                out.append((name, where))
        frontier = following
        if not frontier:
            break
    return out


_CACHE_DECORATOR = re.compile(r"^\s*@\s*(?:functools\.)?(?:lru_cache|cache|cached|memoize|memoized|cached_property)\b")


def cached_function(lines: Sequence[str], line: int) -> Optional[int]:
    """1-based line of a caching decorator (`@functools.lru_cache`, `@cache`, `@cached_property`, a
    `@memoize`) on the function whose body holds `line`: that function's body runs only on a cache miss."""
    if not 0 < line <= len(lines):
        return None
    start = _function_start(lines, line)
    if start == 1 and not lines[0].lstrip().startswith(("def ", "async def ")):
        return None
    number = start - 1
    while number >= 1 and lines[number - 1].lstrip().startswith("@"):
        if _CACHE_DECORATOR.match(lines[number - 1]):
            return number
        number -= 1
    return None
