"""The two sides of a split between ranks, as verdict.py's mechanism readings name them: a stack's key, the
ranks that share its signature, the record of a line, a mechanism's dict. Shared by mismatch.py and
join_split.py. Pure."""

from __future__ import annotations

from typing import Any

from ddpdoctor.hang.stacks import RankStack


def _key(stack: RankStack) -> int:
    return stack.rank if stack.rank is not None else -stack.pid


def _side(groups: list[Any], stack: RankStack) -> list[int]:
    sig = stack.signature()
    return sorted(r for g in groups if g.signature == sig for r in g.ranks) or [_key(stack)]


def _at(ctx: Any, filename: str, line: int, role: str) -> dict[str, Any]:
    """The main thread's record of the line a mechanism points at."""
    return {"thread": "MainThread", "file": filename, "line": line, "code": ctx.code(filename, line), "role": role}


def _mechanism(kind: str, summary: str, fix: str, culprits: list[int], threads: list[Any]) -> dict[str, Any]:
    return {"id": kind, "summary": summary, "threads": threads, "pids": [], "culprits": culprits, "fix": fix}


def _user_line(ctx: Any, stack: RankStack) -> str:
    frame = stack.user_frame()
    return f"line {frame.line} of {frame.name}()" if frame is not None else "?"
