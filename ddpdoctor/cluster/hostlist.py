"""Slurm hostlist expressions (`SLURM_JOB_NODELIST`): `node[01-04,7],gpu-a[1-2]-ib` -> host names.

Pure text handling, so `check --cluster` under srun needs neither `scontrol show hostnames` nor
Slurm's Python bindings on the compute node.
"""

from __future__ import annotations

import itertools
import re

# Guard against an expression that would expand to millions of names (a typo such as node[1-9999999]).
MAX_HOSTS = 100_000

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def split_top_level(text: str) -> list[str]:
    """Split on commas that are outside brackets: `a[1,2],b` -> ["a[1,2]", "b"]."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in hostlist {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def expand_ranges(body: str) -> list[str]:
    """`01-03,7` -> ["01", "02", "03", "7"]; the width of a zero-padded start is kept."""
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        match = _RANGE.match(part)
        if not match:
            raise ValueError(f"bad range {part!r} in hostlist")
        lo_text, hi_text = match.group(1), match.group(2)
        if hi_text is None:
            out.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"range {part!r} runs backwards")
        if hi - lo + len(out) > MAX_HOSTS:
            raise ValueError(f"range {part!r} is larger than {MAX_HOSTS} hosts")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def expand_item(item: str) -> list[str]:
    """One host pattern, possibly with several bracket groups: `r[1-2]n[1-2]` -> r1n1, r1n2, r2n1, r2n2."""
    pieces: list[list[str]] = []
    pos = 0
    for match in re.finditer(r"\[([^\]]*)\]", item):
        pieces.append([item[pos : match.start()]])
        pieces.append(expand_ranges(match.group(1)))
        pos = match.end()
    pieces.append([item[pos:]])
    if any(ch in item[pos:] for ch in "[]"):
        raise ValueError(f"unbalanced brackets in {item!r}")
    total = 1
    for p in pieces:
        total *= len(p)
    if total > MAX_HOSTS:
        raise ValueError(f"{item!r} expands to more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist expression in order, as `scontrol show hostnames` does.

    Equivalent: scontrol show hostnames "$SLURM_JOB_NODELIST"

    Raises ValueError on a malformed expression.
    """
    hosts: list[str] = []
    for item in split_top_level(text.strip()):
        hosts.extend(expand_item(item))
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"hostlist expands to more than {MAX_HOSTS} hosts")
    return hosts
