"""Align Flight Recorder dumps of several ranks by (process group, collective sequence id). Pure.

Every rank of a process group numbers its collectives 1, 2, 3, ... in issue order, so the same seq id
on two ranks must be the same collective. Three ways a job hangs show up here:

- behind: a rank's last enqueued seq is lower than its peers' (it never arrived at the collective
  they wait in);
- desync: at the same seq, ranks issued different ops, sizes or dtypes (if/else on rank, data-dependent
  control flow);
- extra: a rank issued one collective more than its peers (only some ranks issued it, e.g. inside
  `if rank == 0:`), visible when its next collective matches what the peers issued at that seq.

torch's own analyser (torchfrtrace) looks groups up by (name, ...) in pg_config and crashed with
KeyError ('0', 0) on real gloo dumps whose pg_config is keyed by ''; this module keys everything by the
pg id the entries carry and never assumes a dump is complete.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

from ddpdoctor.hang.fr import Dump, Entry


@dataclass(frozen=True)
class Divergence:
    kind: str  # behind | desync | extra
    pg: str
    pg_name: str
    seq: int
    culprits: tuple[int, ...]  # the rank(s) that differ from the rest ("" when it is a tie)
    others: tuple[int, ...]
    culprit_entry: Optional[Entry] = None  # what the culprit issued at seq (None when behind)
    other_entry: Optional[Entry] = None  # what the others issued at seq
    culprit_last: int = -1  # the culprit's last enqueued seq
    others_last: int = -1
    tie: bool = False  # as many ranks on each side: the dumps alone cannot say which side is wrong


@dataclass
class Alignment:
    ranks: tuple[int, ...]
    divergences: list[Divergence] = field(default_factory=list)
    last_enqueued: dict[str, dict[int, int]] = field(default_factory=dict)  # pg -> rank -> seq
    pending: dict[str, dict[int, Entry]] = field(default_factory=dict)  # pg -> rank -> last entry
    notes: list[str] = field(default_factory=list)

    def worst(self) -> Optional[Divergence]:
        """The divergence to report first: the earliest seq (the first thing that went wrong)."""
        order = {"extra": 0, "desync": 1, "behind": 2}
        if not self.divergences:
            return None
        return min(self.divergences, key=lambda d: (d.seq, order.get(d.kind, 9), d.pg))


def _describe_sizes(entry: Entry) -> str:
    return ",".join("x".join(str(d) for d in shape) or "scalar" for shape in entry.input_sizes) or "-"


def describe_entry(entry: Entry) -> str:
    """`all_reduce #4 (16, Float) at train.py:52`."""
    text = f"{entry.op} #{entry.seq}"
    if entry.input_sizes or entry.input_dtypes:
        text += f" ({_describe_sizes(entry)}, {','.join(entry.input_dtypes) or '-'})"
    frame = entry.user_frame()
    if frame is not None:
        text += f" at {frame.where()}"
    return text


def _last_enqueued(dump: Dump, pg: str, entries: dict[int, Entry]) -> int:
    status = dump.pg_status.get(pg)
    from_entries = max(entries, default=-1)
    if status is not None and status.last_enqueued >= 0:
        return max(status.last_enqueued, from_entries)
    return from_entries


def align_dumps(dumps: list[Dump]) -> Alignment:
    """Find the ranks behind, the desyncs and the extra collectives across per-rank dumps."""
    by_rank: dict[int, Dump] = {}
    notes: list[str] = []
    for index, dump in enumerate(dumps):
        rank = dump.rank if dump.rank is not None else index
        if rank in by_rank:
            notes.append(f"two dumps claim rank {rank} ({by_rank[rank].source}, {dump.source}); kept the first")
            continue
        by_rank[rank] = dump
    result = Alignment(ranks=tuple(sorted(by_rank)), notes=notes)
    # pg -> rank -> seq -> entry (collectives only: p2p ops have their own numbering per peer pair)
    table: dict[str, dict[int, dict[int, Entry]]] = defaultdict(lambda: defaultdict(dict))
    names: dict[str, str] = {}
    for rank, dump in by_rank.items():
        for entry in dump.entries:
            if entry.is_p2p or entry.seq < 0:
                continue
            table[entry.pg][rank][entry.seq] = entry
            if entry.pg_name:
                names.setdefault(entry.pg, entry.pg_name)
        for pg in dump.pg_status:
            table[pg].setdefault(rank, {})
    for pg in sorted(table, key=lambda p: (len(p), p)):
        per_rank = table[pg]
        last = {rank: _last_enqueued(by_rank[rank], pg, per_rank[rank]) for rank in per_rank}
        result.last_enqueued[pg] = last
        result.pending[pg] = {
            rank: per_rank[rank][last[rank]] for rank in per_rank if last[rank] in per_rank[rank]
        }
        result.divergences.extend(_judge_group(pg, names.get(pg, ""), per_rank, last))
    return result


def _split(groups: dict[object, list[int]]) -> tuple[list[int], list[int], bool]:
    """(minority ranks, majority ranks, tie) of a two-or-more-way split; largest group is the majority."""
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), min(ranks)))
    majority = ordered[0]
    minority = sorted(r for ranks in ordered[1:] for r in ranks)
    return minority, sorted(majority), len(ordered) > 1 and len(ordered[1]) == len(majority)


def _judge_group(
    pg: str, name: str, per_rank: dict[int, dict[int, Entry]], last: dict[int, int]
) -> list[Divergence]:
    out: list[Divergence] = []
    if len(per_rank) < 2:
        return out
    # 1. the first seq where ranks that recorded it disagree
    seqs = sorted({seq for entries in per_rank.values() for seq in entries})
    for seq in seqs:
        holders = {rank: entries[seq] for rank, entries in per_rank.items() if seq in entries}
        if len(holders) < 2:
            continue
        groups: dict[object, list[int]] = defaultdict(list)
        for rank, entry in holders.items():
            groups[entry.signature()].append(rank)
        if len(groups) == 1:
            continue
        minority, majority, tie = _split(groups)
        culprit_entry = holders[minority[0]]
        other_entry = holders[majority[0]]
        kind = "desync"
        # A culprit whose *next* collective is what the others issued here issued one extra collective.
        shifted = [per_rank[r].get(seq + 1) for r in minority]
        if all(e is not None and e.signature() == other_entry.signature() for e in shifted):
            kind = "extra"
        out.append(
            Divergence(
                kind=kind,
                pg=pg,
                pg_name=name,
                seq=seq,
                culprits=tuple(minority),
                others=tuple(majority),
                culprit_entry=culprit_entry,
                other_entry=other_entry,
                culprit_last=last[minority[0]],
                others_last=last[majority[0]],
                tie=tie,
            )
        )
        break
    # 2. ranks whose last enqueued seq is behind the most advanced one
    top = max(last.values())
    counts = Counter(last.values())
    behind = sorted(rank for rank, seq in last.items() if seq < top)
    if behind and not any(d.kind == "extra" for d in out):
        ahead = sorted(rank for rank, seq in last.items() if seq == top)
        # One rank ahead of many is the one that issued something extra, not the many being late.
        if len(ahead) == 1 and len(behind) > 1 and counts[top] == 1:
            stuck = per_rank[ahead[0]].get(top)
            out.append(
                Divergence(
                    kind="extra",
                    pg=pg,
                    pg_name=name,
                    seq=top,
                    culprits=tuple(ahead),
                    others=tuple(behind),
                    culprit_entry=stuck,
                    other_entry=None,
                    culprit_last=top,
                    others_last=max(last[r] for r in behind),
                )
            )
        else:
            lowest = min(last[r] for r in behind)
            out.append(
                Divergence(
                    kind="behind",
                    pg=pg,
                    pg_name=name,
                    seq=lowest + 1,
                    culprits=tuple(behind),
                    others=tuple(ahead),
                    culprit_entry=per_rank[behind[0]].get(last[behind[0]]),
                    other_entry=per_rank[ahead[0]].get(lowest + 1) or per_rank[ahead[0]].get(top),
                    culprit_last=lowest,
                    others_last=top,
                )
            )
    return out
