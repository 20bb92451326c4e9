"""The NCCL WARN catalogue: every WARN format string of NCCL 2.7 .. 2.28, with its mechanism class.

ddpdoctor/data/nccl_catalogue.json is generated from NCCL's sources by bench/explain_catalogue.py (its header
records the repository, the commit of each release and the date). An `NCCL WARN` line that no specific
signature claims is looked up here: its message is matched against the formats that start with the same
literal word (plus those that start with a placeholder), and the format with the most literal text wins.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

from ddpdoctor.explain.sources import compiled

CATALOGUE_SCHEMA = "ddpdoctor.explain.nccl_catalogue/1"
UNCLASSIFIED = "nccl.unclassified"
# Formats with fewer literal characters (`%s`, `%s: %s`) would claim any WARN line: never matched.
MIN_LITERAL = 10
# Only this much of a message is matched: the wildcards are bounded, and so is the text they run over.
MAX_MESSAGE = 600
_WARN = re.compile(r"\bNCCL WARN\s+|\.(?:cc|c|h|cu):\d+ WARN\s+")
_KEY = re.compile(r"[A-Za-z0-9_/]+")
_ENTRY_FIELDS = ("format", "regex", "key", "literal", "class", "rule", "path", "line", "first", "last")
_CLASS_FIELDS = ("title", "cause", "fix")


class CatalogueError(ValueError):
    """The catalogue file is malformed (a generation or packaging bug, caught by the tests)."""


@dataclass(frozen=True)
class CatalogueEntry:
    format: str
    pattern: str  # compiled on first use: most of the catalogue's ~1,100 regexes never run in one log
    key: str
    literal: int
    cls: str
    path: str
    line: int
    first: str
    last: str
    needle: str  # the longest literal run of the format: tested with `in` before the regex runs
    rule: str = ""  # the generator's rule that classed it ('' when unclassified)

    @property
    def regex(self) -> re.Pattern[str]:
        return compiled(self.pattern)

    def fields(self) -> dict[str, str]:
        """What an event records about the entry (evidence: where NCCL prints it, which releases)."""
        return {
            "nccl_class": self.cls,
            "nccl_rule": self.rule or "(none)",
            "nccl_format": self.format,
            "nccl_source": f"{self.path}:{self.line}",
            "nccl_releases": self.first if self.first == self.last else f"{self.first}-{self.last}",
        }


@dataclass(frozen=True)
class CatalogueClass:
    id: str
    title: str
    cause: str
    fix: str


@dataclass(frozen=True)
class Catalogue:
    classes: Mapping[str, CatalogueClass]
    buckets: Mapping[str, tuple[CatalogueEntry, ...]]  # leading literal word -> entries; '' = placeholder first
    entries: int
    coverage: Mapping[str, Any]
    provenance: Mapping[str, Any]

    def match(self, line: str) -> CatalogueEntry | None:
        """The catalogue entry whose format printed the WARN message in `line`, or None."""
        m = _WARN.search(line)
        if m is None:
            return None
        message = line[m.end() : m.end() + MAX_MESSAGE].rstrip()
        key = _KEY.match(message)
        cands = self.buckets.get(key.group(), ()) if key else ()
        best: CatalogueEntry | None = None
        for entry in (*cands, *self.buckets.get("", ())):
            if best is not None and entry.literal <= best.literal:
                continue
            if entry.needle not in message:
                continue
            if entry.regex.match(message):
                best = entry
        return best


def _needle(fmt: str) -> str:
    runs = re.split(r"%[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t|q)?[diouxXeEfFgGaAcspn%]", fmt)
    # Whitespace is matched loosely (\s+), so a needle never spans it.
    words = [w for run in runs for w in run.split()]
    return max(words, key=len) if words else ""


def parse_catalogue(doc: Mapping[str, Any]) -> Catalogue:
    """Validate and compile a catalogue document (the parsed JSON)."""
    if doc.get("schema") != CATALOGUE_SCHEMA:
        raise CatalogueError(f"unknown catalogue schema {doc.get('schema')!r}")
    prov = doc.get("provenance")
    if not isinstance(prov, dict) or not prov.get("repo") or not prov.get("releases"):
        raise CatalogueError("provenance needs repo and releases")
    for tag, commit in prov["releases"].items():
        if not re.fullmatch(r"[0-9a-f]{40}", str(commit)):
            raise CatalogueError(f"release {tag}: {commit!r} is not a commit id")
    cov = doc.get("coverage")
    if not isinstance(cov, dict) or not {"release", "warn_formats", "classified", "ratio"} <= set(cov):
        raise CatalogueError("coverage needs release, warn_formats, classified and ratio")
    classes: dict[str, CatalogueClass] = {}
    for cid, raw in doc.get("classes", {}).items():
        if not cid.startswith("nccl.") or any(not isinstance(raw.get(f), str) or not raw[f] for f in _CLASS_FIELDS):
            raise CatalogueError(f"class {cid!r} needs an nccl.* id, title, cause and fix")
        classes[cid] = CatalogueClass(cid, raw["title"], raw["cause"], raw["fix"])
    if UNCLASSIFIED not in classes:
        raise CatalogueError(f"class {UNCLASSIFIED} missing")
    buckets: dict[str, list[CatalogueEntry]] = {}
    count = 0
    for raw in doc.get("entries", []):
        missing = [f for f in _ENTRY_FIELDS if f not in raw]
        if missing:
            raise CatalogueError(f"entry {raw.get('format')!r}: missing {missing}")
        if raw["class"] not in classes:
            raise CatalogueError(f"entry {raw['format']!r}: unknown class {raw['class']!r}")
        if (raw["class"] == UNCLASSIFIED) != (not raw["rule"]):
            raise CatalogueError(f"entry {raw['format']!r}: a class needs the rule that assigned it, and only one")
        if not isinstance(raw["regex"], str) or not raw["regex"]:
            raise CatalogueError(f"entry {raw['format']!r}: no regex")
        count += 1
        if int(raw["literal"]) < MIN_LITERAL:
            continue
        entry = CatalogueEntry(
            format=raw["format"],
            pattern=raw["regex"],
            key=raw["key"],
            literal=int(raw["literal"]),
            cls=raw["class"],
            path=raw["path"],
            line=int(raw["line"]),
            first=raw["first"],
            last=raw["last"],
            needle=_needle(raw["format"]),
            rule=raw["rule"],
        )
        buckets.setdefault(entry.key, []).append(entry)
    return Catalogue(
        classes=classes,
        # Most literal text first: the first match in a bucket is that bucket's best.
        buckets={k: tuple(sorted(v, key=lambda e: -e.literal)) for k, v in buckets.items()},
        entries=count,
        coverage=dict(cov),
        provenance=dict(prov),
    )


@functools.lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    """The packaged catalogue, parsed and compiled once per process."""
    text = resources.files("ddpdoctor").joinpath("data", "nccl_catalogue.json").read_text(encoding="utf-8")
    return parse_catalogue(json.loads(text))


def class_signature_id(cls: str) -> str:
    """The explain signature id of a catalogue class: nccl.ib -> nccl.warn.ib."""
    return "nccl.warn." + cls.split(".", 1)[1]
