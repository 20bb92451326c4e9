"""The source catalogue: the messages PyTorch's c10d / elastic, gloo, NCCL's result codes and the CUDA runtime print,
each with its mechanism class.

ddpdoctor/data/torch_catalogue.json is generated from those projects' sources by
bench/explain_catalogue_torch.py (its provenance records each repository or package, commit and release). A
line that no specific signature claims is looked up here: the literal needles of the catalogue's messages are
found in the line with one trie regex, and the entries of the needles found are tried most-literal-first
against their matcher (literal text, with each message argument a bounded wildcard). PROBE_ANCHORS (and the
keywords of continuation lines) go into explain's keyword trie, so a line that holds a catalogued message but
no signature keyword is read.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

SOURCES_SCHEMA = "ddpdoctor.explain.torch_catalogue/1"
UNCLASSIFIED = "torch.unclassified"
SIGNATURE_PREFIX = "catalogue."
WARNING_SUFFIX = ".warning"
LEVELS = ("error", "warning")
ROLES = ("root", "symptom", "consequence")
# What a line holding a catalogued message almost always holds besides it, so that explain's prefilter reads the
# line: an exception or error word (`RuntimeError:`, `cudaErrorX`, `ERROR:`), a logger's level prefix (glog
# `[W1127 ...]` / `E0813 ...`, Python's `WARNING:`), or the component's name. One keyword per catalogue entry
# instead would cost every log's prefilter 15-25% for the few lines that hold none of these; continuation
# lines of multi-line messages still bring their own (`keyword` in the file).
PROBE_ANCHORS = ("Error", "ERROR", "Exception", "Warning", "WARNING", "[E", "[W", "E0", "E1", "W0", "W1",
                 "[c10d", "[enforce fail", "NCCL", "CUDA", "Cuda", "Gloo", "ProcessGroup", "TCPStore", "Timed out")
# Entries with fewer literal characters on their matched line would claim unrelated lines: never matched.
MIN_LITERAL = 16
# Only this much of a line is looked at, and only this many needle hits in it are followed: the work per
# line is bounded whatever the line holds.
MAX_MESSAGE = 2048
MAX_HITS = 32
_ENTRY_FIELDS = ("source", "repo", "kind", "level", "format", "match", "regex", "literal", "needle", "keyword",
                 "class", "rule", "path", "line", "commit", "first", "last")
_CLASS_FIELDS = ("role", "title", "cause", "fix")


@functools.cache
def compiled(pattern: str) -> re.Pattern[str]:
    # Bounded by the catalogue: one compiled matcher per entry ever tried.
    return re.compile(pattern)


class SourceCatalogueError(ValueError):
    """The catalogue file is malformed (a generation or packaging bug, caught by the tests)."""


@dataclass(frozen=True)
class SourceEntry:
    source: str  # pytorch, gloo, nccl, cuda
    repo: str
    kind: str  # the call that prints it: TORCH_CHECK, raise RuntimeError, GLOO_ENFORCE, cudaGetErrorString...
    format: str  # the whole message, {*} for each argument
    match: str  # the line of it that is matched
    pattern: str  # its matcher, compiled on first use (most entries are never tried in a given log)
    literal: int
    needle: str
    cls: str
    rule: str
    path: str
    line: int
    commit: str
    first: str
    last: str
    name: str = ""  # cudaError_t / ncclResult_t name, for result-code entries
    level: str = "error"  # "warning": printed by a warning call (TORCH_WARN, logger.warning): a hint, not a cause

    @property
    def regex(self) -> re.Pattern[str]:
        return compiled(self.pattern)

    @property
    def signature(self) -> str:
        """The explain signature this entry's lines are recorded under."""
        return signature_id(self.cls) + (WARNING_SUFFIX if self.level == "warning" else "")

    def fields(self) -> dict[str, str]:
        """What an event records about the entry (evidence: who prints it, where, which releases)."""
        out = {
            "catalogue_class": self.cls,
            "catalogue_rule": self.rule or "(none)",
            "catalogue_message": self.format,
            "catalogue_source": f"{self.repo} {self.path}:{self.line}",
            "catalogue_releases": self.first if self.first == self.last else f"{self.first}-{self.last}",
        }
        if self.commit:
            out["catalogue_commit"] = self.commit
        if self.name:
            out["catalogue_name"] = self.name
        return out

    def printed_by(self) -> str:
        """Who prints it, for the report: `pytorch/pytorch torch/csrc/.../socket.cpp:123 (2.7.0a0-2.13.0)`."""
        rel = self.first if self.first == self.last else f"{self.first}-{self.last}"
        what = f"{self.name} " if self.name else ""
        return f"{what}{self.repo} {self.path}:{self.line} ({rel})"


@dataclass(frozen=True)
class SourceClass:
    id: str
    role: str
    title: str
    cause: str
    fix: str


@dataclass(frozen=True)
class SourceCatalogue:
    classes: Mapping[str, SourceClass]
    by_needle: Mapping[str, tuple[SourceEntry, ...]]  # needle -> entries it may start, most literal first
    needles: tuple[str, ...]  # every needle: a trie of them is built and compiled on the first lookup
    keywords: tuple[str, ...]  # prefilter keywords: PROBE_ANCHORS and the continuation lines' own
    entries: int
    coverage: Mapping[str, Any]
    provenance: Mapping[str, Any]

    @functools.cached_property
    def _finder(self) -> re.Pattern[str] | None:
        return re.compile(trie_pattern(list(self.needles))) if self.needles else None

    def match(self, line: str) -> tuple[SourceEntry, re.Match[str]] | None:
        """The entry whose message `line` holds (the one with the most literal text), with its match."""
        finder = self._finder
        if finder is None:
            return None
        text = line[:MAX_MESSAGE]
        best: tuple[SourceEntry, re.Match[str]] | None = None
        seen: set[str] = set()
        search = finder.search
        m = search(text)
        hits = 0
        while m is not None and hits < MAX_HITS:
            hits += 1
            needle = m.group()
            if needle not in seen:
                seen.add(needle)
                for entry in self.by_needle.get(needle, ()):
                    if best is not None and entry.literal <= best[0].literal:
                        break
                    found = entry.regex.search(text)
                    if found:
                        best = (entry, found)
                        break
            m = search(text, m.start() + 1)
        return best


