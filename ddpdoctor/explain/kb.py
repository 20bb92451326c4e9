"""The knowledge base of `ddpdoctor explain`: failure signatures loaded once from ddpdoctor/data/signatures.json.

A signature has literal `keywords` (case-sensitive, for the prefilter) and regex `patterns` (case-insensitive,
run only on lines the prefilter let through). The format is documented in docs/explain.md.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Mapping

from ddpdoctor.core.model import Severity
from ddpdoctor.explain.catalogue import UNCLASSIFIED, Catalogue, class_signature_id, load_catalogue
from ddpdoctor.explain.sources import UNCLASSIFIED as SOURCES_UNCLASSIFIED
from ddpdoctor.explain.sources import WARNING_SUFFIX, SourceCatalogue, load_sources, signature_id

KB_SCHEMA = "ddpdoctor.explain.signatures/1"
ROLES = ("root", "symptom", "consequence", "hint", "context")
# A keyword must not start with one of these bytes. The prefilter is one regex (a trie of all keywords);
# Python's regex engine skips ahead using the set of first characters, so keywords that start with a
# common lowercase letter, a digit, a space or '-'/'_' would make it test a large share of the bytes of a
# 1 GB log. A keyword is any substring of the message, so pick one starting at a rare byte (an upper-case
# letter, or j, q, x, z: "zed arguments: --local" for "unrecognized arguments: --local-rank").
_SLOW_FIRST_BYTES = frozenset(b"abcdefghiklmnoprstuvwy0123456789 \t-_:.,/")


@functools.cache
def _compiled_patterns(texts: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.IGNORECASE | re.MULTILINE) for p in texts)


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    component: str
    role: str
    severity: Severity
    precedence: int
    fallback: bool
    context_lines: int
    keywords: tuple[str, ...]
    # The patterns' text; `patterns` compiles them on first use (most signatures never reach a full match in
    # one log, and compiling all of them cost a sixth of a second at every start).
    pattern_texts: tuple[str, ...]
    cause: str
    fix: str
    references: tuple[str, ...]
    # A hint that, with no root cause, is the best lead: it names a misconfiguration that explains failures
    # (torchrun ignoring --master_addr), unlike hints that are usually harmless (no IB device on one node).
    lead: bool = False
    # Broader signatures this one refines: where both match one line, only this one is recorded (a
    # "Cuda failure" printed from transport/nvls.cc is an NVLS setup failure, not just a CUDA call failure).
    refines: tuple[str, ...] = ()
    # Also tried on C++ stack-frame lines (`frame #N:`, `Exception raised from`), which other signatures never
    # see: a backtrace alone (the watchdog's checkTimeout frames) says which code raised, and that it failed.
    frames: bool = False
    # A context line whose repeats need not be matched again: reasoning reads only which processes print it
    # and where first (an 'NCCL version' line, a semaphore frame), not every occurrence.
    presence_only: bool = False
    # Past this many lines in one input (0: never), the signature's own keywords leave the prefilter: a line
    # printed many times per run (NCCL's `Channel ... via P2P/IPC`, once per channel and peer at every
    # communicator init) would otherwise cost a Python step per line; at the input's end its last two lines are
    # still looked at (where a log ends on it).
    quota: int = 0

    @property
    def cacheable(self) -> bool:
        """A repeat of a line this signature matched may be counted without matching it again; not a
        context line (it maps pids to ranks, and every process's line is needed) unless only its presence matters. The first few occurrences
        of each shape (per rank) are always matched in full, so the first watchdog timeout of each rank is
        kept; a cached line that opens torchrun's summary still starts reading it."""
        return self.role != "context" or self.presence_only

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "component": self.component,
            "role": self.role,
            "severity": self.severity.label,
            "cause": self.cause,
            "fix": self.fix,
            "references": list(self.references),
        }

    @property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        return _compiled_patterns(self.pattern_texts)


@dataclass(frozen=True)
class DiagnosisSpec:
    """A diagnosis that reasoning derives from several events (e.g. SeqNum differing across ranks)."""

    id: str
    title: str
    severity: Severity
    cause: str
    fix: str
    references: tuple[str, ...]


# id(KnowledgeBase) -> (it, its prefilter without the quota keywords): compiled on first need only.
_SPARSE: dict[int, tuple[Any, re.Pattern[bytes]]] = {}


