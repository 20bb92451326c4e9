"""Which Flight Recorder dumps may speak about the live job. Pure: facts in, the dumps kept and why the
others were left out.

A dump is a file: it outlives its job. Yesterday's dumps of another script, left in the folder the
job's TORCH_FR_DUMP_TEMP_FILE names, or `--fr` pointing at another job's, would otherwise produce a
confident verdict about lines the live ranks never run. A dump is left out (and named) when:

- it is older than the live ranks (written before the oldest of them started);
- its frames name files none of the live ranks' stacks are in (another script).

Partial dumps (`*.tmp`) are never read (probe_io). Ranks of the job with no dump are named, so that
"all ranks agree" is never said of some of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ddpdoctor.hang.findings import HangFacts
from ddpdoctor.hang.fr import Dump

# A dump written this many seconds before the oldest rank started is from an earlier run (file times
# and process start times come from different clocks' roundings).
START_SLACK_S = 2.0


@dataclass
class DumpVetting:
    kept: list[Dump] = field(default_factory=list)
    ignored: list[dict[str, Any]] = field(default_factory=list)  # {"file", "rank", "why"}
    ranks_without_dump: list[int] = field(default_factory=list)

    def notes(self) -> list[str]:
        """One phrase per left-out dump and for the ranks without one (for the finding's summary)."""
        out = [f"ignored {item['file']}: {item['why']}" for item in self.ignored[:6]]
        if len(self.ignored) > 6:
            out.append(f"{len(self.ignored) - 6} more dump(s) ignored")
        return out


def _live_files(facts: HangFacts) -> set[str]:
    """Every file any thread of any live rank has a frame in."""
    files = set()
    for stack in facts.stacks:
        for thread in stack.threads:
            files.update(frame.filename for frame in thread.frames)
    return files


def _dump_user_files(dump: Dump) -> set[str]:
    return {frame.filename for entry in dump.entries for frame in entry.frames if frame.is_user}


def vet_dumps(facts: HangFacts) -> DumpVetting:
    """Keep the dumps that belong to the live job; name the others and the ranks left without one."""
    out = DumpVetting()
    live = _live_files(facts)
    started: Optional[float] = min(facts.rank_start.values()) if facts.rank_start else None
    for dump in facts.dumps:
        mtime = facts.dump_mtimes.get(dump.source)
        why = ""
        if started is not None and mtime is not None and mtime < started - START_SLACK_S:
            why = (
                f"written {started - mtime:.0f}s before the live ranks started (a dump of an earlier run)"
            )
        elif live:
            files = _dump_user_files(dump)
            if files and not files & live:
                sample = sorted(files)[0]
                why = f"its frames are in {sample}, which no live rank runs (a dump of another script)"
        if why:
            out.ignored.append({"file": dump.source, "rank": dump.rank, "why": why})
        else:
            out.kept.append(dump)
    if facts.job is not None and (out.kept or out.ignored):
        dumped = {d.rank for d in out.kept}
        live_ranks = sorted(w.rank for w in facts.job.workers if w.rank is not None)
        out.ranks_without_dump = [r for r in live_ranks if r not in dumped]
    return out
