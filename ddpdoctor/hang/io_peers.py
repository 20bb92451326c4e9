"""Why a rank's blocking read never returns, told by the process at the other end: a helper service that itself
waits to read (the two sides disagree on the protocol: a length header packed in one byte order and read in
another, a line sent without the newline its reader waits for), or one busy elsewhere. Pure: the peers'
stacks and locals (probe_io._io_peers) in, a phrase out.

Without the other end, "it waits for data nobody writes" names the wait but not the reason; the reason is
almost always in what the writer does at that moment, which is one `py-spy dump` away.
"""

from __future__ import annotations

import posixpath
import re
from typing import Mapping, Optional, Sequence

from ddpdoctor.hang.findings import IoPeer

_READS = re.compile(r"\.(?:recv|recv_into|recvfrom|read|readline|readlines|readinto|read_exactly|readexactly)\(|"
                    r"\bos\.read\(|\bselect\(|\.poll\(|\bin\s+[\w.]+\s*:")
READ_LIBRARY = ("socket.py", "selectors.py", "ssl.py", "_pyio.py", "asyncio/streams.py")
# A length or count local whose value is this big was not meant: a header read in the wrong byte order or size.
_SIZE_NAME = re.compile(r"^(?:n|size|length|len|count|nbytes|num_bytes|expected|remaining|want|need|total)$|"
                        r"(?:_|^)(?:size|len|length|bytes|count)(?:_|$)", re.IGNORECASE)
_HUGE = 1 << 27


def short_argv(argv: Sequence[str]) -> str:
    """`python scorer_server.py 5555` -> 'python scorer_server.py 5555' with paths cut to their last part."""
    return " ".join(posixpath.basename(a) if "/" in a else a for a in argv[:4])[:120] or "?"


def _reading(peer: IoPeer, sources: Mapping[str, Sequence[str]]) -> bool:
    stack = peer.stack
    main = stack.main if stack is not None else None
    if main is None or not main.frames:
        return False
    frame = stack.user_frame() if stack is not None else None
    lines = sources.get(frame.filename) if frame is not None else None
    code = lines[frame.line - 1] if lines and frame is not None and 0 < frame.line <= len(lines) else ""
    library = [f for f in main.frames if not f.is_user]
    return bool(_READS.search(code)) or any(f.filename.endswith(READ_LIBRARY) for f in library[:6])


def _huge_size(values: Mapping[str, str]) -> Optional[tuple[str, int]]:
    for name, value in values.items():
        text = value.strip()
        if _SIZE_NAME.search(name) and text.isdigit() and len(text) < 30 and int(text) >= _HUGE:
            return name, int(text)
    return None


def peer_reason(at: str, peers: Sequence[IoPeer], sources: Mapping[str, Sequence[str]]
                ) -> Optional[tuple[str, str, str, list[dict[str, object]]]]:
    """(mechanism id, summary, fix, thread records) for a rank blocked reading at `at` whose socket or pipe
    leads to one of `peers`; None when no peer's stack was read."""
    for peer in peers:
        stack = peer.stack
        frame = stack.user_frame() if stack is not None else None
        if stack is None or frame is None:
            continue
        lines = sources.get(frame.filename)
        code = lines[frame.line - 1].strip()[:160] if lines and 0 < frame.line <= len(lines) else ""
        where = f"{frame.filename}:{frame.line}" + (f" `{code}`" if code else "") + f" in {frame.name}()"
        shown = ", ".join(f"{k} = {v[:60]}" for k, v in list(peer.locals.items())[:6]
                          if not v.startswith("<") and not k.startswith("__"))
        who = f"pid {peer.pid} (`{short_argv(peer.argv)}`)"
        record: list[dict[str, object]] = [{"thread": "MainThread", "pid": peer.pid, "file": frame.filename,
                                            "line": frame.line, "code": code, "role": "other_end",
                                            "via": peer.via, "locals": dict(list(peer.locals.items())[:12])}]
        if _reading(peer, sources):
            huge = _huge_size(peer.locals)
            summary = (
                f"it waits to read at {at}, and the other end of that {peer.via} is {who}, which waits to read "
                f"too, at {where}" + (f" ({shown})" if shown else "")
                + ": each side waits for the other to write, so the two disagree on their protocol (a length "
                "header packed in one byte order or size and read in another, a line sent without the newline "
                "its reader waits for, a reply or request one side never completes)"
                + (f"; the other end expects {huge[0]} = {huge[1]:,} bytes, far more than any message here: a "
                   "length read with the wrong byte order or width" if huge else ""))
            return ("io.both_ends_read", summary,
                    "Make both sides use one framing: the same struct format for the length header (`!I` on both "
                    "ends, not `!I` and `<I`), a newline after every line sent to a readline(), a flush after each "
                    "write; read with a timeout so a missing reply is an error.", record)
        summary = (f"it waits to read at {at}, and the other end of that {peer.via} is {who}, which is now at "
                   f"{where}" + (f" ({shown})" if shown else "") + ": it does not write what this rank waits for")
        return ("io.peer_elsewhere", summary,
                "Look at why that process does not answer (its stack above); read with a timeout so a missing "
                "reply is an error.", record)
    return None