@dataclass(frozen=True)
class KnowledgeBase:
    signatures: tuple[Signature, ...]
    diagnoses: Mapping[str, DiagnosisSpec]
    prefilter: re.Pattern[bytes]
    # Each distinct keyword and the indexes of the signatures that list it or a keyword inside it.
    keyword_sigs: Mapping[bytes, tuple[int, ...]]
    max_keyword_len: int
    by_id: Mapping[str, Signature] = field(default_factory=dict)
    # NCCL WARN formats by mechanism class; its class signatures (nccl.warn.<class>) are in by_id only:
    # they are never prefiltered, a line the generic nccl.warn matched is looked up in the catalogue.
    catalogue: Catalogue | None = None
    # The messages of c10d / gloo / elastic / NCCL result codes / CUDA errors by mechanism class; its class
    # signatures (catalogue.<class>) are in by_id only. Its prefilter keywords belong to SOURCES_PROBE.
    sources: SourceCatalogue | None = None
    # Every prefilter literal, and those that belong only to signatures with a quota (Signature.quota).
    literals: tuple[bytes, ...] = ()
    quota_literals: frozenset[bytes] = frozenset()

    def prefilter_without_quota(self) -> re.Pattern[bytes]:
        """The prefilter without the quota signatures' own keywords (compiled once, when first needed)."""
        cached = _SPARSE.get(id(self))
        if cached is None or cached[0] is not self:
            pattern = re.compile(trie_regex([lit for lit in self.literals if lit not in self.quota_literals],
                                            PREFILTER_GUARDS))
            _SPARSE[id(self)] = cached = (self, pattern)
        return cached[1]

    @property
    def probe_index(self) -> int:
        """The candidate index of the source catalogue's keywords (one past the last signature)."""
        return len(self.signatures)

    def candidates(self, line: bytes) -> list[int]:
        """Indexes of signatures worth testing on `line` (one of their keywords occurs in it), in KB order."""
        found: set[int] = set()
        search = self.prefilter.search
        m = search(line)
        while m is not None:
            # The trie returns the longest keyword at a position; keyword_sigs also lists the signatures of
            # every keyword inside it. Restarting one byte later finds keywords that start inside a match.
            found.update(self.keyword_sigs[m.group()])
            m = search(line, m.start() + 1)
        return sorted(found)


class KnowledgeBaseError(ValueError):
    """The signatures file is malformed (a packaging or editing bug, caught by the tests)."""


def trie_regex(words: list[bytes], guards: Mapping[bytes, bytes] | None = None) -> bytes:
    """One regex matching any of `words`, factored as a trie so each position is tested once per branch.
    `guards`: a word -> a lookahead that must hold where a match ends on that word (and no longer word
    continues it): `NCCL` not followed by ` INFO`."""
    trie: dict[int, Any] = {}
    end = -1
    for w in words:
        node = trie
        for byte in w:
            node = node.setdefault(byte, {})
        node[end] = {}
    guards = guards or {}

    def build(node: dict[int, Any], path: bytes) -> bytes:
        alts = [re.escape(bytes([b])) + build(sub, path + bytes([b])) for b, sub in sorted(node.items()) if b != end]
        guard = guards.get(path) if end in node else None
        if not alts:
            return guard or b""
        if len(alts) == 1 and end not in node:
            return alts[0]
        body = b"(?:" + b"|".join(alts) + (b"|" + guard if guard else b"") + b")"
        return body + b"?" if end in node and not guard else body

    return build(trie, b"")


# Probe anchors too common to be worth a look on their own in some lines: NCCL's own INFO chatter (hundreds of
# `NCCL INFO Channel ...` lines per communicator) holds no message of the source catalogue, and a bare
# `NCCL` anchor made every such line a hit (bench/bench_explain.py's ordinary log at 10 MB/s).
PREFILTER_GUARDS: Mapping[bytes, bytes] = {b"NCCL": rb"(?! INFO)"}


# Catalogue classes that NCCL prints after another rank or the communicator failed: what a rank sees, not
# why (never a root cause).
_CATALOGUE_SYMPTOMS = frozenset({"nccl.peer_failure"})


def catalogue_signatures(catalogue: Catalogue) -> list[Signature]:
    """One signature per catalogue class (nccl.unclassified stays the generic nccl.warn)."""
    repo = str(catalogue.provenance.get("repo", "NVIDIA/nccl")).removeprefix("https://github.com/")
    return [
        Signature(
            id=class_signature_id(c.id),
            title=c.title,
            component="NCCL",
            role="symptom" if c.id in _CATALOGUE_SYMPTOMS else "root",
            severity=Severity.WARN,
            precedence=2,  # a WARN: the earliest explains a later NCCL error, a specific signature outranks it
            fallback=True,
            context_lines=0,
            keywords=(),
            pattern_texts=(),
            cause=c.cause,
            fix=c.fix,
            references=(repo,),
        )
        for c in catalogue.classes.values()
        if c.id != UNCLASSIFIED
    ]


