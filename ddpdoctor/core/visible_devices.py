"""CUDA_VISIBLE_DEVICES parsing: indices, GPU UUIDs and MIG ids; duplicates and invalid entries."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_UUID_PREFIX = re.compile(r"^GPU-[0-9a-fA-F-]+$")  # CUDA accepts unique UUID prefixes
_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+/\d+/\d+|[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})$")


@dataclass(frozen=True)
class VisibleDevices:
    """What CUDA_VISIBLE_DEVICES selects. `None` raw value means unset (all GPUs visible)."""

    raw: Optional[str]
    entries: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()  # "index", "uuid", "mig" per entry
    duplicates: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    empty_entries: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def is_set(self) -> bool:
        return self.raw is not None

    @property
    def hides_all(self) -> bool:
        """Set but selecting nothing: CUDA sees no device at all."""
        return self.raw is not None and not self.entries

    @property
    def count(self) -> Optional[int]:
        """Number of devices CUDA will expose, or None when unset (all)."""
        return None if self.raw is None else len(self.entries)


def classify_entry(entry: str) -> Optional[str]:
    if entry.isdigit():
        return "index"
    if _MIG.match(entry):
        return "mig"
    if _UUID.match(entry) or _UUID_PREFIX.match(entry):
        return "uuid"
    return None


def parse_visible_devices(raw: Optional[str]) -> VisibleDevices:
    """Parse CUDA_VISIBLE_DEVICES the way the CUDA runtime does.

    The runtime stops at the first invalid entry: everything after it is hidden, which is a
    classic way to lose GPUs silently (e.g. `0,1,,2` or `0,1,gpu2`).
    """
    if raw is None:
        return VisibleDevices(raw=None)
    parts = [p.strip() for p in raw.split(",")]
    if parts == [""]:
        return VisibleDevices(raw=raw)
    entries: list[str] = []
    kinds: list[str] = []
    invalid: list[str] = []
    empty = 0
    notes: list[str] = []
    stopped = False
    for p in parts:
        if stopped:
            continue
        if p == "":
            empty += 1
            stopped = True
            notes.append("an empty entry ends the list: CUDA ignores every entry after it")
            continue
        kind = classify_entry(p)
        if kind is None or (kind == "index" and p.startswith("-")):
            invalid.append(p)
            stopped = True
            notes.append(f"invalid entry {p!r} ends the list: CUDA ignores it and every entry after it")
            continue
        entries.append(p)
        kinds.append(kind)
    normalized = [e.lstrip("0") or "0" if k == "index" else e for e, k in zip(entries, kinds)]
    seen: set[str] = set()
    dups: list[str] = []
    for e in normalized:
        if e in seen and e not in dups:
            dups.append(e)
        seen.add(e)
    return VisibleDevices(
        raw=raw,
        entries=tuple(entries),
        kinds=tuple(kinds),
        duplicates=tuple(dups),
        invalid=tuple(invalid),
        empty_entries=empty,
        notes=tuple(notes),
    )


def expected_cuda_count(gpus: list[Mapping[str, Any]], raw_visible: Optional[str]) -> Optional[int]:
    """How many devices CUDA should expose given CUDA_VISIBLE_DEVICES; None when it cannot be told."""
    visible = parse_visible_devices(raw_visible)
    if not visible.is_set:
        return len(gpus)
    count = 0
    uuids = [str(g.get("uuid") or "") for g in gpus]
    for entry, kind in zip(visible.entries, visible.kinds):
        if kind == "mig":
            return None
        if kind == "index":
            # str.isdigit() also accepts digits such as '²' that int() refuses: CUDA stops there too.
            if not entry.isdecimal() or int(entry) >= len(gpus):
                break  # CUDA stops at the first entry it cannot resolve
            count += 1
        elif kind == "uuid":
            if not any(u.startswith(entry) for u in uuids):
                break
            count += 1
    return count
