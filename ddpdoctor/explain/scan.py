"""Streaming scanner: log bytes in, recognised events out, in bounded memory.

Input is read in chunks and never decoded as a whole. One prefilter regex (a trie of every signature
keyword) runs over each chunk in C; only the few lines it hits are decoded (UTF-8, invalid bytes replaced),
normalised and tested against the signatures' regexes. A line longer than MAX_LINE is never held whole:
it is scanned in windows and its matches are kept as excerpts.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterable, Optional

from ddpdoctor.explain.catalogue import class_signature_id
from ddpdoctor.explain.kb import KnowledgeBase, Signature
from ddpdoctor.explain.normalize import LineInfo, normalize_line, parse_timestamp
from ddpdoctor.explain.sources import SIGNATURE_PREFIX, WARNING_SUFFIX, signature_id
from ddpdoctor.parsers.numbers import parse_int
from ddpdoctor.parsers.pytraceback import FRAME_PATTERN

STATED_CAUSE = "message.stated_cause"
# Generic signatures a source-catalogue class replaces on the same line: it says more than they do (failure.unrecognised
# stays: it is what marks a failed run whose cause is not named).
# A line its logger printed as a warning (glog `[W...]` / `W0920 ...`, Python's `WARNING:`): whatever call built
# the message (socket.cpp's connect errors are kept, and logged as warnings while c10d retries), the program went on.
_WARNING_LINE = re.compile(r"^\s*(?:\[[^\]\n]{0,40}\]:?\s*)?(?:\[W[ \d]|W\d{4} |WARNING\b|\[WARNING\])")
_GENERIC_FOR_SOURCES = frozenset({"python.exception", "nccl.warn"})
CHUNK_SIZE = 1 << 20
MAX_LINE = 64 << 10  # a line longer than this is scanned in windows, never held whole
WINDOW = 2048  # bytes kept around a match in an over-long line
HEAD = 256  # bytes kept from the start of an over-long line (its prefixes)
SOURCE_TRIES_PER_LINE = 4  # windows of one over-long line looked up in the source catalogue
WINDOW_RETRIES = 8  # windows of one line with the same candidate signatures run in full, then skipped
# Windows read in one over-long line (about 4 MiB of it around keywords): the work per line is bounded,
# a 1 GB single line costs what 4 MiB does. What lies beyond is said (`windows_capped`), never silent.
MAX_WINDOWS_PER_LINE = 2048
MAX_TEXT = 400  # characters of a line kept as evidence
EVENTS_PER_KEY = 3  # events kept per (signature, file, rank/pid attribution); the rest are only counted
KEYS_PER_SIGNATURE = 128
MAX_SUMMARY = 512  # torchrun failure-summary entries kept (a log of many restarts repeats the block)
# Line shapes: a hit line with its digits zeroed except in its first WHO_BYTES bytes, which keep who printed
# it ([rank12]:, [default3]:, a short host:pid). Once a shape has been fully matched SHAPE_FULL times with
# the same result, further lines of that shape are only counted: dense logs repeat a few shapes millions of
# times, and full matching costs ~40 us a line.
WHO_BYTES = 12
TAIL_BYTES = 4096  # of each input's end, kept for the quota signatures' last look (Signature.quota)
SHAPE_FULL = EVENTS_PER_KEY + 1
MAX_SHAPES = 4096  # per input; past this, new shapes are matched in full (memory stays bounded)
MAX_SHAPE_LEN = 1024  # longer lines are never cached
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
# Lines joined before matching: a hit line that visibly continues (an unclosed `WorkNCCL(`, a trailing
# `Last error:`, gloo's `[enforce fail at file.cc:N]` with its text on the next line, NCCL's interface list
# wrapped one interface per line) takes up to
# JOIN_LINES following lines, JOIN_BYTES in all, from the same buffer (a continuation cut off by a read
# chunk's end is not joined: the chunks are 1 MiB, so that is rare, and the work per line stays bounded).
JOIN_LINES = 3
JOIN_BYTES = 2048
_GLOO_LOC_END = re.compile(rb"\[(?:enforce fail at )?[^\[\]\s]{1,300}\.(?:cc|cpp|h):\d+\]$")
_CONT_PREFIX = re.compile(rb"(?:\[(?:rank|default) ?\d+\]: ?|\d{1,5}: )*")
# NCCL's interface list (`NET/Socket : Using [0]eth0:10.0.0.1<0> [1]...`), cut after `Using` or after an entry
# when a terminal or a paste wrapped it one interface per line.
_IFACE_LIST_END = re.compile(rb"(?:NET/Socket|Bootstrap) ?: Using(?:\s*\[\d+\][^\s<]+<\d+>)*$")
_IFACE_ENTRY = re.compile(rb"\[\d+\][^\s<]+<\d+>")


def _shape_key(buf: bytes, ls: int, le: int) -> bytes:
    """The shape of the line buf[ls:le]: its first WHO_BYTES bytes as they are, the rest with digits
    zeroed, plus the rank it names further in (`[rank7]:` behind a timestamp, `[Rank 7]`), so that
    every rank's first lines are still matched in full."""
    cut = ls + WHO_BYTES
    key = buf[ls:cut] + buf[cut:le].translate(_DIGITS_TO_ZERO)
    if buf.find(b"ank", ls, cut) >= 0:
        return key  # [rankN]: is in the kept prefix
    at = buf.find(b"ank", cut, min(le, ls + 160))
    return key + b"\0" + buf[at : at + 8] if at >= 0 else key


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Any line of torchrun's failure summary block has one of these; the first line without one ends the block
# (so a ChildFailedError line without its block does not send 40 ordinary lines down the slow path).
_SUMMARY_SHAPE = re.compile(
    rb"====|----|FAILED|Failures:|Root Cause|<NO_OTHER_FAILURES>|\[\d+\]:|"
    rb"(?:time|host|rank|exitcode|error_file|traceback) *:|^[ \t\r]*$",
    re.MULTILINE,
)
# A tqdm-style progress bar (` 99%|#########9| 9990/10000 [29:55<00:01, 5.57it/s]`) glued in front of a
# matched line: its elapsed time says how long the process printing it had been busy.
_PROGRESS = re.compile(rb"(\d{1,3})%\|[^|\n]{0,120}\| *\d+/\d+ *\[(?:(\d{1,3}):)?(\d{1,2}):(\d\d)<")
# The same bar cut off mid-draw by the matched line (`...corrupt:   6%|▋ [E ProcessGroupNCCL.cpp:414] ...`):
# no elapsed time, but the step it draws had not finished when another process of the job printed the hit.
_OPEN_BAR = re.compile(rb"(\d{1,3})%\|[^|\n\r]{0,160}$")
_SUMMARY_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*?)\s*$")
_SUMMARY_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_SUMMARY_RANK = re.compile(r"(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_SUMMARY_EXIT = re.compile(r"(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")


BAR_LINES_BEFORE = 3  # lines before a hit line in which a progress bar still counts as "just before" it
BAR_LOOKBACK = 1024  # bytes looked at before a hit line for those lines


# A Python traceback's frame line (`  File "/x/y.py", line 12, in step`), possibly behind a rank prefix.
_PY_FRAME = re.compile(FRAME_PATTERN.encode())
FRAME_LINES_BEFORE = 8  # lines before an exception line searched for its innermost frame (code, ^^^ markers)
FRAME_LOOKBACK = 4096


def _raising_frame(buf: bytes, ls: int) -> tuple[str, str, str] | None:
    """The innermost traceback frame (file, line, function) printed in the few lines before the line starting
    at `ls`, or None: an exception line's last `File "..."` frame says where it was raised."""
    start = max(0, ls - FRAME_LOOKBACK)
    if ls <= 0 or buf.find(b'File "', start, ls) < 0:
        return None
    cut = ls - 1
    for _ in range(FRAME_LINES_BEFORE):
        prev = buf.rfind(b"\n", start, cut)
        m = _PY_FRAME.search(buf, prev + 1 if prev >= 0 else start, cut)
        if m:
            return tuple(g.decode("utf-8", "replace") for g in m.groups())  # type: ignore[return-value]
        if prev < 0:
            return None
        cut = prev
    return None


def _lines_before(buf: bytes, ls: int) -> bytes:
    """The last BAR_LINES_BEFORE lines before the line starting at `ls` (within BAR_LOOKBACK bytes of the
    same buffer), or b"" when none holds a progress bar's `%|`: a bar redrawn on its own lines (tqdm to a
    file) right before a timeout says what the process was busy with."""
    start = max(0, ls - BAR_LOOKBACK)
    if ls <= 0 or buf.find(b"%|", start, ls) < 0:
        return b""
    cut = ls - 1
    for _ in range(BAR_LINES_BEFORE):
        prev = buf.rfind(b"\n", start, cut)
        if prev < 0:
            cut = start
            break
        cut = prev
    return buf[cut:ls]


def _continues(raw: bytes) -> bool:
    """Does this line visibly go on on the next one?"""
    tail = raw.rstrip()
    if tail.endswith(b"Last error:"):
        return True
    if b"WorkNCCL(" in raw and raw.count(b"(") > raw.count(b")"):
        return True
    if b": Using" in raw and _IFACE_LIST_END.search(tail):
        return True
    return tail.endswith(b"]") and _GLOO_LOC_END.search(tail, max(0, len(tail) - 320)) is not None


@dataclass
class Event:
    """One recognised line."""

    sig: str
    file: str
    file_index: int
    line: int
    text: str  # the raw line (excerpt), for evidence
    rank: int | None = None
    local_rank: int | None = None
    pg_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    ts: float | None = None
    fields: dict[str, str] = field(default_factory=dict)


@dataclass
class InputStats:
    name: str
    bytes: int = 0
    lines: int = 0
    long_lines: int = 0  # lines longer than MAX_LINE, scanned in windows
    windows_capped: int = 0  # over-long lines read only up to MAX_WINDOWS_PER_LINE windows
    error: str | None = None
    # presence-only signature id -> the last line it was seen on, counted repeats included (where a log ends
    # on NCCL's P2P setup is read from it: the repeats themselves are not matched again)
    last_lines: dict[str, int] = field(default_factory=dict)


@dataclass
class SummaryEntry:
    """One worker in torchrun's failure summary (Root Cause / Failures block)."""

    file_index: int
    line: int
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    exitcode: int | None = None
    pid: int | None = None
    ts: float | None = None
    traceback: str = ""
    root: bool = False  # listed under "Root Cause (first observed failure)"


class Collector:
    """Events from every input, bounded: the first few per signature and attribution, all counted."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.counts: Counter[str] = Counter()
        self.summary: list[SummaryEntry] = []
        self.summary_dropped = 0
        self._kept: dict[tuple[Any, ...], int] = {}
        self._keys_per_sig: Counter[str] = Counter()

    @property
    def summary_full(self) -> bool:
        """Enough failure-summary entries kept: later summary blocks (restarts) are not read."""
        return len(self.summary) >= MAX_SUMMARY

    def add(self, ev: Event) -> None:
        self.counts[ev.sig] += 1
        key = (ev.sig, ev.file_index, ev.rank, ev.local_rank, ev.pg_rank, ev.pid, ev.host)
        n = self._kept.get(key)
        if n is None:
            if self._keys_per_sig[ev.sig] >= KEYS_PER_SIGNATURE:
                return
            self._keys_per_sig[ev.sig] += 1
            n = 0
        if n >= EVENTS_PER_KEY:
            return
        self._kept[key] = n + 1
        self.events.append(ev)


class StreamScanner:
    """Scans one input stream: feed() bytes in any chunking, then close()."""

    def __init__(self, kb: KnowledgeBase, collector: Collector, stats: InputStats, file_index: int) -> None:
        self.kb = kb
        self.collector = collector
        self.stats = stats
        self.file_index = file_index
        self._carry = b""
        self._newlines = 0  # newlines consumed before the current buffer position
        self._long_head: bytes | None = None  # start of an over-long line being scanned in windows
        self._context_left = 0  # lines still to read as torchrun's failure summary
        self._entry: SummaryEntry | None = None
        self._entry_is_root = False
        self._last_line = (-1, frozenset())  # (line number, signatures recorded on it)
        self._tried_line, self._tried = -1, {}  # windows of one line: candidate set -> times tried
        self._source_line, self._source_tries = -1, 0  # source-catalogue lookups in the current line
        self._windows_line, self._windows = -1, 0  # windows read in the current over-long line
        # shape -> [full matches so far, signature ids it matched, or None once two matches disagreed]
        self._shapes: dict[bytes, list[Any]] = {}
        self._recorded: list[str] | None = None  # signature ids recorded by the current full match
        self._busy: tuple[int, str] | None = None  # progress bar glued before the current line's match
        self._open_bar: str | None = None  # an unfinished bar (no elapsed time) the current line cut off
        self._here: tuple[bytes, int, int] | None = None  # (buffer, start, line number) of an ordinary line
        self._end = 0  # end of the complete lines of the buffer being scanned (continuations stop there)
        # The prefilter in use: the knowledge base's, until a quota signature (Signature.quota) has been seen
        # its quota of times in this input; then the one without its keywords, and the input's last lines
        # (`_tail`) are looked at for it at the end.
        self._search = kb.prefilter.search
        self._quota_seen: dict[str, int] = {}
        self._tail = b""

    # ------------------------------------------------------------------ input
    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.stats.bytes += len(data)
        buf = self._carry + data if self._carry else data
        end = buf.rfind(b"\n") + 1
        if end:
            self._scan(buf, end)
            self._long_head = None
        rest = buf[end:]
        if len(rest) > MAX_LINE:
            # An over-long line in progress: scan what we have, keep only enough to catch a keyword
            # that straddles the cut.
            if self._long_head is None:
                self._long_head = rest[:HEAD]
                self.stats.long_lines += 1
            cut = len(rest) - self.kb.max_keyword_len
            self._scan_fragment(rest, cut)
            rest = rest[cut:]
        self._carry = rest

    def close(self) -> None:
        if self._carry:
            # The last line had no newline: scan it as a complete line.
            buf, self._carry = self._carry + b"\n", b""
            self._scan(buf, len(buf))
        self._flush_shape_counts()
        self._end_summary()
        self.stats.lines = self._newlines
        if self._quota_seen:
            self._tail_quota_lines()

    # ------------------------------------------------------------------ scanning
    def _scan(self, buf: bytes, end: int) -> None:
        """Scan the complete lines buf[0:end] (end is just after a newline).

        Sparse stretches are skipped by the prefilter in C; a hit line is looked up by its shape (digits
        zeroed) and who printed it: a shape already matched SHAPE_FULL times with one stable result is only
        counted, so dense logs (every line a keyword) cost a dictionary lookup per line, not a match."""
        search = self._search
        shapes = self._shapes
        self._end = end
        pos = 0
        cur = 0  # buf position whose line number is self._newlines + 1
        dense = False
        while pos < end:
            if self._context_left:
                nl = buf.find(b"\n", pos, end)
                if not _SUMMARY_SHAPE.search(buf, pos, nl):
                    self._end_summary()
                    self._context_left = 0
                    continue
                self._newlines += buf.count(b"\n", cur, pos)
                cur = pos
                self._line(buf, pos, nl, pos, head=self._long_head if pos == 0 else None, context=True)
                self._context_left = max(0, self._context_left - 1)
                pos = nl + 1
                continue
            if dense:
                # The previous line was a hit: in a dense stretch the next line is most likely a known
                # shape, and a lookup is cheaper than running the prefilter over it.
                dense = False
                le = buf.find(b"\n", pos, end)
                if le - pos <= MAX_SHAPE_LEN:
                    # _shape_key, inlined: this is the per-line cost of a dense log.
                    cut = pos + WHO_BYTES
                    key = buf[pos:cut] + buf[cut:le].translate(_DIGITS_TO_ZERO)
                    if buf.find(b"ank", pos, cut) < 0:
                        at = buf.find(b"ank", cut, min(le, pos + 160))
                        if at >= 0:
                            key += b"\0" + buf[at : at + 8]
                    shape = shapes.get(key)
                    if shape is not None and shape[0] >= SHAPE_FULL and shape[1] is not None:
                        shape[3] += 1
                        if shape[4]:
                            self._newlines += buf.count(b"\n", cur, pos)
                            cur = pos
                            self._seen_last(shape[4])
                        if shape[2]:
                            self._replay_summary_start(shape[2], buf, pos, le)
                        pos = le + 1
                        dense = True
                        continue
            m = search(buf, pos, end)
            if m is None:
                break
            hit = m.start()
            ls = buf.rfind(b"\n", pos, hit) + 1 or pos
            le = buf.find(b"\n", hit, end)
            dense = True
            if le - ls > MAX_SHAPE_LEN or (ls == 0 and self._long_head is not None):
                self._newlines += buf.count(b"\n", cur, ls)
                cur = ls
                self._line(buf, ls, le, hit, head=self._long_head if ls == 0 else None, context=False)
                pos = le + 1
                continue
            key = _shape_key(buf, ls, le)
            shape = shapes.get(key)
            if shape is not None and shape[0] >= SHAPE_FULL and shape[1] is not None:
                shape[3] += 1
                if shape[4]:
                    self._newlines += buf.count(b"\n", cur, ls)
                    cur = ls
                    self._seen_last(shape[4])
                if shape[2]:
                    self._replay_summary_start(shape[2], buf, ls, le)
                pos = le + 1
                continue
            self._newlines += buf.count(b"\n", cur, ls)
            cur = ls
            self._recorded = []
            self._line(buf, ls, le, hit, head=None, context=False)
            self._note_shape(key, shape, self._recorded)
            self._recorded = None
            pos = le + 1
        self._newlines += buf.count(b"\n", cur, end)
        self._tail = buf[max(0, end - TAIL_BYTES) : end]

    def _note_shape(self, key: bytes, shape: list[Any] | None, recorded: list[str]) -> None:
        """Remember what a full match of this line shape found; only results that may be replayed by
        counting (no torchrun summary, no fields that reasoning compares across ranks) are cacheable."""
        by_id = self.kb.by_id
        cacheable = all(by_id[sid].cacheable for sid in recorded)
        context = max((by_id[sid].context_lines for sid in recorded), default=0)
        result = tuple(recorded) if cacheable else None
        if shape is None:
            if len(self._shapes) >= MAX_SHAPES:
                # Timestamps in the kept prefix make new shapes as time passes: start over rather than
                # stop caching (memory stays bounded, old shapes are rarely seen again).
                self._flush_shape_counts()
                self._shapes.clear()
            # [full matches, signature ids (None once two full matches disagreed), summary context lines,
            #  repeats counted but not yet added to the collector's counts, presence-only ids whose last line
            #  is kept]
            tracked = tuple(sid for sid in recorded if by_id[sid].presence_only) if cacheable else ()
            self._shapes[key] = [1, result, context, 0, tracked]
            return
        shape[0] += 1
        if shape[1] != result:
            self._flush_shape(shape)
            shape[1] = None

    def _seen_last(self, ids: tuple[str, ...], lineno: int | None = None) -> None:
        """A presence-only line on `lineno` (default self._newlines + 1, a counted repeat): the last line it
        was seen on, and one more towards its signature's quota."""
        for sid in ids:
            self.stats.last_lines[sid] = lineno if lineno is not None else self._newlines + 1
            quota = self.kb.by_id[sid].quota
            if quota:
                seen = self._quota_seen[sid] = self._quota_seen.get(sid, 0) + 1
                if seen == quota:
                    self._search = self.kb.prefilter_without_quota().search

    def _tail_quota_lines(self) -> None:
        """After a quota switched the prefilter: the input's last two lines, looked at for each quota
        signature's keywords (a log that ends on NCCL's P2P setup)."""
        lines = self._tail.split(b"\n")[:-1][-2:]
        for sid, seen in self._quota_seen.items():
            sig = self.kb.by_id[sid]
            if seen < sig.quota:
                continue
            for back, text in enumerate(reversed(lines)):
                if any(kw.encode() in text for kw in sig.keywords):
                    self.stats.last_lines[sid] = max(self.stats.last_lines.get(sid, 0), self._newlines - back)
                    break

    def _flush_shape(self, shape: list[Any]) -> None:
        if shape[3] and shape[1]:
            counts = self.collector.counts
            for sig_id in shape[1]:
                counts[sig_id] += shape[3]
        shape[3] = 0

    def _flush_shape_counts(self) -> None:
        """Add the repeats counted per shape to the collector's per-signature counts."""
        for shape in self._shapes.values():
            self._flush_shape(shape)

    def _replay_summary_start(self, context: int, buf: bytes, ls: int, le: int) -> None:
        """A cached line that opens torchrun's failure summary: read the block that follows, as a full
        match would have."""
        if self._context_left or self.collector.summary_full:
            return
        self._end_summary()
        self._context_left = context
        self._entry_is_root = buf.find(b"Root Cause", ls, le) >= 0

    def _scan_fragment(self, rest: bytes, cut: int) -> None:
        """Matches starting before `cut` in a piece of an over-long line."""
        self._keyword_windows(rest, 0, 0, len(rest), cut, self._long_head, None)

    def _keyword_windows(
        self, buf: bytes, pos: int, lo: int, hi: int, stop: int, head: bytes | None, line_start: int | None
    ) -> None:
        """A window around each keyword of an over-long line found from `pos` and starting before `stop`
        (windows kept within buf[lo:hi]), while the line's window budget lasts. `head` (the line's first
        bytes, for its prefixes) goes before every window that does not start at `line_start` (None: the
        line started before `buf`)."""
        search = self._search
        lineno = self._newlines + 1
        while (m := search(buf, pos, hi)) is not None and m.start() < stop and self._count_window():
            w0 = max(lo, m.start() - WINDOW // 2)
            w1 = min(hi, m.end() + WINDOW // 2)
            self._window(buf[w0:w1], m.start() - w0, lineno, None if w0 == line_start else head)
            pos = max(w1, m.end())

    def _line(self, buf: bytes, ls: int, le: int, hit: int, head: bytes | None, context: bool) -> None:
        lineno = self._newlines + 1
        self._here = (buf, ls, lineno) if le - ls <= MAX_LINE else None
        if le - ls > MAX_LINE:
            if head is None:
                head = buf[ls : ls + HEAD]
                self.stats.long_lines += 1
            if context:
                if self._count_window():
                    w0, w1 = max(ls, hit - WINDOW // 2), min(le, hit + WINDOW // 2)
                    self._window(buf[w0:w1], hit - w0, lineno, head if w0 > ls else None, context)
                return
            # Every keyword of the line gets a window (not only the first), within the line's budget.
            self._keyword_windows(buf, hit, ls, le, le, head, ls)
        else:
            raw = buf[ls:le]
            if not context and _continues(raw):
                raw = self._joined(buf, raw, le)
            self._window(raw, hit - ls, lineno, head, context, before=_lines_before(buf, ls))

    def _count_window(self) -> bool:
        """One more window of the current over-long line; False once the line has had its share."""
        lineno = self._newlines + 1
        if self._windows_line != lineno:
            self._windows_line, self._windows = lineno, 0
        self._windows += 1
        if self._windows == MAX_WINDOWS_PER_LINE + 1:
            self.stats.windows_capped += 1
        return self._windows <= MAX_WINDOWS_PER_LINE

    def _joined(self, buf: bytes, raw: bytes, le: int) -> bytes:
        """`raw` (the line ending at `le`) with the lines that continue it appended."""
        pos = le + 1
        for _ in range(JOIN_LINES):
            nl = buf.find(b"\n", pos, self._end)
            if nl < 0 or len(raw) + nl - pos > MAX_SHAPE_LEN + JOIN_BYTES:
                break
            cont = buf[pos:nl].rstrip(b"\r")
            cont = cont[_CONT_PREFIX.match(cont).end() :]  # type: ignore[union-attr]
            if not cont.strip():
                break
            if _IFACE_LIST_END.search(raw.rstrip()) and not _IFACE_ENTRY.match(cont.strip()):
                break  # a whole interface list, and the next line is not an entry of it: nothing was wrapped
            if cont[:1] in b" \t" or raw.rstrip()[-1:] in b",;:(":
                raw = raw.rstrip() + b" " + cont.strip()
            else:
                raw = raw + cont.rstrip()  # a terminal's hard wrap: the word goes on
            if not _continues(raw):
                break
            pos = nl + 1
        return raw

    def _window(
        self, raw: bytes, hit: int, lineno: int, head: bytes | None, context: bool = False, before: bytes = b""
    ) -> None:
        raw = raw.rstrip(b"\r")
        self._busy = None
        self._open_bar = None
        if 0 < hit and b"%|" in raw[:hit]:
            cut = _OPEN_BAR.search(raw, max(0, hit - 170), hit)
            if cut is not None and int(cut.group(1)) < 100 and not re.search(rb"\d+/\d+", raw[cut.end(1) : hit]):
                lead = raw[max(0, cut.start() - 100) : cut.start()]
                lead = lead[max(lead.rfind(b"\r"), lead.rfind(b"]"), lead.rfind(b"\n")) + 1 :].strip()
                self._open_bar = (lead + b" " + cut.group(1) + b"%").decode("utf-8", "replace").strip()
                before = b""  # the bar the hit cut off is the one it interrupted, not one printed lines earlier
        # A progress bar glued in front of the hit (same stream, no newline) or on the lines just before it.
        for text, end in ((raw, hit), (before, len(before))):
            if end <= 0 or b"%|" not in text[:end]:
                continue
            bars = list(_PROGRESS.finditer(text, 0, end))
            if bars:
                last = bars[-1]
                hours, minutes, seconds = (int(g or 0) for g in last.group(2, 3, 4))
                # with the bar's description in front of it (`Tokenizing Prompts (num_proc=64):  92%|...`)
                lead = text[max(0, last.start() - 100) : last.start()]
                lead = lead[max(lead.rfind(b"\r"), lead.rfind(b"]"), lead.rfind(b"\n")) + 1 :].lstrip()
                bar = lead + text[last.start() : last.end() + 40].split(b"]")[0] + b"]"
                self._busy = (hours * 3600 + minutes * 60 + seconds, bar.decode("utf-8", "replace"))
                break
        if b"\r" in raw:
            # Progress bars redraw with \r: keep the segment the match is in.
            start = raw.rfind(b"\r", 0, max(hit, 0)) + 1
            stop = raw.find(b"\r", max(hit, 0))
            raw = raw[start : stop if stop >= 0 else len(raw)]
            hit -= start
        if head is not None:
            sep = b" ... "
            hit += len(head) + len(sep)
            raw = head.split(b"\n")[0] + sep + raw
        cands = self.kb.candidates(raw)
        if not cands and not context:
            return
        text = raw.decode("utf-8", "replace")
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        anchor = len(raw[: max(hit, 0)].decode("utf-8", "replace"))
        info = normalize_line(text, anchor)
        if context:
            self._summary_line(info, lineno)
        if cands and info.frame:
            sigs = self.kb.signatures
            cands = [i for i in cands if i < len(sigs) and sigs[i].frames]
        if cands:
            self._match(cands, info, text, lineno)

    def _match(self, cands: Iterable[int], info: LineInfo, text: str, lineno: int) -> None:
        matched: list[tuple[Signature, re.Match[str]]] = []
        # An over-long line is scanned in many windows; a signature already found in it is not run again
        # (it would only add a count): the work per window is bounded by what is new in it.
        last_no, done = self._last_line
        seen = done if last_no == lineno else frozenset()
        # The same keywords window after window (a 64 MB line of one repeated message) are tried a few
        # times, then skipped: without this bound one pathological line costs minutes.
        if self._tried_line != lineno:
            self._tried_line, self._tried = lineno, {}
        cands = tuple(cands)
        key = frozenset(cands)
        tries = self._tried.get(key, 0)
        if tries >= WINDOW_RETRIES:
            return
        self._tried[key] = tries + 1
        sigs = self.kb.signatures
        for i in cands:
            if i >= len(sigs):
                continue  # the source catalogue's probe: looked up below when nothing specific matches
            sig = sigs[i]
            if sig.id in seen:
                continue
            for rx in sig.patterns:
                m = rx.search(info.message)
                if m:
                    matched.append((sig, m))
                    break
        if matched and all(s.fallback for s, _ in matched):
            # A line only generic signatures claim (a WARN, an exception) may state its own cause in any
            # case ("..., please set X"): keywords are case-sensitive, so the stated-cause patterns are
            # tried on every such line, not only on lines holding one of its keywords.
            stated = self.kb.by_id.get(STATED_CAUSE)
            if stated is not None and all(s is not stated for s, _ in matched):
                for rx in stated.patterns:
                    sm = rx.search(info.message)
                    if sm:
                        matched.append((stated, sm))
                        break
        source_extra: dict[str, str] = {}
        if self.kb.sources is not None and all(s.fallback for s, _ in matched):
            if self._source_line != lineno:
                self._source_line, self._source_tries = lineno, 0
            self._source_tries += 1
            # An over-long line is looked up in its first few windows only: the work per line stays bounded.
            if self._source_tries <= SOURCE_TRIES_PER_LINE:
                matched, source_extra = self._source_lookup(matched, info.message, text)
        if not matched:
            return
        if any(not s.fallback for s, _ in matched):
            matched = [(s, m) for s, m in matched if not s.fallback]
        refined = {r for s, _ in matched for r in s.refines}
        if refined:
            matched = [(s, m) for s, m in matched if s.id not in refined]
        extra: dict[str, str] = {}
        if self.kb.catalogue is not None and any(s.id == "nccl.warn" for s, _ in matched):
            # A WARN no specific signature claimed: name its mechanism from NCCL's own format strings.
            entry = self.kb.catalogue.match(info.message)
            if entry is not None:
                extra = entry.fields()
                cls_sig = self.kb.by_id.get(class_signature_id(entry.cls))
                if cls_sig is not None:
                    matched = [(cls_sig, m) if s.id == "nccl.warn" else (s, m) for s, m in matched]
        last_no, last_sigs = self._last_line
        if last_no != lineno:
            last_sigs = frozenset()
        if extra:
            # The generic WARN was named from the catalogue: later windows of this line need not run it.
            last_sigs = last_sigs | {"nccl.warn"}
        for sig, m in matched:
            if sig.id in last_sigs:
                continue  # the same over-long line matched again in another window
            last_sigs = last_sigs | {sig.id}
            if self._recorded is not None:
                self._recorded.append(sig.id)
            if sig.presence_only:
                self._seen_last((sig.id,), lineno)
            ev = self._event(sig, m, info, text, lineno)
            if extra and (sig.id.startswith("nccl.warn") or sig.id == STATED_CAUSE):
                ev.fields.update(extra)
            if source_extra and (sig.id.startswith(SIGNATURE_PREFIX) or sig.id == STATED_CAUSE):
                ev.fields.update(source_extra)
            self.collector.add(ev)
            if sig.context_lines and not self._context_left and not self.collector.summary_full:
                self._start_summary(sig, info)
        self._last_line = (lineno, last_sigs)

    def _source_lookup(
        self, matched: list[tuple[Signature, re.Match[str]]], message: str, text: str
    ) -> tuple[list[tuple[Signature, re.Match[str]]], dict[str, str]]:
        """A line only generic signatures (or none) claimed: name its mechanism from the message catalogue of
        c10d / gloo / elastic / NCCL result codes / CUDA errors. The class replaces a generic exception or
        failure line; a catalogued NCCL WARN keeps the NCCL catalogue's class."""
        if any(s.id == "nccl.warn" for s, _ in matched):
            cat = self.kb.catalogue
            if cat is not None and cat.match(message) is not None:
                return matched, {}  # NCCL's own format strings name it (below)
        assert self.kb.sources is not None
        hit = self.kb.sources.match(message)
        if hit is None:
            return matched, {}
        entry, found = hit
        warning = entry.level == "warning" or _WARNING_LINE.match(text) is not None
        cls_sig = self.kb.by_id.get(entry.signature if not warning else signature_id(entry.cls) + WARNING_SUFFIX)
        if cls_sig is None:
            return matched, {}  # an unclassified message: the generic signature that claimed the line stays
        if warning:
            # A warning is a hint: it never replaces the error signature that claimed the line.
            kept = matched
        else:
            kept = [(s, m) for s, m in matched if s.id not in _GENERIC_FOR_SOURCES]
        return [*kept, (cls_sig, found)], entry.fields()

    def _event(self, sig: Signature, m: re.Match[str], info: LineInfo, text: str, lineno: int) -> Event:
        fields = {k: v for k, v in m.groupdict().items() if v is not None}
        rank, local_rank, host, pid = info.rank, info.local_rank, info.host, info.pid
        entry = self._entry
        if self._context_left and entry is not None:
            # A line inside torchrun's failure summary belongs to the worker being described.
            rank = entry.rank if rank is None else rank
            local_rank = entry.local_rank if local_rank is None else local_rank
            host = host or entry.host
        if "pid" in fields and pid is None:
            pid = parse_int(fields["pid"])
        if self._busy is not None:
            # The line shares its text with a progress bar printed just before it (same stream, no newline).
            fields["busy_elapsed_s"] = str(self._busy[0])
            fields["busy_bar"] = self._busy[1][:MAX_TEXT]
        elif self._open_bar is not None:
            fields["open_bar"] = self._open_bar[:MAX_TEXT]
        if "exception" in fields and self._here is not None and self._here[2] == lineno:
            # Where the exception was raised (the traceback's last frame): in a library or in the user's code.
            frame = _raising_frame(*self._here[:2])
            if frame is not None:
                fields["frame_file"], fields["frame_line"], fields["frame_func"] = frame
        if "global_rank" in fields and rank is None:
            # Lightning's start line names its process's rank: kept per rank, so a rank printed twice shows.
            rank = parse_int(fields["global_rank"])
        if "local_rank" in fields and local_rank is None and rank is None:
            local_rank = parse_int(fields["local_rank"])
        if "host" in fields and host is None:
            host = fields["host"]
        if len(text) > MAX_TEXT:
            at = len(text) - len(info.message) + m.start()  # the match, in text coordinates
            start = max(0, min(at - MAX_TEXT // 4, len(text) - MAX_TEXT))
            text = ("..." if start else "") + text[start : start + MAX_TEXT] + "..."
        return Event(
            sig=sig.id,
            file=self.stats.name,
            file_index=self.file_index,
            line=lineno,
            text=text,
            rank=rank,
            local_rank=local_rank,
            pg_rank=info.pg_rank,
            host=host,
            pid=pid,
            ts=info.ts,
            fields=fields,
        )

    # ------------------------------------------------------------------ torchrun failure summary
    def _start_summary(self, sig: Signature, info: LineInfo) -> None:
        self._end_summary()
        self._context_left = sig.context_lines
        self._entry_is_root = "Root Cause" in info.message

    def _summary_line(self, info: LineInfo, lineno: int) -> None:
        msg = info.message
        if msg.strip().startswith("====") and self._entry is not None:
            self._end_summary()
            self._context_left = 0
            return
        if "Root Cause (first observed failure)" in msg:
            self._flush_entry()
            self._entry_is_root = True
            return
        if msg.strip() == "Failures:":
            self._flush_entry()
            self._entry_is_root = False
            return
        if _SUMMARY_ENTRY.match(msg):
            self._flush_entry()
            self._entry = SummaryEntry(file_index=self.file_index, line=lineno, root=self._entry_is_root)
            return
        m = _SUMMARY_FIELD.match(msg)
        if not m or self._entry is None:
            return
        key, value = m.group(1), m.group(2)
        entry = self._entry
        if key == "host":
            entry.host = value or None
        elif key == "rank":
            rm = _SUMMARY_RANK.match(value)
            if rm:
                entry.rank = int(rm.group(1))
                entry.local_rank = int(rm.group(2)) if rm.group(2) else None
        elif key == "exitcode":
            em = _SUMMARY_EXIT.match(value)
            if em:
                entry.exitcode = int(em.group(1))
                entry.pid = int(em.group(2)) if em.group(2) else None
        elif key == "time":
            entry.ts = parse_timestamp(value)
        elif key == "traceback":
            entry.traceback = value[:MAX_TEXT]

    def _flush_entry(self) -> None:
        if self._entry is not None and (self._entry.rank is not None or self._entry.pid is not None):
            if len(self.collector.summary) < MAX_SUMMARY:
                self.collector.summary.append(self._entry)
            else:
                self.collector.summary_dropped += 1
        self._entry = None

    def _end_summary(self) -> None:
        self._flush_entry()


@dataclass
class ScanResult:
    inputs: list[InputStats]
    events: list[Event]
    counts: dict[str, int]
    summary: list[SummaryEntry]


def scan_stream(
    kb: KnowledgeBase,
    stream: IO[bytes],
    stats: InputStats,
    file_index: int,
    collector: Collector,
    chunk_size: int = CHUNK_SIZE,
    on_bytes: Optional[Callable[[int], None]] = None,
) -> None:
    """Scan a binary stream to its end. Read errors (a truncated .gz, an I/O error) end the scan of this
    input and are recorded in stats.error; everything read before the error is scanned. `on_bytes(n)`
    is told of each chunk read (a progress bar)."""
    scanner = StreamScanner(kb, collector, stats, file_index)
    # read1 returns what one read of the underlying stream (or one gzip block) gives, so the data
    # before a truncated gzip member's end is not lost with the EOFError.
    read = getattr(stream, "read1", None) or stream.read
    while True:
        parts: list[bytes] = []
        size = 0
        error: BaseException | None = None
        while size < chunk_size:
            try:
                data = read(chunk_size - size)
            except (OSError, EOFError, zlib.error) as exc:
                error = exc
                break
            if not data:
                break
            parts.append(data)
            size += len(data)
        if parts:
            scanner.feed(b"".join(parts))
            if on_bytes is not None:
                on_bytes(size)
        if error is not None:
            stats.error = f"read stopped early: {error}"
            break
        if size < chunk_size:
            break
    scanner.close()


def open_log(path: str) -> IO[bytes]:
    """Open a log file for binary reading, never blocking, decoded whatever it was written as (gzip, xz,
    bzip2, zstd by magic bytes, UTF-16): edge.files.open_user_log; InputRefused (an OSError) otherwise."""
    from ddpdoctor.edge.files import open_user_log

    return open_user_log(path)


def scan_inputs(
    kb: KnowledgeBase,
    named_streams: Iterable[tuple[str, IO[bytes]]],
    on_bytes: Optional[Callable[[str, int], None]] = None,
) -> ScanResult:
    """Scan several inputs (name, binary stream) into one result; `on_bytes(name, n)` as each chunk
    of an input is read (a progress bar)."""
    collector = Collector()
    inputs: list[InputStats] = []
    for index, (name, stream) in enumerate(named_streams):
        stats = InputStats(name=name)
        inputs.append(stats)
        told = None if on_bytes is None else (lambda n, name=name: on_bytes(name, n))
        scan_stream(kb, stream, stats, index, collector, on_bytes=told)
    return ScanResult(
        inputs=inputs, events=collector.events, counts=dict(collector.counts), summary=collector.summary
    )