# The signature that carries the source catalogue's keywords into the prefilter. It never matches by itself:
# a line it lets through is looked up in the catalogue when no specific signature claims it.
SOURCES_PROBE = "catalogue.probe"
_SOURCE_COMPONENTS = {"c10d": "PyTorch distributed", "gloo": "gloo", "ncclres": "NCCL", "cuda": "CUDA"}


def source_signatures(sources: SourceCatalogue) -> list[Signature]:
    """Two signatures per source-catalogue class: its errors (the class's role), and its warnings (a hint: the
    program went on after printing it). The unclassified class has none: such a line keeps whatever generic
    signature claimed it."""
    return [
        Signature(
            id=signature_id(c.id) + (WARNING_SUFFIX if warning else ""),
            title=c.title + (" (warning)" if warning else ""),
            component=_SOURCE_COMPONENTS.get(c.id.split(".", 1)[0], "PyTorch distributed"),
            role="hint" if warning else c.role,
            severity=Severity.INFO if warning else Severity.ERROR if c.role == "root" else Severity.WARN,
            precedence=2,  # like a catalogued NCCL WARN: a specific signature outranks it
            fallback=True,
            context_lines=0,
            keywords=(),
            pattern_texts=(),
            cause=c.cause,
            fix=c.fix,
            references=_source_references(sources, c.id),
        )
        for c in sources.classes.values()
        for warning in (False, True)
        if c.id != SOURCES_UNCLASSIFIED
    ]


def _source_references(sources: SourceCatalogue, cls: str) -> tuple[str, ...]:
    kind = cls.split(".", 1)[0]
    src = {"c10d": "pytorch", "gloo": "gloo", "ncclres": "nccl", "cuda": "cuda"}.get(kind, "pytorch")
    repo = sources.provenance.get(src, {}).get("repo", "")
    return (str(repo),) if repo else ()


def _probe(sources: SourceCatalogue) -> Signature:
    return Signature(
        id=SOURCES_PROBE,
        title="Message from the source catalogue",
        component="PyTorch distributed",
        role="context",
        severity=Severity.INFO,
        precedence=9,
        fallback=True,
        context_lines=0,
        keywords=sources.keywords,
        pattern_texts=(),
        cause="The line holds a message PyTorch distributed, gloo, NCCL or CUDA prints; it is looked up in the "
        "source catalogue when no specific signature claims it.",
        fix="See the class the catalogue names.",
        references=tuple(str(p["repo"]) for p in sources.provenance.values() if isinstance(p, dict) and "repo" in p),
    )