def trie_pattern(words: list[str]) -> str:
    """One regex matching any of `words`, factored as a trie (longest alternative first at each node)."""
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + build(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 and "" not in node else "(?:" + "|".join(alts) + ")"
        return body + "?" if "" in node else body

    return build(trie)


def signature_id(cls: str) -> str:
    """The explain signature id of a catalogue class: c10d.store -> catalogue.c10d.store."""
    return SIGNATURE_PREFIX + cls


def parse_sources(doc: Mapping[str, Any]) -> SourceCatalogue:
    """Validate and compile a source-catalogue document (the parsed JSON)."""
    if doc.get("schema") != SOURCES_SCHEMA:
        raise SourceCatalogueError(f"unknown catalogue schema {doc.get('schema')!r}")
    prov = doc.get("provenance")
    if not isinstance(prov, dict) or not all(isinstance(prov.get(s), dict) for s in ("pytorch", "gloo", "nccl", "cuda")):
        raise SourceCatalogueError("provenance needs pytorch, gloo, nccl and cuda")
    cov = doc.get("coverage")
    if not isinstance(cov, dict) or not all(
        isinstance(cov.get(s), dict) and {"messages", "matchable", "classified", "ratio"} <= set(cov[s])
        for s in ("pytorch", "gloo", "nccl", "cuda")
    ):
        raise SourceCatalogueError("coverage needs messages, matchable, classified and ratio per source")
    classes: dict[str, SourceClass] = {}
    for cid, raw in doc.get("classes", {}).items():
        if any(not isinstance(raw.get(f), str) or not raw[f] for f in _CLASS_FIELDS) or raw["role"] not in ROLES:
            raise SourceCatalogueError(f"class {cid!r} needs a role in {ROLES}, title, cause and fix")
        classes[cid] = SourceClass(cid, raw["role"], raw["title"], raw["cause"], raw["fix"])
    if UNCLASSIFIED not in classes:
        raise SourceCatalogueError(f"class {UNCLASSIFIED} missing")
    by_needle: dict[str, list[SourceEntry]] = {}
    keywords: set[str] = set()
    count = 0
    for raw in doc.get("entries", []):
        missing = [f for f in _ENTRY_FIELDS if f not in raw]
        if missing:
            raise SourceCatalogueError(f"entry {raw.get('format')!r}: missing {missing}")
        if raw["class"] not in classes:
            raise SourceCatalogueError(f"entry {raw['format']!r}: unknown class {raw['class']!r}")
        if raw["level"] not in LEVELS:
            raise SourceCatalogueError(f"entry {raw['format']!r}: level {raw['level']!r} not in {LEVELS}")
        if (raw["class"] == UNCLASSIFIED) != (not raw["rule"]):
            raise SourceCatalogueError(f"entry {raw['format']!r}: a class needs the rule that assigned it")
        count += 1
        if int(raw["literal"]) < MIN_LITERAL or not raw["needle"]:
            continue
        if not isinstance(raw["regex"], str) or not raw["regex"]:
            raise SourceCatalogueError(f"entry {raw['format']!r}: no matcher")
        if raw["needle"] not in raw["match"].replace("{*}", "\0") and raw["needle"] not in re.sub(
            r"\s+", " ", raw["match"]
        ):
            raise SourceCatalogueError(f"entry {raw['format']!r}: needle {raw['needle']!r} is not in its text")
        entry = SourceEntry(
            source=raw["source"], repo=raw["repo"], kind=raw["kind"], format=raw["format"], match=raw["match"],
            pattern=raw["regex"], literal=int(raw["literal"]), needle=raw["needle"], cls=raw["class"], rule=raw["rule"],
            path=raw["path"], line=int(raw["line"]), commit=raw["commit"], first=raw["first"], last=raw["last"],
            name=raw.get("name", ""),
            level=raw["level"],
        )
        by_needle.setdefault(entry.needle, []).append(entry)
        if raw["keyword"]:
            keywords.add(raw["keyword"])
    # The trie finds the longest needle at a position: a needle that is a prefix of another is looked up with it.
    needles = sorted(by_needle)
    closed: dict[str, list[SourceEntry]] = {}
    for n in needles:
        lst = list(by_needle[n])
        for k in range(1, len(n)):
            lst += by_needle.get(n[:k], [])
        closed[n] = sorted(set(lst), key=lambda e: (-e.literal, e.source, e.path, e.line))
    return SourceCatalogue(
        classes=classes,
        by_needle={k: tuple(v) for k, v in closed.items()},
        needles=tuple(needles),
        keywords=tuple(sorted(keywords | set(PROBE_ANCHORS))),
        entries=count,
        coverage=dict(cov),
        provenance=dict(prov),
    )


@functools.lru_cache(maxsize=1)
def load_sources() -> SourceCatalogue:
    """The packaged source catalogue, parsed and compiled once per process."""
    text = resources.files("ddpdoctor").joinpath("data", "torch_catalogue.json").read_text(encoding="utf-8")
    return parse_sources(json.loads(text))
