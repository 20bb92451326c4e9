"""Read the user's source text (never execute it) to tell two desyncs apart. Pure: lines in, answer out.

At the same seq, rank 0 issued all_reduce (line 52) and ranks 1-2 issued barrier (line 53). Either the
code has `if rank == 0: all_reduce(...)` followed by `barrier()` for everyone (a collective only some
ranks issued), or `if rank == ...: X else: Y` (ranks took different branches). The enclosing `if` of
the culprit's line, and whether the others' line lies in its else branch, says which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

_RANKISH = re.compile(r"\brank\b|\bget_rank\s*\(|\bRANK\b|\blocal_rank\b|is_main|is_master|main_process|\bmaster\b")


@dataclass(frozen=True)
class Branch:
    if_line: int  # 1-based line of the `if`
    condition: str  # the `if ...:` text
    rank_dependent: bool
    end_line: int  # last line of the if-body (1-based)
    else_lines: tuple[int, int] | None  # first..last line of the elif/else branches, if any


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip(" \t"))


def enclosing_if(lines: Sequence[str], line: int) -> Optional[Branch]:
    """The innermost `if` whose body holds `line` (1-based), with its else/elif extent."""
    if not 0 < line <= len(lines) or not lines[line - 1].strip():
        return None
    target_indent = _indent(lines[line - 1])
    index = line - 2
    scanned = 0
    while index >= 0 and scanned < 400:
        text = lines[index]
        scanned += 1
        if text.strip() and not text.lstrip().startswith("#") and _indent(text) < target_indent:
            stripped = text.strip()
            if stripped.startswith(("if ", "elif ", "else")):
                return _branch_at(lines, index, stripped)
            if stripped.endswith(":"):
                return None  # a def/for/with/while body, not an if
            target_indent = _indent(text)
        index -= 1
    return None


def _branch_at(lines: Sequence[str], index: int, stripped: str) -> Branch:
    indent = _indent(lines[index])
    # An elif/else body: walk up to its `if` for the condition.
    head = index
    while stripped.startswith(("elif ", "else")) and head > 0:
        head -= 1
        if lines[head].strip() and _indent(lines[head]) == indent and lines[head].strip().startswith(("if ", "elif ")):
            if lines[head].strip().startswith("if "):
                break
    condition = lines[head].strip()
    end = index
    for j in range(index + 1, min(len(lines), index + 2000)):
        if lines[j].strip() and not lines[j].lstrip().startswith("#") and _indent(lines[j]) <= indent:
            break
        end = j
    else_lines = None
    k = end + 1
    while k < len(lines) and not lines[k].strip():
        k += 1
    if k < len(lines) and _indent(lines[k]) == indent and lines[k].strip().startswith(("elif ", "else")):
        last = k
        for j in range(k + 1, min(len(lines), k + 2000)):
            text = lines[j]
            if text.strip() and _indent(text) <= indent and not text.strip().startswith(("elif ", "else")):
                break
            last = j
        else_lines = (k + 1, last + 1)
    return Branch(
        if_line=head + 1,
        condition=condition[:200],
        rank_dependent=bool(_RANKISH.search(condition)),
        end_line=end + 1,
        else_lines=else_lines,
    )


def classify_split(lines: Sequence[str], culprit_line: int, other_line: int) -> tuple[str, Optional[Branch]]:
    """`only_some` (the culprit's collective sits in a rank-dependent if without a counterpart),
    `branches` (culprit and others are in the if and else of one rank-dependent if), or `unknown`."""
    branch = enclosing_if(lines, culprit_line)
    if branch is None or not branch.rank_dependent:
        other_branch = enclosing_if(lines, other_line)
        if other_branch is not None and other_branch.rank_dependent:
            return "branches", other_branch
        return "unknown", branch
    if branch.else_lines and branch.else_lines[0] <= other_line <= branch.else_lines[1]:
        return "branches", branch
    if branch.if_line <= other_line <= branch.end_line:
        return "unknown", branch
    return "only_some", branch