def parse_knowledge_base(
    doc: Mapping[str, Any], catalogue: Catalogue | None = None, sources: SourceCatalogue | None = None,
    compile_patterns: bool = True,
) -> KnowledgeBase:
    """Validate and compile a signatures document (the parsed JSON), with the NCCL WARN catalogue and the
    source catalogue. `compile_patterns=False` leaves the patterns to compile on first use: the packaged
    knowledge base, whose every pattern the tests compile (test_explain_signatures)."""
    if doc.get("schema") != KB_SCHEMA:
        raise KnowledgeBaseError(f"unknown knowledge-base schema {doc.get('schema')!r}")
    sigs: list[Signature] = []
    for raw in doc.get("signatures", []):
        sid = raw.get("id", "?")
        try:
            role = raw["role"]
            if role not in ROLES:
                raise KnowledgeBaseError(f"{sid}: role {role!r} not in {ROLES}")
            keywords = tuple(raw["keywords"])
            if not keywords or not raw["patterns"]:
                raise KnowledgeBaseError(f"{sid}: needs keywords and patterns")
            for kw in keywords:
                if kw.encode()[0] in _SLOW_FIRST_BYTES:
                    raise KnowledgeBaseError(f"{sid}: keyword {kw!r} starts with a slow first byte")
            patterns = tuple(str(p) for p in raw["patterns"])
            if compile_patterns:
                _compiled_patterns(patterns)  # re.error is a KnowledgeBaseError below
            sigs.append(
                Signature(
                    id=sid,
                    title=raw["title"],
                    component=raw["component"],
                    role=role,
                    severity=Severity.parse(raw["severity"]),
                    precedence=int(raw.get("precedence", 1)),
                    fallback=bool(raw.get("fallback", False)),
                    context_lines=int(raw.get("context_lines", 0)),
                    keywords=keywords,
                    pattern_texts=patterns,
                    cause=raw["cause"],
                    fix=raw["fix"],
                    references=tuple(raw.get("references", [])),
                    lead=bool(raw.get("lead", False)),
                    refines=tuple(raw.get("refines", [])),
                    frames=bool(raw.get("frames", False)),
                    presence_only=bool(raw.get("presence_only", False)),
                    quota=int(raw.get("quota", 0)),
                )
            )
        except (KeyError, TypeError, re.error) as exc:
            raise KnowledgeBaseError(f"signature {sid}: {exc}") from exc
    ids = [s.id for s in sigs]
    if len(ids) != len(set(ids)):
        raise KnowledgeBaseError("duplicate signature ids")
    for s in sigs:
        unknown = set(s.refines) - set(ids) - {s.id}
        if unknown or s.id in s.refines:
            raise KnowledgeBaseError(f"{s.id}: refines unknown or itself: {sorted(unknown) or s.id}")
    diagnoses = {
        d["id"]: DiagnosisSpec(
            id=d["id"],
            title=d["title"],
            severity=Severity.parse(d["severity"]),
            cause=d["cause"],
            fix=d["fix"],
            references=tuple(d.get("references", [])),
        )
        for d in doc.get("diagnoses", [])
    }
    probe = _probe(sources) if sources is not None and sources.keywords else None
    literals = sorted({kw.encode() for s in sigs for kw in s.keywords})
    by_keyword: dict[bytes, list[int]] = {}
    for i, sig in enumerate(sigs):
        for k in sig.keywords:
            by_keyword.setdefault(k.encode(), []).append(i)
    keyword_sigs: dict[bytes, tuple[int, ...]] = {
        lit: tuple(sorted({i for k, ids in by_keyword.items() if k in lit for i in ids})) for lit in literals
    }
    if probe is not None:
        # The probe's keywords are many: a keyword inside a longer one is found by the prefilter's restart one
        # byte later, except at the same start, so only prefixes need adding. The probe is candidate index
        # len(signatures): it is not one of the knowledge base's signatures (it never matches by itself).
        probe_kw = {k.encode() for k in probe.keywords}
        own = re.compile(trie_regex(literals))
        for kw in sorted(probe_kw - set(literals)):
            # The signatures' keywords inside this one, found as candidates() finds them in a line.
            found: set[int] = set()
            m = own.search(kw)
            while m is not None:
                found.update(keyword_sigs[m.group()])
                m = own.search(kw, m.start() + 1)
            keyword_sigs[kw] = tuple(sorted(found))
        literals = sorted(set(literals) | probe_kw)
        index = len(sigs)
        for lit in literals:
            if any(lit[:n] in probe_kw for n in range(1, len(lit) + 1)):
                keyword_sigs[lit] = (*keyword_sigs[lit], index)
    others = {kw.encode() for s in sigs if not s.quota for kw in s.keywords}
    quota_only = frozenset(kw.encode() for s in sigs if s.quota for kw in s.keywords) - others - (
        {k.encode() for k in probe.keywords} if probe is not None else set())
    return KnowledgeBase(
        literals=tuple(literals),
        quota_literals=quota_only,
        signatures=tuple(sigs),
        diagnoses=diagnoses,
        prefilter=re.compile(trie_regex(literals, PREFILTER_GUARDS)),
        keyword_sigs=keyword_sigs,
        max_keyword_len=max(len(lit) for lit in literals),
        by_id={
            s.id: s
            for s in [
                *sigs,
                *(catalogue_signatures(catalogue) if catalogue else []),
                *(source_signatures(sources) if sources else []),
                *([probe] if probe else []),
            ]
        },
        catalogue=catalogue,
        sources=sources,
    )


@functools.lru_cache(maxsize=1)
def load_knowledge_base() -> KnowledgeBase:
    """The packaged knowledge base, parsed and compiled once per process."""
    text = resources.files("ddpdoctor").joinpath("data", "signatures.json").read_text(encoding="utf-8")
    return parse_knowledge_base(json.loads(text), load_catalogue(), load_sources(), compile_patterns=False)
