"""`df` output for a mount (e.g. `df -k /dev/shm`, `df -h | grep shm`) to sizes in bytes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_SUFFIX = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
# At most 24 digits (10^24 bytes is a yottabyte): longer numbers are garbage, and as floats they
# overflow to infinity, which int() refuses (an OverflowError took the whole System area down).
_HUMAN = re.compile(r"^(?P<num>\d{1,24}(?:[.,]\d{1,12})?)(?P<suffix>[KMGTPB]?)i?$", re.I | re.ASCII)


@dataclass(frozen=True)
class DfEntry:
    filesystem: str
    size_bytes: Optional[int]
    used_bytes: Optional[int]
    avail_bytes: Optional[int]
    use_percent: Optional[int]
    mount: str


def _size(text: str, block: int) -> Optional[int]:
    m = _HUMAN.match(text)
    if not m:
        return None
    num = float(m.group("num").replace(",", "."))
    suffix = m.group("suffix").upper()
    if suffix:
        return int(num * _SUFFIX[suffix])
    return int(num * block)


def parse_df(text: str) -> list[DfEntry]:
    """Rows of df output. Sizes are 1K blocks unless the header says otherwise or values carry a suffix."""
    block = 1024
    entries: list[DfEntry] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0].lower() == "filesystem":
            header = line.lower()
            m = re.search(r"(\d{1,12})[kK]?-blocks", header, re.ASCII)
            if m:
                block = int(m.group(1)) * (1024 if "k-blocks" in header else 1)
            continue
        if len(parts) < 6 or not parts[-2].endswith("%"):
            continue
        # A long filesystem name can push fields; take the last five as size/used/avail/use%/mount.
        size, used, avail, pct, mount = parts[-5:]
        digits = pct.rstrip("%")
        percent: Optional[int] = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 3 else None
        entries.append(
            DfEntry(
                filesystem=" ".join(parts[:-5]),
                size_bytes=_size(size, block),
                used_bytes=_size(used, block),
                avail_bytes=_size(avail, block),
                use_percent=percent,
                mount=mount,
            )
        )
    return entries


def find_mount(entries: list[DfEntry], mount: str) -> Optional[DfEntry]:
    for e in entries:
        if e.mount == mount:
            return e
    return None


PARSE_TOOLS = {"df": lambda text: {"filesystems": [e.__dict__ for e in parse_df(text)]}}
